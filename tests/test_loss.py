"""Decoupled PPO loss: hand-computed values, the PPO special case, the behaviour-weight cap."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.loss import decoupled_ppo_loss, loglinear_prox_logp


def _t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_hand_computed_values():
    # token 1: r = e^0.1 = 1.105 (inside [0.8, 1.28]), w = e^0.2 = 1.221, A = +1 -> l = -w * r
    # token 2: r = e^0.5 = 1.649 > 1.28 clipped for A = +2  -> l = -w * 1.28 * 2, w = e^-0.1
    # token 3: r = e^-0.5 = 0.607 < 0.8, A = -1: min(-0.607, -0.8) = -0.8 -> l = +w * 0.8, w = 1
    # token 4: w = e^2 = 7.39 > cap 5 -> masked (still counted in N)
    logp = _t(0.1, 0.5, -0.5, 0.0).requires_grad_()
    prox = _t(0.0, 0.0, 0.0, 0.0)
    behav = _t(-0.2, 0.1, 0.0, -2.0)
    adv = _t(1.0, 2.0, -1.0, 3.0)
    loss, st = decoupled_ppo_loss(logp, prox, behav, adv, eps_clip=0.2, eps_clip_high=0.28, behav_weight_cap=5.0)
    expect = (-math.exp(0.2) * math.exp(0.1) * 1.0
              - math.exp(-0.1) * 1.28 * 2.0
              + 1.0 * 0.8 * 1.0
              + 0.0) / 4
    assert loss.item() == pytest.approx(expect, rel=1e-9)
    assert st.tokens == 4 and st.behav_masked == 1 and st.clipped == 2
    loss.backward()
    # gradient flows only through the unclipped, unmasked token 1: d/dlogp (-w e^logp A / 4)
    assert logp.grad[0].item() == pytest.approx(-math.exp(0.2) * math.exp(0.1) / 4)
    assert logp.grad[1:].abs().max().item() == 0.0


def test_equals_plain_ppo_when_prox_equals_behav():
    torch.manual_seed(0)
    old = torch.randn(50, dtype=torch.float64)
    logp = (old + 0.3 * torch.randn(50, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(50, dtype=torch.float64)
    loss, st = decoupled_ppo_loss(logp, old, old, adv, eps_clip=0.2, eps_clip_high=0.2, behav_weight_cap=5.0)
    ratio = torch.exp(logp - old)
    ppo = -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).mean()
    assert float(loss) == pytest.approx(float(ppo), rel=1e-12)
    g1 = torch.autograd.grad(loss, logp, retain_graph=True)[0]
    g2 = torch.autograd.grad(ppo, logp)[0]
    assert torch.allclose(g1, g2)
    assert st.behav_masked == 0 and st.behav_weight_sum == pytest.approx(50.0)


def test_normalizer_is_global_token_count():
    logp, adv = _t(0.0, 0.0).requires_grad_(), _t(1.0, 1.0)
    local, _ = decoupled_ppo_loss(logp, _t(0, 0), _t(0, 0), adv)
    global_, _ = decoupled_ppo_loss(logp, _t(0, 0), _t(0, 0), adv, normalizer=8)
    assert float(local) == pytest.approx(-1.0) and float(global_) == pytest.approx(-0.25)


def test_cap_zero_disables_masking_and_clip_high_defaults_to_eps():
    logp = _t(0.0).requires_grad_()
    loss, st = decoupled_ppo_loss(logp, _t(0.0), _t(-3.0), _t(1.0), behav_weight_cap=0)
    assert st.behav_masked == 0 and float(loss) == pytest.approx(-math.exp(3.0))
    loss, st = decoupled_ppo_loss(_t(0.5), _t(0.0), _t(0.0), _t(1.0), eps_clip=0.1)
    assert float(loss) == pytest.approx(-1.1) and st.clipped == 1


def test_loglinear_prox_interpolates_by_version():
    behav, theta = _t(-1.0, -1.0, -1.0), _t(-3.0, -3.0, -3.0)
    versions = torch.tensor([5, 4, 1])
    prox = loglinear_prox_logp(behav, theta, versions, current_version=5)
    # alpha = (5 - vb) / (6 - vb): 0, 1/2, 4/5
    assert prox.tolist() == pytest.approx([-1.0, -2.0, -1.0 + 0.8 * -2.0])


def test_logp_mismatch_stats_all_tokens_and_fresh_only():
    # |prox - behav| = 0.1, 0.3, 0.5, 2.0; tokens 1 and 3 were sampled at the current version (fresh)
    prox, behav = _t(-1.0, -2.0, -0.5, 0.0), _t(-1.1, -1.7, -1.0, -2.0)
    fresh = torch.tensor([True, False, True, False])
    loss, st = decoupled_ppo_loss(prox.clone().requires_grad_(), prox, behav, _t(1, 1, 1, 1), fresh=fresh)
    plain, _ = decoupled_ppo_loss(prox.clone().requires_grad_(), prox, behav, _t(1, 1, 1, 1))
    assert loss.item() == plain.item()                     # the stats never touch the loss
    assert st.logp_mismatch_sum == pytest.approx(0.1 + 0.3 + 0.5 + 2.0)
    assert st.fresh_tokens == 2 and st.fresh_logp_mismatch_sum == pytest.approx(0.1 + 0.5)
    total = st.add(st)
    assert total.tokens == 8 and total.fresh_tokens == 4
    assert total.logp_mismatch_sum == pytest.approx(5.8) and total.fresh_logp_mismatch_sum == pytest.approx(1.2)
    assert total.behav_weight_max == st.behav_weight_max and total.behav_weight_min == st.behav_weight_min
    _, none = decoupled_ppo_loss(prox, prox, behav, _t(1, 1, 1, 1))
    assert none.fresh_tokens == 0 and none.fresh_logp_mismatch_sum == 0


def test_seq_mean_token_mean_is_the_mean_of_each_episodes_token_mean():
    """c_t = 1 / T_e and N = the number of episodes: two episodes of 2 and 6 tokens weigh the same; with
    c_t = 1 it is the token-mean (the 6-token episode weighs three times as much)."""
    torch.manual_seed(1)
    old = torch.randn(8, dtype=torch.float64)
    logp = (old + 0.1 * torch.randn(8, dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([1.0] * 2 + [-1.0] * 6, dtype=torch.float64)
    c = torch.tensor([1 / 2] * 2 + [1 / 6] * 6, dtype=torch.float64)
    seq, _ = decoupled_ppo_loss(logp, old, old, adv, token_weight=c, normalizer=2.0)
    first, _ = decoupled_ppo_loss(logp[:2], old[:2], old[:2], adv[:2])
    second, _ = decoupled_ppo_loss(logp[2:], old[2:], old[2:], adv[2:])
    assert float(seq) == pytest.approx((float(first) + float(second)) / 2, rel=1e-12)
    plain, _ = decoupled_ppo_loss(logp, old, old, adv)
    ones, _ = decoupled_ppo_loss(logp, old, old, adv, token_weight=torch.ones(8, dtype=torch.float64))
    assert float(ones) == float(plain) == pytest.approx((2 * float(first) + 6 * float(second)) / 8, rel=1e-12)
    assert float(seq) != pytest.approx(float(plain))


def test_a_call_without_policy_tokens_gives_zero_loss_and_zero_gradient():
    """A micro-batch can hold no policy token (e.g. a segment that is all prompt): its loss is 0, not nan,
    so the step's summed gradient is not poisoned."""
    logp = _t().requires_grad_()
    loss, st = decoupled_ppo_loss(logp, _t(), _t(), _t())
    assert loss.item() == 0.0 and st.tokens == 0
    loss.backward()
    assert logp.grad is not None and logp.grad.numel() == 0
