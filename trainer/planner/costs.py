"""Cost models: what one generation replica and one training configuration deliver on a GPU type.

Symbols: P parameters, s bytes per parameter, L layers, h hidden size, kappa KV bytes per token,
M device memory, BW memory bandwidth, F dense bf16 FLOP/s, t tensor-parallel degree, b decode batch.

Generation replica k = (gpu, t, b), memory-bound decoding (the roofline):
    t_step(b) = max((P s / t + b c kappa / t) / (BW e_bw),  2 P b / (t F mfu_prefill))  + t_tp(b)
    t_tp(b)   = 2 L (2 (t-1)/t  b h 2 / (B_intra e_link) + lat)          (two all-reduces per layer, t > 1)
    b <= b_max = (t M f_mem - P s) / (c kappa)                            (KV capacity)
with c the time-average context a decoding slot holds. A slot decodes one trajectory after another; one
that grows by g tokens after its prompt (generated + tool results) holds prompt + g/2 on average for g
steps, so the slot's time average weights long trajectories by their length:
    c = prompt + E[g^2] / (2 E[g]) = prompt + exp(sigma^2) g_mean / 2      (g log-normal, sigma from mean, p99)
Paged KV caches (vLLM, SGLang) hold a sequence's current context, not its final one, so c also bounds the
batch. Prefill of a trajectory's
prompt (beyond the prefix all share, which the prefix cache holds) and tool results costs
pf = 2 P (prompt - shared_prefix + (turns - 1) tool_tokens) / (t F mfu_prefill). A replica
completes r_k = 1 / (R t_step(b) / b + pf) trajectories/s (R: mean generated tokens per trajectory);
a trajectory spends b / r_k on the engine, plus its tool calls: mean latency l_k, tail latency l_tail_k.
Keeping the replica busy needs n_k = r_k l_k episodes in flight (Little's law).

Training configuration c = (gpu, dp, tp, pp) on n = dp tp pp devices, one step of T tokens
(T = B G trained_fraction x tokens per trajectory; a trajectory has (turns - 1) tool results). A profiled
device's step is fixed + B G f (tokens - shared prefix) / measured rate: hexsearch's learner runs the prefix
every sequence of a step shares once (in `fixed`, with the optimizer step). The roofline:
    t_comp = (6 + 2 [recompute_prox]) P T / (n F mfu_train) x (1 + (pp-1)/m)   (m micro-batches per rank)
    t_tp   = (T/dp) (L/pp) 4 h 2 x 2 (tp-1)/tp / (B_intra e_link)
    t_dp   = 3 x 2 P/(tp pp) x (dp-1)/dp / (B_dp e_link)                   (FSDP: reduce-scatter + 2 all-gathers)
    memory = 16 P / n (sharded) or 16 P / (tp pp) (replicated) + gathered units + activations + logits <= M f_mem
             (trainer/planner/memory.py)
Weight sync: tau_sync = P s / (B_sync e_link) + weight_load_s, with B_sync the narrowest link from the
trainer to any engine (phase 2 measures it on the placement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.planner.config import PlanConfig
from trainer.planner.specs import GpuType, ModelSpec, NodePool, WorkloadSpec, lognormal_sigma


@dataclass(frozen=True)
class GenOption:
    """One generation-replica configuration k and what it delivers."""

    gpu: str
    tp: int
    batch: int
    step_s: float
    """Seconds per decode step at this batch."""
    samples_per_s: float
    """r_k: trajectories completed per second by one replica."""
    latency_s: float
    """l_k: mean seconds from a trajectory's start to its end (engine time + tool calls)."""
    latency_tail_s: float
    """l_tail_k: 99th-percentile trajectory latency."""
    in_flight: float
    """n_k = r_k l_k: episodes in flight that keep the replica busy."""
    step_s_at_1: float = 0.0
    """Seconds per decode step at batch 1 (the simulator interpolates t_step linearly in the batch)."""
    prefill_s: float = 0.0
    """pf: seconds of prefill per trajectory."""


