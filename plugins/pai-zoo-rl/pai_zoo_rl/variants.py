"""The loss variants the trainers offer, by TRL's names (a module without torch: ``pai-zoo list`` imports the
plugin)."""

DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "robust", "sigmoid_norm")
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
REWARD_SCALES = ("group", "batch", "none")
