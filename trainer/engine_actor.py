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
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from serving.config import EngineConfig
from serving.protocol import Completion, GenerateRequest, PauseMode, WeightSource


class EngineActor:
    """Ray actor body (created with `ray.remote(**placement)(EngineActor)`); all methods are async."""

    def __init__(self, engine_cfg: EngineConfig, threads: int = 0):
        import torch

        if threads > 0:
            torch.set_num_threads(threads)
        self.cfg = engine_cfg
        self.engine: Any = None

    async def start(self) -> int:
        """Build the engine inside the actor's event loop; returns the engine's version."""
        if self.engine is None:
            from serving.factory import build_engine

            self.engine = build_engine(self.cfg)
            start = getattr(self.engine, "start", None)
            if start is not None:
                res = start()
                if asyncio.iscoroutine(res):
                    await res
        return self.engine.version

    async def generate(self, request: GenerateRequest) -> Completion:
        return await self.engine.generate(request)

    async def pause(self, mode: PauseMode = "abort") -> None:
        await self.engine.pause(mode)

    async def resume(self) -> None:
        await self.engine.resume()

    async def update_weights(self, source: WeightSource, version: int) -> int:
        await self.engine.update_weights(source, version)
        return self.engine.version

    async def health(self) -> dict[str, Any]:
        return await self.engine.health()

    async def get_version(self) -> int:
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
        await asyncio.gather(*(h.pause.remote(mode) for h in self._handles))

    async def resume(self) -> None:
        await asyncio.gather(*(h.resume.remote() for h in self._handles))

    async def update_weights(self, source: WeightSource, version: int) -> None:
        await asyncio.gather(*(h.update_weights.remote(source, version) for h in self._handles))
        self._version = version

    async def health(self) -> dict[str, Any]:
        reports = await asyncio.gather(*(h.health.remote() for h in self._handles))
        return {"ok": all(r.get("ok", False) for r in reports), "version": self._version, "replicas": reports}


def start_engine_actors(engine_cfg: EngineConfig, replicas: int, placement: dict[str, Any], threads: int) -> list[Any]:
    """Create and start `replicas` EngineActors with the given Ray placement options."""
    import ray

    cls = ray.remote(EngineActor)
    handles = [cls.options(max_concurrency=10_000, **placement).remote(engine_cfg, threads) for _ in range(replicas)]
    ray.get([h.start.remote() for h in handles])
    return handles