@dataclass(frozen=True)
class TrainOption:
    """One training configuration c and its step time."""

    gpu: str
    dp: int
    tp: int
    pp: int
    step_s: float
    """tau_c: seconds of one training step of batch_size x group_size trajectories."""
    memory_gb: float
    """Memory per device in GB."""
    fixed_s: float = 0.0
    """Seconds of tau_c that do not grow with the step's trained tokens (a profiled learner's optimizer step and
    shared prefix); the simulator scales the rest with the groups each step keeps."""

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp


def growth_tokens(w: WorkloadSpec) -> float:
    """Tokens a trajectory adds after its prompt: its (turns - 1) tool results and its generated tokens."""
    return max(w.turns - 1, 0) * w.tool_tokens_per_turn + w.response_tokens_mean


def tokens_per_trajectory(w: WorkloadSpec) -> float:
    """Tokens a trajectory puts through training: prompt + tool results + generated tokens."""
    return w.prompt_tokens + growth_tokens(w)


def kv_context(w: WorkloadSpec) -> float:
    """c: the time-average context of a decoding slot, prompt + exp(sigma^2) g_mean / 2 (length-biased: a long
    trajectory occupies its slot for longer, with more context; see the module docstring). The log-normal's second
    moment grows fast with p99 / mean (1.45 at 3.4x, 93 at 14.6x); real lengths stop at max_new_tokens, which the
    fit does not know, so a p99 far above the mean overstates c."""
    sigma = lognormal_sigma(w.response_tokens_mean, w.response_tokens_p99, from_mean=True)
    return w.prompt_tokens + math.exp(sigma * sigma) * growth_tokens(w) / 2


def tool_time(w: WorkloadSpec) -> tuple[float, float]:
    """(mean, tail) seconds of a trajectory's tool calls: (turns-1) calls; the tail is one p99 call among means."""
    calls = max(w.turns - 1, 0)
    if calls == 0 or w.tool_latency_median_s <= 0:
        return 0.0, 0.0
    sigma = lognormal_sigma(w.tool_latency_median_s, w.tool_latency_p99_s, from_mean=False)
    mean = w.tool_latency_median_s * math.exp(sigma * sigma / 2)
    return calls * mean, (calls - 1) * mean + max(w.tool_latency_p99_s, mean)


def decode_step_s(g: GpuType, m: ModelSpec, w: WorkloadSpec, cfg: PlanConfig, tp: int, batch: float,
                  intra_gbps: float) -> float:
    """t_step(b) of a replica (measured line when the device has a profile of this model, else the roofline)."""
    if g.measured and g.measured.model == m.name and g.measured.decode_base_s > 0:
        return g.measured.decode_base_s + g.measured.decode_per_seq_s * max(batch - 1, 0)
    p = m.params_b * 1e9
    mem = (p * m.bytes_per_param + batch * kv_context(w) * m.kv_bytes_per_token) / tp / (g.hbm_tbps * 1e12 * cfg.hbm_efficiency)
    comp = 2 * p * batch / (tp * g.bf16_tflops * 1e12 * cfg.mfu_prefill)
    comm = 0.0
    if tp > 1:
        per_ar = 2 * (tp - 1) / tp * batch * m.hidden * 2 / (intra_gbps * 1e9 * cfg.link_efficiency)
        comm = 2 * m.layers * (per_ar + cfg.allreduce_latency_us * 1e-6)
    return max(mem, comp) + comm


