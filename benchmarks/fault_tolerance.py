"""Fault injection: one training run meets every fault a long run meets, then its files are audited.

    .venv/bin/python benchmarks/fault_tolerance.py [--quick] [--steps N] [--repeats 3]

The run (`hexsearch train`, tiny random model, the offline world, a checkpoint every step) searches
through a real retrieval service (`hexsearch serve retrieval`) behind a fault proxy
(benchmarks/_fault_proxy.py) that fails 30% of tool requests: 500, 503 and 429 with Retry-After,
requests held past the tool timeout, dropped connections. While it trains, this script

    1. SIGKILLs a rollout worker once groups flow          (Ray restarts it; its groups are re-run)
    2. SIGKILLs the engine actor after step 2              (restarted, given the current weights)
    3. SIGKILLs the learner actor after step 3             (the run restarts from its newest checkpoint)
    4. SIGKILLs the whole trainer while it writes a checkpoint, and resumes it with `--resume`

Besides the spread-out faults, an outage at every 10th request fails every request for 5 s, longer than
a tool's whole retry budget, so some searches really fail and episodes see tool errors (counted as
`episodes_with_tool_errors`). Then it audits the ledger (rollouts.jsonl), the saved trajectories and the
final checkpoint:

    duplicated          consumed groups whose question key was consumed before (each must be used once)
    lost                keys handed out that are neither consumed, buffered, queued to re-run, nor
                        skipped after `max_question_attempts` failed runs
    trained_on_failures consumed episodes whose stop reason is an infrastructure failure
                        (engine_error, engine_abort, agent_error)

Negative controls: the audit is run again on copies of the run's records with one fault planted in each (a
group consumed twice, a question's trajectories removed, a trained episode marked engine_error), and must
report each; `controls_caught=<runs>/<runs>` says it did, and the script exits non-zero when it did not.

The scenario runs `--repeats` times (3; once with `--quick`, as the test suite runs it). Prints
`RESULT fault_tolerance lost=<n> duplicated=<n> trained_on_failures=<n> faults=<n> steps=<n> ...`, the
counts being the worst over the runs and faults the median, and writes
benchmarks/results/fault_tolerance.json. All three counts must be 0 in every run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from _common import RECORDS, kv, spread, write_result  # noqa: E402
from _fault_proxy import FAULTS, FaultProxy  # noqa: E402

OUTAGE_EVERY = 10
"""An outage starts at every 10th request to the retrieval service (a --quick run makes a few dozen)..."""
OUTAGE_S = 5.0
"""... and fails every request for 5 s: back-to-back failures beyond the tools' retry budget (1 + 3 tries,
backoff at most 1 s each)."""

CONFIG = """
engine: {{model: tiny-random, max_batch_size: 16, max_model_len: 1024}}
world: {{entities: 30, max_hops: 1, short_articles: true, out: {world}}}
tools: {{topk: 2, snippet_chars: 120, search_backend: url, retrieval_url: "{proxy}", index_dir: "{index}",
        cache_enabled: false, timeout_s: 2.0, retries: 3, backoff_initial_s: 0.1, backoff_max_s: 1.0,
        max_retry_after_s: 1.0}}
agent: {{prefill: tags, worked_example: true, lenient_tags: true, read_search_results: false,
        max_turns: 2, max_tool_calls: 1, max_new_tokens: 8, max_context_tokens: 1024, format_gate: false}}
run: {{root: {root}, name: faults}}
train:
  steps: {steps}
  batch_size: 2
  group_size: 2
  max_staleness: 1
  rollout_workers: 2
  filter_groups: none
  eval_questions: 2
  eval_every: 2
  save_every: 1
  keep_checkpoints: 3
  engine_health_interval_s: 0.5
  learner_max_restarts: 1
  learner_resources: {{num_cpus: 1, threads: 1}}
  engine_resources: {{num_cpus: 1, threads: 1}}
"""


def _rows(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def _step(run: Path) -> int:
    return max((r["step"] for r in _rows(run / "metrics.jsonl") if "train/reward" in r), default=0)


def _kill_actor(root: psutil.Process, name: str) -> int | None:
    """SIGKILL the first process of `root`'s tree that hosts Ray actor class `name`."""
    for p in root.children(recursive=True):
        try:
            if f"ray::{name}" in " ".join(p.cmdline()):
                os.kill(p.pid, signal.SIGKILL)
                return p.pid
        except psutil.Error:
            continue
    return None


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process it started (its local Ray included)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    psutil.wait_procs(procs, timeout=30)


