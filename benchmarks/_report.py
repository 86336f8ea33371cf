"""Write benchmarks/RESULTS.md from the JSON records in benchmarks/results/ and the recorded demo runs.

`make bench` runs it after the benchmarks; README figures are copied from the file it writes. Each
row is one benchmark's last recorded run: its headline figures as median (min-max) over the run's
repeats, the commit and date it ran at, and its RESULT line. The demo headline is the median, with
the range, of the fresh-clone `make demo` runs recorded in benchmarks/demo_runs.jsonl; record one
with

    python benchmarks/_report.py --record-demo runs/train-<stamp> [--fresh-clone]

    python benchmarks/_report.py [--out benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _common import RESULTS, ROOT, commit, fmt, machine, spread

DEMO_RUNS = ROOT / "benchmarks" / "demo_runs.jsonl"


def load_records(folder: Path = RESULTS) -> list[dict]:
    """Every benchmark record in `folder` (files without a `result_line` are older formats: skipped, named)."""
    records = []
    for path in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"skipping {path}: {e}", file=sys.stderr)
            continue
        if isinstance(rec, dict) and "result_line" in rec and "headline" in rec:
            records.append(rec)
        else:
            print(f"skipping {path}: not written by _common.write_result (rerun its benchmark)", file=sys.stderr)
    return records


def load_demo_runs(path: Path = DEMO_RUNS) -> list[dict]:
    runs = []
    for n, line in enumerate(path.read_text().splitlines() if path.exists() else [], 1):
        if line.strip():
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not a JSON object: {e}") from None
    return runs


def demo_summary(runs: list[dict]) -> dict | None:
    fresh = [r for r in runs if r.get("fresh_clone")]
    if not fresh:
        return None
    return {"runs": len(fresh), "dev_reward_after": spread(r["dev_reward_after"] for r in fresh),
            "dev_reward_before": spread(r["dev_reward_before"] for r in fresh),
            "steps": spread(r["steps"] for r in fresh), "minutes": spread(r["minutes"] for r in fresh)}


def render(records: list[dict], demo_runs: list[dict]) -> str:
    out = ["# Benchmark results", "",
           f"Written by `benchmarks/_report.py` on {time.strftime('%Y-%m-%d')} at commit {commit()} from "
           "`benchmarks/results/*.json` (each benchmark's last run). Figures are medians with (min-max) over "
           "each benchmark's repeats or alternating rounds; both arms of a benchmark ran in the same "
           "process tree, one after the other, on the same inputs.", ""]
    demo = demo_summary(demo_runs)
    if demo:
        out += ["## `make demo` on fresh clones", "",
                f"dev_reward_after **{fmt(demo['dev_reward_after'], 3)}** over {demo['runs']} fresh-clone runs, "
                f"from dev_reward_before {fmt(demo['dev_reward_before'], 3)}; steps {fmt(demo['steps'], 0)}, "
                f"minutes {fmt(demo['minutes'], 1)}.", "",
                "| run | commit | machine | before | after | steps | minutes |", "|---|---|---|---|---|---|---|"]
        out += [f"| {r.get('run', '')} | {r.get('commit', '')} | {r.get('machine', '')} | {r['dev_reward_before']:.3f} | "
                f"{r['dev_reward_after']:.3f} | {r['steps']} | {r['minutes']:.1f} |" for r in demo_runs if r.get("fresh_clone")]
        out.append("")
    machines = {json.dumps(r.get("machine", {}), sort_keys=True) for r in records}
    out += ["## Benchmarks", "", "| benchmark | headline: median (min-max) | commit | date |", "|---|---|---|---|"]
    for rec in records:
        head = ", ".join(f"{k}={fmt(v)}" for k, v in rec["headline"].items())
        out.append(f"| `{rec['benchmark']}` | {head} | {rec.get('commit', '?')} | {rec.get('date', '?')} |")
    out += ["", "RESULT lines as printed:", "", "```"] + [rec["result_line"] for rec in records] + ["```", ""]
    out += ["## Machines", ""]
    for m in sorted(machines):
        d = json.loads(m)
        out.append("- " + ", ".join(f"{k}: {v}" for k, v in d.items()))
    return "\n".join(out) + "\n"


def record_demo(run_dir: Path, fresh_clone: bool) -> dict:
    res = json.loads((run_dir / "results.json").read_text())
    m = machine()
    row = {"run": run_dir.name, "commit": commit(), "fresh_clone": fresh_clone,
           "machine": f"{m.get('cpus')}-core {'AVX512_BF16' if m.get('bf16') else 'AVX2'}",
           "dev_reward_before": round(res["dev_reward_before"], 3), "dev_reward_after": round(res["dev_reward_after"], 3),
           "steps": res["steps"], "minutes": round(res["minutes"], 1), "date": time.strftime("%Y-%m-%d")}
    with DEMO_RUNS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    ap.add_argument("--record-demo", metavar="RUN_DIR", help="append a `make demo` run's results to demo_runs.jsonl")
    ap.add_argument("--fresh-clone", action="store_true", help="the recorded demo ran on a fresh clone")
    args = ap.parse_args()
    if args.record_demo:
        print(json.dumps(record_demo(Path(args.record_demo), args.fresh_clone)))
    Path(args.out).write_text(render(load_records(), load_demo_runs()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
