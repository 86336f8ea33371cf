"""The planner: MILP = exhaustive search, simulator = closed form, every plan within every constraint,
infeasible inputs explained, the plan file loads as a config overlay."""

from __future__ import annotations

import dataclasses
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from hexsearch.config import load_config
from trainer.planner.config import PlanConfig
from trainer.planner.costs import GenOption, TrainOption, decode_step_s, train_step_s
from trainer.planner.exhaustive import exhaustive
from trainer.planner.milp import Problem, Solution, solve, theta_of_phi, violations
from trainer.planner.planfile import write
from trainer.planner.planner import Infeasible, make_plan
from trainer.planner.problem import Inputs, build_problem
from trainer.planner.simulator import simulate
from trainer.planner.specs import (
    Cluster,
    ModelSpec,
    NodePool,
    SpecError,
    WorkloadSpec,
    load_catalog,
    load_cluster,
    load_spec,
    lognormal_sigma,
    spec_from,
)

ROOT = Path(__file__).resolve().parents[1]
PLANNER = ROOT / "configs" / "planner"


def model(name: str) -> ModelSpec:
    return load_spec(PLANNER / "models" / f"{name}.yaml", ModelSpec)


def workload(name: str = "math", **changes) -> WorkloadSpec:
    return dataclasses.replace(load_spec(PLANNER / "workloads" / f"{name}.yaml", WorkloadSpec), **changes)


def inputs(cluster: Cluster, m: ModelSpec, w: WorkloadSpec, **cfg) -> Inputs:
    return Inputs(cluster, load_catalog(PLANNER / "gpus.yaml"), m, w, PlanConfig(**cfg))


def two_types(per_type: int = 4, racks: bool = True) -> Cluster:
    return Cluster(pools=[NodePool("h800", "H800", 1, per_type, 50, "a" if racks else ""),
                          NodePool("h20", "H20", 1, per_type, 50, "b" if racks else "")])


# -- phase 1 ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("budget", [0.0, 20.0, 12.0])
@pytest.mark.parametrize("eta", [0, 4])
@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "qwen2.5-7b"])
def test_milp_optimum_equals_exhaustive_search_on_real_cost_models(budget, eta, name):
    w = workload(batch_size=16, group_size=8, max_staleness=eta)
    p = build_problem(inputs(two_types(), model(name), w, budget_per_hour=budget, gen_tp=[1, 2], train_tp=[1, 2],
                             train_pp=[1], batch_ladder=2))
    milp, (best, seen) = solve(p), exhaustive(p)
    assert seen >= 10  # the search really enumerated alternatives
    assert (milp is None) == (best is None)
    if best is not None:
        assert milp.phi == pytest.approx(best.phi, rel=1e-6)
        assert milp.cost == pytest.approx(best.cost, rel=1e-6)
        assert violations(p, milp) == []


def random_problem(rng: random.Random) -> Problem:
    types = ["A", "B", "C"][: rng.randint(1, 3)]
    gen = [GenOption(t, tp, b, 0.01, rng.uniform(0.1, 3.0) * tp ** 0.8, lat, lat * rng.uniform(1, 4),
                     rng.uniform(1, 30)) for t in types for tp in (1, 2) for b, lat in ((8, rng.uniform(5, 50)),)]
    train = [TrainOption(t, n, 1, 1, rng.uniform(2, 40) / n ** 0.9, 1.0) for t in types for n in (1, 2, 3)]
    return Problem(gen=gen, train=train, counts={t: rng.randint(2, 5) for t in types},
                   prices={t: rng.choice([0.5, 1.0, 2.0, 5.0]) for t in types}, batch_samples=rng.choice([8, 32]),
                   sync_s=rng.uniform(0, 2), max_staleness=rng.randint(0, 3), max_concurrent=rng.choice([0, 40]),
                   budget=rng.choice([0.0, 6.0, 15.0]), target=rng.choice([0.0, 0.0, 0.5]))


def test_milp_optimum_equals_exhaustive_search_on_random_instances():
    rng = random.Random(7)
    feasible = 0
    for _ in range(60):
        p = random_problem(rng)
        milp, (best, _) = solve(p), exhaustive(p)
        assert (milp is None) == (best is None), p
        if best is None:
            continue
        feasible += 1
        assert violations(p, milp) == []
        if p.target > 0:  # cost mode: the cheapest plan that reaches the target
            assert milp.cost == pytest.approx(best.cost, rel=1e-6)
        else:
            assert milp.phi == pytest.approx(best.phi, rel=1e-6)
            assert milp.cost == pytest.approx(best.cost, rel=1e-6)
    assert feasible >= 20


