"""Phase 1: the MILP that chooses generation replicas and the training configuration (HiGHS via scipy).

Variables: x_k >= 0 integer (replicas of generation option k), w_k binary (option k used), y_c binary
(training option c), phi >= 0 (the pipeline rate without weight-sync pauses, samples/s).

    max phi                                   (throughput mode; then min cost at that phi)
    s.t. sum_c y_c = 1,  sum_k x_k >= 1                            one trainer, some generation
         sum_{k of g} t_k x_k + sum_{c of g} n_c y_c <= N_g          devices per type g
         sum_k p_k t_k x_k + sum_c p_c n_c y_c <= budget             price per hour
         phi <= sum_k r_k x_k                                        producer: generation rate
         phi <= sum_c (B G / tau_c) y_c                              consumer: training rate
         sum_k n_k x_k <= (eta + 1) B G                              admission: staleness bound on episodes in flight
         x_k <= U_k w_k,  phi <= phi_max_k + M (1 - w_k)             tail latency l_tail_k <= (eta + 1) step period
Each step both sides also pause tau_sync for the weight sync, so the trained rate is
    theta = B G / (tau_sync + max(tau_train, B G / gen_rate)) = B G phi / (B G + tau_sync phi),
increasing in phi: maximising phi maximises theta, and a bound on theta is a bound on phi.
In cost mode (a throughput target theta*) the MILP minimises price subject to phi >= phi(theta*).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from trainer.planner.costs import GenOption, TrainOption


@dataclass
class Problem:
    gen: list[GenOption]
    """Generation options k."""
    train: list[TrainOption]
    """Training options c."""
    counts: dict[str, int]
    """N_g: devices per GPU type."""
    prices: dict[str, float]
    """p_g: dollars per device-hour."""
    batch_samples: int
    """B G: trajectories per training step."""
    sync_s: float
    """tau_sync: seconds of one weight sync (engines and trainer pause)."""
    max_staleness: int
    """eta."""
    max_concurrent: int = 0
    """`train.max_inflight_trajectories` (0: only the staleness rule limits episodes in flight)."""
    budget: float = 0.0
    """Dollars per hour (0: none)."""
    target: float = 0.0
    """Trained samples/s to reach at least cost (0: maximise throughput)."""
    time_limit_s: float = 60.0
    """HiGHS time limit per solve."""

    @property
    def max_in_flight(self) -> float:
        """Episodes the admission rule lets run at once: min((eta + 1) B G, max_inflight_trajectories)."""
        bound = (self.max_staleness + 1) * self.batch_samples
        return min(bound, self.max_concurrent) if self.max_concurrent > 0 else bound


@dataclass
class Solution:
    replicas: dict[int, int]
    """Generation option index -> replica count (only counts > 0)."""
    train: int
    """Index of the training option."""
    phi: float
    """min(generation rate, training rate, staleness caps of the options in use), samples/s."""
    throughput: float
    """theta: trained samples/s including weight-sync pauses."""
    cost: float
    """Dollars per hour."""
    gen_rate: float = 0.0
    """sum_k r_k x_k."""
    train_rate: float = 0.0
    """B G / tau_c."""
    devices: dict[str, int] = field(default_factory=dict)
    """Devices used per type."""


def theta_of_phi(phi: float, bg: float, sync: float) -> float:
    """theta = B G phi / (B G + tau_sync phi)."""
    return bg * phi / (bg + sync * phi) if phi > 0 else 0.0


def phi_of_theta(theta: float, bg: float, sync: float) -> float:
    """The inverse: phi = theta B G / (B G - tau_sync theta); inf when the sync alone rules theta out."""
    return theta * bg / (bg - sync * theta) if bg > sync * theta else math.inf


def staleness_phi_cap(p: Problem, g: GenOption) -> float:
    """The largest phi whose step period B G / theta is at least l_tail / (eta + 1)."""
    return phi_of_theta((p.max_staleness + 1) * p.batch_samples / g.latency_tail_s, p.batch_samples, p.sync_s)


def evaluate(p: Problem, replicas: dict[int, int], train: int) -> Solution:
    """Rates, throughput, cost and devices of an assignment (no feasibility check); phi = min(generation rate,
    training rate, the staleness cap of every option in use)."""
    gen_rate = sum(p.gen[k].samples_per_s * n for k, n in replicas.items())
    c = p.train[train]
    train_rate = p.batch_samples / c.step_s
    devices = {c.gpu: c.gpus}
    for k, n in replicas.items():
        devices[p.gen[k].gpu] = devices.get(p.gen[k].gpu, 0) + p.gen[k].tp * n
    # the admission rule throttles the pipeline so that no used option's tail exceeds (eta + 1) step periods
    phi = min([gen_rate, train_rate, *(staleness_phi_cap(p, p.gen[k]) for k, n in replicas.items() if n)])
    cost = sum(p.prices[g] * n for g, n in devices.items())
    return Solution({k: n for k, n in replicas.items() if n}, train, phi, theta_of_phi(phi, p.batch_samples, p.sync_s),
                    cost, gen_rate, train_rate, devices)


def violations(p: Problem, s: Solution) -> list[str]:
    """Every constraint the solution breaks (empty: feasible)."""
    out = []
    for g, n in s.devices.items():
        if n > p.counts.get(g, 0):
            out.append(f"uses {n} {g} of {p.counts.get(g, 0)}")
    if p.budget > 0 and s.cost > p.budget * (1 + 1e-9):
        out.append(f"costs ${s.cost:.2f}/h over the ${p.budget:.2f}/h budget")
    in_flight = sum(p.gen[k].in_flight * n for k, n in s.replicas.items())
    if in_flight > p.max_in_flight * (1 + 1e-9):
        out.append(f"needs {in_flight:.0f} episodes in flight, the staleness rule admits {p.max_in_flight:.0f}")
    for k in s.replicas:
        if s.phi > staleness_phi_cap(p, p.gen[k]) * (1 + 1e-6):
            out.append(f"{p.gen[k].gpu} tp={p.gen[k].tp} b={p.gen[k].batch}: tail latency "
                       f"{p.gen[k].latency_tail_s:.0f}s exceeds {p.max_staleness + 1} step periods")
    if p.target > 0 and s.throughput < p.target * (1 - 1e-6):
        out.append(f"reaches {s.throughput:.2f} samples/s, below the target {p.target}")
    return out


def solve(p: Problem, budget: bool = True, staleness: bool = True, target: bool = True) -> Solution | None:
    """The optimum (None when infeasible). Throughput mode: max phi, then min cost at that phi."""
    if not p.gen or not p.train:
        return None
    if p.target > 0 and target:
        floor = phi_of_theta(p.target, p.batch_samples, p.sync_s)
        if math.isinf(floor):
            return None
        return _solve(p, budget, staleness, phi_floor=floor * (1 - 1e-9), minimise_cost=True)
    best = _solve(p, budget, staleness, phi_floor=0.0, minimise_cost=False)
    if best is None or best.phi <= 0:
        return best
    cheaper = _solve(p, budget, staleness, phi_floor=best.phi * (1 - 1e-7), minimise_cost=True)
    return cheaper if cheaper is not None and cheaper.phi >= best.phi * (1 - 1e-6) else best


def _solve(p: Problem, use_budget: bool, use_staleness: bool, phi_floor: float, minimise_cost: bool) -> Solution | None:
    K, C = len(p.gen), len(p.train)
    n = 2 * K + C + 1
    xs, ys, PHI = slice(0, K), slice(2 * K, 2 * K + C), 2 * K + C  # w_k sit at K..2K-1
    big = max(p.batch_samples / c.step_s for c in p.train)  # phi never exceeds the fastest trainer
    tp = np.array([g.tp for g in p.gen], float)
    ngpu = np.array([c.gpus for c in p.train], float)
    price_x = np.array([p.prices[g.gpu] for g in p.gen]) * tp
    price_y = np.array([p.prices[c.gpu] for c in p.train]) * ngpu
    upper_x = np.array([p.counts[g.gpu] // g.tp for g in p.gen], float)
    rows, lo, hi = [], [], []

    def add(*coef: tuple[slice | int, np.ndarray | float], low: float = -np.inf, high: float = np.inf) -> None:
        row = np.zeros(n)
        for where, value in coef:
            row[where] = value
        rows.append(row)
        lo.append(low)
        hi.append(high)

    add((ys, 1.0), low=1, high=1)
    add((xs, 1.0), low=1)
    for gpu, count in p.counts.items():
        add((xs, tp * [g.gpu == gpu for g in p.gen]), (ys, ngpu * [c.gpu == gpu for c in p.train]), high=count)
    if use_budget and p.budget > 0:
        add((xs, price_x), (ys, price_y), high=p.budget)
    add((PHI, 1.0), (xs, -np.array([g.samples_per_s for g in p.gen])), high=0)
    add((PHI, 1.0), (ys, -np.array([p.batch_samples / c.step_s for c in p.train])), high=0)
    if use_staleness:
        add((xs, np.array([g.in_flight for g in p.gen])), high=p.max_in_flight)
        for k, g in enumerate(p.gen):
            cap = staleness_phi_cap(p, g)
            if cap < big:
                add((k, 1.0), (K + k, -upper_x[k]), high=0)
                add((PHI, 1.0), (K + k, big), high=big + cap)
    cost_vec = np.zeros(n)
    cost_vec[xs], cost_vec[ys] = price_x, price_y
    obj = cost_vec if minimise_cost else -np.eye(n)[PHI]
    lower = np.zeros(n)
    lower[PHI] = phi_floor
    upper = np.concatenate([upper_x, np.ones(K), np.ones(C), [big]])
    integrality = np.concatenate([np.ones(2 * K + C), [0]])
    options = {"time_limit": p.time_limit_s, "mip_rel_gap": 1e-7, "disp": False}
    args = dict(constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integrality, bounds=Bounds(lower, upper))
    res = milp(obj, **args, options=options)
    if res.status == 4:  # "Solve error": HiGHS's presolve fails on some of these instances; solve without it
        res = milp(obj, **args, options={**options, "presolve": False})
    if res.x is None:
        return None
    x = np.round(res.x).astype(int)
    replicas = {k: int(x[k]) for k in range(K) if x[k] > 0}
    return evaluate(p, replicas, int(np.argmax(res.x[ys])))


def explain_infeasible(p: Problem) -> str:
    """Which constraint binds when no plan exists, in one sentence with the figures."""
    if not p.train:
        return "no training configuration fits in device memory on any GPU type of the cluster"
    if not p.gen:
        return "the model's weights do not fit on any GPU type for generation, even with the largest tensor parallelism"
    if solve(p, budget=False, staleness=False, target=False) is None:
        smallest = min(p.train, key=lambda c: c.gpus)
        return (f"the cluster cannot hold one trainer and one engine replica: the smallest trainer needs {smallest.gpus} "
                f"{smallest.gpu}, the smallest replica {min(g.tp for g in p.gen)} devices")
    if p.budget > 0 and solve(p, budget=True, staleness=False, target=False) is None:
        cheapest = min(p.prices[c.gpu] * c.gpus for c in p.train) + min(p.prices[g.gpu] * g.tp for g in p.gen)
        return f"the budget binds: the cheapest trainer plus one engine replica costs ${cheapest:.2f}/h > ${p.budget:.2f}/h"
    if solve(p, budget=True, staleness=True, target=False) is None:
        fastest = min(p.gen, key=lambda g: g.latency_tail_s)
        tries = sorted({min(256, (p.max_staleness + 1) * 2 ** i) for i in range(9)} - {p.max_staleness})
        need = next((eta for eta in tries if solve(dataclasses.replace(p, max_staleness=eta), target=False)), None)
        hint = f"; max_staleness={need} admits a plan" if need is not None else ""
        return (f"the staleness bound binds: with max_staleness={p.max_staleness} the admission rule allows "
                f"{p.max_in_flight:.0f} episodes in flight and the shortest tail latency is "
                f"{fastest.latency_tail_s:.1f}s ({fastest.gpu} tp={fastest.tp} b={fastest.batch}){hint}")
    best = solve(p, budget=True, staleness=True, target=False)
    assert best is not None
    if p.batch_samples <= p.sync_s * p.target:
        return (f"the target binds: each step pauses {p.sync_s:.1f}s for weight sync, so no plan exceeds "
                f"{p.batch_samples / p.sync_s:.2f} samples/s < target {p.target}")
    return (f"the target binds: the best plan within the devices{' and budget' if p.budget else ''} reaches "
            f"{best.throughput:.2f} samples/s < target {p.target}")

