"""A training process killed mid-run (SIGKILL, no goodbye) and resumed with `--resume RUN_DIR`.

Checks: no question is repeated or skipped (consumed + buffered + to-re-run = exactly the keys handed
out), metrics have each step once, the staleness counters come back with the version (AReaL #1388)
and the rule holds for every admission after the restart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_train_e2e import TINY, ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from fault_tolerance import kill_tree  # noqa: E402

from trainer import checkpoint

pytestmark = pytest.mark.slow


def test_killed_run_resumes_without_repeats_or_skips(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY.replace("WORLD", str(tmp_path / "world")))
    run = tmp_path / "runs" / "r"
    cmd = [sys.executable, "-m", "hexsearch.cli", "--quiet", "train"]
    args = [f"run.root={tmp_path / 'runs'}", "run.name=r", "train.steps=6", "train.save_every=2",
            "train.eval_every=0", "tools.latency_median_s=0.2"]
    env = dict(os.environ)
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen([*cmd, str(cfg), *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and first.poll() is None:
            rows = [json.loads(x) for x in run.joinpath("metrics.jsonl").read_text().splitlines()] \
                if run.joinpath("metrics.jsonl").exists() else []
            if (run / "checkpoints" / "step-2" / "state.json").exists() and any(r["step"] >= 3 for r in rows):
                break
            time.sleep(0.5)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        kill_tree(first.pid)
    ckpt_state, ckpt_buffer = checkpoint.load(run / "checkpoints" / "step-2")
    assert ckpt_state["loop"]["step"] == 2

    second = subprocess.run([*cmd, "--resume", str(run)], capture_output=True, text=True, env=env, timeout=900)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert "RESULT train" in second.stdout

    # each step logged once, in order
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/reward" in r] == [1, 2, 3, 4, 5, 6]

    # the restart restored the counters with the version (AReaL #1388) and kept the rule
    events = ledger(run)
    resume = next(e for e in events if e["event"] == "resume")
    assert resume["v"] == 2 and resume["accepted"] == ckpt_state["staleness"]["accepted"]
    assert resume["running"] == 0 and resume["buffered"] == len(ckpt_buffer)
    after = events[events.index(resume):]
    for e in after:
        if e["event"] == "admit":
            assert e["accepted"] + e["running"] <= e["bound"]
        if e["event"] == "consume":
            assert e["version"] - e["min_version"] <= 1

    # no question repeated or skipped: every key handed out is consumed, buffered or queued to re-run
    assert not [e for e in events if e["event"] == "failed"]
    final_state, final_buffer = checkpoint.load(checkpoint.latest(run / "checkpoints"))
    trajs = [json.loads(x) for x in (run / "trajectories" / "train.jsonl").read_text().splitlines()]
    consumed = sorted({(t["meta"]["key"], t["meta"]["step"]) for t in trajs})
    keys = [k for k, _ in consumed]
    assert len(keys) == 6 * 2 and len(set(keys)) == len(keys)
    stream = final_state["stream"]
    assert stream["epoch"] == 0
    handed_out = {f"0:{i}" for i in range(stream["position"])}
    rest = [g.key for g in final_buffer] + list(stream["retry"])
    assert sorted(keys + rest) == sorted(handed_out)
