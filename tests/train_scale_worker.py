"""Several ``pai-zoo train`` runs on the session's 2 worker ranks, one after the other, each with its own parallel
layout (megatron's parallel state is torn down between them): :func:`train_cases`, sent by tests/test_train_scale.py
with ``pai_zoo_workers.run(train_cases, CASES_JSON)``.

CASES.json maps a case name to its settings (``TrainConfig.from_mapping`` keys). Each run also writes
``recompute_calls.json`` into its save folder on rank 0: how many times megatron-core's activation recompute
(``tensor_parallel.checkpoint``) ran, so that a test can tell that recompute was on; and
``parameters_per_rank.json``: the parameters megatron-core built on each rank (its pipeline and tensor rank).
"""
import json
from pathlib import Path


def train_cases(cases_file: str) -> None:
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    from pai_zoo.training.config import TrainConfig
    from pai_zoo.training.trainer import Trainer
    from pai_zoo.util.dist import is_rank0

    calls = [0]
    apply = mrandom.CheckpointFunction.apply

    def counted_apply(*args, **kwargs):
        calls[0] += 1
        return apply(*args, **kwargs)

    mrandom.CheckpointFunction.apply = counted_apply
    try:
        for name, settings in json.loads(Path(cases_file).read_text()).items():
            calls[0] = 0
            trainer = Trainer(TrainConfig.from_mapping(settings, where=name), echo=lambda *a: None)
            trainer.run()
            built = sum(p.numel() for chunk in trainer.chunks for p in chunk.parameters())
            counts = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(counts, {"pp": parallel_state.get_pipeline_model_parallel_rank(),
                                                         "tp": parallel_state.get_tensor_model_parallel_rank(),
                                                         "parameters": built})
            if is_rank0():
                (Path(settings["save"]) / "recompute_calls.json").write_text(json.dumps(calls[0]))
                (Path(settings["save"]) / "parameters_per_rank.json").write_text(json.dumps(counts))
            parallel_state.destroy_model_parallel()
    finally:
        mrandom.CheckpointFunction.apply = apply