class Injector(threading.Thread):
    """Walks the fault plan (module docstring) against the running trainer; records what it did."""

    def __init__(self, proc: subprocess.Popen, run: Path, deadline: float):
        super().__init__(daemon=True)
        self.proc, self.run_dir, self.deadline = proc, run, deadline
        self.done: dict[str, object] = {}
        self.error = ""

    def wait_for(self, what: str, cond) -> None:
        while not cond():
            if self.proc.poll() is not None or time.time() > self.deadline:
                raise RuntimeError(f"trainer ended or timed out while waiting for {what}")
            time.sleep(0.2)

    def run(self) -> None:
        try:
            self._plan()
        except Exception as e:  # reported in the results; the audit still runs
            self.error = f"{type(e).__name__}: {e}"

    def _plan(self) -> None:
        root, ledger = psutil.Process(self.proc.pid), self.run_dir / "rollouts.jsonl"
        self.wait_for("a group", lambda: any(e["event"] == "accept" for e in _rows(ledger)))
        self.done["rollout_worker"] = _kill_actor(root, "RolloutWorker")
        self.wait_for("step 2", lambda: _step(self.run_dir) >= 2)
        self.done["engine"] = _kill_actor(root, "EngineActor")
        self.wait_for("engine restore", lambda: any(e["event"] == "engine_restored" for e in _rows(ledger)))
        self.wait_for("step 3", lambda: _step(self.run_dir) >= 3)
        self.done["learner"] = _kill_actor(root, "LearnerWorker")
        self.wait_for("the restart from a checkpoint",
                      lambda: any(e["event"] == "resume" for e in _rows(ledger)))
        self.wait_for("a step after the restart", lambda: _step(self.run_dir) >= 4)
        ckpts = self.run_dir / "checkpoints"
        while self.proc.poll() is None and time.time() < self.deadline:
            writing = [p.name for p in ckpts.glob(".tmp-step-*")] if ckpts.exists() else []
            if writing:
                kill_tree(self.proc.pid)
                self.done["trainer_mid_checkpoint"] = writing[0]
                self.done["checkpoint_left_unfinished"] = (ckpts / writing[0]).exists()
                return
            time.sleep(0.001)
        raise RuntimeError("no checkpoint write was caught before the run ended")


def audit(run: Path, steps: int, batch_size: int, n_items: int) -> dict:
    """The three counts of the module docstring, from the run's files, and the negative controls."""
    from trainer import checkpoint

    state, buffer = checkpoint.load(checkpoint.latest(run / "checkpoints"))
    records = (_rows(run / "rollouts.jsonl"), _rows(run / "trajectories" / "train.jsonl"), state["stream"],
               [g.key for g in buffer], steps, batch_size, n_items)
    return {**audit_records(*records), "controls": negative_controls(*records)}


def audit_records(events: list[dict], trajs: list[dict], stream: dict, buffered: list[str], steps: int,
                  batch_size: int, n_items: int) -> dict:
    """The audit over a run's records: the ledger's events, the trained trajectories, the final checkpoint's
    question stream (`epoch`, `position`, `retry`) and the keys of its buffered groups."""
    from trainer.controller import INFRA_STOPS

    groups = sorted({(t["meta"]["key"], t["meta"]["step"]) for t in trajs})
    keys = [k for k, _ in groups]
    duplicated = len(keys) - len(set(keys))
    trained_on_failures = sum(t["stop_reason"] in INFRA_STOPS for t in trajs)
    handed_out = {f"{e}:{i}" for e in range(stream["epoch"]) for i in range(n_items)}
    handed_out |= {f"{stream['epoch']}:{i}" for i in range(stream["position"])}
    last_admit = {e["key"]: n for n, e in enumerate(events) if e["event"] == "admit"}
    skipped = {e["key"] for n, e in enumerate(events) if e["event"] == "skip" and last_admit.get(e["key"], -1) < n}
    accounted = set(keys) | set(buffered) | set(stream["retry"]) | skipped
    per_step = [sum(s == k for _, s in groups) for k in range(1, steps + 1)]
    counts = {e: sum(x["event"] == e for x in events) for e in
              ("lost", "failed", "skip", "engine_restored", "engine_hung", "learner_lost", "resume")}
    tool_errors = sum(1 for t in trajs if any(c.get("error") for c in t.get("tool_calls", [])))
    return {"lost": len(handed_out - accounted), "duplicated": duplicated, "trained_on_failures": trained_on_failures,
            "unknown_consumed": len(set(keys) - handed_out), "groups_per_step": per_step,
            "steps_complete": per_step == [batch_size] * steps, "skipped": len(skipped), "ledger": counts,
            "episodes_with_tool_errors": tool_errors}


