"""Weight sync after each training step: pause, swap, bump the version, resume.

    1. every engine pauses (`abort`: in-flight calls return their partial output with
       finish_reason "abort"; the agent's `generate_continuing` re-sends prompt + partial output,
       which then continues under the new weights; each token keeps the version that produced it)
    2. every engine takes the new weights and the new version
         embedded engines: in memory (a Ray ObjectRef of the learner's state dict, resolved in the
                           engine actor: learner -> object store -> engine)
         remote engines:   from a folder the learner saved (`serving.models.save_untied`), which
                           vLLM/SGLang reload from disk; with `adapter` (LoRA on vLLM) a folder with
                           the adapter only, which vLLM loads as a new LoRA; with `nccl` learner rank 0
                           broadcasts the tensors to the servers' GPUs, then the engine clients label
                           them with the version (`Transferred`; serving/remote/weight_transfer.py)
    3. every engine resumes (also when the update failed, so generation never stays frozen)

The admission of new groups pauses around the swap, as in AReaL, so no episode starts on an engine
that is about to change. Every phase is bounded by `timeout_s`: an engine that does not answer is
named in a TimeoutError that stops the run (after a resume was sent to every engine), never a hang.
`current` is the (version, source) the engines hold; the engine supervisor (trainer/engine_watch.py)
restores a restarted engine actor from it, under `lock`, so a restore never interleaves with a push.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any


class WeightSync:
    """Pushes the learner's weights to the engines (see module docstring)."""

    def __init__(self, engines: list[Any], learners: Any, *, in_memory: bool, folder: str | Path | None = None,
                 pause_mode: str = "abort", keep_folders: int = 2, timeout_s: float = 600.0, adapter: bool = False,
                 nccl: bool = False):
        self.engines, self.learners, self.in_memory, self.adapter = engines, learners, in_memory, adapter
        self.nccl = nccl
        """Remote servers take the weights from learner rank 0 over NCCL (`learners.push_weights`), while paused."""
        self.timeout_s = timeout_s
        self.folder = Path(folder) if folder else None
        self.pause_mode, self.keep_folders = pause_mode, keep_folders
        self.lock = asyncio.Lock()
        self.current: tuple[int, Any] = (0, None)  # version 0: the base weights every engine starts from
        if not in_memory and not nccl and self.folder is None:
            raise ValueError("remote engines reload weights from disk: WeightSync needs a folder")

    async def source(self, version: int) -> Any:
        """What the engines load: an ObjectRef (in memory), a saved HF folder path, or (nccl) the label of
        weights rank 0 sends while the engines are paused."""
        if self.nccl:
            from serving.protocol import Transferred

            return Transferred(version)
        if self.in_memory:
            return self.learners.export_ref()
        assert self.folder is not None
        path = self.folder / f"v{version}"
        saved = await (self.learners.save_for_engine(str(path), adapter=True) if self.adapter
                       else self.learners.save_for_engine(str(path)))
        self._prune(version)
        return saved

    async def push(self, version: int, controller: Any = None) -> float:
        """Sync the engines to `version`; returns the seconds the engines were paused."""
        src = await self.source(version)  # prepared while the engines still generate
        if controller is not None:
            controller.pause()
        t0 = time.perf_counter()
        async with self.lock:
            self.current = (version, src)
            try:
                await self._all("pause", lambda e: e.pause(self.pause_mode))
                if self.nccl:
                    await self.learners.push_weights(version)
                await self._all(f"update_weights to v{version}", lambda e: e.update_weights(src, version))
            finally:
                await self._all("resume", lambda e: e.resume())
                if controller is not None:
                    controller.set_version(version)
                    controller.resume()
        return time.perf_counter() - t0

    async def _all(self, what: str, call: Any) -> None:
        """`call(engine)` on every engine at once, bounded by `timeout_s`: a hung engine is reported by
        index (TimeoutError), never waited on silently; the first engine error is raised."""
        tasks = [asyncio.ensure_future(call(e)) for e in self.engines]
        done, pending = await asyncio.wait(tasks, timeout=self.timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
            hung = [i for i, t in enumerate(tasks) if t in pending]
            raise TimeoutError(f"weight sync: {what} did not finish on engine(s) {hung} within {self.timeout_s:g}s "
                               "(train.weight_sync_timeout_s)")
        for task in tasks:
            task.result()

    def _prune(self, version: int) -> None:
        assert self.folder is not None
        for p in self.folder.glob("v*"):
            try:
                v = int(p.name[1:])
            except ValueError:
                continue
            if v <= version - self.keep_folders:
                shutil.rmtree(p, ignore_errors=True)
