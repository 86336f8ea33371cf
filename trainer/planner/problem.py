"""From the input files to a `milp.Problem`: enumerate generation and training options per GPU type."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainer.planner.config import PlanConfig
from trainer.planner.costs import gen_options, sync_s, train_options
from trainer.planner.milp import Problem
from trainer.planner.specs import Cluster, GpuType, ModelSpec, WorkloadSpec, gpu_counts


@dataclass
class Inputs:
    """Everything the planner reads, loaded and checked."""

    cluster: Cluster
    """The cluster (pools of nodes)."""
    types: dict[str, GpuType]
    """GPU types by name (catalog + the cluster's own)."""
    model: ModelSpec
    """The model."""
    workload: WorkloadSpec
    """The workload."""
    cfg: PlanConfig
    """Planner knobs."""


def worst_sync_gbps(inputs: Inputs) -> float:
    """Phase 1's assumption for the weight-sync link: the slowest inter-node path in the cluster."""
    pools = inputs.cluster.pools
    nic = min(p.nic_gbps for p in pools)
    racks = {p.rack or p.name for p in pools}
    return min(nic, inputs.cluster.inter_rack_gbps) if len(racks) > 1 else nic


def build_problem(inputs: Inputs, sync_gbps: float | None = None, only: str = "",
                  train_gbps: float | None = None) -> Problem:
    """The MILP instance; `only` restricts the cluster to one GPU type (a homogeneous baseline). `sync_gbps`
    (default: the worst inter-node link) and `train_gbps` (default: the NIC) are the links phase 2 measured
    for the weight sync and between the trainer's nodes."""
    cfg, m, w = inputs.cfg, inputs.model, inputs.workload
    gen, train = [], []
    by_type: dict[str, list] = {}
    for pool in inputs.cluster.pools:
        by_type.setdefault(pool.gpu, []).append(pool)
    for name, pools in by_type.items():
        if only and name != only:
            continue
        g = inputs.types[name]
        gen.extend(gen_options(name, g, min(pools, key=lambda p: p.gpus_per_node), m, w, cfg))
        train.extend(train_options(name, g, pools, m, w, cfg, train_gbps))
    counts = {k: v for k, v in gpu_counts(inputs.cluster).items() if not only or k == only}
    measured_sync = max((inputs.types[k].measured.weight_sync_s for k in counts
                         if inputs.types[k].measured and inputs.types[k].measured.model == m.name), default=0.0)
    return Problem(gen=gen, train=train, counts=counts,
                   prices={k: inputs.types[k].price_per_hour for k in counts},
                   batch_samples=w.batch_size * w.group_size,
                   sync_s=sync_s(m, cfg, sync_gbps if sync_gbps is not None else worst_sync_gbps(inputs)) + measured_sync,
                   max_staleness=w.max_staleness, max_concurrent=w.max_inflight_trajectories,
                   budget=cfg.budget_per_hour, target=cfg.target_samples_per_s, time_limit_s=cfg.time_limit_s)


def homogeneous(inputs: Inputs, gpu: str, budget: float) -> Inputs:
    """The baseline at equal budget: the cluster's pools of `gpu` only (same nodes, racks and links), plus
    nodes of the same shape in the first such pool's rack when the budget buys more devices than they hold."""
    pools = [p for p in inputs.cluster.pools if p.gpu == gpu]
    devices = int(budget // inputs.types[gpu].price_per_hour)
    have = sum(p.nodes * p.gpus_per_node for p in pools)
    if devices > have:
        first = pools[0]
        extra = -(-(devices - have) // first.gpus_per_node)
        pools = pools + [dataclasses.replace(first, name=f"{first.name}-extra", nodes=extra, rack=first.rack or first.name)]
    return dataclasses.replace(inputs, cluster=dataclasses.replace(inputs.cluster, pools=pools))
