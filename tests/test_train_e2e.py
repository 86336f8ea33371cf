"""End to end on Ray with the tiny model: a short async run in which a rollout worker is killed (`slow`: the
default suite's end-to-end training check is tests/test_fault_tolerance.py, which also kills one).

One run (to keep the default suite fast) checks both: the loop trains, syncs, evaluates, logs and
checkpoints; and after a rollout worker process is SIGKILLed mid-run, Ray restarts it, its lost
groups are re-run, and every accepted group is consumed exactly once (or is still buffered at the end).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from core.rundir import RunDir
from hexsearch.config import load_config
from trainer import checkpoint

TINY = """
engine: {model: tiny-random, max_batch_size: 16, max_model_len: 1024}
world: {entities: 30, max_hops: 1, short_articles: true, out: WORLD}
tools: {topk: 2, snippet_chars: 120, latency_median_s: 0.3, latency_p99_s: 1.0}
agent: {prefill: tags, worked_example: true, lenient_tags: true, read_search_results: false,
        max_turns: 2, max_tool_calls: 1, max_new_tokens: 8, max_context_tokens: 1024, format_gate: false}
train:
  steps: 4
  batch_size: 2
  group_size: 2
  max_staleness: 1
  rollout_workers: 2
  filter_groups: none
  eval_questions: 4
  eval_every: 2
  save_every: 2
  learner_resources: {num_cpus: 1, threads: 1}
  engine_resources: {num_cpus: 1, threads: 1}
"""


def tiny_config(tmp_path: Path, world: Path, **overrides):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.replace("WORLD", str(world)))
    extra = [f"{k}={v}" for k, v in overrides.items()]
    return load_config(path, [f"run.root={tmp_path / 'runs'}", "run.name=r", *extra])


def ledger(run: Path) -> list[dict]:
    p = run / "rollouts.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def _kill_one_worker(stop: threading.Event, killed: list[int], run: Path) -> None:
    """Wait until groups flow, then SIGKILL one RolloutWorker process of this test's Ray."""
    while not stop.is_set():
        if sum(e["event"] == "accept" for e in ledger(run)) >= 2:
            for p in psutil.Process().children(recursive=True):
                try:
                    if "RolloutWorker" in " ".join(p.cmdline()) or p.name().startswith("ray::RolloutWorker"):
                        os.kill(p.pid, signal.SIGKILL)
                        killed.append(p.pid)
                        return
                except psutil.Error:
                    continue
        time.sleep(0.2)


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("world") / "w"


@pytest.mark.slow
def test_async_run_survives_a_killed_rollout_worker(tmp_path, world_dir):
    from trainer.train import train

    cfg = tiny_config(tmp_path, world_dir)
    run = RunDir.create(cfg.run.root, cfg.run.name)
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_one_worker, args=(stop, killed, run.path), daemon=True)
    killer.start()
    try:
        summary = train(cfg, run)
    finally:
        stop.set()
        killer.join(5)

    # the loop ran to the end and wrote its outputs
    assert summary["steps"] == 4 and summary["dev_reward_before"] is not None
    rows = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    steps = [r["step"] for r in rows if "train/reward" in r]
    assert steps == [1, 2, 3, 4]
    last = [r for r in rows if "train/reward" in r][-1]
    for name in ("train/clip_frac", "train/behav_weight_mean", "rollout/staleness_hist", "rollout/queue_depth",
                 "agent/turns", "agent/tool_calls", "tools/errors", "train/tokens_per_s", "rollout/gen_tokens_per_s"):
        assert name in last, name
    assert last["train/optimizer_steps"] == 1 and last["train/policy_tokens"] > 0
    assert any("eval/reward" in r for r in rows if r["step"] == 2)
    assert (run.path / "reward_curve.png").stat().st_size > 0 and list(run.tb.glob("events.*"))
    assert checkpoint.latest(run.checkpoints).name == "step-4"

    # the worker was killed, its groups were lost and re-run, and nothing was consumed twice
    events = ledger(run.path)
    assert killed, "no rollout worker was found to kill"
    assert summary["rollouts"]["lost"] >= 1
    lost = {e["key"] for e in events if e["event"] == "lost"}
    accepted = [e["key"] for e in events if e["event"] == "accept"]
    consumed = [e["key"] for e in events if e["event"] == "consume"]
    refused = [e["key"] for e in events if e["event"] == "refuse"]   # too stale: re-run, never trained on
    assert len(consumed) == 4 * 2 and len(set(consumed)) == len(consumed)
    assert lost <= {e["key"] for e in events if e["event"] == "admit"}
    assert not [e for e in events if e["event"] == "failed"]
    _, buffered = checkpoint.load(checkpoint.latest(run.checkpoints))
    # every accepted group is consumed exactly once, still buffered, or was refused as too stale
    assert sorted(accepted) == sorted(consumed + [g.key for g in buffered] + refused)
    # staleness: every consumed group within the bound, every admission within the rule
    for e in events:
        if e["event"] == "consume":
            assert e["version"] - e["min_version"] <= 1
        if e["event"] == "admit":
            assert e["accepted"] + e["running"] <= e["bound"]
    trajs = [json.loads(line) for line in (run.trajectories / "train.jsonl").read_text().splitlines()]
    assert len(trajs) == 4 * 2 * 2 and all(t["segments"] and t["meta"]["step"] >= 1 for t in trajs)
