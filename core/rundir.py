"""The one run-directory layout every command writes (leaf module).

    runs/<name>/
        config.yaml          resolved config of the command that created the run
        log.txt              log of the run (secrets redacted)
        metrics.jsonl        one JSON object per logged step (stable metric names)
        tb/                  TensorBoard event files
        trajectories/        trajectory JSONL files (one episode per line)
        checkpoints/         step-N/ folders, written atomically (tmp dir + rename)
        engines.json         addresses of engines/services started for this run
        results.json         final figures of the command (eval scores, train summary)
        artifacts/           anything else (plots, exported data)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from core.checkpoint import write_atomic

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


@dataclass
class RunConfig:
    """The `run` section: where the run folder goes, the seed, logging (here, below every package that reads
    the seed; hexsearch.config assembles it with the other sections)."""

    name: str = ""
    """Run name; the run folder is `<root>/<name>`. Empty: `<command>-<timestamp>`."""
    root: str = "runs"
    """Folder that holds all runs."""
    seed: int = 0
    """Global random seed (python, numpy, torch, data order)."""
    log_level: LogLevel = "WARNING"
    """Python logging level for the console and `log.txt`: `DEBUG`, `INFO`, `WARNING`, `ERROR` or `CRITICAL`."""


@dataclass(frozen=True)
class RunDir:
    """Paths of one run. Create with `RunDir.create(root, name)`; reopen with `RunDir(path)`."""

    path: Path

    @classmethod
    def create(cls, root: str | os.PathLike = "runs", name: str | None = None, kind: str = "run") -> RunDir:
        """Make `root/name` and its sub-folders. The default name is `<kind>-<timestamp>`, with `-2`, `-3`, ...
        added when another run took it in the same second (an explicit name may be reused: resume)."""
        if name is None:
            stamp = f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
            Path(root).mkdir(parents=True, exist_ok=True)
            for i in range(1, 10_000):
                name = stamp if i == 1 else f"{stamp}-{i}"
                try:
                    (Path(root) / name).mkdir()  # atomic: of two runs started together, one gets each name
                    break
                except FileExistsError:
                    continue
        run = cls(Path(root) / str(name))
        for sub in (run.path, run.trajectories, run.checkpoints, run.artifacts, run.tb):
            sub.mkdir(parents=True, exist_ok=True)
        return run

    config = property(lambda self: self.path / "config.yaml")
    log = property(lambda self: self.path / "log.txt")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    tb = property(lambda self: self.path / "tb")
    trajectories = property(lambda self: self.path / "trajectories")
    checkpoints = property(lambda self: self.path / "checkpoints")
    engines = property(lambda self: self.path / "engines.json")
    results = property(lambda self: self.path / "results.json")
    artifacts = property(lambda self: self.path / "artifacts")

    def write_json(self, path: Path, obj: Any) -> None:
        """Write JSON atomically (tmp file + rename), so a crash never leaves half a file."""
        write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))

    def record_engine(self, name: str, info: dict) -> None:
        """Add or replace one entry of engines.json (address, pid, kind of a started service)."""
        current = json.loads(self.engines.read_text()) if self.engines.exists() else {}
        current[name] = info
        self.write_json(self.engines, current)
