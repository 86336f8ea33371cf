"""The plan file: a config overlay that `hexsearch train` loads, with the explanation as comments.

    # hexsearch plan: ... (explanation)
    extends: ../configs/recipe.yaml          # with --base
    plan:  {cluster, model, workload, budget_per_hour, nodes: {node: {ray resources}}}
    train: {engine_replicas, learner_workers, rollout_workers, *_resources, batch/group/staleness}

Each node of the plan declares its Ray resources (`plan.nodes`, also printed as `ray start` lines); the
roles ask for one `hexsearch_engine` / `hexsearch_learner` / `hexsearch_rollout` slot each, plus the
device type when the role uses only one, so Ray puts every actor on a node the plan gave it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from trainer.planner.partition import ray_resources
from trainer.planner.planner import PlanResult
from trainer.planner.problem import Inputs


def overlay(inputs: Inputs, r: PlanResult) -> dict[str, Any]:
    """The `plan` and `train` sections the plan sets."""
    p, s = r.problem, r.solution
    c = p.train[s.train]
    engines = [p.gen[k] for k, n in s.replicas.items() for _ in range(n)]
    engine_types = {g.gpu for g in engines}
    tps = sorted({g.tp for g in engines})

    def role(gpu_types: set[str], devices: int, slot: str) -> dict[str, Any]:
        res: dict[str, Any] = {"resources": {slot: 1.0}}
        cpu = all(inputs.types[t].cpu for t in gpu_types)
        if cpu:
            res.update(num_cpus=float(devices), num_gpus=0.0, threads=devices)
        else:
            res.update(num_cpus=1.0, num_gpus=float(devices))
        if len(gpu_types) == 1:
            res["resources"][next(iter(gpu_types))] = float(devices)
        return res

    engine_nodes = [n for n in r.nodes if n.engines]
    w = inputs.workload
    train = {
        "batch_size": w.batch_size, "group_size": w.group_size, "max_staleness": w.max_staleness,
        "engine_replicas": len(engines), "learner_workers": c.gpus if c.tp * c.pp == 1 else c.dp,
        "rollout_workers": max(1, len(engine_nodes)),
        "engine_resources": role(engine_types, tps[0], "hexsearch_engine"),
        "learner_resources": role({c.gpu}, c.tp * c.pp, "hexsearch_learner"),
        "rollout_resources": {"num_cpus": 0.0, "threads": 1, "resources": {"hexsearch_rollout": 1.0}},
    }
    if w.max_inflight_trajectories:
        train["max_inflight_trajectories"] = w.max_inflight_trajectories
    nodes = ray_resources(r.nodes)
    for n in r.nodes:  # a learner slot per learner process (tp x pp devices each)
        if n.learners:
            nodes[n.name]["hexsearch_learner"] = float(max(1, n.learners // (c.tp * c.pp)))
    cfg = inputs.cfg
    plan = {"cluster": _abs(cfg.cluster), "model": _abs(cfg.model), "workload": _abs(cfg.workload),
            "budget_per_hour": cfg.budget_per_hour, "target_samples_per_s": cfg.target_samples_per_s, "nodes": nodes}
    return {"plan": plan, "train": train}


def _abs(path: str) -> str:
    return str(Path(path).resolve()) if path else ""


def render(inputs: Inputs, r: PlanResult, base: str | None = None, out: str | Path | None = None) -> str:
    """The plan file's text."""
    lines = ["# hexsearch plan (generated; `hexsearch train <this file>` places actors as planned)"]
    lines += [f"# {line}" for line in r.explanation]
    lines.append(f"# solved in {r.solve_s:.2f}s, {r.iterations} round(s) of MILP + partitioning")
    if len(r.problem.train[r.solution.train].__dict__) and any(len(n.engines) and len(set(n.engines)) > 1 for n in r.nodes):
        lines.append("# note: engine replicas of different tensor-parallel degrees; engine_resources asks for the smallest")
    lines.append("# start each node with its resources:")
    ov = overlay(inputs, r)
    for name, res in ov["plan"]["nodes"].items():
        lines.append(f"#   {name}: ray start --address=<head> --resources='{json.dumps(res)}'")
    text = "\n".join(lines) + "\n"
    if base:
        rel = os.path.relpath(Path(base).resolve(), Path(out).resolve().parent) if out else base
        text += f"extends: {rel}\n"
    return text + OmegaConf.to_yaml(OmegaConf.create(ov))


def write(inputs: Inputs, r: PlanResult, out: str | Path, base: str | None = None) -> Path:
    """Write the plan file (atomically) and return its path."""
    from core.checkpoint import write_atomic

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, render(inputs, r, base, out))
    return out