# -- cost models --------------------------------------------------------------------------------------------

def test_cost_model_formulas_by_hand():
    types = load_catalog(PLANNER / "gpus.yaml")
    g, m, w, cfg = types["H20"], model("qwen2.5-7b"), workload(), PlanConfig()
    sigma = lognormal_sigma(w.response_tokens_mean, w.response_tokens_p99, from_mean=True)
    ctx = w.prompt_tokens + math.exp(sigma * sigma) * w.response_tokens_mean / 2  # a slot's time-average context
    by_hand = (m.params_b * 1e9 * 2 + 8 * ctx * m.kv_bytes_per_token) / (4.0e12 * cfg.hbm_efficiency)
    assert decode_step_s(g, m, w, cfg, 1, 8, g.intra_node_gbps) == pytest.approx(by_hand)  # memory-bound at b=8
    by_hand = 2 * m.params_b * 1e9 * 64 / (148e12 * cfg.mfu_prefill)  # H20's 148 TFLOP/s: compute-bound at b=64
    assert decode_step_s(g, m, w, cfg, 1, 64, g.intra_node_gbps) == pytest.approx(by_hand)
    tokens = w.batch_size * w.group_size * (w.prompt_tokens + w.response_tokens_mean)
    h800 = types["H800"]
    assert train_step_s(h800, m, w, cfg, 1, 1, 1, 200, 50) == pytest.approx(
        8 * m.params_b * 1e9 * tokens / (989e12 * cfg.mfu_train))
    # data parallelism adds the FSDP traffic: 3 x 2P (dp-1)/dp over the link
    assert train_step_s(h800, m, w, cfg, 4, 1, 1, 200, 50) == pytest.approx(
        8 * m.params_b * 1e9 * tokens / (4 * 989e12 * cfg.mfu_train) + 3 * 2 * m.params_b * 1e9 * 0.75 / (50e9 * 0.7))


# -- simulator -----------------------------------------------------------------------------------------------

def synthetic(rate_tokens_per_s: float, replicas: int, batch: int, tau_train: float, sync: float) -> tuple:
    step = batch / rate_tokens_per_s
    w = WorkloadSpec(prompt_tokens=0, response_tokens_mean=100, response_tokens_p99=100, turns=1, batch_size=4,
                     group_size=4, max_staleness=50)
    r = rate_tokens_per_s / 100
    gen = GenOption("X", 1, batch, step, r, 100 * step, 100 * step, r * 100 * step, step, 0.0)
    p = Problem(gen=[gen], train=[TrainOption("X", 1, 1, 1, tau_train, 1.0)], counts={"X": 64}, prices={"X": 1.0},
                batch_samples=16, sync_s=sync, max_staleness=50)
    return p, w, Solution({0: replicas}, 0, 0, 0, 0)


@pytest.mark.parametrize("tau_train,sync", [(0.5, 0.0), (8.0, 0.0), (0.5, 1.0), (8.0, 2.0)])
def test_simulator_matches_closed_form_throughput(tau_train, sync):
    p, w, s = synthetic(rate_tokens_per_s=400, replicas=2, batch=8, tau_train=tau_train, sync=sync)
    cap = 2 * 400 / 100  # samples/s of two replicas
    closed = 16 / (sync + max(tau_train, 16 / cap))
    sim = simulate(p, s, w, steps=40)
    assert sim.throughput == pytest.approx(closed, rel=0.03)
    assert theta_of_phi(min(cap, 16 / tau_train), 16, sync) == pytest.approx(closed)
    if tau_train > 16 / cap:          # training-bound: the trainer never waits
        assert sim.trainer_idle < 0.02
    else:                             # generation-bound: the engines never idle
        assert sim.engine_idle < 0.02


def test_simulator_staleness_never_exceeds_the_bound():
    w = workload(batch_size=16, group_size=4, max_staleness=1)
    p = build_problem(inputs(two_types(8), model("qwen2.5-1.5b"), w))
    s = solve(p)
    sim = simulate(p, s, w, steps=12, seed=1)
    assert sim.steps == 12 and sim.throughput > 0
    assert max(sim.staleness) <= 1


