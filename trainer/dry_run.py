"""`hexsearch train CONFIG --dry-run`: the placement and memory per device of a run, without Ray or a GPU.

It resolves what a run would place: the devices (`plan.cluster` of a plan file from `hexsearch plan`, else nodes of
8 x `--gpu` from the shipped catalog, as many as the roles need; the CPU of this machine when no role uses a GPU),
the roles' Ray bundles per node (a plan's `plan.nodes` slots, else engines then learners packed onto nodes in
order, as Ray's PACK strategy does), and per role the memory per device from the planner's model
(trainer/planner/memory.py; the learner at a micro-batch of policy tokens only, its worst case; an engine's KV
cache for the trajectories it holds at full context, as much as its memory holds), the trajectories in flight
(trainer/staleness.py) and the planner's predicted tokens/s and step time (trainer/planner/costs.py) for the
workload (`plan.workload`, else a shipped one with this config's batch, group, staleness and cap).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from trainer.config import FullConfig, TrainConfig
from trainer.planner import costs
from trainer.planner.memory import engine_memory_gb, learner_memory, model_spec_of
from trainer.planner.specs import (
    CATALOG,
    GpuType,
    ModelSpec,
    NodePool,
    WorkloadSpec,
    load_catalog,
    load_cluster,
    load_spec,
)
from trainer.staleness import inflight_trajectories

PLANNER = CATALOG.parent


@dataclass
class Role:
    name: str
    """`learner` or `engine`."""
    actors: int
    """Ray actors of the role."""
    devices_each: int
    """Devices per actor."""
    parts_gb: dict[str, float]
    """Memory per device by term."""
    placed: list[str] = field(default_factory=list)
    """`node:device` of every device the role holds."""
    note: str = ""

    @property
    def gb(self) -> float:
        return sum(self.parts_gb.values())


@dataclass
class DryRun:
    device: str
    """GPU type (or `cpu`) and what one device offers."""
    usable_gb: float
    """Memory per device the roles may use (memory x the planner's memory_fraction)."""
    nodes: dict[str, list[dict[str, float]]]
    """Ray bundles per node."""
    roles: list[Role]
    inflight: int
    tokens_per_s: float
    step_s: float
    workload: str
    shortfalls: list[str]

    @property
    def fits(self) -> bool:
        return not self.shortfalls

    def lines(self) -> list[str]:
        out = [f"devices: {self.device}, {self.usable_gb:.1f} GB usable per device; workload {self.workload}"]
        for node, bundles in self.nodes.items():
            kinds: dict[str, int] = {}
            for b in bundles:
                key = "{" + ", ".join(f"{k}: {v:g}" for k, v in b.items()) + "}"
                kinds[key] = kinds.get(key, 0) + 1
            out.append(f"  {node} bundles: " + ", ".join(f"{n} x {k}" for k, n in kinds.items()))
        for r in self.roles:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in r.parts_gb.items())
            out.append(f"{r.name}: {r.actors} x {r.devices_each} device(s) on {', '.join(r.placed) or '-'}; "
                       f"{r.gb:.1f} GB per device ({parts}){'; ' + r.note if r.note else ''}")
        out.append(f"trajectories in flight: {self.inflight}; predicted {self.tokens_per_s:.0f} generated tokens/s, "
                   f"{self.step_s:.1f} s per step")
        out.extend(self.shortfalls)
        learner = next((r.gb for r in self.roles if r.name == "learner"), 0.0)
        engine = next((r.gb for r in self.roles if r.name == "engine"), 0.0)
        out.append(f"RESULT dry_run fits={str(self.fits).lower()} inflight_trajectories={self.inflight} "
                   f"learner_gb_per_gpu={learner:.1f} engine_gb_per_gpu={engine:.1f} step_s={self.step_s:.1f}")
        return out


def _model_spec(cfg: FullConfig, bytes_per_param: float) -> ModelSpec:
    """`plan.model`, else the shipped planner model of the same name, else the model's own config (loaded)."""
    if cfg.plan.model:
        return load_spec(cfg.plan.model, ModelSpec)
    want = Path(cfg.engine.model.rstrip("/")).name.lower()
    for path in sorted((PLANNER / "models").glob("*.yaml")):
        spec = load_spec(path, ModelSpec)
        if spec.name.lower() == want or path.stem == want:
            return replace(spec, bytes_per_param=bytes_per_param) if spec.bytes_per_param != bytes_per_param else spec
    return model_spec_of(cfg.engine.model, bytes_per_param)


