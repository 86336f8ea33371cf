"""A plan file places actors as planned: on a real Ray cluster of three nodes (one machine, three raylets),
each started with the resources the plan gives it, actors created with the options `hexsearch train` uses
(`trainer.placement.ray_options` of the plan's train.*_resources, the plan's counts) land on the planned nodes.
A local single-node Ray declares the plan's slots itself (`placement.requested_resources`)."""

from __future__ import annotations

from collections import Counter

import pytest

from hexsearch.config import load_config
from trainer.planner.config import PlanConfig
from trainer.planner.planfile import write
from trainer.planner.planner import make_plan
from trainer.planner.problem import Inputs
from trainer.planner.specs import Cluster, GpuType, MeasuredSpeed, ModelSpec, NodePool, WorkloadSpec

MODEL = ModelSpec("toy", 0.1, 4, 256, 4096, 4)


def cpu_device(decode_s: float, train_tps: float) -> GpuType:
    """A profiled CPU core with the given decode step and training speed."""
    return GpuType(hbm_gb=16, hbm_tbps=0, bf16_tflops=0, price_per_hour=1.0, intra_node_gbps=10, cpu=True,
                   source="test", price_source="test",
                   measured=MeasuredSpeed(model="toy", decode_base_s=decode_s, decode_per_seq_s=decode_s / 10,
                                          prefill_tokens_per_s=5000, train_tokens_per_s=train_tps, max_batch=16,
                                          weight_sync_s=0.1))


def toy_plan(tmp_path):
    """Decoding is fast on `genbox` cores and training fast on `trainbox` cores: the plan splits them."""
    cluster = Cluster(pools=[NodePool("gen", "genbox", 2, 2, 10, "r"), NodePool("train", "trainbox", 1, 2, 10, "r")])
    types = {"genbox": cpu_device(0.01, 300), "trainbox": cpu_device(0.2, 3000)}
    w = WorkloadSpec(prompt_tokens=100, response_tokens_mean=50, response_tokens_p99=50, turns=1, batch_size=4,
                     group_size=4, max_staleness=2)
    inp = Inputs(cluster, types, MODEL, w, PlanConfig(gen_tp=[1], train_tp=[1], train_pp=[1]))
    r = make_plan(inp, simulate_plan=False)
    return inp, r, load_config(write(inp, r, tmp_path / "plan.yaml"))


def test_plan_splits_roles_by_device_strength(tmp_path):
    _, r, cfg = toy_plan(tmp_path)
    assert {n.gpu for n in r.nodes if n.engines} == {"genbox"}
    assert {n.gpu for n in r.nodes if n.learners} == {"trainbox"}
    assert cfg.train.engine_resources.num_gpus == 0 and cfg.train.engine_resources.num_cpus == 1
    assert cfg.train.engine_resources.resources == {"hexsearch_engine": 1.0, "genbox": 1.0}


def test_requested_resources_let_a_local_ray_host_the_plan(tmp_path):
    from trainer.placement import requested_resources

    _, _, cfg = toy_plan(tmp_path)
    t = cfg.train
    need = requested_resources(t, embedded=True)
    assert need["hexsearch_engine"] == t.engine_replicas and need["hexsearch_learner"] == t.learner_workers
    assert need["hexsearch_rollout"] == t.rollout_workers
    assert need["genbox"] == t.engine_replicas and need["trainbox"] == t.learner_workers


@pytest.fixture()
def plan_cluster(tmp_path):
    """A Ray cluster whose nodes declare the plan's resources (+ a marker naming each node)."""
    import ray
    from ray.cluster_utils import Cluster as RayCluster

    inp, r, cfg = toy_plan(tmp_path)
    if ray.is_initialized():
        ray.shutdown()
    cluster = RayCluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for name, res in cfg.plan.nodes.items():
        cluster.add_node(num_cpus=4, resources={**res, f"test_marker_{name}": 1.0})
    cluster.wait_for_nodes()
    yield r, cfg, cluster
    ray.shutdown()
    cluster.shutdown()


def test_actors_land_on_the_planned_nodes(plan_cluster):
    import dataclasses

    import ray

    from trainer.placement import init_ray, ray_options

    r, cfg, cluster = plan_cluster
    t = dataclasses.replace(cfg.train, ray_address=cluster.address)
    init_ray(t)

    @ray.remote
    class Where:
        def node(self) -> str:
            me = ray.get_runtime_context().get_node_id()
            node = next(n for n in ray.nodes() if n["NodeID"] == me)
            return next(k[len("test_marker_"):] for k in node["Resources"] if k.startswith("test_marker_"))

    roles = {"engine": (t.engine_replicas, t.engine_resources), "learner": (t.learner_workers, t.learner_resources),
             "rollout": (t.rollout_workers, t.rollout_resources)}
    placed = {}
    for role, (count, res) in roles.items():
        actors = [Where.options(**ray_options(res)).remote() for _ in range(count)]
        placed[role] = Counter(ray.get([a.node.remote() for a in actors], timeout=60))
    nodes = cfg.plan.nodes
    assert placed["engine"] == Counter({n: int(v["hexsearch_engine"]) for n, v in nodes.items() if "hexsearch_engine" in v})
    assert placed["learner"] == Counter({n: int(v["hexsearch_learner"]) for n, v in nodes.items() if "hexsearch_learner" in v})
    assert placed["rollout"] == Counter({n: 1 for n, v in nodes.items() if "hexsearch_rollout" in v})
    assert sum(placed["engine"].values()) == sum(r.solution.replicas.values())
