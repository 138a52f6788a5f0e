"""The PPO mathematics of :mod:`pai_zoo.rl.ops` against values worked out by hand (in the comments)."""
from __future__ import annotations

import math

import pytest
import torch

from pai_zoo.plugin.errors import SettingError
from pai_zoo.rl import ops

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32),
                               torch.as_tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def test_gae_by_hand():
    # gamma 0.9, lambda 0.8 (gamma * lambda = 0.72); V is 0 after the last token.
    # t=2: delta = 2 + 0.9*0   - 0.5 = 1.5;   A2 = 1.5
    # t=1: delta = 0 + 0.9*0.5 - 1.0 = -0.55; A1 = -0.55 + 0.72*1.5  = 0.53
    # t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4;   A0 = 1.4   + 0.72*0.53 = 1.7816
    rewards, values = torch.tensor([[1.0, 0.0, 2.0]]), torch.tensor([[0.5, 1.0, 0.5]])
    adv, ret = ops.gae(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.8)
    close(adv, [[1.7816, 0.53, 1.5]])
    close(ret, [[2.2816, 1.53, 2.0]])  # A + V


def test_gae_ignores_padding():
    # A right-padded response of two tokens: the padding's reward 5 and value 9 must not leak in.
    # t=1: delta = 2 + 0.9*0 - 1 = 1;  A1 = 1
    # t=0: delta = 1 + 0.9*1 - 1 = 0.9; A0 = 0.9 + 0.72*1 = 1.62
    rewards, values = torch.tensor([[1.0, 2.0, 5.0]]), torch.tensor([[1.0, 1.0, 9.0]])
    adv, ret = ops.gae(rewards, values, torch.tensor([[1, 1, 0]]), gamma=0.9, lam=0.8)
    close(adv, [[1.62, 1.0, 0.0]])
    close(ret, [[2.62, 2.0, 0.0]])


def test_gae_with_gamma_one_lambda_one_is_reward_to_go_minus_value():
    # lambda = gamma = 1: A_t = sum_{k>=t} r_k - V_t ; rewards-to-go of [1, 2, 3] are [6, 5, 3]
    adv, ret = ops.gae(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[1.0, 1.0, 1.0]]), torch.ones(1, 3), 1.0, 1.0)
    close(adv, [[5.0, 4.0, 2.0]])
    close(ret, [[6.0, 5.0, 3.0]])


def test_clipped_policy_objective_by_hand():
    # ratios 1.5, 0.5, 1.1, 0.7 with advantages 1, 1, -2, -1 and epsilon 0.2:
    #   -A*r, -A*clip(r):  (-1.5, -1.2) -> -1.2 clipped ; (-0.5, -0.8) -> -0.5 ;
    #                       (2.2, 2.2)  -> 2.2          ; (0.7, 0.8)   -> 0.8 clipped
    # mean = (-1.2 - 0.5 + 2.2 + 0.8) / 4 = 0.325 ; clip fraction 2/4
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.7]])
    adv = torch.tensor([[1.0, 1.0, -2.0, -1.0]])
    loss, clip_frac = ops.policy_loss(ratios.log(), torch.zeros(1, 4), adv, torch.ones(1, 4), 0.2)
    close(loss, 0.325)
    close(clip_frac, 0.5)
    # the last token masked out: (-1.2 - 0.5 + 2.2) / 3 ; clip fraction 1/3
    loss, clip_frac = ops.policy_loss(ratios.log(), torch.zeros(1, 4), adv, torch.tensor([[1, 1, 1, 0]]), 0.2)
    close(loss, 0.5 / 3)
    close(clip_frac, 1 / 3)


def test_policy_gradient_vanishes_where_the_clip_binds():
    # ratio 1.5 > 1.2 with A = 1: the clipped branch wins and is constant -> zero gradient
    logp = torch.tensor([[math.log(1.5), math.log(1.0)]], requires_grad=True)
    loss, _ = ops.policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), 0.2)
    loss.backward()
    close(logp.grad, [[0.0, -0.5]])  # d/dlogp of -A*exp(logp)/2 at ratio 1 is -0.5


def test_clipped_value_loss_by_hand():
    # old values 0, clip 0.2:
    #   V=0.5, R=1:  (0.5-1)^2 = 0.25 ; V_clip = 0.2 -> (0.2-1)^2 = 0.64  -> 0.64 (clipped)
    #   V=-0.1, R=1: 1.21 ; V_clip = -0.1 -> 1.21                         -> 1.21
    #   V=0.3, R=-1: 1.69 ; V_clip = 0.2 -> 1.44                          -> 1.69
    # loss = 0.5 * (0.64 + 1.21 + 1.69) / 3 = 0.59 ; clip fraction 1/3
    values, returns = torch.tensor([[0.5, -0.1, 0.3]]), torch.tensor([[1.0, 1.0, -1.0]])
    loss, frac = ops.value_loss(values, torch.zeros(1, 3), returns, torch.ones(1, 3), 0.2)
    close(loss, 0.59)
    close(frac, 1 / 3)
    loss, frac = ops.value_loss(values, torch.zeros(1, 3), returns, torch.ones(1, 3), None)
    close(loss, 0.5 * (0.25 + 1.21 + 1.69) / 3)  # unclipped
    close(frac, 0.0)


