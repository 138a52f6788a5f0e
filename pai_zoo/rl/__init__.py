"""RL trainers: a registry by name, filled through the ``pai_zoo_rl_trainers`` hook.

The core registers ``ppo`` (:mod:`pai_zoo.rl.ppo`) and ``reward`` (:mod:`pai_zoo.rl.reward`);
a plugin adds its own (DPO, GRPO ...) by returning ``{name: RLTrainer subclass}`` from the hook.
Importing this package imports neither torch nor megatron-core.
"""
from __future__ import annotations

import argparse
from typing import Any

from ..errors import UnknownModelError


class RLTrainer:
    """Base class of an RL trainer (PPO, DPO, GRPO ...).

    A subclass sets ``name`` and ``description`` and implements :meth:`run`; it is
    registered by returning ``{name: cls}`` from a plugin's ``pai_zoo_rl_trainers`` hook.
    ``pai-zoo rl NAME ARGS...`` parses ``ARGS`` with the parser :meth:`add_arguments` fills
    and builds the trainer with the parsed values as settings.
    """

    name: str = ""
    description: str = ""

    def __init__(self, **settings: Any):
        self.settings = settings

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add the trainer's command-line flags (``dest`` names become settings)."""

    def run(self) -> dict:
        """Train; returns a summary (metrics of the last step, checkpoint paths)."""
        raise NotImplementedError(f"{type(self).__name__}.run")


def list_trainers() -> dict[str, type[RLTrainer]]:
    """Every registered trainer, ``{name: class}``."""
    from ..registry import get_registry

    return get_registry().rl_trainers()


def get_trainer(name: str) -> type[RLTrainer]:
    """The trainer class registered as ``name``."""
    trainers = list_trainers()
    if name not in trainers:
        raise UnknownModelError(f"unknown RL trainer {name!r}; registered: {', '.join(sorted(trainers)) or 'none'}")
    return trainers[name]


__all__ = ["RLTrainer", "get_trainer", "list_trainers"]
