"""Soak: does a long run stay healthy? A few hundred steps of the tiny-model agent workload.

ASearcher users report rollout time exploding after 200-250 steps and training hanging. This runs
`hexsearch train` for `--steps` steps (tiny random model, the offline world, web-like tool latency
off, checkpoints every 50 steps, trajectories written) in a subprocess and, every 2 s, samples the
resident memory and open files of its whole process tree (driver, Ray's GCS and raylet, engine,
learner and rollout actors). Afterwards it reads the run's metrics and files.

Figures (a "window" is 50 steps; the first window starts at step 6, after models and the index loaded):
- step_time_ratio = mean `time/step_s` of the last window / of the first window (flat: ~1; bound 1.2);
- rss_growth_mb = median tree RSS while the last window ran - median while the first window ran (also
  per role: driver, each actor class, gcs_server, raylet), and the same from the window ending at
  mid-run to the last one (`rss_growth_mb_second_half`: growth that levels off is caches filling up);
- open_files_growth = the same for open file descriptors;
- file_growth_ratio = bytes per step written to metrics.jsonl + trajectories/train.jsonl in the second
  half / in the first half (linear growth: ~1).

Each figure is the median over `--repeats` independent runs, with its range (open files: the largest).
Prints `RESULT soak step_time_ratio=<x> rss_growth_mb=<y> open_files_growth=<z> steps=<n> ...` and writes
benchmarks/results/soak.json.

    .venv/bin/python benchmarks/soak.py [--steps 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from _common import kv, spread, write_result

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 50
SKIP = 5

WORKLOAD = """
engine: {{model: tiny-random, max_batch_size: 64, max_model_len: 1024}}
world: {{entities: 60, max_hops: 1, short_articles: true, out: {world}}}
tools: {{topk: 2, snippet_chars: 160}}
agent: {{prefill: tags, worked_example: true, lenient_tags: true, read_search_results: false,
        max_turns: 2, max_tool_calls: 1, max_new_tokens: 16, max_context_tokens: 1024}}
run: {{root: {root}, name: soak}}
train:
  steps: {steps}
  batch_size: 4
  group_size: 4
  rollout_workers: 2
  filter_groups: none
  eval_questions: 0
  eval_every: 0
  save_every: 50
  engine_resources: {{num_cpus: 1, threads: 1}}
  learner_resources: {{num_cpus: 1, threads: 1}}
"""


def _role(p: psutil.Process, root: int) -> str:
    """A process's role: driver, a Ray actor class (`ray::EngineActor`), gcs_server, raylet, ..."""
    if p.pid == root:
        return "driver"
    name = p.name().split(".")[0]  # `ray::EngineActor.generate` while it runs a method: the actor's class
    return name if name.startswith("ray::") or name in ("gcs_server", "raylet") else "other"


