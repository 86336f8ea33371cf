"""benchmarks/vs_trl.py counts the same quantity in both arms and reports step times: the hexsearch arm runs
without a group filter (each step trains on the B x G episodes it generated, as TRL's does), each arm's
steady-state step time and generation/training split come from its per-step records, and every round
records its commit and date. (The benchmark itself takes many minutes; these are its parts.)"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import vs_trl  # noqa: E402


def test_the_hexsearch_arm_trains_on_every_generated_group():
    args = argparse.Namespace(minutes=6.0, batch=8, group=4)
    overrides = vs_trl.ours_overrides(args)
    assert "train.filter_groups=none" in overrides
    assert {"train.batch_size=8", "train.group_size=4", "train.time_budget_min=6.0"} <= set(overrides)


def test_steady_state_step_time_and_split_of_each_arm():
    steps = [{"time/step_s": 30.0, "time/wait_s": 20.0, "time/train_s": 9.0, "time/sync_s": 1.0},
             {"time/step_s": 10.0, "time/wait_s": 2.0, "time/train_s": 7.0, "time/sync_s": 1.0},
             {"time/step_s": 12.0, "time/wait_s": 4.0, "time/train_s": 7.5, "time/sync_s": 0.5}]
    ours = vs_trl.ours_timing(steps)
    assert ours["step_s"]["median"] == 11.0 and ours["step_s"]["n"] == 2  # the warm-up step is left out
    assert ours["wait_s"]["median"] == 3.0 and ours["train_s"]["median"] == 7.25
    log = [{"step": 1, "t": 40.0, "generation_s": 30.0}, {"step": 2, "t": 60.0, "generation_s": 44.0},
           {"step": 3, "t": 82.0, "generation_s": 60.0}]
    trl = vs_trl.trl_timing(log)
    assert trl["step_s"]["median"] == pytest.approx(21.0) and trl["step_s"]["n"] == 2
    assert trl["generation_s"]["median"] == pytest.approx(15.0) and trl["train_s"]["median"] == pytest.approx(6.0)
    no_split = vs_trl.trl_timing([{"step": 1, "t": 40.0, "generation_s": None}, {"step": 2, "t": 60.0,
                                                                                  "generation_s": None}])
    assert no_split["step_s"]["median"] == 20.0 and no_split["generation_s"] is None


def test_each_round_records_its_commit_and_date():
    got = {"hexsearch": {"samples_per_s": 1.2}, "trl": {"samples_per_s": 0.3}}
    rec = vs_trl.round_record(["trl", "hexsearch"], got)
    assert rec["ratio"] == pytest.approx(4.0) and rec["order"] == ["trl", "hexsearch"]
    assert rec["commit"] not in ("", "?") and rec["date"].endswith("UTC") and rec["date"][:2] == "20"
