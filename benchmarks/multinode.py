"""Wall time of the same `hexsearch train` run on a three-node Ray cluster and on one node (docs/scale-out.md).

Both clusters are started on this machine by scripts/local_cluster.sh with `ray start` (token authentication on):
three nodes (the engine on the head, one learner rank on each of two workers, a rollout worker per node), or one
node holding all the same custom resources (`NODES=1`). The run is configs/three-node-tiny.yaml (the tiny model,
6 steps, 2 gloo learner ranks, checkpoints at steps 2, 4 and 6), joined with train.ray_address; the clock runs
from `hexsearch train` starting to its exit (connecting, loading every actor, evaluating before and after, the
steps); the clusters start before and stop after it, untimed. Rounds alternate which layout runs first.

    ratio     = the three-node run's wall seconds / the one-node run's (per round; median and range)

On one machine the three nodes share its cores: the figure says what running as a multi-node cluster costs
(three raylets, object transfers between them, gloo between the learner nodes), not what more machines gain.

    python benchmarks/multinode.py [--rounds 3] [--steps 6]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, fmt, kv, spread, write_result  # noqa: E402

SCRIPT = ROOT / "scripts" / "local_cluster.sh"
CONFIG = ROOT / "configs" / "three-node-tiny.yaml"


def run_on(nodes: int, steps: int, runs: Path, name: str) -> dict:
    """Start a cluster of `nodes`, time one training run on it, stop the cluster."""
    cluster = tempfile.mkdtemp(prefix="hexsearch-mn-", dir="/tmp")   # short: Ray's socket paths fit 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "token", "NODES": str(nodes)}
    try:
        started = subprocess.run(["bash", str(SCRIPT), "start", cluster], capture_output=True, text=True, env=env,
                                 timeout=300, check=True)
        address = started.stdout.strip().splitlines()[-1].removeprefix("address=")
        cmd = [sys.executable, "-m", "hexsearch.cli", "--quiet", "train", str(CONFIG), f"train.ray_address={address}",
               f"train.steps={steps}", f"run.root={runs}", f"run.name={name}"]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        wall = time.perf_counter() - t0
        if out.returncode != 0 or "RESULT train" not in out.stdout:
            raise SystemExit(f"{nodes}-node run failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
        minutes = float(re.search(r"minutes=([\d.]+)", out.stdout).group(1))
        return {"wall_s": wall, "minutes": minutes, "result": out.stdout.strip().splitlines()[-1]}
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", cluster], timeout=120)
        shutil.rmtree(cluster, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    runs = Path(tempfile.mkdtemp(prefix="hexsearch-mn-runs-"))
    rounds = []
    try:
        for r in range(args.rounds):
            order = (3, 1) if r % 2 == 0 else (1, 3)
            got = {n: run_on(n, args.steps, runs, f"r{r}-{n}node") for n in order}
            rounds.append(got)
            print(f"round {r + 1}: 3 nodes {got[3]['wall_s']:.1f} s, 1 node {got[1]['wall_s']:.1f} s", flush=True)
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    ratio = spread([g[3]["wall_s"] / g[1]["wall_s"] for g in rounds])
    three, one = spread([g[3]["wall_s"] for g in rounds]), spread([g[1]["wall_s"] for g in rounds])
    line = " ".join(["RESULT multinode", kv("ratio", ratio), kv("wall_s_3node", three, 1), kv("wall_s_1node", one, 1),
                     f"steps={args.steps} rounds={args.rounds}"])
    print(f"3 nodes {fmt(three, 1)} s, 1 node {fmt(one, 1)} s, ratio {fmt(ratio)}")
    write_result("multinode", line, {"ratio": ratio, "wall_s_3node": three, "wall_s_1node": one},
                 {"args": vars(args), "rounds": [{str(n): v for n, v in g.items()} for g in rounds],
                  "config": str(CONFIG.relative_to(ROOT))})
    print(line)


if __name__ == "__main__":
    main()
