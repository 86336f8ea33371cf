"""`hexsearch view` on a run of 100,000 trajectories: time until the first page of the trajectory table is
served, vs a viewer that parses every line before showing anything (the baseline: `json.loads` of each
whole line, what reading the JSONL naively costs).

The run folder holds 100,000 trajectory lines of the quickstart's size (copied from the newest run under
runs/ when there is one, else synthesised: one 400-token segment, a tool call, meta), ~7 KB each.
Ours is measured through the real server over HTTP on 127.0.0.1: `first` (no cached index: the first
8 MB are indexed before answering, the rest in a background thread) and `cached` (the index saved by the
first open is reused). Rounds alternate the arms; figures are medians with their range.

    .venv/bin/python benchmarks/viewer_open.py [--lines 100000] [--rounds 3]
    RESULT viewer_open ratio=<baseline / first> first_s=... cached_s=... full_index_s=... baseline_s=...
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import fmt, kv, spread, write_result  # noqa: E402


def source_lines(root: Path) -> list[str]:
    """Real trajectory lines of the newest training run, else synthetic ones of the same shape."""
    runs = sorted(root.glob("runs/train-*/trajectories/train.jsonl"), key=lambda p: p.stat().st_mtime)
    if runs:
        return [line for line in runs[-1].read_text().splitlines() if line.strip()][:500]
    rng = random.Random(0)
    out = []
    for i in range(100):
        n = 400
        seg = {"token_ids": [rng.randrange(49152) for _ in range(n)], "loss_mask": [0] * 380 + [1] * 20,
               "logprobs": [0.0] * 380 + [-rng.random() for _ in range(20)], "versions": [-1] * 380 + [3] * 20}
        out.append(json.dumps({"question_id": f"q{i}", "question": f"In what year was place {i} founded?",
                               "gold": ["1642"], "segments": [seg], "tool_calls": [
                                   {"turn": 0, "name": "search", "args": {"query": f"place {i}"}, "latency_s": 0.01,
                                    "cost": 0.0, "error": None, "cached": False, "summary": "[1] ..." * 20}],
                               "prediction": "1642", "stop_reason": "answered", "num_turns": 2, "format_errors": 0,
                               "reward": 1.0, "reward_info": {"f1": 1.0}, "timings": {"total": 1.0}, "group_id": f"{i}:0#0",
                               "meta": {"step": i // 32, "generated_tokens": 20}}, separators=(",", ":")))
    return out


def make_run(folder: Path, lines: int, src: list[str]) -> int:
    (folder / "trajectories").mkdir(parents=True)
    (folder / "config.yaml").write_text("engine:\n  model: smollm2-135m-instruct\n")
    with (folder / "trajectories" / "train.jsonl").open("w") as f:
        for i in range(lines):
            d = json.loads(src[i % len(src)])
            d["question_id"], d["group_id"] = f"q{i}", f"{i // 4}:0#0"
            f.write(json.dumps(d, separators=(",", ":")) + "\n")
    return (folder / "trajectories" / "train.jsonl").stat().st_size


def baseline(path: Path) -> float:
    t0 = time.perf_counter()
    with path.open("rb") as f:
        rows = [json.loads(line) for line in f]
    assert rows
    return time.perf_counter() - t0


def ours(run: Path) -> tuple[float, float]:
    """(seconds to the first page, seconds until the whole file is indexed)."""
    from hexsearch.viewer.server import ViewerServer

    t0 = time.perf_counter()
    server = ViewerServer([run]).start()
    page = json.loads(urllib.request.urlopen(server.url + "api/run/0/trajectories?limit=50", timeout=60).read())
    first = time.perf_counter() - t0
    assert len(page["rows"]) == 50, page
    server.api.runs[0].indexes["train.jsonl"].wait(120)
    full = time.perf_counter() - t0
    server.close()
    return first, full


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="viewer-open-"))
    os.environ["HEXSEARCH_CACHE"] = str(work / "cache")
    try:
        size = make_run(work / "run", args.lines, source_lines(Path(__file__).resolve().parents[1]))
        path = work / "run" / "trajectories" / "train.jsonl"
        base, first, full, cached = [], [], [], []
        for r in range(args.rounds):
            shutil.rmtree(work / "cache", ignore_errors=True)
            arms = [("baseline", lambda: base.append(baseline(path))), ("ours", None)]
            for name, fn in arms if r % 2 == 0 else arms[::-1]:
                if name == "baseline":
                    fn()
                else:
                    f, t = ours(work / "run")
                    first.append(f)
                    full.append(t)
                    cached.append(ours(work / "run")[0])
        s_base, s_first, s_cached, s_full = spread(base), spread(first), spread(cached), spread(full)
        ratio = spread([b / f for b, f in zip(base, first, strict=True)])
        line = (f"RESULT viewer_open {kv('ratio', ratio)} {kv('first_s', s_first)} {kv('cached_s', s_cached)} "
                f"{kv('full_index_s', s_full)} {kv('baseline_s', s_base)} lines={args.lines} mb={size / 1e6:.0f}")
        print(f"{args.lines} trajectories, {size / 1e6:.0f} MB: first page {fmt(s_first)} s (whole index "
              f"{fmt(s_full)} s in the background), cached {fmt(s_cached)} s; parse-everything baseline "
              f"{fmt(s_base)} s")
        print(line)
        write_result("viewer_open", line, {"ratio": ratio, "first_s": s_first, "cached_s": s_cached,
                                           "full_index_s": s_full, "baseline_s": s_base},
                     {"lines": args.lines, "bytes": size})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
