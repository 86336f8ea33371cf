"""Checkpoints: everything needed to continue a run exactly, written atomically and durably.

    checkpoints/step-N/
        learner/         trainable weights (all, or the LoRA adapters) and AdamW moments: one
                         torch.distributed.checkpoint shard file per learner rank, JSON metadata
        learner.json     optimizer settings, LR schedule, torch RNG (trainer/learner_state.py)
                         (`learner.pt` in checkpoints of earlier versions: loaded with `weights_only=True`)
        state.json       step, version, data cursor (+ questions in flight, to re-run), staleness
                         counters, ledger counters
        rng.json         Python's `random` state, as JSON
        buffer.jsonl     accepted groups not yet consumed (their trajectories, token-exact)
        manifest.json    size and SHA-256 of every file above (paths relative to step-N/)
    checkpoints/latest   name of the newest complete checkpoint

A checkpoint is assembled in a `.tmp-*` folder, every file and the folder fsynced, renamed into place,
then `latest` is replaced (also by rename, then fsync of the parent). A crash at any moment leaves the
old or the new checkpoint, never half; and a checkpoint damaged afterwards (a truncated or altered
file: its manifest no longer matches) is skipped by `latest()` with a warning, falling back to the
previous valid one (`keep_checkpoints` >= 2 keeps one to fall back to). So is one whose manifest is
missing or malformed, or names a file outside its folder. Only folders named `step-<n>` are checkpoints,
and `latest` counts only when it names one of them inside the checkpoints folder. Nothing here
unpickles: a pickle dropped into a run folder is never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from trainer.buffer import Group

log = logging.getLogger(__name__)
MANIFEST = "manifest.json"
STEP_FOLDER = re.compile(r"step-([0-9]+)")
"""The name of a checkpoint folder; nothing else under checkpoints/ counts (`step-3.bak`, `step-x`, ...)."""


def step_folders(root: Path) -> list[Path]:
    """The `step-<n>` folders directly under `root` (not symlinks out of it), oldest first."""
    found = [(int(m.group(1)), p) for p in root.glob("step-*")
             if (m := STEP_FOLDER.fullmatch(p.name)) and p.is_dir() and p.resolve().parent == root.resolve()]
    return [p for _, p in sorted(found)]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    """fsync a file or a directory (so a rename or a new file survives a power cut)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(folder: Path) -> None:
    """Size and SHA-256 of every file under the folder (the learner's shard folder included), then fsync of
    each file and of every folder."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / MANIFEST)
    manifest = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    folders = sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True)
    for p in [*files, folder / MANIFEST, *folders, folder]:
        _fsync(p)


def verify(path: str | Path) -> str | None:
    """Why the checkpoint folder is not valid (missing state, a missing or malformed manifest, a manifest entry
    outside the folder, a file missing, truncated or altered), or None. Never raises on what the files say."""
    path = Path(path)
    if not (path / "state.json").is_file():
        return "no state.json"
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST}: nothing to verify its files against"
    except (OSError, ValueError) as e:
        return f"unreadable {MANIFEST} ({e})"
    if not isinstance(manifest, dict) or not manifest:
        return f"{MANIFEST} is not an object of files"
    folder = path.resolve()
    for name, want in manifest.items():
        f = (path / name).resolve()
        if not f.is_relative_to(folder) or f == folder:
            return f"{MANIFEST} names {name!r}, outside the checkpoint folder"
        if not (isinstance(want, dict) and isinstance(want.get("size"), int) and isinstance(want.get("sha256"), str)):
            return f"{MANIFEST} entry {name!r} is not {{size, sha256}}: {str(want)[:80]}"
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != want["size"]:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {want['size']}"
        if _sha256(f) != want["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest"
    return None


def begin(root: str | Path, step: int) -> Path:
    """A fresh temp folder for checkpoint `step` (the learner ranks write learner/ and learner.json into it)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-step-{step}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def commit(tmp: Path, step: int, state: dict[str, Any], buffer: list[Group], keep: int = 2) -> Path:
    """Write state + buffer into `tmp`, rename it to `step-N`, point `latest` at it, prune old ones."""
    if not ((tmp / "learner.json").exists() or (tmp / "learner.pt").exists()):
        raise RuntimeError(f"checkpoint {tmp} has no learner.json: the learner did not save")
    (tmp / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    with (tmp / "buffer.jsonl").open("w") as f:
        for g in buffer:
            f.write(g.to_json() + "\n")
    _write_manifest(tmp)
    root = tmp.parent
    final = root / f"step-{step}"
    if final.exists():  # re-saving a step after a resume: move the old one aside first
        old = root / f".old-step-{step}-{uuid.uuid4().hex[:8]}"
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / f".latest-{uuid.uuid4().hex[:8]}"
    latest_tmp.write_text(final.name)
    _fsync(latest_tmp)
    os.replace(latest_tmp, root / "latest")
    _fsync(root)
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    steps = step_folders(root)
    for p in steps[:-keep] if keep > 0 else []:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".tmp-step-*"):
        shutil.rmtree(p, ignore_errors=True)


def latest(root: str | Path) -> Path | None:
    """The newest valid checkpoint folder (see `verify`), or None. The one `latest` names is tried first,
    then every `step-N` from the newest down; each one skipped is logged with the reason."""
    root = Path(root)
    steps = step_folders(root)[::-1]
    named = _pointed_at(root)
    if named is not None:
        steps = [named, *(p for p in steps if p != named)]
    for i, path in enumerate(steps):
        problem = verify(path)
        if problem is None:
            return path
        later = "; trying an older one" if i + 1 < len(steps) else ""
        log.warning("checkpoint %s is not valid (%s)%s", path, problem, later)
    return None


def _pointed_at(root: Path) -> Path | None:
    """The checkpoint `root/latest` names, when it names a `step-<n>` folder of `root` (else None, with a warning)."""
    pointer = root / "latest"
    try:
        name = pointer.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        log.warning("%s is unreadable (%s); looking for the newest checkpoint instead", pointer, e)
        return None
    named = root / name
    if STEP_FOLDER.fullmatch(name) is None or named not in step_folders(root):
        log.warning("%s names %r, not a step-<n> folder of %s; looking for the newest checkpoint instead",
                    pointer, name[:200], root)
        return None
    return named


def load(path: str | Path) -> tuple[dict[str, Any], list[Group]]:
    """(state, buffered groups) of a checkpoint folder; the learner's files are loaded by the learner itself."""
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
