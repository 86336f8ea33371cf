"""The heterogeneity-aware planner against the best homogeneous plan at equal budget, exhaustive search,
and a real run on this machine.

1. Scenarios (AReaL-Hex's): 1.5B, 7B, 14B models (configs/planner/models/), the math-reasoning workload,
   a pool of compute-rich H800 and bandwidth-rich H20 with AReaL-Hex's device figures, prices and links and the
   budget of N H800 (N = 64 and 1,024; configs/planner/clusters/h800-h20-pool*.yaml). The baseline is the best plan on one GPU type only
   with as many devices as the same budget buys. Both plans are evaluated by the discrete-event
   simulator; ratio = simulated hetero / simulated homogeneous samples/s (the cost model's ratio beside it).
   Also the cost ratio at equal throughput: the homogeneous plan's $/h over the cheapest heterogeneous plan
   that reaches its (cost-model) samples/s.
2. Gap: on small instances (one node of 4 H800 + one of 4 H20, budgets, staleness 0 and 4) the MILP's
   throughput against exhaustive search over every assignment.
3. Solve time: phases 1 + 2 (all rounds), repeated --repeats times; median, min, max.
4. Prediction error (--validate; otherwise the last stored validation is reused, and the RESULT line says
   so: `validation=reused_<date>`, `recomputed_<date>` with --predict-only, `fresh` or `none`):
   `hexsearch plan profile` measures this CPU (engine + learner + weight sync, one core per device),
   then for each placement the simulator predicts trained samples/s and a real `hexsearch train` run of
   the quickstart with that placement measures it (steps 2..N; B G / step time, with the standard error of
   the mean step and each half's figure); the workload (prompt, shared prefix, generated and tool tokens per
   trajectory, turns, the fraction of groups dynamic filtering kept for the loss) is read from that run's
   trajectories and metrics. Each phase (training at each step's kept groups, weight sync, the trainer's
   wait) is compared with the model's. Hold the CPU alone while it runs (`flock /tmp/hexsearch-cpu.lock`).

Prints `RESULT planner ratio=<geomean over scenarios> gap=<max> solve_s=<median at 1,024> prediction_error=<max>`
followed by the scenarios' range and each ratio, the cost ratio at equal throughput (geomean, range) and the
measurement's largest relative standard error, and writes benchmarks/results/planner.json.

    .venv/bin/python benchmarks/planner.py [--validate | --predict-only] [--repeats 3] [--steps 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import spread, write_result  # noqa: E402

from trainer.planner.config import PlanConfig  # noqa: E402
from trainer.planner.costs import tokens_per_trajectory, train_step_s  # noqa: E402
from trainer.planner.exhaustive import exhaustive  # noqa: E402
from trainer.planner.milp import solve  # noqa: E402
from trainer.planner.planner import homogeneous_best, make_plan  # noqa: E402
from trainer.planner.problem import Inputs, build_problem  # noqa: E402
from trainer.planner.simulator import simulate  # noqa: E402
from trainer.planner.specs import Cluster, ModelSpec, NodePool, WorkloadSpec, load_cluster, load_spec  # noqa: E402

PLANNER = ROOT / "configs" / "planner"
OUT = ROOT / "benchmarks" / "results" / "planner.json"
MODELS = ["qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b"]
SIZES = {64: ("h800-h20-pool.yaml", 512, 30), 1024: ("h800-h20-pool-1024.yaml", 4096, 8)}
"""GPUs of the homogeneous baseline -> (cluster file, batch size in questions, simulated steps). 512: AReaL's batch,
which AReaL-Hex uses (configs/planner/workloads/math.yaml); 4096 at 1,024 GPUs is this benchmark's own scaling."""


