"""`hexsearch train` on a three-node Ray cluster (three raylets from `ray start`, scripts/local_cluster.sh), with
the commands docs/scale-out.md gives for a real cluster: the engine on the `engine_node`, the two learner ranks
(gloo) on the two `learner_node`s, one rollout worker per node. The run trains and checkpoints, its driver is
SIGKILLed, and `hexsearch train --resume` finishes it on the same cluster from the checkpoint. Token
authentication stays on (the cluster and the driver run with RAY_AUTH_MODE=token). `slow`: about 2 minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local_cluster.sh"

# Where every actor of every job ran: run as a second driver on the cluster (GCS tables, no dashboard).
PROBE = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
nodes = {n["NodeID"]: sorted(k for k in n["Resources"] if k in ("engine_node", "learner_node", "rollout_slot"))
         for n in ray.nodes()}
rows = [{"cls": a["ActorClassName"], "job": a["JobID"], "node": a["Address"]["NodeID"],
         "labels": nodes.get(a["Address"]["NodeID"])} for a in ray._private.state.actors().values()]
print("PROBE " + json.dumps({"nodes": nodes, "actors": rows}))
"""


def _metrics(run: Path) -> list[dict]:
    p = run / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def _placement(address: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, address], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(next(x for x in out.stdout.splitlines() if x.startswith("PROBE "))[6:])


def _check_job(actors: list[dict]) -> None:
    """One job's actors sit where their resources say."""
    by = {cls: [a for a in actors if a["cls"] == cls] for cls in ("EngineActor", "LearnerWorker", "RolloutWorker")}
    assert len(by["EngineActor"]) == 1 and "engine_node" in by["EngineActor"][0]["labels"], by["EngineActor"]
    learners = by["LearnerWorker"]
    assert len(learners) == 2 and all("learner_node" in a["labels"] for a in learners), learners
    assert len({a["node"] for a in learners}) == 2   # one rank per node
    assert len({a["node"] for a in by["RolloutWorker"]}) == 3   # one worker on each node


def test_three_node_run_trains_is_killed_and_resumes(tmp_path):
    cluster = tempfile.mkdtemp(prefix="hexsearch-mn-", dir="/tmp")   # short: Ray's socket paths fit 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    started = subprocess.run(["bash", str(SCRIPT), "start", cluster], capture_output=True, text=True, env=env,
                             timeout=300)
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-3000:]
        address = started.stdout.strip().splitlines()[-1].removeprefix("address=")
        nodes = _placement(address, env)["nodes"]
        assert sorted(map(tuple, nodes.values())) == [("engine_node", "rollout_slot"), ("learner_node", "rollout_slot"),
                                                       ("learner_node", "rollout_slot")]
        run = tmp_path / "runs" / "mn"
        cmd = [sys.executable, "-m", "hexsearch.cli", "--quiet", "train"]
        first_log = (tmp_path / "first.log").open("w")
        first = subprocess.Popen([*cmd, str(ROOT / "configs" / "three-node-tiny.yaml"), f"train.ray_address={address}",
                                  f"run.root={tmp_path / 'runs'}", "run.name=mn"],
                                 stdout=first_log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.time() + 600
            while time.time() < deadline and first.poll() is None:
                if (run / "checkpoints" / "step-2" / "state.json").exists() and any(
                        r.get("step", 0) >= 3 for r in _metrics(run)):
                    break
                time.sleep(0.3)
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        finally:
            os.kill(first.pid, signal.SIGKILL)   # the driver only: Ray ends the actors it owned
            first.wait()
        # both ranks, on their two nodes, wrote their shard files into the one run folder
        assert {p.name for p in (run / "checkpoints" / "step-2" / "learner").glob("*.distcp")} == {
            "__0_0.distcp", "__1_0.distcp"}
        saved = sorted(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*")
                       if (p / "state.json").exists())

        second = subprocess.run([*cmd, "--resume", str(run)], capture_output=True, text=True, env=env, timeout=900)
        assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
        assert "RESULT train" in second.stdout and "steps=6" in second.stdout

        # the second driver joined the same cluster (the run's config keeps train.ray_address) and went on
        # from the newest checkpoint the first one had committed: each step logged once, in order
        events = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
        resume = next(e for e in events if e["event"] == "resume")
        assert resume["v"] == saved[-1] >= 2
        assert [r["step"] for r in _metrics(run) if "train/reward" in r] == [1, 2, 3, 4, 5, 6]
        assert (run / "checkpoints" / "step-6" / "state.json").exists()

        actors = _placement(address, env)["actors"]
        jobs = sorted({a["job"] for a in actors if a["cls"] == "LearnerWorker"})
        assert len(jobs) == 2   # the killed run and the resumed one, both placed as configured
        for job in jobs:
            _check_job([a for a in actors if a["job"] == job])
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", cluster], timeout=120)
        shutil.rmtree(cluster, ignore_errors=True)
