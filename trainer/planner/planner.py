"""The planner: phase 1 (MILP) and phase 2 (partitioning) iterated, the simulator's verdict, the explanation.

    inputs = load_inputs(cfg)          # cluster, GPU types, model, workload
    result = make_plan(inputs)         # raises Infeasible with the binding constraint explained
    print(result.explanation)
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from trainer.planner.config import PlanConfig
from trainer.planner.milp import Problem, Solution, explain_infeasible, solve, theta_of_phi
from trainer.planner.partition import NodeAssignment, place
from trainer.planner.problem import Inputs, build_problem
from trainer.planner.simulator import SimResult, simulate
from trainer.planner.specs import ModelSpec, SpecError, WorkloadSpec, load_cluster, load_spec


class Infeasible(ValueError):
    """No plan satisfies every constraint; the message names the one that binds."""


@dataclass
class PlanResult:
    problem: Problem
    """The final MILP instance (with phase 2's weight-sync bandwidth)."""
    solution: Solution
    """The chosen counts and configurations."""
    nodes: list[NodeAssignment]
    """Phase 2's node assignment."""
    sync_gbps: float
    """Realised weight-sync bandwidth per device, GB/s."""
    iterations: int
    """Phase 1 + 2 rounds (of the chosen candidate) until the links phase 1 assumed (weight sync, between trainer
    nodes) matched the placement."""
    solve_s: float
    """Seconds spent in phases 1 and 2."""
    sim: SimResult | None = None
    """The simulator's evaluation of the plan (None when not simulated)."""
    explanation: list[str] = field(default_factory=list)
    """Human-readable lines: choices, bottleneck, what the next dollar buys."""


def load_inputs(cfg: PlanConfig) -> Inputs:
    """Read the three input files named in the config."""
    for key in ("cluster", "model", "workload"):
        if not getattr(cfg, key):
            raise SpecError(f"plan.{key} is required (a YAML file; see configs/planner/{key}s/)")
    cluster, types = load_cluster(cfg.cluster)
    return Inputs(cluster, types, load_spec(cfg.model, ModelSpec), load_spec(cfg.workload, WorkloadSpec), cfg)


def make_plan(inputs: Inputs, simulate_plan: bool = True, explain: bool = True) -> PlanResult:
    """Phases 1 and 2 until the links agree, on the whole cluster and on each GPU type alone; the plan with the
    highest throughput after phase 2 wins (lower cost on ties), then it is simulated and explained.

    The single-type candidates matter because phase 1 prices the weight sync with one bandwidth for every
    plan: a plan that keeps engines next to the trainer syncs faster than phase 1 assumed."""
    t0 = time.perf_counter()
    best = _phases(inputs, "")
    if len(_types(inputs)) > 1:
        for gpu in _types(inputs):
            try:
                one = _phases(inputs, gpu)
            except Infeasible:
                continue
            if (one[1].throughput > best[1].throughput * (1 + 1e-9)
                    or (one[1].throughput >= best[1].throughput * (1 - 1e-9) and one[1].cost < best[1].cost)):
                best = one
    problem, solution, nodes, realised, rounds = best
    result = PlanResult(problem, solution, nodes, realised, rounds, time.perf_counter() - t0)
    if simulate_plan:
        result.sim = simulate(problem, solution, inputs.workload, inputs.cfg.simulate_steps, inputs.cfg.seed)
    if explain:
        result.explanation = explanation(inputs, result)
    return result


def _types(inputs: Inputs) -> list[str]:
    return sorted({p.gpu for p in inputs.cluster.pools})


def _phases(inputs: Inputs, only: str) -> tuple[Problem, Solution, list[NodeAssignment], float, int]:
    """(problem, solution, nodes, sync GB/s, rounds): MILP then partitioning, re-solved with the links the
    placement has (weight sync, between trainer nodes) until they agree or `max_iterations` rounds."""
    links: tuple[float | None, float | None] = (None, None)   # None: phase 1's guess
    rounds = 0
    while True:
        rounds += 1
        problem = build_problem(inputs, links[0], only=only, train_gbps=links[1])
        solution = solve(problem)
        if solution is None:
            raise Infeasible(explain_infeasible(problem))
        nodes, realised, inner = place(inputs.cluster, inputs.types, problem, solution)
        if links[0] is not None and (realised, inner) == links:
            return problem, solution, nodes, realised, rounds
        if rounds >= inputs.cfg.max_iterations:
            # keep the last solution but cost it with the links its placement really has
            problem, solution = _recost(build_problem(inputs, realised, only=only, train_gbps=inner), problem, solution)
            return problem, solution, nodes, realised, rounds
        links = (realised, inner)


def _recost(new: Problem, old: Problem, s: Solution) -> tuple[Problem, Solution]:
    """The solution costed in `new` (its training option found by configuration; generation options do not
    depend on the links). When `new` no longer lists that option, the old problem and solution stay."""
    from trainer.planner.milp import evaluate

    c = old.train[s.train]
    match = [i for i, o in enumerate(new.train) if (o.gpu, o.dp, o.tp, o.pp) == (c.gpu, c.dp, c.tp, c.pp)]
    return (new, evaluate(new, s.replicas, match[0])) if match else (old, s)


def describe_solution(p: Problem, s: Solution) -> list[str]:
    """One line per role: what runs where."""
    c = p.train[s.train]
    lines = [f"trainer: {c.gpus} x {c.gpu} (dp={c.dp} tp={c.tp} pp={c.pp}), {c.step_s:.2f}s per step of "
             f"{p.batch_samples} trajectories, {c.memory_gb:.1f} GB per device"]
    for k, n in sorted(s.replicas.items()):
        g = p.gen[k]
        lines.append(f"generation: {n} x {g.gpu} replica(s) tp={g.tp} batch={g.batch}: {g.samples_per_s:.3f} "
                     f"trajectories/s each, mean latency {g.latency_s:.1f}s, p99 {g.latency_tail_s:.1f}s")
    return lines


def explanation(inputs: Inputs, r: PlanResult) -> list[str]:
    """Why each choice, where the bottleneck is, what the next dollar buys."""
    p, s = r.problem, r.solution
    lines = describe_solution(p, s)
    lines.append(f"cost ${s.cost:.2f}/h; devices used {s.devices} of {p.counts}")
    lines.append(f"predicted {s.throughput:.3f} trained samples/s (generation {s.gen_rate:.3f}, training "
                 f"{s.train_rate:.3f}, weight sync {p.sync_s:.2f}s per step over {r.sync_gbps:g} GB/s)")
    if r.sim:
        lines.append(f"simulated {r.sim.throughput:.3f} samples/s over {r.sim.steps} steps: trainer idle "
                     f"{r.sim.trainer_idle:.0%}, engine slots idle {r.sim.engine_idle:.0%}, staleness "
                     f"{r.sim.staleness}, refused groups {r.sim.refused}")
    gen_eff, train_eff = {}, {}
    for gpu in p.counts:
        price = p.prices[gpu]
        gen_eff[gpu] = max((g.samples_per_s / (price * g.tp) for g in p.gen if g.gpu == gpu), default=0.0)
        train_eff[gpu] = max((p.batch_samples / c.step_s / (price * c.gpus) for c in p.train if c.gpu == gpu),
                             default=0.0)
        lines.append(f"{gpu}: generation {gen_eff[gpu]:.4f}, training {train_eff[gpu]:.4f} samples/s per $/h "
                     f"(${price:.2f}/h per device)")
    if len(p.counts) > 1:
        lines.append(f"why: {max(gen_eff, key=gen_eff.get)} generates most per dollar, {max(train_eff, key=train_eff.get)} "
                     f"trains most per dollar; the MILP balances the two rates within the devices, budget and staleness")
    bound = "generation" if s.gen_rate < s.train_rate * (1 - 1e-3) else "training"
    binding = [f"{g} devices" for g, n in s.devices.items() if n >= p.counts[g]]
    if p.budget and s.cost >= p.budget * 0.99:
        binding.append("budget")
    if any(s.phi >= _cap(p, p.gen[k]) * (1 - 1e-6) for k in s.replicas):
        binding.append("staleness (tail latency)")
    lines.append(f"bottleneck: {bound}; binding constraints: {', '.join(binding) or 'none'}")
    lines.extend(_next_dollar(inputs, r))
    return lines


def _cap(p: Problem, g) -> float:
    from trainer.planner.milp import staleness_phi_cap

    return staleness_phi_cap(p, g)


def _next_dollar(inputs: Inputs, r: PlanResult) -> list[str]:
    """Re-solve with 10% more budget (or one more node of each type) and report samples/s per extra $/h."""
    p, s = r.problem, r.solution
    if p.target > 0:
        return []
    if p.budget > 0:
        more = solve(dataclasses.replace(p, budget=p.budget * 1.1))
        if more is None or more.cost <= s.cost:
            return ["next dollar: 10% more budget buys nothing (devices or staleness bind)"]
        gain = (more.throughput - s.throughput) / (more.cost - s.cost)
        return [f"next dollar: +10% budget -> {more.throughput:.3f} samples/s, {gain:.4f} samples/s per extra $/h"]
    out = []
    for pool in {pl.gpu: pl for pl in inputs.cluster.pools}.values():
        counts = dict(p.counts)
        counts[pool.gpu] += pool.gpus_per_node
        more = solve(dataclasses.replace(p, counts=counts))
        if more is not None and more.cost > s.cost:
            gain = (more.throughput - s.throughput) / (more.cost - s.cost)
            out.append(f"next dollar: one more {pool.gpu} node -> {more.throughput:.3f} samples/s, {gain:.4f} "
                       f"samples/s per extra $/h")
    return out


def homogeneous_best(inputs: Inputs, budget: float) -> tuple[str, PlanResult | None]:
    """The best single-type plan at the same budget (the baseline heterogeneity must beat), planned the same
    way (phases 1 and 2) on that type's pools alone."""
    from trainer.planner.problem import homogeneous

    best: tuple[str, PlanResult | None] = ("", None)
    cfg = dataclasses.replace(inputs.cfg, budget_per_hour=budget)
    for gpu in _types(inputs):
        try:
            r = make_plan(homogeneous(dataclasses.replace(inputs, cfg=cfg), gpu, budget), simulate_plan=False,
                          explain=False)
        except Infeasible:
            continue
        if best[1] is None or r.solution.throughput > best[1].solution.throughput:
            best = (gpu, r)
    return best


__all__ = ["Infeasible", "PlanResult", "load_inputs", "make_plan", "homogeneous_best", "theta_of_phi"]
