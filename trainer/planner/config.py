"""Planner configuration (section `plan`): what `hexsearch plan` reads besides its three input files.

The inputs themselves (cluster, model, workload) are YAML files described by the dataclasses in
`trainer.planner.specs`; the knobs here are the cost models' efficiency factors and the search space.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PlanConfig:
    cluster: str = ""
    """Cluster description YAML (GPU types, counts per node, prices, links); see configs/planner/clusters/."""
    model: str = ""
    """Model description YAML (parameters, layers, hidden size, KV bytes per token); see configs/planner/models/."""
    workload: str = ""
    """Workload description YAML (prompt and response lengths, turns, tool latency, batch, group, staleness);
    see configs/planner/workloads/."""
    budget_per_hour: float = 0.0
    """Price budget in dollars per hour for the GPUs the plan uses (0: unlimited, only device counts bind)."""
    target_samples_per_s: float = 0.0
    """Throughput target in trained samples/s. When > 0 the planner minimises cost subject to reaching it
    (instead of maximising throughput under `budget_per_hour`)."""
    mfu_train: float = 0.4
    """Model FLOP utilisation of training: achieved / peak dense bf16 FLOP/s."""
    mfu_prefill: float = 0.5
    """FLOP utilisation of prefill and of the compute-bound part of decoding."""
    hbm_efficiency: float = 0.7
    """Fraction of peak memory bandwidth that decoding attains (weights + KV read per decode step)."""
    link_efficiency: float = 0.7
    """Fraction of a link's nominal bandwidth that collectives and weight transfers attain."""
    memory_fraction: float = 0.9
    """Fraction of device memory usable for weights, KV cache, optimizer state and activations."""
    max_decode_batch: int = 256
    """Most sequences one generation replica decodes at once (besides the KV-capacity bound)."""
    batch_ladder: int = 4
    """Decode batch sizes tried per generation configuration: the largest that fits, then halved this many
    times less one (smaller batches have lower latency, which the staleness bound may need)."""
    gen_tp: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    """Tensor-parallel degrees tried for generation replicas (a replica stays inside one node)."""
    train_tp: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    """Tensor-parallel degrees tried for training ([1] for hexsearch's own data-parallel learner)."""
    train_pp: list[int] = field(default_factory=lambda: [1, 2, 4])
    """Pipeline-parallel degrees tried for training ([1] for hexsearch's own learner)."""
    shard_optimizer: bool = True
    """Training shards weights, gradients and Adam state over all its GPUs (FSDP/ZeRO-3). False: every
    data-parallel rank holds a full copy (hexsearch's own learner today)."""
    recompute_prox: bool = True
    """Training runs an extra forward pass for pi_prox (`train.prox_logp=recompute`): 8 instead of 6 FLOPs
    per parameter and token."""
    micro_batch_tokens: int = 16384
    """Tokens per training micro-batch (activation memory and pipeline micro-batch count)."""
    allreduce_latency_us: float = 10.0
    """Fixed latency of one collective call (added per tensor-parallel all-reduce in decoding)."""
    weight_load_s: float = 0.0
    """Fixed seconds an engine needs to swap in new weights, on top of the transfer (pause, load, resume)."""
    max_iterations: int = 3
    """Rounds of MILP (phase 1) and partitioning (phase 2): phase 2's real weight-sync bandwidth is fed back."""
    time_limit_s: float = 60.0
    """Wall-clock limit of one MILP solve (HiGHS)."""
    simulate_steps: int = 30
    """Training steps the discrete-event simulator runs to evaluate the plan (the first 20% are warm-up)."""
    seed: int = 0
    """Seed of the simulator's random response lengths and tool latencies."""
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    """Output of `hexsearch plan`: the Ray resources each node of the plan declares (`ray start --resources`),
    keyed by node name. Roles ask for `hexsearch_engine`, `hexsearch_learner`, `hexsearch_rollout` slots, so Ray
    places every actor on a node the plan gave it."""
