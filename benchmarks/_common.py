"""What every benchmark shares: the spread of repeated measurements, the machine it ran on, and one
JSON file per benchmark under benchmarks/results/, and the same record appended to benchmarks/records.jsonl,
which `_report.py` turns into RESULTS.md.

A headline figure is always a median over repeats (or alternating rounds), reported with its range:

    s = spread([3.1, 2.6, 4.3])        # {"median": 3.1, "min": 2.6, "max": 4.3, "n": 3, "values": [...]}
    fmt(s)                              # "3.10 (2.60-4.30)"   (for people)
    kv("ratio", s)                      # "ratio=3.10 ratio_range=2.60-4.30"   (for RESULT lines)
    write_result("async_vs_sync", "RESULT async_vs_sync ratio=3.10 ...", {"ratio": s}, details)
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RECORDS = ROOT / "benchmarks" / "records.jsonl"
"""Every benchmark record ever written, one JSON line each, append-only and committed: RESULTS.md and the
README's benchmark figures are regenerated from it by `_report.py` (results/*.json are local copies)."""


def spread(values) -> dict:
    """Median, min and max of repeated measurements (the values kept, rounded, for the record)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("spread() needs at least one measurement")
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals),
            "values": [round(v, 4) for v in vals]}


def fmt(s: dict | float, digits: int = 2) -> str:
    """'median (min-max)' for a spread, the plain number for a scalar."""
    if not isinstance(s, dict):
        return f"{s:.{digits}f}" if isinstance(s, float) else str(s)
    if s["n"] == 1:
        return f"{s['median']:.{digits}f} (1 run)"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def kv(key: str, s: dict | float | None, digits: int = 2) -> str:
    """A RESULT-line figure: `key=<median> key_range=<min>-<max>` (`key_runs=1` for a single run), so that
    every token of a RESULT line is one key=value and `ratio=<x>` always parses as a number."""
    if s is None:
        return f"{key}=nan"
    if not isinstance(s, dict):
        return f"{key}={fmt(s, digits)}"
    head = f"{key}={s['median']:.{digits}f}"
    if s["n"] == 1:
        return f"{head} {key}_runs=1"
    return f"{head} {key}_range={s['min']:.{digits}f}-{s['max']:.{digits}f}"


def machine() -> dict:
    """What the figures depend on: CPU model and flags that matter (bf16), cores, memory, versions."""
    info = {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), "?")
        flags = next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), [])
        info["bf16"] = "avx512_bf16" in flags or "amx_bf16" in flags
        mem_kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
        info["memory_gib"] = round(mem_kb / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


def commit(root: Path = ROOT) -> str:
    """The commit measured (of the work tree holding `root`), with '+dirty' when it has uncommitted changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha or "?") + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def write_result(name: str, result_line: str, headline: dict, details: dict | None = None,
                 out: str | Path | None = None, records: str | Path | None = RECORDS) -> Path:
    """Write benchmarks/results/<name>.json (or `out`): the RESULT line, the headline figures (spreads or
    scalars), when, where and at which commit, plus the benchmark's own details; and append the same record
    as one line to `records` (benchmarks/records.jsonl, committed; None: not appended). Returns the path."""
    if not result_line.startswith(f"RESULT {name} "):
        raise ValueError(f"result line must start with 'RESULT {name} ': {result_line!r}")
    record = {"benchmark": name, "result_line": result_line, "headline": headline,
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "commit": commit(), "machine": machine(),
              **(details or {})}
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str))
    tmp.replace(path)
    if records is not None:
        with Path(records).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    return path
