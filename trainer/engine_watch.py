"""Engine supervision: a dead or hung engine actor is replaced and given the current weights.

Every `interval_s` the supervisor asks each engine actor for its `status()`, bounded by `timeout_s`:

    answers, needs_weights       restarted by Ray: restore(current source, current version), logged
    answers                      healthy
    Ray actor error              dead or restarting: Ray restarts it (`train.engine_max_restarts`) and
                                 the next check restores it; down for longer than `timeout_s` (its
                                 restarts are spent) stops the run with an error naming the engine
    no answer within timeout_s   hung: reported, killed so that Ray starts a fresh one, then restored
                                 (`ray.kill`, and SIGKILL when it runs on this node: a stopped
                                 process never acts on Ray's kill request)

A restore holds the weight sync's lock, so it never interleaves with a push: the restored actor gets
exactly the version the other replicas have, before it serves its first token (trainer/engine_actor.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


class EngineSupervisor:
    def __init__(self, handles: list[Any], sync: Any, *, interval_s: float, timeout_s: float,
                 log: Callable[..., None], fail: Callable[[BaseException], None]):
        self.handles, self.sync = handles, sync
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.log, self.fail = log, fail
        self.down_since: dict[int, float] = {}
        self.last_seen: dict[int, dict[str, Any]] = {}  # engine -> its last status (pid, node)
        self.stats = {"restored": 0, "hung": 0}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.handles and self.interval_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the run must hear of it: a silent supervisor would hide dead engines
                self.fail(RuntimeError(f"engine supervisor failed: {type(e).__name__}: {e}"))
                return

    async def check(self) -> None:
        """One round over every engine actor (see module docstring)."""
        await asyncio.gather(*(self._check(i, h) for i, h in enumerate(self.handles)))

    async def _check(self, i: int, handle: Any) -> None:
        from trainer.controller import lost_errors

        try:
            status = await asyncio.wait_for(handle.status.remote(), self.timeout_s)
            self.down_since.pop(i, None)
            self.last_seen[i] = status
            if status["needs_weights"]:
                async with self.sync.lock:  # a restore builds the engine too: bounded like a weight sync
                    version, source = self.sync.current
                    await asyncio.wait_for(handle.restore.remote(source, version), self.sync.timeout_s)
                self.stats["restored"] += 1
                self.log("engine_restored", engine=i, version=version, pid=status["pid"])
        except asyncio.TimeoutError:
            self.stats["hung"] += 1
            self.log("engine_hung", engine=i, timeout_s=self.timeout_s)
            self._kill(handle, self.last_seen.pop(i, None))  # Ray starts a fresh process; the next round restores it
        except lost_errors() as e:
            first = self.down_since.setdefault(i, time.monotonic())
            if time.monotonic() - first > self.timeout_s:
                self.fail(RuntimeError(f"engine actor {i} has been down for {self.timeout_s:g}s and was not restarted "
                                       f"(train.engine_max_restarts spent?): {type(e).__name__}"))

    @staticmethod
    def _kill(handle: Any, status: dict[str, Any] | None) -> None:
        import os
        import signal

        import ray

        ray.kill(handle, no_restart=False)
        if status and status.get("node") == ray.get_runtime_context().get_node_id():
            try:
                os.kill(status["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
