"""On every rank of a worker group (:mod:`pai_zoo_conformance.workers`), ``ep`` ranks: load a Megatron-Core
checkpoint of a mixture-of-experts model (written by ``convert --to mcore``) with that expert parallelism (each rank
builds its share of the experts; megatron-core's ``dist_checkpointing`` gives each rank its own experts) and return
rank 0's logits of given token ids; with ``save``, save the model as that expert-parallel run would (megatron-core's
``dist_checkpointing.save``, each rank writing its own experts) into a checkpoint folder. Used by the suite's
expert-parallel check (:mod:`pai_zoo_conformance.expert_parallel`) and ``tests/test_moe.py``."""
from __future__ import annotations


def expert_logits(checkpoint, ids, ep: int = 2, swap: bool = False, save=None):
    """Rank 0's logits of ``ids`` from ``checkpoint`` loaded with expert parallelism ``ep`` (``swap``: the last
    rank's first two local experts of the first MoE layer swapped, a broken layout for tests; ``save``: the folder
    the model is saved into under this layout); None on the other ranks."""
    import torch

    torch.set_num_threads(1)
    from pai_zoo.mcore.compat import apply_cpu_patch

    apply_cpu_patch()
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(expert_model_parallel_size=ep)
    model_parallel_cuda_manual_seed(1234)

    from pai_zoo.families.registry import get_registry
    from pai_zoo.formats import mcore_dist
    from pai_zoo.formats.megatron_folder import iteration_dir
    from pai_zoo.mcore import dist_ckpt
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.forward import mcore_forward

    config, meta = mcore_dist.mcore_config_of(checkpoint)
    family = get_registry().family(config.family)
    model = build_gpt_model(family, config, padded_vocab_size=meta.get("padded_vocab_size"),
                            expert_model_parallel_size=ep).eval()
    local = next(layer.mlp.experts.local_experts for layer in model.decoder.layers
                 if hasattr(getattr(layer, "mlp", None), "experts"))  # a hybrid's Mamba layers have none
    assert len(local) * ep == config["num_moe_experts"], (len(local), config["num_moe_experts"])
    dist_ckpt.load_model_weights(model, iteration_dir(checkpoint))
    if save:
        import json
        import shutil
        from pathlib import Path

        from megatron.core import dist_checkpointing

        save, source = Path(save), Path(checkpoint)
        if torch.distributed.get_rank() == 0:
            (save / mcore_dist.RELEASE).mkdir(parents=True)
            record = json.loads((source / mcore_dist.PAI_ZOO_CONFIG).read_text())
            record["expert_parallel"] = ep
            (save / mcore_dist.PAI_ZOO_CONFIG).write_text(json.dumps(record))
            (save / mcore_dist.TRACKER).write_text(mcore_dist.RELEASE)
            shutil.copytree(source / mcore_dist.HF_DIR, save / mcore_dist.HF_DIR)
        torch.distributed.barrier()
        dist_checkpointing.save(model.sharded_state_dict(), str(save / mcore_dist.RELEASE))
    if swap and torch.distributed.get_rank() == ep - 1:
        with torch.no_grad():
            first = local[0].linear_fc1.weight.detach().clone()
            local[0].linear_fc1.weight.copy_(local[1].linear_fc1.weight)
            local[1].linear_fc1.weight.copy_(first)
    with torch.no_grad():
        logits = mcore_forward(model, ids)
    torch.distributed.barrier()
    return logits if torch.distributed.get_rank() == 0 else None
