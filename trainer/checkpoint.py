"""Checkpoints: everything needed to continue a run exactly, written atomically.

    checkpoints/step-N/
        learner.pt       trainable weights (all, or the LoRA adapters), optimizer, LR schedule, torch RNG
        state.json       step, version, data cursor (+ questions in flight, to re-run), staleness
                         counters, ledger counters, python RNG
        buffer.jsonl     accepted groups not yet consumed (their trajectories, token-exact)
    checkpoints/latest   name of the newest complete checkpoint

A checkpoint is assembled in a `.tmp-*` folder and renamed into place, then `latest` is replaced
(also by rename), so a crash at any moment leaves either the old or the new checkpoint, never half.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from trainer.buffer import Group


def begin(root: str | Path, step: int) -> Path:
    """A fresh temp folder for checkpoint `step` (the learner writes learner.pt into it)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-step-{step}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def commit(tmp: Path, step: int, state: dict[str, Any], buffer: list[Group], keep: int = 2) -> Path:
    """Write state + buffer into `tmp`, rename it to `step-N`, point `latest` at it, prune old ones."""
    if not (tmp / "learner.pt").exists():
        raise RuntimeError(f"checkpoint {tmp} has no learner.pt: the learner did not save")
    (tmp / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    with (tmp / "buffer.jsonl").open("w") as f:
        for g in buffer:
            f.write(g.to_json() + "\n")
    root = tmp.parent
    final = root / f"step-{step}"
    if final.exists():  # re-saving a step after a resume: move the old one aside first
        old = root / f".old-step-{step}-{uuid.uuid4().hex[:8]}"
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / f".latest-{uuid.uuid4().hex[:8]}"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    steps = sorted((p for p in root.glob("step-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    for p in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp-step-*"):
        shutil.rmtree(p, ignore_errors=True)


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint folder, or None."""
    root = Path(root)
    pointer = root / "latest"
    if pointer.exists():
        path = root / pointer.read_text().strip()
        if (path / "state.json").exists():
            return path
    steps = sorted((p for p in root.glob("step-*") if (p / "state.json").exists()),
                   key=lambda p: int(p.name.split("-")[1]))
    return steps[-1] if steps else None


def load(path: str | Path) -> tuple[dict[str, Any], list[Group]]:
    """(state, buffered groups) of a checkpoint folder; learner.pt is loaded by the learner itself."""
    path = Path(path)
    state = json.loads((path / "state.json").read_text())
    buffer_file = path / "buffer.jsonl"
    groups = []
    if buffer_file.exists():
        for n, line in enumerate(buffer_file.read_text().splitlines(), 1):
            if line.strip():
                try:
                    groups.append(Group.from_json(line))
                except (ValueError, TypeError, KeyError) as e:
                    raise ValueError(f"{buffer_file}:{n}: bad buffered group: {e}") from e
    return state, groups