def test_kl_estimators_by_hand():
    # policy p = 0.5, reference q = 0.25: log p/q = ln 2
    # k1 = ln 2 = 0.693147 ; k2 = (ln 2)^2 / 2 = 0.240227 ; k3 = q/p - 1 - ln(q/p) = 0.5 - 1 + ln 2 = 0.193147
    p, q = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    close(ops.kl_penalty(p, q, "k1"), [0.693147])
    close(ops.kl_penalty(p, q, "k2"), [0.240227])
    close(ops.kl_penalty(p, q, "k3"), [0.193147])
    # p = 0.25, q = 0.5: k1 = -ln 2 (k1 can be negative), k2 = 0.240227, k3 = 2 - 1 - ln 2 = 0.306853
    close(ops.kl_penalty(q, p, "k1"), [-0.693147])
    close(ops.kl_penalty(q, p, "k2"), [0.240227])
    close(ops.kl_penalty(q, p, "k3"), [0.306853])
    with pytest.raises(SettingError, match="unknown KL estimator 'k4' \\(--kl-estimator\\); use one of k1, k2, k3"):
        ops.kl_penalty(p, q, "k4")


def test_kl_estimators_are_unbiased_or_not_as_expected():
    # Sampling from p = [0.7, 0.3] with q = [0.4, 0.6]: KL(p||q) = 0.7 ln(7/4) + 0.3 ln(3/6) = 0.183787
    # k1 and k3 are unbiased; exact expectations over the two outcomes:
    p, q = torch.tensor([0.7, 0.3]), torch.tensor([0.4, 0.6])
    for estimator in ("k1", "k3"):
        expectation = (p * ops.kl_penalty(p.log(), q.log(), estimator)).sum()
        close(expectation, 0.183787)


def test_masked_whitening_by_hand():
    # real values 2, 4, 6 (the 100 is padding): mean 4, unbiased variance (4 + 0 + 4) / 2 = 4, std 2
    x, mask = torch.tensor([[2.0, 4.0, 6.0, 100.0]]), torch.tensor([[1, 1, 1, 0]])
    close(ops.masked_whiten(x, mask), [[-1.0, 0.0, 1.0, 0.0]])
    close(ops.masked_whiten(x, mask, shift_mean=False), [[3.0, 4.0, 5.0, 0.0]])
    close(ops.masked_mean(x, mask), 4.0)
    close(ops.masked_var(x, mask), 4.0)
    close(ops.masked_var(x, mask, unbiased=False), 8.0 / 3)


def test_kl_penalised_rewards_by_hand():
    # coefficient 0.1, k1 = logp - ref; the score goes to each row's last real token
    # row 0: kl [0, 0.5, 0.2]  -> [0, -0.05, -0.02 + 1.0]
    # row 1: kl [-0.2, 0.1, -] -> [0.02, -0.01 + 2.0, 0]
    logp = torch.tensor([[0.0, 0.5, 0.2], [0.1, 0.1, 7.0]])
    ref = torch.tensor([[0.0, 0.0, 0.0], [0.3, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards = ops.kl_penalised_rewards(torch.tensor([1.0, 2.0]), logp, ref, mask, 0.1)
    close(rewards, [[0.0, -0.05, 0.98], [0.02, 1.99, 0.0]])


def test_adaptive_kl_controller_by_hand():
    # Ziegler et al.: e = clip(KL/target - 1, -0.2, 0.2); coef *= 1 + e * n / horizon  (n = 256, horizon 10000)
    ctl = ops.AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(9.0, 256)    # e = +0.5 -> clipped to 0.2: 0.1 * 1.00512
    close(ctl.value, 0.100512, atol=1e-9)
    ctl = ops.AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(3.0, 256)    # e = -0.5 -> -0.2: 0.1 * 0.99488
    close(ctl.value, 0.099488, atol=1e-9)
    ctl = ops.AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(6.6, 256)    # e = 0.1: 0.1 * 1.00256
    close(ctl.value, 0.100256, atol=1e-9)
    fixed = ops.kl_controller(0.1)
    fixed.update(100.0, 256)
    assert fixed.value == 0.1 and isinstance(ops.kl_controller(0.1, 6.0), ops.AdaptiveKLController)
    with pytest.raises(SettingError, match="not --kl-target 0.0 and --kl-horizon 10000; give both above 0"):
        ops.kl_controller(0.1, 0.0, 10000)
    with pytest.raises(SettingError, match="--kl-horizon 0;"):
        ops.AdaptiveKLController(0.1, target=6.0, horizon=0)


def test_pairwise_loss_entropy_and_logprobs_by_hand():
    # -log sigmoid(2) = ln(1 + e^-2) = 0.126928 ; -log sigmoid(-1) = ln(1 + e) = 1.313262 ; mean 0.720095
    close(ops.pairwise_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0])), 0.720095)
    # entropy of [0.5, 0.5] = ln 2 ; of [0.25, 0.75] = 0.25 ln 4 + 0.75 ln(4/3) = 0.562335
    close(ops.entropy_of(torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]])), [0.693147, 0.562335])
    # log p(token 1) under logits [0, ln 3] = ln 0.75
    close(ops.logprobs_of(torch.tensor([[[0.0, math.log(3.0)]]]), torch.tensor([[1]])), [[math.log(0.75)]])
