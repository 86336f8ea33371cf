"""An engine hosted in a Ray actor, and a proxy that is an InferenceEngine again.

    EngineActor   owns one engine built by `serving.factory.build_engine(cfg.engine)`: the embedded
                  engine (continuous batching, pause/resume, in-memory weight updates), or the client
                  (one server, or a pool) of remote vLLM/SGLang/hexsearch servers
    EngineProxy   implements `serving.protocol.InferenceEngine` over one or more EngineActor handles;
                  rollout workers and the driver hold it like any engine. Requests are routed by a
                  stable hash of their request id, so every call of one trajectory reaches the same
                  replica (its prefix cache stays warm); pause / update / resume go to all replicas.

A weight source may be a Ray ObjectRef of a state dict: Ray resolves it inside the actor, so the
tensors go learner -> object store -> engine without passing through the driver.

Recovery: Ray restarts a dead engine actor (`train.engine_max_restarts`). A restarted actor that is
weight-synced holds every request until the driver's `EngineSupervisor` (trainer/engine_watch.py) has
given it the current weights and version: it never serves tokens from stale weights under a new label.
"""

from __future__ import annotations

import asyncio
import os
import uuid
import warnings
import zlib
from typing import Any

from serving.config import EngineConfig
from serving.protocol import Completion, GenerateRequest, PauseMode, WeightSource


class EngineActor:
    """Ray actor body (created with `ray.remote(**placement)(EngineActor)`); all methods are async."""

    def __init__(self, engine_cfg: EngineConfig, threads: int = 0, synced: bool = True, ready_timeout_s: float = 300.0):
        import ray
        import torch

        if threads > 0:
            torch.set_num_threads(threads)
        self.cfg, self.ready_timeout_s = engine_cfg, ready_timeout_s
        self.engine: Any = None
        with warnings.catch_warnings():  # Ray's own property reads a deprecated field and warns on every start
            warnings.simplefilter("ignore")
            self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        # a fresh actor starts at the base weights (version 0) like every replica; a restarted one must
        # first be given the run's current weights (unless it is never synced, like the judge)
        self._ready, self._building = asyncio.Event(), asyncio.Lock()
        if not (self.restarted and synced):
            self._ready.set()

    async def start(self) -> int:
        """Build the engine inside the actor's event loop; returns the engine's version."""
        if self.engine is not None:  # every call passes here: no lock once built
            return self.engine.version
        async with self._building:  # calls arriving while the engine is built wait for it
            if self.engine is None:
                from serving.factory import build_engine

                engine = build_engine(self.cfg)
                start = getattr(engine, "start", None)
                if start is not None:
                    res = start()
                    if asyncio.iscoroutine(res):
                        await res
                self.engine = engine
        return self.engine.version

    async def _serving(self) -> None:
        """Wait until this actor may serve (see module docstring); an engine_error when it never may."""
        if not self._ready.is_set():
            try:
                await asyncio.wait_for(self._ready.wait(), self.ready_timeout_s)
            except asyncio.TimeoutError:
                raise RuntimeError(f"restarted engine actor got no weights within {self.ready_timeout_s:g}s") from None
        await self.start()

    async def generate(self, request: GenerateRequest) -> Completion:
        await self._serving()
        return await self.engine.generate(request)

    async def pause(self, mode: PauseMode = "abort") -> None:
        await self.start()
        await self.engine.pause(mode)

    async def resume(self) -> None:
        await self.start()
        await self.engine.resume()

    async def update_weights(self, source: WeightSource, version: int) -> int:
        from core.memory import release_free_memory

        await self.start()
        await self.engine.update_weights(source, version)
        self._ready.set()
        release_free_memory()  # the previous weights and the batches since the last update, freed but kept by malloc
        return self.engine.version

    async def restore(self, source: WeightSource | None, version: int) -> int:
        """Bring a restarted actor to the run's weights (`source` None: the base weights are current)."""
        if source is not None:
            return await self.update_weights(source, version)
        self._ready.set()
        return await self.start()

    async def status(self) -> dict[str, Any]:
        """What the supervisor checks: is this actor waiting for weights, and at which version is it."""
        import ray

        return {"needs_weights": not self._ready.is_set(), "restarted": self.restarted, "pid": os.getpid(),
                "node": ray.get_runtime_context().get_node_id(),
                "version": self.engine.version if self.engine is not None else None}

    async def health(self) -> dict[str, Any]:
        await self.start()
        return await self.engine.health()

    async def get_version(self) -> int:
        await self.start()
        return self.engine.version