# -- every plan within every constraint ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b"])
@pytest.mark.parametrize("wl,budget", [("math", 300.0), ("search-agent", 120.0), ("math", 0.0)])
def test_every_plan_respects_every_constraint(name, wl, budget):
    cluster, types = load_cluster(PLANNER / "clusters" / "h800-h20-pool.yaml")
    inp = Inputs(cluster, types, model(name), workload(wl), PlanConfig(budget_per_hour=budget))
    r = make_plan(inp, simulate_plan=False)
    p, s = r.problem, r.solution
    assert violations(p, s) == []
    c = p.train[s.train]
    assert c.memory_gb <= types[c.gpu].hbm_gb * 0.9
    pools = {pl.gpu: pl for pl in cluster.pools}
    for k in s.replicas:
        assert p.gen[k].tp <= pools[p.gen[k].gpu].gpus_per_node
    used: dict[str, int] = {}
    for node in r.nodes:
        assert node.learners + sum(node.engines) <= node.gpus
        used[node.gpu] = used.get(node.gpu, 0) + node.learners + sum(node.engines)
    assert used == s.devices
    assert sum(len(n.engines) for n in r.nodes) == sum(s.replicas.values())


def test_phase2_keeps_the_trainer_in_one_rack_and_feeds_back_the_sync_link():
    cluster = Cluster(pools=[NodePool("fast", "H800", 2, 8, 50, "a"), NodePool("far", "H800", 2, 8, 50, "b"),
                             NodePool("gen", "H20", 2, 8, 50, "a")], inter_rack_gbps=5)
    inp = inputs(cluster, model("qwen2.5-1.5b"), workload(batch_size=32), train_tp=[1], train_pp=[1])
    r = make_plan(inp, simulate_plan=False)
    trainer_racks = {n.rack for n in r.nodes if n.learners}
    c = r.problem.train[r.solution.train]
    if c.gpus <= 16:
        assert len(trainer_racks) == 1
    engine_racks = {n.rack for n in r.nodes if n.engines}
    # engines in the trainer's rack: the sync runs at the 50 GB/s NIC, not the 5 GB/s inter-rack link
    if engine_racks == trainer_racks == {"a"}:
        assert r.sync_gbps == 50
    assert r.problem.sync_s == pytest.approx(1.54e9 * 2 / (r.sync_gbps * 1e9 * 0.7))


# -- infeasible inputs ----------------------------------------------------------------------------------------

def test_infeasible_inputs_name_the_binding_constraint():
    small = two_types()
    with pytest.raises(Infeasible, match=r"budget binds.*\$3\.70/h > \$1\.00/h"):
        make_plan(inputs(small, model("qwen2.5-1.5b"), workload(), budget_per_hour=1.0), simulate_plan=False)
    with pytest.raises(Infeasible, match="target binds"):
        make_plan(inputs(small, model("qwen2.5-1.5b"), workload(), target_samples_per_s=1e6), simulate_plan=False)
    huge = ModelSpec("huge", 400, 126, 16384, 516096)
    with pytest.raises(Infeasible, match="fits in device memory|do not fit"):
        make_plan(inputs(small, huge, workload()), simulate_plan=False)
    # one long-tailed step of 2 questions: no replica finishes its p99 trajectory within one step period
    tight = workload(batch_size=2, group_size=2, max_staleness=0, response_tokens_p99=30000)
    with pytest.raises(Infeasible, match=r"staleness bound binds.*max_staleness=\d+ admits a plan"):
        make_plan(inputs(small, model("qwen2.5-1.5b"), tight), simulate_plan=False)


