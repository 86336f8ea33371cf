"""Weight sync after each training step: pause, swap, bump the version, resume.

    1. every engine pauses (`abort`: in-flight calls return their partial output with
       finish_reason "abort"; the agent's `generate_continuing` re-sends prompt + partial output,
       which then continues under the new weights; each token keeps the version that produced it)
    2. every engine takes the new weights and the new version
         embedded engines: in memory (a Ray ObjectRef of the learner's state dict, resolved in the
                           engine actor: learner -> object store -> engine)
         remote engines:   from a folder the learner saved (`serving.models.save_untied`), which
                           vLLM/SGLang reload from disk
    3. every engine resumes (also when the update failed, so generation never stays frozen)

The admission of new groups pauses around the swap, as in AReaL, so no episode starts on an engine
that is about to change.
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
                 pause_mode: str = "abort", keep_folders: int = 2):
        self.engines, self.learners, self.in_memory = engines, learners, in_memory
        self.folder = Path(folder) if folder else None
        self.pause_mode, self.keep_folders = pause_mode, keep_folders
        if not in_memory and self.folder is None:
            raise ValueError("remote engines reload weights from disk: WeightSync needs a folder")

    async def source(self, version: int) -> Any:
        """What the engines load: an ObjectRef (in memory) or a saved HF folder path."""
        if self.in_memory:
            return self.learners.export_ref()
        assert self.folder is not None
        path = self.folder / f"v{version}"
        saved = await self.learners.save_for_engine(str(path))
        self._prune(version)
        return saved

    async def push(self, version: int, controller: Any = None) -> float:
        """Sync the engines to `version`; returns the seconds the engines were paused."""
        src = await self.source(version)  # prepared while the engines still generate
        if controller is not None:
            controller.pause()
        t0 = time.perf_counter()
        await asyncio.gather(*(e.pause(self.pause_mode) for e in self.engines))
        try:
            await asyncio.gather(*(e.update_weights(src, version) for e in self.engines))
        finally:
            await asyncio.gather(*(e.resume() for e in self.engines))
            if controller is not None:
                controller.set_version(version)
                controller.resume()
        return time.perf_counter() - t0

    def _prune(self, version: int) -> None:
        assert self.folder is not None
        for p in self.folder.glob("v*"):
            try:
                v = int(p.name[1:])
            except ValueError:
                continue
            if v <= version - self.keep_folders:
                shutil.rmtree(p, ignore_errors=True)
