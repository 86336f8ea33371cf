"""`hexsearch train` / `hexsearch demo` front door: bad input fails with one clear line, exit 2."""

from __future__ import annotations

import subprocess
import sys

from hexsearch.commands.train import result_line


def run(*args):
    return subprocess.run([sys.executable, "-m", "hexsearch.cli", *args], capture_output=True, text=True, timeout=120)


def test_unknown_train_key_lists_valid_ones():
    out = run("train", "configs/quickstart.yaml", "train.max_stalenes=2")
    assert out.returncode == 2
    assert "train.max_stalenes" in out.stderr and "max_staleness" in out.stderr


def test_bad_choice_is_a_one_line_error(tmp_path):
    out = run("train", "configs/quickstart.yaml", "train.advantage=ppo", f"run.root={tmp_path}")
    assert out.returncode == 2
    lines = [x for x in out.stderr.splitlines() if x.startswith("hexsearch:")]
    assert len(lines) == 1 and "grpo, rloo, drgrpo" in lines[0]


def test_nccl_weight_transfer_without_vllm_here_fails_at_startup(tmp_path):
    """`train.weight_transfer=nccl` with vLLM needs vLLM's trainer side in this Python: one line naming the key,
    no run folder, never a silent fall back to disk (this environment has no vllm; .venv-vllm is separate)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        return  # a GPU install with the gpu extra: the check passes here
    out = run("train", "configs/quickstart.yaml", "engine.backend=vllm", "engine.urls=[http://127.0.0.1:9]",
              "train.weight_transfer=nccl", f"run.root={tmp_path}")
    assert out.returncode == 2
    lines = [x for x in out.stderr.splitlines() if x.startswith("hexsearch:")]
    assert len(lines) == 1 and "train.weight_transfer=nccl" in lines[0] and "vllm is not importable" in lines[0]
    assert not any(tmp_path.iterdir())


def test_resume_needs_a_run_folder(tmp_path):
    out = run("train", "--resume", str(tmp_path))
    assert out.returncode == 2 and "not a run folder" in out.stderr


def test_result_line_format():
    line = result_line({"dev_reward_before": 0.125, "dev_reward_after": 0.3, "steps": 12, "minutes": 14.04})
    assert line == "RESULT train dev_reward_before=0.125 dev_reward_after=0.300 steps=12 minutes=14.0"


def test_demo_help_and_shipped_quickstart_resolves():
    out = run("demo", "--help")
    assert out.returncode == 0 and "quickstart" in out.stdout
    from hexsearch.config import load_config

    cfg = load_config("configs/quickstart.yaml")
    assert cfg.engine.model == "smollm2-135m-instruct" and cfg.train.time_budget_min <= 15


def test_demo_trains_and_ends_with_the_result_line(tmp_path):
    """`hexsearch demo` (what `make demo` runs) end to end, shrunk to the tiny model and one step."""
    import json

    out = subprocess.run(
        [sys.executable, "-m", "hexsearch.cli", "demo", f"run.root={tmp_path}", "run.name=d",
         "engine.model=tiny-random", "world.entities=30", f"world.out={tmp_path / 'world'}", "train.steps=1",
         "train.batch_size=2", "train.group_size=2", "train.eval_questions=2", "train.save_every=0",
         "agent.max_new_tokens=8", "train.engine_replicas=1"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    # restartable actors take no handles as constructor arguments (Ray could not restart them with those)
    assert "constructor arguments in the object store" not in out.stderr, out.stderr[-3000:]
    assert out.stdout.startswith("world: 30 entities")
    results = json.loads((tmp_path / "d" / "results.json").read_text())
    assert results["steps"] == 1
    assert out.stdout.strip().splitlines()[-1] == result_line(results)
    assert (tmp_path / "d" / "reward_curve.png").exists()
    # the trained trajectories are token-exact: the weights that sampled them re-score their policy tokens
    # (in-process through the real command: a subprocess would add its imports' seconds three times)
    from typer.testing import CliRunner

    from hexsearch.cli import app
    from hexsearch.commands.common import UserError

    def check_logprobs(*args):
        return CliRunner().invoke(app, ["check-logprobs", str(tmp_path / "d"), *args])

    check = check_logprobs("--limit", "0", "--json")
    assert check.exit_code == 0, check.output[-2000:]
    report = json.loads(check.stdout)
    assert report["ok"] and report["versions"] == [0] and report["checked"] > 0
    assert report["mean_diff"] <= report["tolerance"]
    # a log-prob recorded wrong is caught: shift one episode's by 0.5 and the check fails on that episode
    rows = (tmp_path / "d" / "trajectories" / "train.jsonl").read_text().splitlines()
    bad = json.loads(rows[0])
    for s in bad["segments"]:
        s["logprobs"] = [lp - 0.5 if m else lp for lp, m in zip(s["logprobs"], s["loss_mask"], strict=True)]
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    check = check_logprobs("--trajectories", str(tmp_path / "bad.jsonl"))
    assert check.exit_code == 1 and check.stdout.splitlines()[-1].startswith("NOT token-exact: 1 episodes")
    check = check_logprobs("--trajectories", str(tmp_path / "bad.jsonl"), "--json")
    shifted = json.loads(check.stdout)["episodes"][0]
    assert shifted["question_id"] == bad["question_id"] and abs(shifted["mean_diff"] - 0.5) < 0.1
    # a row that is not a trajectory names its file and line
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + '\n{"nope": 1}\n')
    check = check_logprobs("--trajectories", str(tmp_path / "bad.jsonl"))
    assert isinstance(check.exception, UserError) and f"{tmp_path / 'bad.jsonl'}:2:" in str(check.exception)
