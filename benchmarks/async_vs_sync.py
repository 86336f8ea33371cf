"""Fully asynchronous RL (max_staleness=4) against synchronous RL (max_staleness=0), same workload.

The local search tool gets heavy-tailed latency like a real web API: log-normal with median 0.5 s
and 99th percentile 5 s. Synchronous RL waits at every step for the slowest of B x G episodes;
asynchronous RL keeps generating while the learner trains, within the staleness bound. Both runs use
the same code (`trainer.train.train`), model, world, agent and seeds; only max_staleness differs.

Metric: trained samples per second = steps * B * G / (sum of the loop's step times), so setup (Ray,
world, model loads) is excluded and evaluation is off. The first step of both runs waits for the
first batch to be generated from nothing; 16 steps amortise that one-time cost the way a training run
does, and the steady-state figures (steps 2..N) are reported beside it.

Fairness: both arms draw the same tool latencies for the same episodes (tools/latency.py draws per
seed, episode and call, not per process), and they run in alternating order over `--repeats` rounds
(sync first, then async first, ...) so neither always gets the warmer machine. The ratio is taken per
round; the headline is the median round, with the min and max. Prints
`RESULT async_vs_sync ratio=<median async samples/s / sync samples/s> ...` and writes
benchmarks/results/async_vs_sync.json.

    .venv/bin/python benchmarks/async_vs_sync.py [--model tiny-random] [--steps 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from _common import kv, spread, write_result  # noqa: E402

WORKLOAD = """
engine: {{model: {model}, max_batch_size: 64, max_model_len: 1024}}
world: {{entities: 60, max_hops: 1, short_articles: true, out: {world}}}
tools: {{topk: 2, snippet_chars: 160, latency_median_s: 0.5, latency_p99_s: 5.0}}
agent: {{prefill: tags, worked_example: true, lenient_tags: true, read_search_results: false,
        max_turns: 2, max_tool_calls: 1, max_new_tokens: 16, max_context_tokens: 1024}}
train:
  steps: {steps}
  batch_size: {batch}
  group_size: {group}
  rollout_workers: 2
  max_inflight_trajectories: 128
  filter_groups: none
  eval_questions: 0
  eval_every: 0
  save_every: 0
  engine_resources: {{num_cpus: 1, threads: 1}}
  learner_resources: {{num_cpus: 1, threads: 1}}
"""


def run_once(root: Path, name: str, staleness: int, args) -> dict:
    from core.rundir import RunDir
    from hexsearch.config import load_config
    from trainer.metrics import read_metrics
    from trainer.train import train

    cfg_path = root / f"{name}.yaml"
    cfg_path.write_text(WORKLOAD.format(model=args.model, world=root / "world", steps=args.steps,
                                        batch=args.batch, group=args.group))
    cfg = load_config(cfg_path, [f"run.root={root / 'runs'}", f"run.name={name}", f"train.max_staleness={staleness}"])
    run = RunDir.create(cfg.run.root, cfg.run.name)
    t0 = time.time()
    summary = train(cfg, run)
    rows = [r for r in read_metrics(run.metrics) if "time/step_s" in r]
    step_s = [r["time/step_s"] for r in rows]
    per_step = args.batch * args.group
    loop_s = sum(step_s)
    return {"max_staleness": staleness, "steps": len(rows), "samples": len(rows) * per_step,
            "loop_s": round(loop_s, 2), "samples_per_s": len(rows) * per_step / loop_s,
            "steady_samples_per_s": (len(rows) - 1) * per_step / sum(step_s[1:]),
            "first_step_s": round(step_s[0], 2), "wall_s": round(time.time() - t0, 1),
            "mean_staleness": sum(r.get("rollout/staleness_mean", 0.0) for r in rows) / max(len(rows), 1),
            "wait_s": round(sum(r["time/wait_s"] for r in rows), 2), "rollouts": summary["rollouts"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random", help="policy model spec (tiny-random keeps it fast)")
    ap.add_argument("--steps", type=int, default=16, help="training steps per run (at least 2)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="rounds of both arms, in alternating order")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the steady state starts at step 2)")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="async_vs_sync-") as tmp:
        root = Path(tmp)
        for r in range(args.repeats):
            arms = [("sync", 0), ("async", 4)] if r % 2 == 0 else [("async", 4), ("sync", 0)]
            got = {name: run_once(root, f"{name}-{r}", staleness, args) for name, staleness in arms}
            rounds.append({"order": [a for a, _ in arms], **got,
                           "ratio": got["async"]["samples_per_s"] / got["sync"]["samples_per_s"],
                           "steady_ratio": got["async"]["steady_samples_per_s"] / got["sync"]["steady_samples_per_s"]})
            print(f"round {r + 1}/{args.repeats} ({' then '.join(a for a, _ in arms)}): ratio {rounds[-1]['ratio']:.2f} "
                  f"(async {got['async']['samples_per_s']:.2f}, sync {got['sync']['samples_per_s']:.2f} samples/s)",
                  flush=True)

    ratio = spread(x["ratio"] for x in rounds)
    steady = spread(x["steady_ratio"] for x in rounds)
    asyn = spread(x["async"]["samples_per_s"] for x in rounds)
    sync = spread(x["sync"]["samples_per_s"] for x in rounds)
    line = (f"RESULT async_vs_sync {kv('ratio', ratio)} "
            f"{kv('async_samples_per_s', asyn)} {kv('sync_samples_per_s', sync)} {kv('steady_ratio', steady)} "
            f"rounds={args.repeats} steps={args.steps} model={args.model} target>=2.77")
    write_result("async_vs_sync", line, {"ratio": ratio, "steady_ratio": steady, "async_samples_per_s": asyn,
                                         "sync_samples_per_s": sync},
                 {"rounds": rounds, "model": args.model, "tool_latency": {"median_s": 0.5, "p99_s": 5.0},
                  "batch": args.batch, "group": args.group})
    print(line)


if __name__ == "__main__":
    os.environ.setdefault("HEXSEARCH_QUIET", "1")  # here, not at import: a test importing this module must not go quiet
    main()
