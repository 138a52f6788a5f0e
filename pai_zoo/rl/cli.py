"""``pai-zoo rl``: list the registered RL trainers and run one by name.

    pai-zoo rl list                      every trainer (core and plugins) with its description
    pai-zoo rl NAME [FLAGS]              run trainer NAME (``pai-zoo rl NAME --help`` for its flags)
    pai-zoo rl run NAME [FLAGS]          the same

The trainer's flags come from its :meth:`~pai_zoo.rl.RLTrainer.add_arguments`; the parsed values
are its settings. The summary ``run()`` returns is printed as JSON.
"""
from __future__ import annotations

import argparse
import json

from . import get_trainer, list_trainers

USAGE = "usage: pai-zoo rl {list | NAME [FLAGS] | run NAME [FLAGS]}"


def cmd_list() -> int:
    trainers = list_trainers()
    if not trainers:
        print("no RL trainers registered")
        return 0
    width = max(len(n) for n in trainers)
    for name in sorted(trainers):
        cls = trainers[name]
        print(f"{name:<{width}}  {cls.__module__}.{cls.__qualname__}  {cls.description}".rstrip())
    return 0


def run_trainer(name: str, argv: list[str]) -> int:
    cls = get_trainer(name)
    parser = argparse.ArgumentParser(prog=f"pai-zoo rl {name}", description=cls.description or None)
    cls.add_arguments(parser)
    settings = vars(parser.parse_args(argv))
    summary = cls(**settings).run()
    print(json.dumps(summary, indent=2, default=str))
    return 0


def main(argv: list[str]) -> int:
    """Dispatch ``pai-zoo rl ARGS``."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        print("\ntrainers:")
        cmd_list()
        return 0 if argv else 2
    if argv[0] == "list":
        return cmd_list()
    if argv[0] == "run":
        if len(argv) < 2:
            print(USAGE)
            return 2
        return run_trainer(argv[1], argv[2:])
    return run_trainer(argv[0], argv[1:])