def negative_controls(events: list[dict], trajs: list[dict], stream: dict, buffered: list[str], steps: int,
                      batch_size: int, n_items: int) -> dict[str, bool]:
    """Whether the audit catches each fault when one is planted in a copy of a run's records: a group trained
    twice (its key consumed again at a later step), a lost question (its trajectories gone) and a trained
    episode that failed (stop reason engine_error). An audit that reports 0 on these proves nothing."""
    if not trajs:
        return {"duplicate": False, "lost": False, "trained_failure": False}
    key = trajs[0]["meta"]["key"]
    later = max(t["meta"]["step"] for t in trajs) + 1
    planted = {
        "duplicate": [*trajs, *({**t, "meta": {**t["meta"], "step": later}} for t in trajs if t["meta"]["key"] == key)],
        "lost": [t for t in trajs if t["meta"]["key"] != key],
        "trained_failure": [{**trajs[0], "stop_reason": "engine_error"}, *trajs[1:]],
    }
    base = audit_records(events, trajs, stream, buffered, steps, batch_size, n_items)
    field = {"duplicate": "duplicated", "lost": "lost", "trained_failure": "trained_on_failures"}
    return {name: audit_records(events, rows, stream, [b for b in buffered if b != key] if name == "lost" else buffered,
                                steps, batch_size, n_items)[field[name]] > base[field[name]]
            for name, rows in planted.items()}


