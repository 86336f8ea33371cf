"""`hexsearch train CONFIG --dry-run`: every shipped training recipe fits, an oversized one is refused, no Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hexsearch.config import load_config
from trainer.dry_run import dry_run
from trainer.planner.memory import learner_memory
from trainer.planner.specs import ModelSpec, load_spec

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (ROOT / "configs").glob("*.yaml") if "train" in p.read_text())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hexsearch.cli", "train", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                                        "HOME": str(Path.home())})


def _result(stdout: str) -> dict[str, str]:
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT dry_run "), last
    return dict(kv.split("=", 1) for kv in last.split()[2:])


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_fits(path):
    r = dry_run(load_config(path))
    assert r.fits, r.shortfalls
    lines = r.lines()
    assert lines[-1].startswith("RESULT dry_run fits=true ")
    assert r.inflight == min(load_config(path).train.max_inflight_trajectories, r.inflight) and r.inflight > 0
    assert r.step_s > 0 and r.tokens_per_s > 0


def test_cli_prints_roles_and_result_and_starts_no_ray(tmp_path):
    out = _cli(str(ROOT / "configs/asearcher-local-7b-1node.yaml"), "--dry-run", f"run.root={tmp_path}")
    assert out.returncode == 0, out.stderr
    res = _result(out.stdout)
    assert res["fits"] == "true" and res["inflight_trajectories"] == "384"
    assert 40 < float(res["learner_gb_per_gpu"]) < 72, "the 51 GB docs/scale-out.md derives by hand"
    assert "engine: 4 x 1 device(s) on node-0:0, node-0:1, node-0:2, node-0:3" in out.stdout
    assert "learner: 4 x 1 device(s) on node-0:4, node-0:5, node-0:6, node-0:7" in out.stdout
    assert "node-0 bundles: 4 x {GPU: 1, CPU: 1, hexsearch_engine: 1}, 4 x {GPU: 1, CPU: 1, hexsearch_learner: 1}" \
        in out.stdout
    assert not list(tmp_path.iterdir()), "a dry run makes no run folder"
    probe = subprocess.run([sys.executable, "-c", "import sys\nfrom hexsearch.config import load_config\n"
                            "from trainer.dry_run import dry_run\n"
                            "dry_run(load_config('configs/asearcher-web-7b-4node.yaml'))\n"
                            "print('ray' in sys.modules)"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert probe.stdout.strip().splitlines()[-1] == "False", probe.stderr


def test_oversized_recipe_is_refused_naming_role_gpu_and_shortfall(tmp_path):
    """ddp replicates 16 B/param: 122 GB per GPU for a 7B model, which no 80 GB GPU holds."""
    big = tmp_path / "oversized.yaml"
    big.write_text(f"extends: {ROOT / 'configs/asearcher-local-7b-1node.yaml'}\ntrain:\n  learner:\n    strategy: ddp\n")
    out = _cli(str(big), "--dry-run")
    assert out.returncode == 1, out.stdout + out.stderr
    refusals = [line for line in out.stdout.splitlines() if line.startswith("dry-run: learner on H100 GPU node-0:4")]
    assert len(refusals) == 1 and "short by" in refusals[0], out.stdout
    assert _result(out.stdout)["fits"] == "false"


def test_too_few_gpus_is_refused():
    cfg = load_config(ROOT / "configs/asearcher-local-7b-1node.yaml", ["train.engine_replicas=20"])
    r = dry_run(cfg, gpus_per_node=8)
    assert r.fits  # 24 GPUs: three nodes are planned
    assert sum(1 for n in r.nodes if n.startswith("node-")) == 3
    small = load_config(ROOT / "configs/asearcher-local-7b-1node.yaml", ["train.micro_batch_tokens=64000"])
    r = dry_run(small, gpu="L40S")
    assert not r.fits and any("learner on L40S GPU" in s for s in r.shortfalls)


def test_memory_model_matches_the_hand_derivation_in_docs():
    """docs/scale-out.md derives 51 GB (1 node) and 54 GB (4 nodes) per learner GPU for Qwen2.5-7B term by term."""
    m = load_spec(ROOT / "configs/planner/models/qwen2.5-7b.yaml", ModelSpec)
    one = learner_memory(m, strategy="fsdp2", ranks=4, micro_batch_tokens=8000, checkpointing=True)
    four = learner_memory(m, strategy="fsdp2", ranks=8, micro_batch_tokens=16384, checkpointing=True)
    assert one.total / 1e9 == pytest.approx(51.2, abs=0.5) and four.total / 1e9 == pytest.approx(54.3, abs=0.5)
    assert one.logits / 1e9 == pytest.approx(14.6, abs=0.1)   # 3 x 8,000 x 152,064 x 4 B
    ddp = learner_memory(m, strategy="ddp", ranks=4, micro_batch_tokens=8000, checkpointing=True)
    assert ddp.state / 1e9 == pytest.approx(122, abs=0.5) and ddp.ddp_buckets > 0 and ddp.gathered == 0
