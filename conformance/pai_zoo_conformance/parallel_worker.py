"""On every rank of a worker group (:mod:`pai_zoo_conformance.workers`): load a Megatron-Core checkpoint with
tensor/pipeline-parallel layouts, return the logits of given token ids (rank 0's) and, with ``save``, write the
model back with megatron-core's own ``dist_checkpointing.save`` (sharded as a training run with that layout would).
Used by the parallel checks of the conformance suite and the conversion tests."""
from __future__ import annotations


def layout_logits(checkpoint, layouts, ids, save=None, inputs=None) -> dict | None:
    """Load ``checkpoint`` with each ``(tp, pp)`` of ``layouts`` in turn (in this process group) and take the logits
    of ``ids`` (a LongTensor [batch, seq]); with ``save``, write the last layout's model there. Returns
    ``{(tp, pp): logits}`` on rank 0, None on the other ranks. ``inputs``: a vision-language model's image and
    video inputs (transformers' names)."""
    import torch
    from megatron.core import parallel_state

    from pai_zoo.models.handle import load

    torch.set_num_threads(1)
    logits = {}
    for tp, pp in layouts:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()  # the next layout's groups, in the same process group
        handle = load(checkpoint, backend="mcore", tensor_parallel_size=tp, pipeline_parallel_size=pp)
        logits[(tp, pp)] = handle.logits(ids, **(inputs or {}))
    if save:
        _save_like_megatron(handle.model, checkpoint, save)
    torch.distributed.barrier()
    return logits if torch.distributed.get_rank() == 0 else None


def _save_like_megatron(model, source, target) -> None:
    import shutil
    from pathlib import Path

    import torch
    from megatron.core import dist_checkpointing

    from pai_zoo.formats import mcore_dist

    target = Path(target)
    if torch.distributed.get_rank() == 0:
        (target / mcore_dist.RELEASE).mkdir(parents=True)
        for name in (mcore_dist.TRACKER, mcore_dist.PAI_ZOO_CONFIG):
            shutil.copy2(Path(source) / name, target / name)
        shutil.copytree(Path(source) / mcore_dist.HF_DIR, target / mcore_dist.HF_DIR)
    torch.distributed.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), str(target / mcore_dist.RELEASE))

