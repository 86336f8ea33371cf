"""How the planner's heterogeneous gain depends on inputs that are not sourced exactly, and on the AReaL-Hex
inputs (device figures, links, prices, batch and staleness) against the ones used before: the cost-model ratio
(heterogeneous plan / best single-type plan at equal budget, phases 1 + 2, not simulated) of each scenario of
benchmarks/planner.py under variants of the math workload and of the planner's knobs, with the share of the
single-type plan's devices that generate. docs/planner.md quotes it; it writes nothing.

    .venv/bin/python benchmarks/planner_sensitivity.py        # ~2 min (hold /tmp/hexsearch-cpu.lock)
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner import MODELS, PLANNER, SIZES  # noqa: E402

from trainer.planner.config import PlanConfig  # noqa: E402
from trainer.planner.planner import homogeneous_best, make_plan  # noqa: E402
from trainer.planner.problem import Inputs  # noqa: E402
from trainer.planner.specs import ModelSpec, WorkloadSpec, load_cluster, load_spec  # noqa: E402

SXM5 = {"bf16_tflops": 989, "hbm_tbps": 3.35}
"""The catalog's H800 (SXM5 datasheet) instead of AReaL-Hex's (756 TFLOPS, 2 TB/s)."""
FAST_LINKS = {"nic_gbps": 50, "inter_rack_gbps": 25}
"""400 Gb/s per GPU and 25 GB/s between racks instead of AReaL-Hex's 5 and 1.5 GB/s."""
VARIANTS = {
    "as shipped": ({}, {}, {}),
    "mean 8192, p99 27648 (AReaL's generation cap)": ({"response_tokens_mean": 8192, "response_tokens_p99": 27648},
                                                      {}, {}),
    "decode batch cap 1024": ({}, {"max_decode_batch": 1024}, {}),
    "catalog H800 (SXM5)": ({}, {}, {"H800": SXM5}),
    "50 GB/s NICs, 25 GB/s between racks": ({}, {}, FAST_LINKS),
    "before AReaL-Hex's inputs (SXM5, fast links, H20 $2.00, B 256/2048, eta 4)":
        ({"max_staleness": 4}, {}, {"H800": SXM5, "H20": {"price_per_hour": 2.0}, "batch": {64: 256, 1024: 2048},
                                    **FAST_LINKS}),
}
"""name -> (workload changes, plan.* changes, cluster changes: per GPU type field changes, link changes, batch)."""


def _cluster(cluster, types, change: dict):
    types = {g: dataclasses.replace(t, **change.get(g, {})) for g, t in types.items()}
    if "nic_gbps" in change:
        cluster = dataclasses.replace(cluster, pools=[dataclasses.replace(p, nic_gbps=change["nic_gbps"])
                                                      for p in cluster.pools])
    if "inter_rack_gbps" in change:
        cluster = dataclasses.replace(cluster, inter_rack_gbps=change["inter_rack_gbps"])
    return cluster, types


def main() -> None:
    for label, (work, knobs, change) in VARIANTS.items():
        ratios = []
        for size, (cluster_file, batch, _) in SIZES.items():
            cluster, types = _cluster(*load_cluster(PLANNER / "clusters" / cluster_file), change)
            batch = change.get("batch", {}).get(size, batch)
            budget = size * types["H800"].price_per_hour
            for name in MODELS:
                w = dataclasses.replace(load_spec(PLANNER / "workloads" / "math.yaml", WorkloadSpec), batch_size=batch,
                                        **work)
                inp = Inputs(cluster, types, load_spec(PLANNER / "models" / f"{name}.yaml", ModelSpec), w,
                             PlanConfig(budget_per_hour=budget, **knobs))
                het = make_plan(inp, simulate_plan=False, explain=False).solution
                gpu, homo = homogeneous_best(inp, budget)
                h = homo.solution
                generating = sum(homo.problem.gen[k].tp * n for k, n in h.replicas.items()) / sum(h.devices.values())
                ratios.append(het.throughput / h.throughput)
                print(f"{label:46s} {size:5d} GPUs {name:13s} ratio {ratios[-1]:.3f}  ({gpu}-only plan: "
                      f"{generating:.0%} of its devices generate)", flush=True)
        print(f"{label:46s} geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}\n", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HEXSEARCH_QUIET", "1")  # here, not at import: a test importing this module must not go quiet
    main()
