"""train.time_budget_min: the loop stops taking steps when the budget is spent, and does not start a step
whose batch the learner's measured tokens/s says would end past it (trainer/train.py)."""

from __future__ import annotations

from trainer.config import TrainConfig
from trainer.train import _budget_stop, _LearnerRate, _out_of_time


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


def test_the_reason_for_a_budget_stop_says_which_rule_and_what_it_measured():
    budget = TrainConfig(time_budget_min=20)
    rate = _LearnerRate()
    assert _budget_stop(budget, 19 * 60, 8) == ""  # before the batch is in hand: only the clock
    assert _budget_stop(budget, 20 * 60, 8) == "before step 8: train.time_budget_min=20 is spent"
    assert _budget_stop(budget, 19 * 60, 1, 10**9, rate) == ""  # nothing measured: the first step is taken
    rate.add(6_500, 100.0)  # 65 tokens/s, the 1-thread fp32 learner of lh16
    assert _budget_stop(budget, 13 * 60, 8, 6_500, rate) == ""  # 100 s from minute 13 fits
    assert _budget_stop(budget, 13 * 60, 8, 34_775, rate) == (
        "before step 8: its batch (34775 tokens, ~535 s at the learner's 65 tokens/s so far) would end past "
        "train.time_budget_min=20")
    assert _budget_stop(TrainConfig(time_budget_min=0), 10**6, 8, 10**9, rate) == ""