def _workload(cfg: FullConfig, on_gpu: bool) -> tuple[WorkloadSpec, str]:
    path = cfg.plan.workload or str(PLANNER / "workloads" / ("search-agent.yaml" if on_gpu else "quickstart-cpu.yaml"))
    t = cfg.train
    w = replace(load_spec(path, WorkloadSpec), batch_size=t.batch_size, group_size=t.group_size,
                max_staleness=t.max_staleness, max_inflight_trajectories=t.max_inflight_trajectories)
    return w, os.path.relpath(path)


def _host_cpu() -> GpuType:
    """This machine as one device: its RAM; speeds of a few-core CPU (assumed: `hexsearch plan profile` measures)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return GpuType(hbm_gb=ram, hbm_tbps=0.02, bf16_tflops=0.2, intra_node_gbps=10.0, source="assumed", cpu=True)


def _devices(cfg: FullConfig, gpu: str, gpus_per_node: int, needed: int, on_gpu: bool) -> tuple[str, GpuType, list[tuple[str, int]]]:
    """(type name, type, [(node, devices)]): the plan's cluster, nodes of `gpu` from the catalog, or this CPU."""
    if not on_gpu:
        return "cpu", _host_cpu(), [("local", 1)]
    if cfg.plan.cluster:
        cluster, types = load_cluster(cfg.plan.cluster)
        pool = cluster.pools[0]
        nodes = [(f"{p.name}-{i}", p.gpus_per_node) for p in cluster.pools for i in range(p.nodes)]
        return pool.gpu, types[pool.gpu], nodes
    types = load_catalog(CATALOG)
    if gpu not in types:
        raise ValueError(f"--gpu {gpu}: not in {CATALOG} (known: {', '.join(sorted(types))})")
    count = max(1, math.ceil(needed / gpus_per_node))
    return gpu, types[gpu], [(f"node-{i}", gpus_per_node) for i in range(count)]


def _pack(roles: list[Role], nodes: list[tuple[str, int]], cfg: FullConfig) -> dict[str, list[dict[str, float]]]:
    """Each actor's GPUs on one node, nodes filled in order (engines first); the rollout workers spread over the
    nodes. Records `node:gpu` on the roles; an actor that fits on no node is left unplaced (a shortfall)."""
    free = {name: list(range(n)) for name, n in nodes}
    bundles: dict[str, list[dict[str, float]]] = {name: [] for name, _ in nodes}
    for role in roles:
        for _ in range(role.actors):
            node = next((n for n, gpus in free.items() if len(gpus) >= role.devices_each), None)
            if node is None:
                continue
            taken, free[node] = free[node][:role.devices_each], free[node][role.devices_each:]
            role.placed += [f"{node}:{g}" for g in taken]
            bundles[node].append({"GPU": float(role.devices_each), "CPU": 1.0, f"hexsearch_{role.name}": 1.0})
    names = list(bundles)
    for i in range(cfg.train.rollout_workers):
        bundles[names[i % len(names)]].append({"CPU": cfg.train.rollout_resources.num_cpus, "hexsearch_rollout": 1.0})
    return bundles


