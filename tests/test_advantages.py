"""Group-relative advantages (GRPO, RLOO, Dr.GRPO) and the zero-variance filter."""

from __future__ import annotations

import math

import pytest

from trainer.advantages import group_advantages, has_signal


def test_grpo_normalises_by_group_std():
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], "grpo", eps=0.0)
    std = math.sqrt((0.75**2 + 3 * 0.25**2) / 4)
    assert adv == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std])
    assert sum(adv) == pytest.approx(0.0, abs=1e-12)


def test_rloo_is_leave_one_out_baseline():
    r = [1.0, 0.5, 0.0]
    adv = group_advantages(r, "rloo")
    assert adv == pytest.approx([1.0 - 0.25, 0.5 - 0.5, 0.0 - 0.75])


def test_drgrpo_only_centres():
    assert group_advantages([0.2, 0.6], "drgrpo") == pytest.approx([-0.2, 0.2])


def test_zero_variance_groups_have_no_signal():
    assert not has_signal([0.5, 0.5, 0.5])
    assert not has_signal([1.0])
    assert has_signal([0.0, 0.0, 1.0])
    for est in ("grpo", "rloo", "drgrpo"):
        assert group_advantages([0.3, 0.3], est) == pytest.approx([0.0, 0.0])


def test_unknown_estimator_lists_valid_ones():
    with pytest.raises(ValueError, match="grpo, rloo, drgrpo"):
        group_advantages([1.0, 0.0], "ppo")


def test_samples_carry_their_episodes_loss_weight():
    """build_samples: each segment becomes a sample with its trajectory's advantage; under seq-mean-token-mean
    every sample of a trajectory weighs 1 / the trajectory's policy tokens (all its segments), so each episode's
    weights sum to 1; under token-mean every weight is 1."""
    from agent.trajectory import Segment, Trajectory
    from trainer.batch import build_samples
    from trainer.buffer import Group

    def segment(generated: int) -> Segment:
        seg = Segment()
        seg.append_prompt([1, 2, 3])
        seg.append_generated(list(range(10, 10 + generated)), [-0.5] * generated, [0] * generated)
        return seg

    trajs = [Trajectory(question_id="q", question="Who?", gold=["x"], segments=[segment(2)], reward=1.0),
             Trajectory(question_id="q", question="Who?", gold=["x"], segments=[segment(6), segment(4)], reward=0.0)]
    group = Group(key="g", question_id="q", trajectories=trajs, admitted_version=0)
    plain, kept = build_samples([group], "grpo", "drop")
    assert kept == 1 and [s.loss_weight for s in plain] == [1.0, 1.0, 1.0]
    samples, _ = build_samples([group], "grpo", "drop", "seq-mean-token-mean")
    assert [s.num_loss_tokens for s in samples] == [2, 6, 4]
    assert [s.loss_weight for s in samples] == [pytest.approx(1 / 2), pytest.approx(1 / 10), pytest.approx(1 / 10)]
    assert samples[0].advantage > 0 > samples[1].advantage == samples[2].advantage
    with pytest.raises(ValueError, match="token-mean or seq-mean-token-mean"):
        build_samples([group], "grpo", "drop", "sum")
