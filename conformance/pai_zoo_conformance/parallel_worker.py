"""Run under ``torchrun``: load a Megatron-Core checkpoint with a tensor/pipeline-parallel layout,
save the logits of given token ids (from rank 0) and, with ``--save``, write the model back with
megatron-core's own ``dist_checkpointing.save`` (sharded as a training run with that layout
would). Used by the parallel checks of the conformance suite and the conversion tests."""
from __future__ import annotations

import argparse


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--layouts", help="several TPxPP layouts, comma-separated (e.g. 2x1,1x2), one after the "
                                          "other in this launch; --out is then a folder of logits-tpT-ppP.pt")
    parser.add_argument("--ids", required=True, help="torch.save'd LongTensor [batch, seq]")
    parser.add_argument("--out", required=True)
    parser.add_argument("--save", help="write the loaded model here with megatron-core's dist_checkpointing.save")
    args = parser.parse_args(argv)

    import torch
    from megatron.core import parallel_state

    import pai_zoo

    torch.set_num_threads(1)
    ids = torch.load(args.ids)
    if args.layouts:
        layouts = [tuple(int(n) for n in layout.split("x")) for layout in args.layouts.split(",")]
        outs = [f"{args.out}/{layout_file(tp, pp)}" for tp, pp in layouts]
    else:
        layouts, outs = [(args.tp, args.pp)], [args.out]
    for (tp, pp), out in zip(layouts, outs):
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()  # the next layout's groups, in the same process group
        handle = pai_zoo.load(args.checkpoint, backend="mcore", tensor_parallel_size=tp, pipeline_parallel_size=pp)
        logits = handle.logits(ids)
        if torch.distributed.get_rank() == 0:
            torch.save(logits, out)
    if args.save:
        _save_like_megatron(handle.model, args.checkpoint, args.save)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def layout_file(tp: int, pp: int) -> str:
    """The file ``--layouts`` writes one layout's logits to."""
    return f"logits-tp{tp}-pp{pp}.pt"


def _save_like_megatron(model, source, target) -> None:
    import shutil
    from pathlib import Path

    import torch
    from megatron.core import dist_checkpointing

    from pai_zoo.mcore import dist_ckpt

    target = Path(target)
    if torch.distributed.get_rank() == 0:
        (target / dist_ckpt.RELEASE).mkdir(parents=True)
        for name in (dist_ckpt.TRACKER, dist_ckpt.PAI_ZOO_CONFIG):
            shutil.copy2(Path(source) / name, target / name)
        shutil.copytree(Path(source) / dist_ckpt.HF_DIR, target / dist_ckpt.HF_DIR)
    torch.distributed.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), str(target / dist_ckpt.RELEASE))


if __name__ == "__main__":
    main()