def _rss_parts(pid: int) -> dict[str, float]:
    """RSS split by kind (MB): `anon` (heap: tensors, Python objects, allocator caches), `shmem` (shared memory
    this process has touched: Ray's object store pages, counted again in every process that maps them) and
    `file` (mapped files: libraries, safetensors)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            for kind in ("RssAnon", "RssFile", "RssShmem"):
                if line.startswith(kind + ":"):
                    out[kind[3:].lower()] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


def tree_sample(pid: int) -> tuple[float, int, dict[str, float]] | None:
    """(RSS in MB, open file descriptors, MB per role and per `role/anon|shmem|file`) of a process and all its
    descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    rss, fds, roles = 0, 0, {}
    for p in procs:
        try:
            mine = p.memory_info().rss
            fds += p.num_fds()
            role = _role(p, pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += mine
        roles[role] = roles.get(role, 0.0) + mine / 2**20
        for kind, mb in _rss_parts(p.pid).items():
            roles[f"{role}/{kind}"] = roles.get(f"{role}/{kind}", 0.0) + mb
    return rss / 2**20, fds, roles


def window_of(samples: list[tuple], t0: float, t1: float) -> list[tuple[float, int]]:
    return [(rss, fds) for t, rss, fds, _ in samples if t0 <= t <= t1]


def role_growth(samples: list[tuple], early: tuple[float, float], late: tuple[float, float]) -> dict[str, float]:
    """Median RSS growth (MB) per role between two time spans: where the memory goes."""
    roles = {r for *_, by in samples for r in by}
    out = {}
    for role in sorted(roles):
        a = [by.get(role, 0.0) for t, _, _, by in samples if early[0] <= t <= early[1]]
        b = [by.get(role, 0.0) for t, _, _, by in samples if late[0] <= t <= late[1]]
        if a and b:
            out[role] = round(statistics.median(b) - statistics.median(a), 1)
    return out


def soak_once(steps: int) -> dict:
    """One run of `steps` steps, sampled every 2 s; its figures."""
    tmp = Path(tempfile.mkdtemp(prefix="hex-soak-"))
    cfg = tmp / "soak.yaml"
    cfg.write_text(WORKLOAD.format(world=tmp / "world", root=tmp / "runs", steps=steps))
    env = {**os.environ, "HEXSEARCH_QUIET": "1"}
    t_start = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "hexsearch.cli", "train", str(cfg)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples: list[tuple] = []

    def sample() -> None:
        while proc.poll() is None:
            got = tree_sample(proc.pid)
            if got is not None:
                samples.append((time.time(), *got))
            time.sleep(2.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"training failed ({proc.returncode}):\n{err[-3000:]}")
    run = tmp / "runs" / "soak"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "time/step_s" in r]
    first, last = steps[SKIP:SKIP + WINDOW], steps[-WINDOW:]
    step_ratio = statistics.mean(r["time/step_s"] for r in last) / statistics.mean(r["time/step_s"] for r in first)

    def span(rows_: list[dict]) -> tuple[float, float]:
        return rows_[0]["time"] - rows_[0]["time/step_s"], rows_[-1]["time"]

    early, late = window_of(samples, *span(first)), window_of(samples, *span(last))
    by_role = role_growth(samples, span(first), span(last))
    middle = steps[len(steps) // 2 - WINDOW:len(steps) // 2]  # growth over the second half: does it level off?
    mid = window_of(samples, *span(middle))
    by_role_second_half = role_growth(samples, span(middle), span(last))
    late_growth = statistics.median(r for r, _ in late) - statistics.median(r for r, _ in mid)
    rss_growth = statistics.median(r for r, _ in late) - statistics.median(r for r, _ in early)
    fd_growth = statistics.median(f for _, f in late) - statistics.median(f for _, f in early)
    files = [run / "metrics.jsonl", run / "trajectories" / "train.jsonl"]
    per_step = _bytes_per_step(files, len(steps))
    result = {
        "steps": len(steps), "step_time_ratio": round(step_ratio, 3),
        "step_s_first_window": round(statistics.mean(r["time/step_s"] for r in first), 3),
        "step_s_last_window": round(statistics.mean(r["time/step_s"] for r in last), 3),
        "rss_growth_mb": round(rss_growth, 1), "rss_mb_first_window": round(statistics.median(r for r, _ in early), 1),
        "rss_mb_last_window": round(statistics.median(r for r, _ in late), 1), "open_files_growth": fd_growth,
        "file_growth_ratio": per_step, "rss_growth_mb_by_role": by_role,
        "rss_growth_mb_by_role_second_half": by_role_second_half,
        "rss_growth_mb_second_half": round(late_growth, 1), "samples": len(samples), "wall_minutes": round((time.time() - t_start) / 60, 1),
        "bounds": {"step_time_ratio": 1.2}}
    print(json.dumps(result, indent=2), flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3, help="independent runs (figures: median and range)")
    args = ap.parse_args()
    if args.steps < SKIP + 2 * WINDOW:
        raise SystemExit(f"--steps must be at least {SKIP + 2 * WINDOW} (two {WINDOW}-step windows after warm-up)")
    runs = [soak_once(args.steps) for _ in range(args.repeats)]
    head = {k: spread(r[k] for r in runs if r[k] is not None) for k in ("step_time_ratio", "rss_growth_mb", "rss_growth_mb_second_half",
                                                      "open_files_growth", "file_growth_ratio")}
    line = (f"RESULT soak {kv('step_time_ratio', head['step_time_ratio'], 3)} "
            f"{kv('rss_growth_mb', head['rss_growth_mb'], 1)} "
            f"open_files_growth={head['open_files_growth']['max']:.0f} steps={min(r['steps'] for r in runs)} "
            f"runs={len(runs)} {kv('rss_growth_mb_second_half', head['rss_growth_mb_second_half'], 1)} "
            f"{kv('file_growth_ratio', head['file_growth_ratio'], 3)} bound_step_time_ratio=1.2")
    write_result("soak", line, head, {"runs": runs, "bounds": {"step_time_ratio": 1.2}})
    print(line)


def _bytes_per_step(files: list[Path], steps: int) -> float | None:
    """Bytes written per step in the second half of the run / in the first half, from the step field of
    each line (metrics rows carry `step`; trajectories carry `meta.step`)."""
    halves = [0, 0]
    for path in files:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            step = row.get("step", (row.get("meta") or {}).get("step"))
            if isinstance(step, int) and step > SKIP:
                halves[step > steps // 2] += len(line) + 1
    return round(halves[1] / halves[0], 3) if halves[0] else None


if __name__ == "__main__":
    main()
