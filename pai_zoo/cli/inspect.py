"""``pai-zoo inspect CKPT``: what a checkpoint holds (Hugging Face, pai-zoo or Megatron-LM) and what converting it
would need."""
from __future__ import annotations

from ._common import add_command


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "inspect", "describe any checkpoint: format, iteration, layout, architecture, "
                                           "family, parameters")
    p.add_argument("checkpoint", help="a Hugging Face folder or a Megatron checkpoint (pai-zoo's or Megatron-LM's)")
    p.add_argument("--family", help="family name, when a Megatron-LM checkpoint's args fit several")
    p.add_argument("--tokenizer", metavar="DIR", help="the original HF folder of a Megatron-LM checkpoint")
    p.add_argument("--iteration", help="a saved iteration other than the tracker's (a number or 'release')")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..models.inspection import inspect_checkpoint

    report = inspect_checkpoint(args.checkpoint, family=args.family, tokenizer=args.tokenizer,
                                iteration=args.iteration)
    print("\n".join(report.lines()))
    return 0
