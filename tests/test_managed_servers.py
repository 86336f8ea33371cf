"""Managed inference servers (trainer/managed_servers.py) on CPU: `hexsearch train` with a remote backend and no
URLs starts the servers as Ray actors, waits for health, restarts a dead one on its port with the current
weights, and stops them. Our own engine server (`engine.backend=http`) stands in for vLLM/SGLang here: the
same actor, launcher and restart path, on a machine without GPUs."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from hexsearch.config import load_config
from trainer.managed_servers import ManagedServers
from trainer.placement import init_ray


class _Sync:  # what the watch reads from trainer.weight_sync.WeightSync
    def __init__(self, current):
        self.lock, self.current = asyncio.Lock(), current


def _kill(servers: ManagedServers) -> int:
    import ray

    pid = ray.get(servers.actors[0].pid.remote())
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while ray.get(servers.actors[0].alive.remote()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pid


def test_managed_server_starts_restarts_with_the_weights_and_stops(tiny_model_spec, tmp_path):
    import ray

    from serving.models import load_model, load_tokenizer, save_untied

    cfg = load_config(None, [f"engine.model={tiny_model_spec}", "engine.backend=http", "engine.max_model_len=256",
                             "train.engine_replicas=1", "train.engine_max_restarts=1", "engine.dtype=float32"])
    weights = save_untied(load_model(tiny_model_spec, dtype="float32"), load_tokenizer(tiny_model_spec), tmp_path / "v3")
    init_ray(cfg.train, embedded=False)
    try:
        servers = ManagedServers.start(cfg, str(tmp_path))
        url = servers.urls[0]
        assert url.startswith("http://127.0.0.1:") and httpx.get(f"{url}/health").status_code == 200
        assert "http-0" in (tmp_path / "engines.json").read_text()
        first = _kill(servers)
        logged = []
        restarted = asyncio.run(servers.check(_Sync((3, str(weights))), lambda *a, **k: logged.append(k)))
        assert restarted == [0] and logged == [{"server": 0, "version": 3, "restarts": 1}]
        assert ray.get(servers.actors[0].pid.remote()) != first
        assert httpx.get(f"{url}/weight_info").json()["weight_version"] == "3"  # same URL, current weights
        _kill(servers)
        with pytest.raises(RuntimeError, match="restarts are spent"):
            asyncio.run(servers.check(_Sync((3, str(weights))), lambda *a, **k: None))
        servers.stop()
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        ray.shutdown()
