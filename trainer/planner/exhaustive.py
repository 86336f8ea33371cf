"""Exhaustive search over every assignment: the reference the MILP is checked against on small instances.

For each training option c and every vector of replica counts x (bounded by the devices left per type and
the budget), the assignment is kept when `milp.violations` finds nothing; the best has the largest phi, then
the lowest cost (with a throughput target: the lowest cost). The number of vectors grows as prod_k (N_g / t_k + 1), so this is for tens of devices.
"""

from __future__ import annotations

from trainer.planner.milp import Problem, Solution, evaluate, violations


def exhaustive(p: Problem, limit: int = 2_000_000) -> tuple[Solution | None, int]:
    """(best solution or None, assignments evaluated); raises when more than `limit` would be needed."""
    best: Solution | None = None
    seen = 0
    for c, opt in enumerate(p.train):
        left = dict(p.counts)
        if left.get(opt.gpu, 0) < opt.gpus:
            continue
        left[opt.gpu] -= opt.gpus
        spent = p.prices[opt.gpu] * opt.gpus
        for replicas in _vectors(p, 0, left, spent, {}):
            seen += 1
            if seen > limit:
                raise ValueError(f"exhaustive search over more than {limit} assignments; use a smaller instance")
            s = evaluate(p, replicas, c)
            if not replicas or violations(p, s):
                continue
            if best is None or _better(s, best, cost_first=p.target > 0):
                best = s
    return best, seen


def _better(a: Solution, b: Solution, cost_first: bool) -> bool:
    """Larger phi wins; within 1e-9 relative, lower cost wins (the MILP's objectives, in order). With a
    target (`cost_first`), every candidate already reaches it and the lower cost wins."""
    if cost_first:
        return a.cost < b.cost - 1e-9
    if a.phi > b.phi * (1 + 1e-9):
        return True
    return a.phi >= b.phi * (1 - 1e-9) and a.cost < b.cost - 1e-9


def _vectors(p: Problem, k: int, left: dict[str, int], spent: float, chosen: dict[int, int]):
    """Every count vector over options k.. that fits the devices left and the budget."""
    if k == len(p.gen):
        yield dict(chosen)
        return
    g = p.gen[k]
    price = p.prices[g.gpu] * g.tp
    n = 0
    while n * g.tp <= left.get(g.gpu, 0) and (p.budget <= 0 or spent + n * price <= p.budget * (1 + 1e-9)):
        if n:
            chosen[k] = n
        left[g.gpu] -= n * g.tp
        yield from _vectors(p, k + 1, left, spent + n * price, chosen)
        left[g.gpu] += n * g.tp
        chosen.pop(k, None)
        n += 1