class EngineProxy:
    """An InferenceEngine over EngineActor handles (see module docstring)."""

    def __init__(self, handles: list[Any], model_spec: str, version: int = 0):
        if not handles:
            raise ValueError("EngineProxy needs at least one engine actor")
        self._handles, self._spec, self._version, self._tok = list(handles), model_spec, version, None

    @property
    def version(self) -> int:
        """The newest version this proxy has seen (from updates it sent or tokens it received)."""
        return self._version

    @property
    def tokenizer(self) -> Any:
        if self._tok is None:
            from serving.models import load_tokenizer

            self._tok = load_tokenizer(self._spec)
        return self._tok

    def route(self, request_id: str) -> Any:
        return self._handles[zlib.crc32(request_id.encode()) % len(self._handles)]

    async def generate(self, request: GenerateRequest) -> Completion:
        completion = await self.route(request.request_id).generate.remote(request)
        if completion.versions:
            self._version = max(self._version, max(completion.versions))
        return completion

    async def pause(self, mode: PauseMode = "abort") -> None:
        await _broadcast(h.pause.remote(mode) for h in self._handles)

    async def resume(self) -> None:
        await _broadcast(h.resume.remote() for h in self._handles)

    async def update_weights(self, source: WeightSource, version: int) -> None:
        await _broadcast(h.update_weights.remote(source, version) for h in self._handles)
        self._version = version

    async def health(self) -> dict[str, Any]:
        reports = await asyncio.gather(*(h.health.remote() for h in self._handles))
        return {"ok": all(r.get("ok", False) for r in reports), "version": self._version, "replicas": reports}


async def _broadcast(calls: Any) -> None:
    """Await one call per replica; a replica that died (or is restarting) is skipped, since the supervisor
    gives it the current weights when it is back. Any other error is raised."""
    from trainer.controller import lost_errors

    for result in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(result, BaseException) and not isinstance(result, lost_errors()):
            raise result


def create_engine_actors(engine_cfg: EngineConfig, replicas: int, placement: dict[str, Any], threads: int,
                         *, max_restarts: int = 0, synced: bool = True,
                         names: list[str] | None = None) -> tuple[list[Any], list[Any]]:
    """Create `replicas` EngineActors with the given Ray placement options and ask each to build its engine.
    Returns the handles and the refs of those `start()` calls, so that the caller can wait for them together
    with other actors' loading. Ray restarts a dead one up to `max_restarts` times (`synced`: it then waits
    for the supervisor's weights). `names` registers them as named actors, for `lookup_engine_actors`."""
    import ray

    if names is not None and len(names) != replicas:
        raise ValueError(f"{len(names)} names for {replicas} engine actors")
    cls = ray.remote(EngineActor)
    handles = [cls.options(max_concurrency=10_000, max_restarts=max_restarts, max_task_retries=0, name=name,
                           **placement).remote(engine_cfg, threads, synced)
               for name in (names or [None] * replicas)]
    return handles, [h.start.remote() for h in handles]


def engine_actor_names(role: str, replicas: int) -> list[str]:
    """Names, unique to this call, for `replicas` engine actors of one role ("engine", "judge").

    Restartable actors look engines up by name (`lookup_engine_actors`) instead of taking their handles as
    constructor arguments: Ray keeps no reference to constructor arguments for a restart, and says so on
    every run (ray-project/ray#53727)."""
    run = uuid.uuid4().hex[:12]
    return [f"hexsearch-{role}-{run}-{i}" for i in range(replicas)]


def lookup_engine_actors(names: list[str]) -> list[Any]:
    """The handles of named engine actors of this Ray job (`create_engine_actors(names=...)`)."""
    import ray

    return [ray.get_actor(name) for name in names]


def start_engine_actors(*args: Any, **kwargs: Any) -> list[Any]:
    """`create_engine_actors`, then wait until every engine is built."""
    import ray

    handles, started = create_engine_actors(*args, **kwargs)
    ray.get(started)
    return handles
