"""RL trainers: a registry by name, filled through the ``pai_zoo_rl_trainers`` hook.

This package registers ``ppo`` (:mod:`pai_zoo.rl.ppo`) and ``reward`` (:mod:`pai_zoo.rl.reward`) itself;
a plugin adds its own (DPO, GRPO ...) by returning ``{name: RLTrainer subclass}`` from the hook.
Importing this package imports neither torch nor megatron-core.
"""
from __future__ import annotations

from ..families.registry import Registry, get_registry
from ..plugin.errors import PluginError, UnknownModelError
from .base import RLTrainer
from .ppo import PPOTrainer
from .reward import RewardTrainer


def builtin_trainers() -> dict[str, type[RLTrainer]]:
    """The trainers pai-zoo itself registers: ``ppo`` and the reward-model trainer ``reward``."""
    return {"ppo": PPOTrainer, "reward": RewardTrainer}


def list_trainers(registry: Registry | None = None) -> dict[str, type[RLTrainer]]:
    """Every registered trainer, ``{name: class}``: the built-in ones and those plugins return from their
    ``pai_zoo_rl_trainers`` hook (through ``registry``'s plugin manager, default :func:`get_registry`)."""
    trainers: dict[str, type[RLTrainer]] = builtin_trainers()
    owner = dict.fromkeys(trainers, "pai_zoo.rl")
    for impl in (registry or get_registry()).pm.hook.pai_zoo_rl_trainers.get_hookimpls():
        for name, cls in (impl.function() or {}).items():
            if name in trainers:
                raise PluginError(f"RL trainer {name!r} is registered by both {owner[name]!r} and {impl.plugin_name!r}")
            trainers[name], owner[name] = cls, impl.plugin_name
    return trainers


def get_trainer(name: str) -> type[RLTrainer]:
    """The trainer class registered as ``name``."""
    trainers = list_trainers()
    if name not in trainers:
        raise UnknownModelError(f"unknown RL trainer {name!r}; registered: {', '.join(sorted(trainers)) or 'none'}")
    return trainers[name]


__all__ = ["RLTrainer", "builtin_trainers", "get_trainer", "list_trainers"]