def scenarios(repeats: int) -> list[dict]:
    rows = []
    for size, (cluster_file, batch, steps) in SIZES.items():
        cluster, types = load_cluster(PLANNER / "clusters" / cluster_file)
        budget = size * types["H800"].price_per_hour
        for name in MODELS:
            w = dataclasses.replace(load_spec(PLANNER / "workloads" / "math.yaml", WorkloadSpec), batch_size=batch)
            inp = Inputs(cluster, types, load_spec(PLANNER / "models" / f"{name}.yaml", ModelSpec), w,
                         PlanConfig(budget_per_hour=budget, simulate_steps=steps))
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                r = make_plan(inp, simulate_plan=False, explain=False)
                times.append(time.perf_counter() - t0)
            sim = simulate(r.problem, r.solution, w, steps)
            gpu, homo_plan = homogeneous_best(inp, budget)
            homo = homo_plan.solution
            homo_sim = simulate(homo_plan.problem, homo, w, steps)
            # equal throughput: the cheapest heterogeneous plan that reaches the homogeneous plan's samples/s
            cheap = make_plan(dataclasses.replace(inp, cfg=dataclasses.replace(inp.cfg, budget_per_hour=0.0,
                                                                               target_samples_per_s=homo.throughput)),
                              simulate_plan=False, explain=False)
            row = {"gpus": size, "model": name, "budget_per_hour": budget,
                   "cost_ratio_at_equal_throughput": homo.cost / cheap.solution.cost,
                   "hetero": {"devices": r.solution.devices, "cost": r.solution.cost,
                              "predicted": r.solution.throughput, "simulated": sim.throughput,
                              "trainer": dataclasses.asdict(r.problem.train[r.solution.train]),
                              "refused_groups": sim.refused, "staleness": sim.staleness},
                   "homogeneous": {"gpu": gpu, "devices": homo.devices, "cost": homo.cost,
                                   "predicted": homo.throughput, "simulated": homo_sim.throughput},
                   "ratio_simulated": sim.throughput / homo_sim.throughput,
                   "ratio_model": r.solution.throughput / homo.throughput,
                   "solve_s": spread(times)}
            rows.append(row)
            print(f"{size:5d} GPUs {name:13s} hetero {sim.throughput:9.2f} samples/s {r.solution.devices} "
                  f"vs {gpu}-only {homo_sim.throughput:9.2f} {homo.devices}: ratio {row['ratio_simulated']:.3f} "
                  f"(model {row['ratio_model']:.3f}), cost ratio at equal throughput {row['cost_ratio_at_equal_throughput']:.3f}, "
                  f"solve {row['solve_s']['median']:.2f}s", flush=True)
    return rows


def gaps() -> list[dict]:
    rows = []
    cluster = Cluster(pools=[NodePool("h800", "H800", 1, 4, 50, "a"), NodePool("h20", "H20", 1, 4, 50, "b")])
    types = load_cluster(PLANNER / "clusters" / "h800-h20-64.yaml")[1]
    for name in MODELS:
        for eta in (0, 4):
            for budget in (0.0, 24.0, 14.0):
                w = dataclasses.replace(load_spec(PLANNER / "workloads" / "math.yaml", WorkloadSpec), batch_size=16,
                                        group_size=8, max_staleness=eta)
                p = build_problem(Inputs(cluster, types, load_spec(PLANNER / "models" / f"{name}.yaml", ModelSpec), w,
                                         PlanConfig(budget_per_hour=budget, gen_tp=[1, 2], train_tp=[1, 2],
                                                    train_pp=[1, 2], batch_ladder=2)))
                milp, (best, seen) = solve(p), exhaustive(p)
                if best is None:
                    continue
                rows.append({"model": name, "max_staleness": eta, "budget": budget, "assignments": seen,
                             "milp": milp.throughput if milp else 0.0, "exhaustive": best.throughput,
                             "gap": max(0.0, (best.throughput - (milp.throughput if milp else 0.0)) / best.throughput)})
    return rows


def _run(cmd: list[str], timeout: float) -> str:
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return out.stdout


PLACEMENTS = {
    "async: 1 engine + 1 learner (the plan), max_staleness=1": [],
    "sync: 1 engine + 1 learner (the plan), max_staleness=0": ["train.max_staleness=0"],
}
"""Real runs: `hexsearch train <plan file> <overrides>`; the plan file extends configs/quickstart.yaml."""
COMMON = ["train.eval_questions=2", "train.save_every=0", "train.time_budget_min=0"]
"""No time budget: a run trains exactly `--steps` steps (the measured spread needs all of them)."""


