"""pai-zoo plugin: the DPO and GRPO trainers (``pai-zoo rl dpo``, ``pai-zoo rl grpo``) and the built-in reward
functions (``exact_match``, ``format``), registered through pai-zoo's ``pai_zoo_rl_trainers`` and
``pai_zoo_reward_funcs`` hooks exactly as a third party's plugin registers its own. Importing it imports neither
torch nor megatron-core."""
from __future__ import annotations

from pai_zoo import hookimpl

from .dpo import DPOTrainer
from .grpo import GRPOTrainer
from .rewards import BUILTIN


@hookimpl
def pai_zoo_rl_trainers():
    return {"dpo": DPOTrainer, "grpo": GRPOTrainer}


@hookimpl
def pai_zoo_reward_funcs():
    return dict(BUILTIN)


__all__ = ["DPOTrainer", "GRPOTrainer"]
