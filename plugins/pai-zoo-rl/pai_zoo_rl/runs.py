"""What the DPO and GRPO commands share: the flags of a run (its layout, seed, checkpoints) and their checks."""
from __future__ import annotations

from pai_zoo.errors import SettingError


def add_run_arguments(parser, defaults: dict) -> None:
    """``--clip-grad``, ``--seed``, ``--save-every``, ``--no-resume``, ``--tp``, ``--pp`` and ``--quiet``."""
    a = parser.add_argument
    a("--clip-grad", "--max-grad-norm", dest="max_grad_norm", metavar="NORM", type=float,
      default=defaults["max_grad_norm"], help="max global gradient norm, as train --clip-grad (0 disables clipping)")
    a("--seed", type=int, default=defaults["seed"], help="random seed (data order, sampling)")
    a("--save-every", type=int, default=defaults["save_every"], help="checkpoint every N steps (0: at the end)")
    a("--no-resume", dest="resume", action="store_false", help="start over even if SAVE holds a checkpoint")
    a("--tp", dest="tensor_parallel_size", type=int, default=defaults["tensor_parallel_size"],
      help="tensor-parallel size (under torchrun; the ranks beyond tp x pp are data-parallel)")
    a("--pp", dest="pipeline_parallel_size", type=int, default=defaults["pipeline_parallel_size"],
      help="pipeline-parallel size (under torchrun)")
    a("--quiet", action="store_true", help="no line per step on the terminal (metrics.jsonl is written all the same)")


def check_run_settings(command: str, s: dict, required: tuple[str, ...]) -> None:
    """The required settings are given and the run's sizes are positive."""
    for key in required:
        if s.get(key) is None or s.get(key) == "":
            raise SettingError(f"{command}: --{key.replace('_', '-')} is required")
    for key, flag in (("tensor_parallel_size", "--tp"), ("pipeline_parallel_size", "--pp")):
        if s[key] < 1:
            raise SettingError(f"{flag} {s[key]}: must be at least 1")
    if s["save_every"] < 0:
        raise SettingError(f"--save-every {s['save_every']}: must be 0 (at the end) or positive")
