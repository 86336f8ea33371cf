"""Run folders as the viewer sees them: what kind each is and what its files say.

    train    metrics.jsonl, rollouts.jsonl, trajectories/train.jsonl, results.json, checkpoints/
    eval     results.jsonl (one row per question x sample), report.json, trajectories/eval.jsonl
    datagen  items.jsonl (accepted and rejected items with the reason), report.json, qa.jsonl
    ask      trajectories/ask.jsonl, results.json

A folder that is none of these but holds run folders (`runs/`) stands for all of them. Every JSONL file
is read line by line: a line that is not JSON becomes an error naming the file and the line, and the
rest of the file is still shown. Nothing here writes into a run folder, and nothing is read from outside
one: every file is resolved (symlinks included) first, and one that leads out of its run folder is
reported as an error, never read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hexsearch.viewer.index import TrajectoryIndex

KINDS = ("train", "eval", "datagen", "ask")


class OutsideRun(Exception):
    """A run's file whose resolved path leads out of the run folder (a symlink, say): never read."""

REPORT_FILES = ("report.md", "accuracy.png", "reward_curve.png", "log.txt")
"""Files of a run folder the run page links to (served as they are)."""


def kind_of(folder: Path) -> str | None:
    """train, eval, datagen, ask, or None when the folder is not a run folder."""
    if (folder / "items.jsonl").exists() or (folder / "datagen.log").exists():
        return "datagen"
    if (folder / "results.jsonl").exists() or (folder / "trajectories" / "eval.jsonl").exists():
        return "eval"
    if (folder / "metrics.jsonl").exists() or (folder / "trajectories" / "train.jsonl").exists():
        return "train"
    if (folder / "trajectories" / "ask.jsonl").exists():
        return "ask"
    if (folder / "config.yaml").exists():
        name = folder.name.split("-", 1)[0]
        return name if name in KINDS else "train"
    return None


def find_runs(paths: list[str | Path]) -> list[Path]:
    """The run folders named, and those one level below a folder that is not one itself."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise FileNotFoundError(f"{p}: no such folder")
        if kind_of(p) is not None:
            out.append(p.resolve())
            continue
        below = sorted((c.resolve() for c in p.iterdir() if c.is_dir() and kind_of(c) is not None),
                       key=lambda c: c.stat().st_mtime, reverse=True)
        if not below:
            raise FileNotFoundError(f"{p}: not a run folder (no config.yaml, metrics.jsonl, results.jsonl, "
                                    "items.jsonl or trajectories/), and no run folders inside")
        out.extend(below)
    return list(dict.fromkeys(out))


def read_jsonl(path: Path, limit: int = 1_000_000) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, errors) of a small JSONL file; a torn last line (no newline yet: still being written) is skipped."""
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    if not path.exists():
        return rows, errors
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip() or not raw.endswith(b"\n"):
                continue
            try:
                row = json.loads(raw)
                if not isinstance(row, dict):
                    raise ValueError("not a JSON object")
                rows.append(row)
            except ValueError as e:
                errors.append({"file": str(path), "line": n, "error": str(e)[:200]})
            if len(rows) >= limit:
                break
    return rows, errors


def read_json(path: Path) -> tuple[Any, dict[str, Any] | None]:
    """(content or None, error or None) of a JSON file."""
    if not path.exists():
        return None, None
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except (ValueError, OSError) as e:
        return None, {"file": str(path), "line": 0, "error": str(e)[:200]}