def workload_of(run: Path, base: WorkloadSpec) -> WorkloadSpec:
    """Tokens per trajectory as the run's trajectories have them: prompt (before the first policy token) and the
    prefix all prompts share, generated (loss mask 1), tool results (the rest); turns per trajectory."""
    prompts, gens, tools, turns = [], [], [], []
    shared: list[int] | None = None
    for line in (run / "trajectories" / "train.jsonl").read_text().splitlines():
        t = json.loads(line)
        ids = t["segments"][0]["token_ids"]
        if shared is None:
            shared = list(ids)
        n = next((i for i, (a, b) in enumerate(zip(shared, ids, strict=False)) if a != b), min(len(shared), len(ids)))
        shared = shared[:n]
        mask = [m for seg in t["segments"] for m in seg["loss_mask"]]
        first = t["segments"][0]["loss_mask"].index(1) if 1 in t["segments"][0]["loss_mask"] else len(mask)
        prompts.append(first)
        gens.append(sum(mask))
        tools.append(len(mask) - first - sum(mask))
        turns.append(t["num_turns"])
    n_turns = max(1, round(statistics.mean(turns)))
    gens_sorted = sorted(gens)
    return dataclasses.replace(base, prompt_tokens=statistics.mean(prompts), shared_prefix_tokens=len(shared or []),
                               response_tokens_mean=statistics.mean(gens),
                               response_tokens_p99=gens_sorted[int(0.99 * (len(gens) - 1))], turns=n_turns,
                               tool_tokens_per_turn=statistics.mean(tools) / max(n_turns - 1, 1),
                               tool_latency_median_s=0.0, tool_latency_p99_s=0.0)


def validate(steps: int, work: Path) -> list[dict]:
    """Profile this CPU, plan the quickstart on it, run each placement for real, predict each."""
    work.mkdir(parents=True, exist_ok=True)
    device, plan = work / "this-cpu.yaml", work / "plan.yaml"
    cli = [sys.executable, "-m", "hexsearch.cli"]
    quick = load_spec(PLANNER / "workloads" / "quickstart-cpu.yaml", WorkloadSpec)
    print(_run([*cli, "plan", "profile", "configs/quickstart.yaml", "--batch", "48", "--prompt-tokens",
                str(round(quick.prompt_tokens)), "--shared-prefix-tokens", str(round(quick.shared_prefix_tokens)),
                "--train-tokens", str(round(tokens_per_trajectory(quick))), "--policy-tokens",
                str(round(quick.response_tokens_mean)), "--out", str(device)], 600),
          flush=True)
    print(_run([*cli, "plan", "--cluster", str(device), "--model", str(PLANNER / "models" / "smollm2-135m.yaml"),
                "--workload", str(PLANNER / "workloads" / "quickstart-cpu.yaml"), "--base", "configs/quickstart.yaml",
                "--out", str(plan), "plan.gen_tp=[1]", "plan.train_tp=[1]", "plan.train_pp=[1]"], 300), flush=True)
    rows = []
    for label, extra in PLACEMENTS.items():
        name = f"plan-{len(rows)}-{int(time.time())}"
        _run([*cli, "train", str(plan), *COMMON, *extra, f"train.steps={steps}", f"run.root={work}",
              f"run.name={name}"], 120 + 90 * steps)
        rows.append(predict(label, work / name, device))
    return rows


