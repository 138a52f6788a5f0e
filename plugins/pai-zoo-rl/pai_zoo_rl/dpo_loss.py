"""DPO's losses on sequence log-probabilities, as TRL's ``DPOTrainer`` computes them (``trl/trainer/dpo_trainer.py``,
``_compute_loss``, the reverse-KL scores), and the rewards it logs.

With ``delta = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))`` (sums over the completion tokens):

- ``sigmoid`` (DPO, Rafailov et al. 2023): ``-log sigmoid(beta * delta)``;
- ``hinge`` (SLiC): ``relu(1 - beta * delta)``;
- ``ipo`` (Azar et al. 2023): ``(delta' - 1 / (2 beta))^2`` with ``delta'`` from per-token averages (each log-ratio
  divided by its completion's length, as TRL does);
- ``robust`` (Chowdhury et al. 2024, with ``label_smoothing`` the flip rate ``eps``):
  ``(-(1 - eps) log sigmoid(beta delta) + eps log sigmoid(-beta delta)) / (1 - 2 eps)``;
- ``sigmoid_norm``: ``-log sigmoid(beta * delta')``, DPO on the length-normalised log-ratios.

The loss is the mean over pairs. The rewards are ``beta * (log pi - log ref)`` of each completion.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .variants import DPO_LOSS_TYPES as LOSS_TYPES


def dpo_losses(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float, loss_type: str,
               label_smoothing: float = 0.0, chosen_tokens=None, rejected_tokens=None):
    """Per-pair losses ``[n]`` and the chosen and rejected rewards ``[n]`` (detached). ``*_tokens``: the completions'
    lengths, for ``ipo`` and ``sigmoid_norm``."""
    chosen_ratios = chosen_logps - ref_chosen_logps
    rejected_ratios = rejected_logps - ref_rejected_logps
    delta = chosen_ratios - rejected_ratios
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * delta)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * delta)
    elif loss_type in ("ipo", "sigmoid_norm"):
        normalised = chosen_ratios / chosen_tokens.clamp(min=1.0) - rejected_ratios / rejected_tokens.clamp(min=1.0)
        losses = (normalised - 1 / (2 * beta)) ** 2 if loss_type == "ipo" else -F.logsigmoid(beta * normalised)
    elif loss_type == "robust":
        clean = -(1 - label_smoothing) * F.logsigmoid(beta * delta)
        flipped = -label_smoothing * F.logsigmoid(-beta * delta)
        losses = (clean - flipped) / (1 - 2 * label_smoothing)
    else:
        raise ValueError(f"unknown DPO loss type {loss_type!r}; one of {', '.join(LOSS_TYPES)}")
    return losses, beta * chosen_ratios.detach(), beta * rejected_ratios.detach()