def dry_run(cfg: FullConfig, gpu: str = "H100", gpus_per_node: int = 8) -> DryRun:
    from serving.backends import engine_backend

    t, e = cfg.train, cfg.engine
    backend = engine_backend(e.backend)
    gpu_servers = backend.gpu_server and not e.urls  # servers this run would start, on GPUs
    on_gpu = gpu_servers or e.device.startswith("cuda") or bool(cfg.plan.cluster) or (
        t.learner_resources.num_gpus > 0)
    serves = gpu_servers or not backend.remote
    compute = 4 if (t.precision == "fp32" or (t.precision == "auto" and not on_gpu)) else 2
    weight_bytes = 4 if e.dtype == "float32" or (e.dtype == "auto" and not on_gpu) else 2
    m = _model_spec(cfg, weight_bytes)
    w, wname = _workload(cfg, on_gpu)
    tp = max(1, e.tensor_parallel_size) if backend.gpu_server else 1
    inflight = inflight_trajectories(t)

    lm = learner_memory(m, strategy=t.learner.strategy, ranks=t.learner_workers, micro_batch_tokens=t.micro_batch_tokens,
                        checkpointing=t.gradient_checkpointing, policy_fraction=1.0, compute_bytes=compute)
    roles = [Role("learner", t.learner_workers, 1, lm.parts_gb(), note="logits at a micro-batch of policy tokens only")]
    needed = t.learner_workers + (t.engine_replicas * tp if serves else 0)
    name, g, nodes = _devices(cfg, gpu, gpus_per_node, needed, on_gpu)
    usable = g.hbm_gb * cfg.plan.memory_fraction
    per_replica = math.ceil(inflight / max(1, t.engine_replicas))
    if serves:
        seqs = min(per_replica, e.max_batch_size)
        context = min(cfg.agent.max_context_tokens, e.max_model_len)
        em = engine_memory_gb(m, tp=tp, sequences=seqs, context_tokens=context)
        if not backend.remote:  # the embedded engine's own bounds: the running batch's KV and the finished requests' prefix cache
            em["kv_cache"] = min(em["kv_cache"], e.kv_cache_gb) + e.prefix_cache_gb
            note = f"{seqs} sequences at once; KV bounded by engine.kv_cache_gb"
        else:
            room = max(usable - em["weights"], 0.0)
            holds = int(room // (context * m.kv_bytes_per_token / tp / 1e9)) if m.kv_bytes_per_token else seqs
            note = (f"{seqs} sequences at once (of {per_replica} in flight per replica); the KV cache holds {holds} at "
                    f"{context} tokens (a paged cache holds more at shorter contexts)")
            em["kv_cache"] = min(em["kv_cache"], room)
        roles.insert(0, Role("engine", t.engine_replicas, tp, em, note=note))
    shortfalls = []
    if on_gpu:
        bundles = _pack(roles, nodes, cfg)
        for r in roles:
            if len(r.placed) < r.actors * r.devices_each:
                shortfalls.append(f"dry-run: {r.name} needs {r.actors * r.devices_each} {name} GPUs, the nodes have "
                                  f"{sum(n for _, n in nodes)} for all roles: short by {r.actors * r.devices_each - len(r.placed)}")
        full_context = (min(cfg.agent.max_context_tokens, e.max_model_len) * m.kv_bytes_per_token / tp / 1e9
                        if serves and backend.remote else 0.0)
        for r in roles:
            need = r.gb + (full_context if r.name == "engine" and r.parts_gb["kv_cache"] < full_context else 0.0)
            if need > usable:
                where = r.placed[0] if r.placed else "unplaced"
                shortfalls.append(f"dry-run: {r.name} on {name} GPU {where} needs {need:.1f} GB, {usable:.1f} GB usable "
                                  f"({g.hbm_gb:g} GB x {cfg.plan.memory_fraction:g}): short by {need - usable:.1f} GB")
    else:
        bundles = {"local": [{"CPU": t.learner_resources.num_cpus} for _ in range(t.learner_workers)]
                   + [{"CPU": t.engine_resources.num_cpus} for _ in range(t.engine_replicas if serves else 0)]}
        for r in roles:
            r.placed = ["local:cpu"]
        total = sum(r.gb * r.actors for r in roles)
        if total > usable:
            shortfalls.append(f"dry-run: learner and engines on cpu need {total:.1f} GB together, {usable:.1f} GB usable: "
                              f"short by {total - usable:.1f} GB")
    tokens_s, step = _speed(g, m, w, cfg, tp, t, inflight)
    return DryRun(f"{name} ({g.hbm_gb:.0f} GB)", usable, bundles, roles, inflight, tokens_s, step, wname, shortfalls)


def _speed(g: GpuType, m: ModelSpec, w: WorkloadSpec, cfg: FullConfig, tp: int, t: TrainConfig, inflight: int) -> tuple[float, float]:
    """(generated tokens/s, seconds per step): the planner's generation option at the decode batch each replica gets,
    Little's law for the trajectories in flight, its training step time and weight sync."""
    plan = replace(cfg.plan, micro_batch_tokens=t.micro_batch_tokens, recompute_prox=t.minibatches > 1,
                   shard_optimizer=t.learner.strategy == "fsdp2", max_decode_batch=cfg.engine.max_batch_size)
    options = [o for o in costs.gen_options("x", g, NodePool(gpus_per_node=max(tp, 8)), m, w, plan) if o.tp == tp]
    per_replica = inflight / max(1, t.engine_replicas)
    if options:
        k = min(options, key=lambda o: (abs(o.batch - min(per_replica, options[-1].batch)), -o.batch))
        rate = min(t.engine_replicas * k.samples_per_s, inflight / max(k.latency_s, 1e-9))
    else:
        rate = 0.0
    train = costs.train_step_s(g, m, w, plan, t.learner_workers, 1, 1, g.intra_node_gbps, g.intra_node_gbps)
    batch = t.batch_size * t.group_size
    step = max(train, batch / rate if rate > 0 else math.inf) + costs.sync_s(m, plan, g.intra_node_gbps)
    return rate * w.response_tokens_mean, step
