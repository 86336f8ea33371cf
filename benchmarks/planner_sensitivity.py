"""How the planner's heterogeneous gain depends on inputs that are not sourced exactly: the cost-model ratio
(heterogeneous plan / best single-type plan at equal budget, phases 1 + 2, not simulated) of each scenario of
benchmarks/planner.py under variants of the math workload and of the planner's knobs, with the share of the
single-type plan's devices that generate. docs/planner.md quotes it; it writes nothing.

    .venv/bin/python benchmarks/planner_sensitivity.py        # ~1 min (hold /tmp/hexsearch-cpu.lock)
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HEXSEARCH_QUIET", "1")

from planner import MODELS, PLANNER, SIZES  # noqa: E402

from trainer.planner.config import PlanConfig  # noqa: E402
from trainer.planner.planner import homogeneous_best, make_plan  # noqa: E402
from trainer.planner.problem import Inputs  # noqa: E402
from trainer.planner.specs import ModelSpec, WorkloadSpec, load_cluster, load_spec  # noqa: E402

VARIANTS = {
    "as shipped": ({}, {}),
    "mean 8192, p99 27648 (AReaL's generation cap)": ({"response_tokens_mean": 8192, "response_tokens_p99": 27648}, {}),
    "decode batch cap 1024": ({}, {"max_decode_batch": 1024}),
}
"""name -> (workload changes, plan.* changes)."""


def main() -> None:
    for label, (work, knobs) in VARIANTS.items():
        ratios = []
        for size, (cluster_file, batch, _) in SIZES.items():
            cluster, types = load_cluster(PLANNER / "clusters" / cluster_file)
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
    main()