def max_decode_batch(g: GpuType, m: ModelSpec, w: WorkloadSpec, cfg: PlanConfig, tp: int) -> int:
    """b_max: KV capacity / the slots' time-average context, capped by `max_decode_batch` (and the profiled batch)."""
    if g.measured and g.measured.model == m.name and g.measured.max_batch > 0:
        return min(g.measured.max_batch, cfg.max_decode_batch)
    free = tp * g.hbm_gb * 1e9 * cfg.memory_fraction - m.params_b * 1e9 * m.bytes_per_param
    if free <= 0 or m.kv_bytes_per_token <= 0:
        return 0 if free <= 0 else cfg.max_decode_batch
    return int(min(cfg.max_decode_batch, free // (kv_context(w) * m.kv_bytes_per_token)))


def prefill_s(g: GpuType, m: ModelSpec, w: WorkloadSpec, cfg: PlanConfig, tp: int) -> float:
    """pf: seconds of prefill per trajectory (prompt beyond the shared prefix + tool results; earlier turns and
    the shared prefix stay cached)."""
    tokens = max(w.prompt_tokens - w.shared_prefix_tokens, 0) + max(w.turns - 1, 0) * w.tool_tokens_per_turn
    if g.measured and g.measured.model == m.name and g.measured.prefill_tokens_per_s > 0:
        return tokens / g.measured.prefill_tokens_per_s
    return 2 * m.params_b * 1e9 * tokens / (tp * g.bf16_tflops * 1e12 * cfg.mfu_prefill)


def gen_options(name: str, g: GpuType, pool: NodePool, m: ModelSpec, w: WorkloadSpec, cfg: PlanConfig) -> list[GenOption]:
    """Every feasible (tp, batch) replica on this GPU type: tp within a node, batch from b_max halved."""
    out = []
    tail_ratio = _tail_ratio(w)
    tool_mean, tool_tail = tool_time(w)
    for tp in sorted(set(cfg.gen_tp)):
        if tp > pool.gpus_per_node or pool.gpus_per_node % tp:
            continue
        b_max = max_decode_batch(g, m, w, cfg, tp)
        batches = sorted({max(1, b_max >> i) for i in range(max(cfg.batch_ladder, 1))}) if b_max >= 1 else []
        for b in batches:
            step = decode_step_s(g, m, w, cfg, tp, b, g.intra_node_gbps)
            pf = prefill_s(g, m, w, cfg, tp)
            rate = 1.0 / (w.response_tokens_mean * step / b + pf)
            engine_s = b / rate
            latency = engine_s + tool_mean
            tail = w.response_tokens_mean * tail_ratio * step + pf * b + tool_tail
            out.append(GenOption(name, tp, b, step, rate, latency, tail, rate * latency,
                                 decode_step_s(g, m, w, cfg, tp, 1, g.intra_node_gbps), pf))
    return out


def _tail_ratio(w: WorkloadSpec) -> float:
    return max(w.response_tokens_p99 / w.response_tokens_mean, 1.0) if w.response_tokens_mean > 0 else 1.0


def policy_fraction(w: WorkloadSpec) -> float:
    """f: the fraction of a trajectory's trained tokens that are policy (generated) tokens."""
    total = tokens_per_trajectory(w)
    return min(1.0, w.response_tokens_mean / total) if total > 0 else 1.0


def train_memory_gb(m: ModelSpec, cfg: PlanConfig, dp: int, tp: int, pp: int, w: WorkloadSpec | None = None) -> float:
    """Per-device memory of training (trainer/planner/memory.py, term by term): 16 bytes/param of weights, grads
    and Adam state (sharded over all devices, or over tp x pp only), the gathered root unit and layers (sharded),
    DDP's gradient buckets (replicated), checkpointed activations and one layer's working set, and the fp32 logits
    at the workload's policy tokens (all policy tokens without a workload)."""
    from trainer.planner.memory import learner_memory

    mem = learner_memory(m, strategy="fsdp2" if cfg.shard_optimizer else "ddp", ranks=dp,
                         micro_batch_tokens=cfg.micro_batch_tokens, checkpointing=True,
                         policy_fraction=policy_fraction(w) if w is not None else 1.0, tp=tp, pp=pp)
    return mem.total / 1e9


def train_step_s(g: GpuType, m: ModelSpec, w: WorkloadSpec, cfg: PlanConfig, dp: int, tp: int, pp: int,
                 intra_gbps: float, dp_gbps: float) -> float:
    """tau_c of one step (see the module docstring); measured tokens/s replace the roofline when profiled."""
    trained = w.batch_size * w.group_size * w.trained_fraction
    tokens = trained * tokens_per_trajectory(w)
    if g.measured and g.measured.model == m.name and g.measured.train_tokens_per_s > 0:
        # hexsearch's learner (what a profile measures) runs the prefix all sequences share once per step
        computed = trained * max(tokens_per_trajectory(w) - w.shared_prefix_tokens, 0.0)
        return computed / (g.measured.train_tokens_per_s * dp) + g.measured.train_fixed_s
    p = m.params_b * 1e9
    flops = (8 if cfg.recompute_prox else 6) * p * tokens
    n = dp * tp * pp
    micro = max(1.0, tokens / (dp * cfg.micro_batch_tokens))
    comp = flops / (n * g.bf16_tflops * 1e12 * cfg.mfu_train) * (1 + (pp - 1) / micro)
    link = cfg.link_efficiency * 1e9
    t_tp = (tokens / dp) * (m.layers / pp) * 4 * m.hidden * 2 * 2 * (tp - 1) / tp / (intra_gbps * link) if tp > 1 else 0.0
    t_dp = 3 * 2 * p / (tp * pp) * (dp - 1) / dp / (dp_gbps * link) if dp > 1 else 0.0
    t_pp = (tokens / dp) * m.hidden * 2 * 2 * (pp - 1) / pp / (dp_gbps * link) if pp > 1 else 0.0
    return comp + t_tp + t_dp + t_pp


def train_options(name: str, g: GpuType, pools: list[NodePool], m: ModelSpec, w: WorkloadSpec,
                  cfg: PlanConfig, cross_node_gbps: float | None = None) -> list[TrainOption]:
    """Every (dp, tp, pp) that fits in memory on this type's devices (tp inside a node; any device count up to eight
    nodes, whole nodes beyond), the fastest per device count, and only counts that are faster than all smaller ones."""
    gpn = min(p.gpus_per_node for p in pools)
    total = sum(p.nodes * p.gpus_per_node for p in pools)
    nic = min([p.nic_gbps for p in pools] + ([cross_node_gbps] if cross_node_gbps else []))  # phase 2 may lower it
    out = []
    for tp in sorted(set(cfg.train_tp)):
        for pp in sorted(set(cfg.train_pp)):
            if tp > gpn or gpn % tp or pp > max(m.layers, 1):
                continue
            for dp in range(1, total // (tp * pp) + 1):
                n = dp * tp * pp
                if n > 8 * gpn and n % gpn:  # beyond eight nodes, whole nodes only (keeps the MILP small)
                    continue
                mem = train_memory_gb(m, cfg, dp, tp, pp, w)
                if mem > g.hbm_gb * cfg.memory_fraction:
                    continue
                dp_gbps = g.intra_node_gbps if n <= gpn else nic
                fixed = g.measured.train_fixed_s if g.measured and g.measured.model == m.name else 0.0
                out.append(TrainOption(name, dp, tp, pp, train_step_s(g, m, w, cfg, dp, tp, pp, g.intra_node_gbps,
                                                                      dp_gbps), mem, fixed))
    return _pareto(out)


def _pareto(options: list[TrainOption]) -> list[TrainOption]:
    """Drop options that use at least as many devices and are no faster than another (same GPU type)."""
    best: dict[int, TrainOption] = {}
    for o in options:
        if o.gpus not in best or o.step_s < best[o.gpus].step_s:
            best[o.gpus] = o
    kept, fastest = [], math.inf
    for n in sorted(best):
        if best[n].step_s < fastest:
            kept.append(best[n])
            fastest = best[n].step_s
    return kept


def sync_s(m: ModelSpec, cfg: PlanConfig, gbps: float) -> float:
    """tau_sync: the new weights over the narrowest trainer-to-engine link, plus the engines' load time."""
    return m.params_b * 1e9 * m.bytes_per_param / (gbps * 1e9 * cfg.link_efficiency) + cfg.weight_load_s