def scenario(steps: int, quick: bool, timeout: float, workdir: Path | None = None) -> dict:
    """One faulted run, resumed, then audited, in `workdir` (default: a new folder under the system's temp)."""
    t0 = time.time()
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="hexsearch-faults-", dir=workdir))
    world = tmp / "world"
    env = {**os.environ, "HEXSEARCH_QUIET": "1", "PYTHONPATH": str(ROOT)}
    # the world and its index first: the retrieval service serves that index
    from hexsearch.config import load_config
    from tools.index import default_index
    from world import QA_FILES, resolve_world

    (tmp / "cfg.yaml").write_text(CONFIG.format(world=world, proxy="", index="", root=tmp / "runs", steps=steps))
    cfg = load_config(tmp / "cfg.yaml")
    index = default_index(resolve_world(cfg.world))
    n_items = sum(1 for line in (world / QA_FILES["train"]).read_text().splitlines() if line.strip())
    addr = tmp / "retrieval.addr"
    service = subprocess.Popen([sys.executable, "-m", "hexsearch.cli", "--quiet", "serve", "retrieval", "--index",
                                str(index), "--port", "0", "--addr-file", str(addr), "--worker", "thread"],
                               env=env, stdout=subprocess.DEVNULL, stderr=(tmp / "retrieval.log").open("w"))
    # outages: every request fails for OUTAGE_S, longer than a tool's whole retry budget (retries 3, backoff
    # and Retry-After at most 1 s), so some searches really fail and episodes see tool errors
    proxy = FaultProxy("", rate=0.3, hang_s=3.0, outage_every=OUTAGE_EVERY, outage_s=OUTAGE_S)
    try:
        while not addr.exists():
            if service.poll() is not None or time.time() - t0 > 300:
                raise RuntimeError("retrieval service did not start: " + (tmp / "retrieval.log").read_text()[-2000:])
            time.sleep(0.2)
        proxy.upstream = f"http://{addr.read_text().strip()}"
        url = proxy.start()
        (tmp / "cfg.yaml").write_text(CONFIG.format(world=world, proxy=url, index=index, root=tmp / "runs", steps=steps))
        run = tmp / "runs" / "faults"
        cmd = [sys.executable, "-m", "hexsearch.cli", "--quiet", "train"]
        log1 = (tmp / "first.log").open("w")
        first = subprocess.Popen([*cmd, str(tmp / "cfg.yaml")], env=env, stdout=log1, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        injector = Injector(first, run, deadline=t0 + timeout)
        injector.start()
        injector.join(timeout)
        kill_tree(first.pid)
        first.wait()
        second = subprocess.run([*cmd, "--resume", str(run)], env=env, capture_output=True, text=True,
                                timeout=max(60.0, timeout - (time.time() - t0)))
        (tmp / "second.log").write_text(second.stdout + second.stderr)
        results = json.loads((run / "results.json").read_text()) if (run / "results.json").exists() else {}
        report = audit(run, steps, 2, n_items)
    finally:
        proxy.stop()
        service.terminate()
        service.wait(30)
    injected = {k: v for k, v in proxy.stats.items() if k in FAULTS}
    outage = {"outages": proxy.stats["outages"], "outage_requests": proxy.stats["outage"]}
    kills = {k: v for k, v in injector.done.items() if k in ("rollout_worker", "engine", "learner",
                                                             "trainer_mid_checkpoint")}
    faults = sum(injected.values()) + sum(v is not None for v in kills.values())
    out = {"steps": results.get("steps", 0), "faults": faults + outage["outage_requests"], "tool_faults": injected,
           **outage,
           "tool_requests": proxy.stats["requests"], "kills": injector.done, "injector_error": injector.error,
           "resume_exit_code": second.returncode, "seconds": round(time.time() - t0, 1), "run_dir": str(run),
           "quick": quick, **report}
    if second.returncode != 0:
        print(second.stdout[-2000:] + second.stderr[-3000:], file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=0, help="training steps (default 12; 6 with --quick)")
    ap.add_argument("--quick", action="store_true", help="the short scenario the test suite runs (one run)")
    ap.add_argument("--repeats", type=int, default=0, help="independent faulted runs (default 3; 1 with --quick)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/fault_tolerance.json)")
    ap.add_argument("--timeout", type=float, default=1500.0, help="seconds before one run gives up")
    ap.add_argument("--no-record", action="store_true", help="do not append to benchmarks/records.jsonl")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="folder for each run's world, logs and run folder (default: the system's temp; they are "
                         "kept there for inspection, ~110 MB a run)")
    args = ap.parse_args()
    steps = args.steps or (6 if args.quick else 12)
    runs = []
    for r in range(args.repeats or (1 if args.quick else 3)):
        runs.append(scenario(steps, args.quick, args.timeout, args.workdir))
        print(f"run {r + 1}: " + json.dumps(runs[-1], indent=1), flush=True)
    last = runs[-1]
    controls = [all(x["controls"].values()) for x in runs]

    def worst(key: str) -> int:   # the audit counts must be 0 in every run
        return max(x[key] for x in runs)
    faults, seconds = spread(x["faults"] for x in runs), spread(x["seconds"] for x in runs)
    tool_rate = spread(sum(x["tool_faults"].values()) / max(x["tool_requests"], 1) for x in runs)
    kills = sum(v is not None for k, v in last["kills"].items()
                if k in ("rollout_worker", "engine", "learner", "trainer_mid_checkpoint"))
    line = (f"RESULT fault_tolerance lost={worst('lost')} duplicated={worst('duplicated')} "
            f"trained_on_failures={worst('trained_on_failures')} faults={faults['median']:.0f} "
            f"steps={min(x['steps'] for x in runs)} runs={len(runs)} faults_range={faults['min']:.0f}-{faults['max']:.0f} "
            f"{kv('tool_fault_rate', tool_rate)} kills={kills} outages={sum(x['outages'] for x in runs)} "
            f"episodes_with_tool_errors={sum(x['episodes_with_tool_errors'] for x in runs)} "
            f"controls_caught={sum(controls)}/{len(runs)} {kv('seconds', seconds, 0)}")
    write_result("fault_tolerance", line, {"lost": worst("lost"), "duplicated": worst("duplicated"),
                                           "trained_on_failures": worst("trained_on_failures"), "faults": faults,
                                           "seconds": seconds},
                 {**last, "runs": runs}, args.out, records=None if args.no_record else RECORDS)
    print(line)
    if not all(controls):  # the audit missed a planted fault: its zeros above prove nothing
        sys.exit(f"fault_tolerance: the audit missed a planted fault: {[x['controls'] for x in runs]}")


if __name__ == "__main__":
    main()