def predict(label: str, run: Path, device: Path) -> dict:
    """Measured trained samples/s of a run (steps 2..N) against the simulator's prediction for its placement,
    with the device profile `device` and the workload read from the run's trajectories."""
    from hexsearch.config import load_config
    from trainer.planner.milp import evaluate

    cluster, types = load_cluster(device)
    cfg = load_config(run / "config.yaml")
    t = cfg.train
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    step_rows = [m for m in metrics if "time/step_s" in m]
    measured = t.batch_size * t.group_size * len(step_rows[1:]) / sum(m["time/step_s"] for m in step_rows[1:])
    kept = [m["train/kept_groups"] for m in step_rows if "train/kept_groups" in m]
    w = dataclasses.replace(workload_of(run, WorkloadSpec()), batch_size=t.batch_size, group_size=t.group_size,
                            max_staleness=t.max_staleness, max_inflight_trajectories=t.max_inflight_trajectories,
                            trained_fraction=statistics.mean(kept) / t.batch_size if kept else 1.0)
    inp = Inputs(cluster, types, load_spec(PLANNER / "models" / "smollm2-135m.yaml", ModelSpec), w,
                 PlanConfig(gen_tp=[1], train_tp=[1], train_pp=[1], batch_ladder=1,
                            max_decode_batch=cfg.engine.max_batch_size))
    p = build_problem(inp, sync_gbps=1e6)  # one machine: the measured sync time is the whole sync
    # the placement the run had: its engine replicas (one core each) and its learners (one core each)
    placed = evaluate(p, {0: t.engine_replicas}, next(c for c, o in enumerate(p.train) if o.gpus == t.learner_workers))
    sim = simulate(p, placed, w, steps=200)  # long enough that the random lengths and kept groups average out
    steps_s = [m["time/step_s"] for m in step_rows[1:]]
    row = {"placement": label, "run": str(run), "engine_replicas": t.engine_replicas,
           "learner_workers": t.learner_workers, "steps_measured": len(steps_s),
           "measured_samples_per_s": measured, "predicted_samples_per_s": sim.throughput,
           "model_samples_per_s": placed.throughput, "error": abs(sim.throughput - measured) / measured,
           "measured_rel_se": _rel_se(steps_s), "measured_halves": _halves(steps_s, t.batch_size * t.group_size),
           "phases": phases(step_rows[1:], p, placed, w, types, inp.model, sim),
           "measured_step_s": [m["time/step_s"] for m in step_rows], "measured_train_s":
           [m.get("time/train_s") for m in step_rows], "workload": dataclasses.asdict(w)}
    print(f"{label}: measured {measured:.3f} (standard error {row['measured_rel_se']:.1%}; halves "
          f"{row['measured_halves'][0]:.3f}, {row['measured_halves'][1]:.3f}), simulated {sim.throughput:.3f}, "
          f"cost model {placed.throughput:.3f} samples/s (error {row['error']:.1%})", flush=True)
    print("  per phase (mean s per step, measured vs model): " + ", ".join(
        f"{k} {v['measured']:.2f} vs {v['model']:.2f}" for k, v in row["phases"].items()), flush=True)
    return row


def _rel_se(values: list[float]) -> float:
    """Standard error of the mean step time, relative to it (the measurement's own spread)."""
    if len(values) < 2:
        return float("nan")
    return statistics.stdev(values) / math.sqrt(len(values)) / statistics.mean(values)


def _halves(values: list[float], samples_per_step: int) -> tuple[float, float]:
    """Samples/s over the first and the second half of the measured steps."""
    h = len(values) // 2
    return tuple(samples_per_step * len(v) / sum(v) for v in (values[:h], values[h:])) if h else (math.nan, math.nan)


def phases(rows: list[dict], p, placed, w: WorkloadSpec, types: dict, model: ModelSpec, sim) -> dict:
    """Each phase of a step as the run measured it and as the profiled cost model has it: training (the model at
    each step's own kept groups), weight sync, and the trainer's wait for data (the simulator's idle trainer)."""
    gpu = types[p.train[placed.train].gpu]
    train_model = [train_step_s(gpu, model, dataclasses.replace(w, trained_fraction=r["train/kept_groups"] / w.batch_size),
                                PlanConfig(), 1, 1, 1, 1.0, 1.0) for r in rows]
    wait = sim.trainer_idle * p.batch_samples / sim.throughput if sim.throughput > 0 else math.nan
    mean = statistics.mean
    return {"train_s": {"measured": mean(r["time/train_s"] for r in rows), "model": mean(train_model)},
            "sync_s": {"measured": mean(r["time/sync_s"] for r in rows), "model": p.sync_s},
            "wait_s": {"measured": mean(r["time/wait_s"] for r in rows), "model": wait}}


