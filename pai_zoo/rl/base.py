"""The base class of an RL trainer (re-exported as :class:`pai_zoo.rl.RLTrainer`)."""

from __future__ import annotations

import argparse
from typing import Any


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
