"""Discrete-event simulation of the asynchronous pipeline under a plan: what throughput it really gets.

Modelled: groups of G episodes admitted under AReaL's rule (accepted + running <= (eta + v + 1) B groups,
and at most `max_concurrent` episodes); each episode draws its generated length (log-normal, mean and
p99 of the workload) and its tool latencies (log-normal, median and p99), and alternates decoding turns
with tool calls; engines of one option form a processor-sharing pool of x_k b_k slots in which every
active sequence advances one token per t_step(n) seconds, n the active sequences per replica
(t_step linear between batch 1 and b_k); a turn's prefill is pf b_k / t_step(b_k) extra token-equivalents.
The trainer takes the B oldest finished groups, trains tau_c seconds (with dynamic filtering, trained_fraction
f < 1, each step keeps k ~ Binomial(B, f) groups and trains fixed + (tau_c - fixed) k / (B f) seconds: short
steps leave generation less time to fill the next batch), then every engine and the trainer
pause tau_sync for the weight sync and the version advances. A finished group older than eta versions
when the trainer reaches it is refused (hexsearch's per-sample bound) and counted, not trained.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from trainer.planner.costs import GenOption
from trainer.planner.milp import Problem, Solution
from trainer.planner.specs import WorkloadSpec, lognormal_sigma


@dataclass
class SimResult:
    throughput: float
    """Trained samples/s after the warm-up steps."""
    steps: int
    """Training steps simulated."""
    trainer_idle: float
    """Fraction of the measured time the trainer waited for data."""
    engine_idle: float
    """Fraction of engine slot-time unused while not paused for weight sync."""
    staleness: dict[int, int] = field(default_factory=dict)
    """Versions behind at training time -> trained groups."""
    refused: int = 0
    """Groups refused by the per-sample staleness bound."""
    seconds: float = 0.0
    """Simulated seconds."""


class _Pool:
    """Processor-sharing engines of one generation option: virtual time V counts tokens per active sequence."""

    def __init__(self, opt: GenOption, replicas: int):
        self.opt, self.replicas, self.slots = opt, replicas, opt.batch * replicas
        self.V, self.active, self.waiting = 0.0, [], deque()
        self.busy_slot_s = 0.0

    def step_s(self) -> float:
        n = len(self.active) / self.replicas
        o = self.opt
        if o.batch <= 1:
            return o.step_s
        return o.step_s_at_1 + (o.step_s - o.step_s_at_1) * (max(n, 1.0) - 1) / (o.batch - 1)

    def load(self) -> float:
        return (len(self.active) + len(self.waiting)) / self.slots

    def add(self, work: float, seq: int) -> None:
        if len(self.active) < self.slots:
            heapq.heappush(self.active, (self.V + work, seq))
        else:
            self.waiting.append((work, seq))

    def next_finish(self, now: float) -> float:
        return now + (self.active[0][0] - self.V) * self.step_s() if self.active else math.inf

    def advance(self, dt: float) -> None:
        if self.active:
            self.V += dt / self.step_s()
            self.busy_slot_s += dt * len(self.active)

    def pop(self) -> int:
        _, seq = heapq.heappop(self.active)
        if self.waiting:
            work, nxt = self.waiting.popleft()
            heapq.heappush(self.active, (self.V + work, nxt))
        return seq


def simulate(p: Problem, s: Solution, w: WorkloadSpec, steps: int = 30, seed: int = 0,
             max_events: int = 5_000_000) -> SimResult:
    """Run the pipeline for `steps` training steps (the first 20% are warm-up, not measured)."""
    rng = np.random.default_rng(seed)
    pools = [_Pool(p.gen[k], n) for k, n in s.replicas.items()]
    B, G, eta = w.batch_size, w.group_size, w.max_staleness
    tau_train, tau_sync = p.train[s.train].step_s, p.sync_s
    tau_fixed = min(p.train[s.train].fixed_s, tau_train)
    sig_len = lognormal_sigma(w.response_tokens_mean, w.response_tokens_p99, from_mean=True)
    sig_tool = lognormal_sigma(w.tool_latency_median_s, w.tool_latency_p99_s, from_mean=False)
    mu_len = math.log(max(w.response_tokens_mean, 1e-9)) - sig_len ** 2 / 2
    cap_eps = p.max_concurrent if p.max_concurrent > 0 else math.inf

    seqs: list[list] = []            # [group, pool index, turns left, work per turn]
    groups: list[list] = []          # [start version, episodes left]
    events: list[tuple[float, int, str, int]] = []   # (time, tiebreak, kind, id)
    ready: list[int] = []            # heap of finished group ids: the oldest (smallest id) first
    now, version, started, running_eps, tick = 0.0, 0, 0, 0, 0
    trainer_busy, paused_until = False, 0.0
    warm = max(1, steps // 5)
    t_measure = trained = idle = busy_slots0 = paused_s = paused0 = 0.0
    wait_since: float | None = 0.0
    staleness: dict[int, int] = {}
    refused = done_steps = 0

    def push(t: float, kind: str, ident: int) -> None:
        nonlocal tick
        tick += 1
        heapq.heappush(events, (t, tick, kind, ident))

    def start_turn(seq: int) -> None:
        pool = pools[seqs[seq][1]]
        pool.add(seqs[seq][3], seq)

    def admit() -> None:
        nonlocal started, running_eps
        # a refused group leaves `accepted` (trainer/staleness.py), so a replacement may start
        while started - refused < (eta + version + 1) * B and running_eps + G <= max(cap_eps, G):
            gid = len(groups)
            groups.append([version, G])
            started += 1
            running_eps += G
            for _ in range(G):
                i = min(range(len(pools)), key=lambda j: pools[j].load())
                length = math.exp(mu_len + sig_len * rng.standard_normal()) if sig_len else w.response_tokens_mean
                opt = pools[i].opt
                pf_tokens = opt.prefill_s / max(w.turns, 1) * opt.batch / opt.step_s
                seqs.append([gid, i, w.turns, length / max(w.turns, 1) + pf_tokens])
                start_turn(len(seqs) - 1)

    def tool_s() -> float:
        if w.tool_latency_median_s <= 0:
            return 0.0
        return w.tool_latency_median_s * math.exp(sig_tool * rng.standard_normal())

    def try_train() -> None:
        nonlocal trainer_busy, wait_since, done_steps, idle
        nonlocal refused
        while ready and version - groups[ready[0]][0] > eta:   # too old by now: refused, never trained
            heapq.heappop(ready)
            refused += 1
        if trainer_busy or len(ready) < B:
            return
        batch = [heapq.heappop(ready) for _ in range(B)]
        for gid in batch:
            lag = version - groups[gid][0]
            staleness[lag] = staleness.get(lag, 0) + 1
        trainer_busy = True
        if wait_since is not None and done_steps >= warm:
            idle += now - max(wait_since, t_measure)
        wait_since = None
        tau = tau_train
        if 0 < w.trained_fraction < 1:  # dynamic filtering: this step's kept groups set its length
            kept = rng.binomial(B, w.trained_fraction)
            tau = tau_fixed + (tau_train - tau_fixed) * kept / (B * w.trained_fraction)
        push(now + tau, "trained", len(batch))

    admit()
    for _ in range(max_events):
        t_pool = min((pl.next_finish(now) if now >= paused_until else math.inf for pl in pools), default=math.inf)
        t_next = min(t_pool, events[0][0] if events else math.inf, paused_until if now < paused_until else math.inf)
        if math.isinf(t_next):
            break
        if now >= paused_until:
            for pl in pools:
                pl.advance(t_next - now)
        else:
            paused_s += t_next - now
        now = t_next
        if now >= paused_until:
            for pl in pools:
                while pl.active and pl.active[0][0] <= pl.V * (1 + 1e-12) + 1e-9:
                    seq = pl.pop()
                    seqs[seq][2] -= 1
                    if seqs[seq][2] > 0:
                        push(now + tool_s(), "tool", seq)
                    else:
                        gid = seqs[seq][0]
                        groups[gid][1] -= 1
                        if groups[gid][1] == 0:
                            running_eps -= G
                            heapq.heappush(ready, gid)
        while events and events[0][0] <= now:
            _, _, kind, ident = heapq.heappop(events)
            if kind == "tool":
                start_turn(ident)
            elif kind == "trained":
                paused_until = now + tau_sync
                push(paused_until, "synced", ident)
            elif kind == "synced":
                version += 1
                done_steps += 1
                trainer_busy = False
                wait_since = now
                if done_steps == warm:
                    t_measure, busy_slots0, paused0 = now, sum(pl.busy_slot_s for pl in pools), paused_s
                elif done_steps > warm:
                    trained += ident * G
                if done_steps >= steps:
                    break
        else:
            admit()
            try_train()
            continue
        break
    span = now - t_measure
    slot_s = sum(pl.slots for pl in pools) * (span - (paused_s - paused0))
    busy = sum(pl.busy_slot_s for pl in pools) - busy_slots0
    return SimResult(throughput=trained / span if span > 0 else 0.0, steps=done_steps,
                     trainer_idle=idle / span if span > 0 else 0.0,
                     engine_idle=1 - busy / slot_s if slot_s > 0 else 0.0,
                     staleness=dict(sorted(staleness.items())), refused=refused, seconds=now)