def validation_token(validation: dict, fresh: bool, recomputed: bool) -> str:
    """What the RESULT line says about the prediction error's validation runs: `validation=fresh` (run now),
    `validation=reused_<date>` (an earlier --validate's runs, as stored), `validation=recomputed_<date>`
    (earlier runs, predictions recomputed now) or `validation=none`."""
    if not validation.get("placements"):
        return "validation=none"
    if fresh:
        return "validation=fresh"
    date = str(validation.get("date", "unknown")).replace(" UTC", "Z").replace(" ", "T")
    return f"validation={'recomputed' if recomputed else 'reused'}_{date}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--validate", action="store_true", help="profile this CPU and run the real trainings (~10 min)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--predict-only", action="store_true",
                    help="recompute the predictions for the stored validation runs (no new profile or training)")
    args = ap.parse_args()
    previous = json.loads(OUT.read_text()) if OUT.exists() else {}
    validation = previous.get("validation", {})
    if args.validate:  # first, while nothing else of this benchmark loads the machine
        validation = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "placements": validate(args.steps, ROOT / "runs" / "planner-bench")}
    elif args.predict_only and validation:
        validation = {**validation, "placements": [
            predict(p["placement"], Path(p["run"]), Path(p["run"]).parent / "this-cpu.yaml")
            for p in validation["placements"]]}
    rows = scenarios(args.repeats)
    gap_rows = gaps()
    if not args.validate and not args.predict_only:
        if validation:
            print(f"prediction error: reusing the validation of {validation['date']} (--validate to re-run)")
    ratio = math.exp(statistics.mean(math.log(r["ratio_simulated"]) for r in rows))
    gap = max(r["gap"] for r in gap_rows)
    big = [r["solve_s"] for r in rows if r["gpus"] == 1024]
    solve_s = statistics.median(s["median"] for s in big)
    err = max((p["error"] for p in validation.get("placements", [])), default=float("nan"))
    result = {"ratio_geomean": ratio, "ratio_max": max(r["ratio_simulated"] for r in rows), "gap_max": gap,
              "cost_ratio_max": max(r["cost_ratio_at_equal_throughput"] for r in rows),
              "solve_s_1024_median": solve_s, "solve_s_1024_min": min(s["min"] for s in big),
              "solve_s_1024_max": max(s["max"] for s in big), "prediction_error_max": err,
              "scenarios": rows, "gaps": gap_rows, "validation": validation}
    solve_all = spread(x for s in big for x in s["values"])
    ratios = spread(r["ratio_simulated"] for r in rows)
    cost = spread(r["cost_ratio_at_equal_throughput"] for r in rows)
    cost_geo = math.exp(statistics.mean(math.log(r["cost_ratio_at_equal_throughput"]) for r in rows))
    result.update(cost_ratio_geomean=cost_geo)
    per = " ".join(f"ratio_{r['model'].split('-')[-1]}_{r['gpus']}={r['ratio_simulated']:.3f}" for r in rows)
    se = max((p["measured_rel_se"] for p in validation.get("placements", []) if "measured_rel_se" in p),
             default=float("nan"))
    line = (f"RESULT planner ratio={ratio:.3f} gap={gap:.4f} solve_s={solve_s:.2f} prediction_error={err:.3f} "
            f"ratio_range={ratios['min']:.3f}-{ratios['max']:.3f} {per} cost_ratio={cost_geo:.3f} "
            f"cost_ratio_range={cost['min']:.3f}-{cost['max']:.3f} measured_rel_se={se:.3f} "
            f"solve_s_range={solve_all['min']:.2f}-{solve_all['max']:.2f} "
            f"{validation_token(validation, args.validate, args.predict_only)} "
            "target_ratio>=1.5 target_prediction_error<=0.20")
    write_result("planner", line, {"ratio": ratio, "gap": gap, "solve_s_1024": solve_all, "prediction_error": err},
                 result, OUT)
    print(line)


if __name__ == "__main__":
    os.environ.setdefault("HEXSEARCH_QUIET", "1")  # here, not at import: a test importing this module must not go quiet
    main()
