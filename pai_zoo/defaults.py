"""The core's own hook implementations, consulted after every plugin's (``trylast``)."""
from __future__ import annotations

from .hookspecs import hookimpl


@hookimpl(trylast=True)
def pai_zoo_weight_map(family, config):
    """The family's own table."""
    return family.weight_map_for(config)


@hookimpl(trylast=True)
def pai_zoo_tokenizer(family, path):
    """Whatever tokenizer file the checkpoint folder holds."""
    from .tokenizer import load_tokenizer

    return load_tokenizer(path)


@hookimpl
def pai_zoo_rl_trainers():
    """The core's RL trainers: ``ppo`` and the reward-model trainer ``reward``."""
    from .rl.ppo import PPOTrainer
    from .rl.reward import RewardTrainer

    return {"ppo": PPOTrainer, "reward": RewardTrainer}
