"""The fault-injection scenario, short: one training run in which a rollout worker, the engine actor and the
learner actor are SIGKILLed, 30% of tool requests fail (5xx, 429 with Retry-After, timeouts, dropped
connections), and the trainer is SIGKILLed while it writes a checkpoint and then resumed. Nothing is lost,
nothing is consumed twice, no failed episode is trained on (benchmarks/fault_tolerance.py --quick).

It is also the default suite's end-to-end check of the training loop on Ray (tests/test_train_e2e.py, a run
without faults, is `slow`): the loop trains, syncs, evaluates, logs, plots and checkpoints, under the
staleness rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_survives_every_fault_and_loses_nothing(tmp_path):
    out = tmp_path / "faults.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fault_tolerance.py"), "--quick",
                           "--out", str(out), "--timeout", "900", "--no-record",
                           "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=1000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["injector_error"] == "", r["injector_error"]
    # every fault was injected
    assert all(r["kills"].get(k) for k in ("rollout_worker", "engine", "learner", "trainer_mid_checkpoint"))
    assert r["kills"]["checkpoint_left_unfinished"]           # the trainer died inside a checkpoint write
    assert min(r["tool_faults"].values()) >= 1
    assert sum(r["tool_faults"].values()) + r["outage_requests"] >= 0.25 * r["tool_requests"]
    # outages: one search's every try failed back to back (1 + 3 retries), so tool errors reached episodes
    assert r["outages"] >= 1 and r["outage_requests"] >= 4
    # ... and recovered from
    assert r["ledger"]["engine_restored"] >= 1 and r["ledger"]["learner_lost"] == 1 and r["ledger"]["resume"] == 2
    assert r["resume_exit_code"] == 0 and r["steps"] == 6 and r["steps_complete"]
    # the audit
    assert r["lost"] == 0 and r["duplicated"] == 0 and r["trained_on_failures"] == 0 and r["unknown_consumed"] == 0
    assert r["controls"] == {"duplicate": True, "lost": True, "trained_failure": True}  # it would have seen them
    assert proc.stdout.strip().splitlines()[-1].startswith("RESULT fault_tolerance lost=0 duplicated=0 "
                                                           "trained_on_failures=0")

    # the loop's outputs, after all that
    run = Path(r["run_dir"])
    assert run.is_relative_to(tmp_path)  # the run's ~110 MB go where pytest cleans up, not into /tmp for good
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if "train/reward" in x] == [1, 2, 3, 4, 5, 6]
    last = [x for x in rows if "train/reward" in x][-1]
    for name in ("train/clip_frac", "train/behav_weight_mean", "train/logp_mismatch", "rollout/staleness_hist",
                 "rollout/queue_depth", "agent/turns", "agent/tool_calls", "tools/errors", "train/tokens_per_s",
                 "rollout/gen_tokens_per_s"):
        assert name in last, name
    assert last["train/optimizer_steps"] == 1 and last["train/policy_tokens"] > 0
    assert any("eval/reward" in x for x in rows if x["step"] == 2) and any("eval/reward" in x for x in rows
                                                                          if x["step"] == 0)
    assert (run / "reward_curve.png").stat().st_size > 0 and list((run / "tb").glob("events.*"))
    events = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    for e in events:  # the staleness rule held through every fault and both restarts
        if e["event"] == "consume":
            assert e["version"] - e["min_version"] <= 1
        if e["event"] == "admit":
            assert e["accepted"] + e["running"] <= e["bound"]