def test_cli_explains_infeasible_in_one_line_and_writes_a_plan(tmp_path):
    args = [sys.executable, "-m", "hexsearch.cli", "plan", "--cluster", str(PLANNER / "clusters" / "h800-h20-64.yaml"),
            "--model", str(PLANNER / "models" / "qwen2.5-1.5b.yaml"), "--workload", str(PLANNER / "workloads" / "math.yaml")]
    bad = subprocess.run([*args, "--budget", "1"], capture_output=True, text=True)
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and len(lines) == 1 and "budget binds" in lines[0]
    out = tmp_path / "plan.yaml"
    ok = subprocess.run([*args, "--budget", "200", "--no-simulate", "--out", str(out)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "bottleneck:" in ok.stdout and out.exists()


# -- inputs and the plan file ------------------------------------------------------------------------------------

def test_unknown_keys_and_types_list_the_valid_ones(tmp_path):
    bad = tmp_path / "w.yaml"
    bad.write_text("prompt_tokens: 10\nrespons_tokens_mean: 5\n")
    with pytest.raises(SpecError, match="respons_tokens_mean.*response_tokens_mean.*turns"):
        load_spec(bad, WorkloadSpec)
    with pytest.raises(SpecError, match=r"pools\[0\]\.gpux.*gpus_per_node"):
        spec_from({"pools": [{"name": "a", "gpux": "H20"}]}, Cluster, "c.yaml")
    cluster = tmp_path / "c.yaml"
    cluster.write_text("pools:\n  - {name: a, gpu: B200, nodes: 1}\n")
    with pytest.raises(SpecError, match="B200.*Known types: A100, H100, H20, H800, L40S, RTX4090"):
        load_cluster(cluster)


def test_catalog_names_a_source_for_every_figure():
    for name, g in load_catalog(PLANNER / "gpus.yaml").items():
        assert g.source and g.price_source, name
        assert g.hbm_gb > 0 and g.hbm_tbps > 0 and g.bf16_tflops > 0 and g.price_per_hour > 0, name


def test_plan_file_is_a_config_overlay_with_the_planned_counts(tmp_path):
    cluster, types = load_cluster(PLANNER / "clusters" / "h800-h20-64.yaml")
    inp = Inputs(cluster, types, model("qwen2.5-7b"), workload(),
                 PlanConfig(cluster=str(PLANNER / "clusters" / "h800-h20-64.yaml"), budget_per_hour=250))
    r = make_plan(inp, simulate_plan=False)
    path = write(inp, r, tmp_path / "plan.yaml", base=str(ROOT / "configs" / "quickstart.yaml"))
    cfg = load_config(path)
    t, s, c = cfg.train, r.solution, r.problem.train[r.solution.train]
    assert cfg.agent.prefill == "tags"  # the base recipe came through `extends`
    # one learner process per data-parallel rank, each on tp x pp devices (AReaL-Hex's 5 GB/s links make this plan
    # pipeline its trainer)
    assert t.engine_replicas == sum(s.replicas.values()) and t.learner_workers * c.tp * c.pp == c.gpus
    assert t.learner_workers == (c.gpus if c.tp * c.pp == 1 else c.dp)
    assert t.engine_resources.resources["hexsearch_engine"] == 1
    assert t.learner_resources.resources[c.gpu] == c.tp * c.pp == t.learner_resources.num_gpus
    nodes = cfg.plan.nodes
    assert sum(n.get("hexsearch_engine", 0) for n in nodes.values()) == t.engine_replicas
    assert sum(n.get("hexsearch_learner", 0) for n in nodes.values()) == t.learner_workers
    assert sum(n.get("hexsearch_rollout", 0) for n in nodes.values()) == t.rollout_workers
    assert t.batch_size == inp.workload.batch_size and t.max_staleness == inp.workload.max_staleness


def test_phase2_feeds_back_the_link_between_trainer_nodes():
    # one H800 node per rack and slow links between racks: a trainer on more than 8 devices spans racks
    cluster = Cluster(pools=[NodePool(f"r{i}", "H800", 1, 8, 50, f"rack{i}") for i in range(3)]
                      + [NodePool("gen", "H20", 4, 8, 50, "rack0")], inter_rack_gbps=5)
    inp = inputs(cluster, model("qwen2.5-1.5b"), workload(), train_tp=[1], train_pp=[1])
    r = make_plan(inp, simulate_plan=False)
    c = r.problem.train[r.solution.train]
    racks = {n.rack for n in r.nodes if n.learners}
    dp_gbps = 5 if len(racks) > 1 else (50 if c.gpus > 8 else 200)
    types = load_catalog(PLANNER / "gpus.yaml")
    assert c.step_s == pytest.approx(train_step_s(types["H800"], inp.model, inp.workload, inp.cfg, c.dp, 1, 1,
                                                  200, dp_gbps))


@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b"])
def test_plan_is_never_worse_than_the_best_single_type_plan_at_equal_budget(name):
    from trainer.planner.planner import homogeneous_best

    cluster, types = load_cluster(PLANNER / "clusters" / "h800-h20-pool.yaml")
    inp = Inputs(cluster, types, model(name), workload(), PlanConfig(budget_per_hour=200.0))
    mixed = make_plan(inp, simulate_plan=False, explain=False)
    gpu, single = homogeneous_best(inp, 200.0)
    assert mixed.solution.cost <= 200.0 and single.solution.cost <= 200.0
    assert mixed.solution.throughput >= single.solution.throughput * (1 - 1e-9)
