"""train.time_budget_min: the loop stops taking steps when the budget is spent, and does not start a step
whose batch the learner's measured tokens/s says would end past it (trainer/train.py)."""

from __future__ import annotations

from trainer.config import TrainConfig
from trainer.train import _LearnerRate, _out_of_time


def test_a_step_predicted_to_end_past_the_budget_is_not_started():
    budget = TrainConfig(time_budget_min=20)
    rate = _LearnerRate()
    assert rate.seconds(10**6) == 0.0  # nothing measured yet: the first step is never refused on a guess
    assert not _out_of_time(budget, 19 * 60 + rate.seconds(10**6))
    rate.add(20_000, 40.0)  # a step of hop groups: 500 tokens/s
    rate.add(10_000, 20.0)
    assert rate.tokens_per_s == 500.0
    long_step = rate.seconds(235_500)  # an N = 32 lineage batch: 471 s at that rate
    assert long_step == 471.0
    assert _out_of_time(budget, 13 * 60 + long_step)  # started at minute 13 it would end at 20.85: refused
    assert not _out_of_time(budget, 12 * 60 + long_step)  # ends at minute 19.85: taken
    assert not _out_of_time(budget, 19 * 60 + rate.seconds(20_000))  # a short step still fits at minute 19
    assert _out_of_time(budget, 20 * 60)  # spent


def test_no_budget_never_stops_the_loop():
    rate = _LearnerRate()
    rate.add(100, 100.0)
    assert not _out_of_time(TrainConfig(time_budget_min=0), 10**6 + rate.seconds(10**9))
