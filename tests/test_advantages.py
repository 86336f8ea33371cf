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
