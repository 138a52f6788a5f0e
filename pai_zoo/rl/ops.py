"""The mathematics of PPO on token sequences, as plain tensor functions.

Shapes: ``[batch, T]`` over the response tokens; ``mask`` is 1 on real response tokens and 0 on
padding (responses are right-padded, so a row's real tokens come first).
"""
from __future__ import annotations

import torch

from ..plugin.errors import SettingError

KL_ESTIMATORS = ("k1", "k2", "k3")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1 (all of them, or along ``dim``)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over the masked positions (Bessel-corrected unless ``unbiased=False``)."""
    mean = masked_mean(x, mask)
    n = mask.to(x.dtype).sum()
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased and n > 1:
        var = var * n / (n - 1)
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and (unbiased) variance taken over the masked
    positions only; padding stays 0. ``shift_mean=False`` adds the mean back (scale only)."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """Generalised advantage estimation over each response; returns ``(advantages, returns)``.

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` (``V`` is 0 past a response's last token) and
    ``A_t = delta_t + gamma * lam * A_{t+1}``; ``returns = A + V``. Padding is 0 in both.
    """
    mask = mask.to(values.dtype)
    values, rewards = values * mask, rewards * mask
    T = rewards.shape[-1]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(T)):
        next_value = values[..., t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        last = delta + gamma * lam * last
        advantages[..., t] = last
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy (Schulman's
    estimators): ``k1 = log p - log q``, ``k2 = (log p - log q)^2 / 2``,
    ``k3 = q/p - 1 - log(q/p)``, with ``p`` the policy and ``q`` the reference."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio ** 2
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise SettingError(f"unknown KL estimator {estimator!r} (--kl-estimator); use one of {', '.join(KL_ESTIMATORS)}")


def kl_penalised_rewards(scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
                         mask: torch.Tensor, kl_coef: float, estimator: str = "k1") -> torch.Tensor:
    """Per-token rewards ``-kl_coef * KL_t`` plus each sequence's score at its last response token."""
    mask = mask.to(logprobs.dtype)
    rewards = -kl_coef * kl_penalty(logprobs, ref_logprobs, estimator) * mask
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    rows = torch.arange(rewards.shape[0])
    rewards[rows, last] += scores.to(rewards.dtype) * (mask.sum(-1) > 0).to(rewards.dtype)
    return rewards


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_range: float):
    """PPO's clipped surrogate: ``mean(max(-A * ratio, -A * clip(ratio, 1-eps, 1+eps)))`` over the
    masked tokens; returns ``(loss, clip fraction)`` (the share of tokens where clipping binds)."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = masked_mean(torch.maximum(unclipped, clipped), mask)
    clip_fraction = masked_mean((clipped > unclipped).to(logprobs.dtype), mask)
    return loss, clip_fraction


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip_range: float | None):
    """The critic's loss ``0.5 * mean(max((V - R)^2, (V_clip - R)^2))`` with
    ``V_clip = V_old + clip(V - V_old, -c, c)`` (no clipping when ``clip_range`` is None);
    returns ``(loss, clip fraction)``."""
    unclipped = (values - returns) ** 2
    if clip_range is None:
        return 0.5 * masked_mean(unclipped, mask), torch.zeros((), dtype=values.dtype)
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)
    return loss, masked_mean((clipped > unclipped).to(values.dtype), mask)


def logprobs_of(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[..., token]`` per position (``logits`` ``[b, T, V]``, ``tokens`` ``[b, T]``)."""
    logits = logits.float()
    return torch.gather(logits, -1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` per position."""
    logits = logits.float()
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, value: float):
        self.value = float(value)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """Ziegler et al. (2019)'s proportional controller: after a batch of ``n_steps`` samples with
    mean KL ``current_kl``, ``e = clip(current_kl / target - 1, -0.2, 0.2)`` and the coefficient
    is multiplied by ``1 + e * n_steps / horizon``."""

    def __init__(self, value: float, target: float, horizon: int):
        super().__init__(value)
        if target <= 0 or horizon <= 0:
            raise SettingError(f"adaptive KL needs a positive target and horizon, not --kl-target {target} and "
                               f"--kl-horizon {horizon}; give both above 0, or leave out --kl-target for a fixed "
                               "--kl-coef")
        self.target, self.horizon = float(target), int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def kl_controller(kl_coef: float, target: float | None = None, horizon: int = 10000) -> FixedKLController:
    """Adaptive when a ``target`` KL is given, else fixed."""
    return FixedKLController(kl_coef) if target is None else AdaptiveKLController(kl_coef, target, horizon)


def pairwise_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """The reward model's ranking loss ``mean(-log sigmoid(r_chosen - r_rejected))``."""
    return -torch.nn.functional.logsigmoid(chosen - rejected).mean()


__all__ = [
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "entropy_of",
    "gae",
    "kl_controller",
    "kl_penalised_rewards",
    "kl_penalty",
    "logprobs_of",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "pairwise_loss",
    "policy_loss",
    "value_loss",
]