@dataclass
class Run:
    """One run folder and the trajectory indexes of its files."""

    path: Path
    indexes: dict[str, TrajectoryIndex] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return kind_of(self.path) or "train"

    def file(self, rel: str) -> Path:
        """`rel` under the run folder, resolved (symlinks and `..` followed); OutsideRun when that leads out."""
        root = self.path.resolve()
        target = (root / rel).resolve()
        if not target.is_relative_to(root):
            raise OutsideRun(f"{self.path / rel}: leads out of the run folder (to {target}); not read")
        return target

    def _read(self, rel: str, reader: Any) -> tuple[Any, list[dict[str, Any]]]:
        """`reader(path)` on the run's file `rel` -> (content, errors); a file leading out of the run folder gives
        (None, [its error]) and is not read."""
        try:
            path = self.file(rel)
        except OutsideRun as e:
            return None, [{"file": str(self.path / rel), "line": 0, "error": str(e)}]
        content, errors = reader(path)
        return content, (errors if isinstance(errors, list) else [errors] if errors else [])

    def config(self) -> dict[str, Any]:
        try:
            cfg = yaml.safe_load(self.file("config.yaml").read_text(encoding="utf-8"))
        except (OSError, OutsideRun, yaml.YAMLError):
            return {}
        return cfg if isinstance(cfg, dict) else {}

    def trajectory_files(self) -> list[str]:
        """The trajectory files whose resolved path stays in the run folder."""
        try:
            folder = self.file("trajectories")
        except OutsideRun:
            return []
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.glob("*.jsonl") if p.resolve().is_relative_to(self.path.resolve()))

    def index(self, name: str) -> TrajectoryIndex:
        """The (growing) index of trajectories/<name>; only names that `trajectory_files` lists."""
        if name not in self.trajectory_files():
            raise KeyError(f"{self.path.name}: no trajectory file {name!r}")
        if name not in self.indexes:
            self.indexes[name] = TrajectoryIndex(self.file(f"trajectories/{name}"))
        return self.indexes[name].refresh()

    def stamp(self) -> str:
        """Changes whenever a file the pages read changes (the page polls it to update live)."""
        parts = []
        for p in (*self.path.glob("*.json*"), *(self.path / "trajectories").glob("*.jsonl")):
            if not p.resolve().is_relative_to(self.path.resolve()):
                continue
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
        return "|".join(sorted(parts))

    def summary(self) -> dict[str, Any]:
        """What the run page shows above its tables (per kind)."""
        cfg = self.config()
        out: dict[str, Any] = {"name": self.path.name, "path": str(self.path), "kind": self.kind,
                               "stamp": self.stamp(), "trajectory_files": self.trajectory_files(),
                               "model": (cfg.get("engine") or {}).get("model", ""), "errors": [],
                               "files": [n for n in REPORT_FILES if (self.path / n).is_file()]}
        results, errs = self._read("results.json", read_json)
        out["results"] = results if isinstance(results, dict) else None
        out["errors"] += errs
        if (self.path / "metrics.jsonl").exists():
            rows, errs = self._read("metrics.jsonl", read_jsonl)
            out["metrics"], out["errors"] = rows or [], out["errors"] + errs
            out["advantage"] = (cfg.get("train") or {}).get("advantage", "grpo")
        if self.kind == "eval":
            rows, errs = self._read("results.jsonl", read_jsonl)
            report, err = self._read("report.json", read_json)
            out.update(rows=rows or [], report=report, suite=(cfg.get("eval") or {}).get("suite", ""))
            out["errors"] += errs + err
        if self.kind == "datagen":
            rows, errs = self._read("items.jsonl", read_jsonl)
            report, err = self._read("report.json", read_json)
            out.update(items=[_item_row(r) for r in rows or []], report=report)
            out["errors"] += errs + err
        return out

    def datagen_item(self, index: int) -> dict[str, Any]:
        rows, errors = self._read("items.jsonl", read_jsonl)
        if rows is None:
            raise KeyError(errors[0]["error"])
        for r in rows:
            if r.get("index") == index:
                return r
        raise KeyError(f"{self.path.name}: no item {index}")


def _item_row(r: dict[str, Any]) -> dict[str, Any]:
    """The table fields of one datagen item."""
    diff = r.get("difficulty") or {}
    return {"index": r.get("index"), "id": r.get("id"), "status": r.get("status"), "reason": r.get("reason", ""),
            "question": r.get("question", ""), "answer": r.get("answer", ""), "hops": r.get("hops"),
            "difficulty": f"{diff.get('correct')}/{diff.get('attempts')}" if diff else "",
            "edits": len(r.get("edits") or []), "seconds": r.get("seconds")}
