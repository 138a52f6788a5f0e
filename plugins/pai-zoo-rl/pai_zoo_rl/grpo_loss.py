"""GRPO's mathematics as TRL's ``GRPOTrainer`` computes it (``trl/trainer/grpo_trainer.py``: the advantages of
``_generate_and_score_completions``, the loss of ``_compute_loss`` with token-level importance sampling).

Advantages (Shao et al. 2024): each completion's reward (the weighted sum over the reward functions) minus its
group's mean (the ``G`` completions of one prompt), divided by ``std + 1e-4`` -- the group's (``scale="group"``),
the whole batch's (``"batch"``) or not at all (``"none"``, Dr. GRPO).

Loss, per completion token: ``-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)`` with ``r = pi / pi_old``
(DAPO's ``eps_high``), plus ``beta * KL`` against the reference with the k3 estimator
``exp(ref - logp) - (ref - logp) - 1``, multiplied by ``r`` (TRL's default ``use_bias_correction_kl``: the unbiased
reverse-KL gradient of DeepSeek-V3.2; ``bias_correction_kl=False`` leaves it out). Aggregated as TRL names it:

- ``grpo``: each completion's token mean, then the mean over completions (sequence level);
- ``bnpo``: the mean over the batch's tokens;
- ``dr_grpo``: the sum over tokens divided by ``completions x max_completion_length``;
- ``dapo``: the sum over tokens divided by the tokens of the whole generation batch (all ranks), token level.
"""
from __future__ import annotations

import torch

from .variants import GRPO_LOSS_TYPES as LOSS_TYPES


def group_advantages(rewards: torch.Tensor, group: int, scale: str = "group") -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages [n], std [n])`` of ``rewards [n]`` laid out as consecutive groups of ``group``."""
    grouped = rewards.view(-1, group)
    mean = grouped.mean(dim=1).repeat_interleave(group)
    if scale == "batch":
        std = rewards.std().expand_as(rewards)
    else:
        std = grouped.std(dim=1).repeat_interleave(group)
    advantages = rewards - mean
    if scale != "none":
        advantages = advantages / (std + 1e-4)
    return advantages, std


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, *, beta: float, epsilon_low: float,
              epsilon_high: float, loss_type: str, max_completion_length: int, batch_tokens: float,
              bias_correction_kl: bool = True):
    """The loss of a batch (``[b, T]`` per-token log-probabilities, ``mask`` 1 on completion tokens) and the
    per-token KL and clip indicators for the logs: ``(loss, kl [b, T] or None, (low, high) clipped [b, T])``.
    ``old_logps`` None: the policy that sampled is this one (``logps.detach()``); ``batch_tokens``: the completion
    tokens of the whole generation batch divided by the data-parallel ranks (``dapo``)."""
    mask = mask.to(logps.dtype)
    old_logps = logps.detach() if old_logps is None else old_logps
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    kl = None
    if beta != 0.0:
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        if bias_correction_kl:
            kl = kl * ratio
        per_token = per_token + beta * kl
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    elif loss_type == "dapo":
        loss = (per_token * mask).sum() / max(batch_tokens, 1.0)
    else:
        raise ValueError(f"unknown GRPO loss type {loss_type!r}; one of {', '.join(LOSS_TYPES)}")
    low = ((ratio < 1 - epsilon_low) & (advantages < 0)).to(logps.dtype)
    high = ((ratio > 1 + epsilon_high) & (advantages > 0)).to(logps.dtype)
    return loss, kl, (low, high)
