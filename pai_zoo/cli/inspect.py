"""``pai-zoo inspect CKPT``: what a checkpoint holds (Hugging Face, pai-zoo or Megatron-LM) and what converting it
would need, once its files are checked whole (each file's size against its index or metadata; ``--deep``: every
tensor read and checked finite) and its tokenizer checked against its config. A missing or truncated file, a
non-finite tensor or a tokenizer of another model is one error line, exit 1."""
from __future__ import annotations

from ..models.inspection import inspect_checkpoint
from ._common import add_command, add_revision, hub_args


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "inspect", "describe any checkpoint: format, iteration, layout, architecture, "
                                           "family, parameters")
    p.add_argument("checkpoint", help="a Hugging Face folder or Hub id (org/name), or a Megatron checkpoint (pai-zoo's "
                                      "or Megatron-LM's)")
    add_revision(p, "CHECKPOINT")
    p.add_argument("--family", help="family name, when a Megatron-LM checkpoint's args fit several")
    p.add_argument("--tokenizer", metavar="DIR", help="the original HF folder of a Megatron-LM checkpoint")
    p.add_argument("--iteration", help="a saved iteration other than the tracker's (a number or 'release')")
    p.add_argument("--deep", action="store_true",
                   help="also read every tensor and check that it is finite (reads the whole checkpoint)")
    p.add_argument("--tokenizer-mismatch-ok", action="store_true",
                   help="describe a checkpoint whose tokenizer does not fit its config (a tokenizer of another "
                        "model) instead of stopping with an error")
    p.set_defaults(func=run)


def run(args) -> int:
    hub_args(args, "checkpoint")
    report = inspect_checkpoint(args.checkpoint, family=args.family, tokenizer=args.tokenizer,
                                iteration=args.iteration, deep=args.deep,
                                tokenizer_mismatch_ok=args.tokenizer_mismatch_ok)
    print("\n".join(report.lines()))
    return 0
