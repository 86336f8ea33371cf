"""docs/extending.md runs as written: every file it shows is saved, every `hexsearch` command it shows is
run from that folder, and each plug-in's effect is checked in what the command printed or saved.

The default suite runs the first `train` command only (the one that builds the world and trains with the
reward plug-in), with overrides appended (tiny model, small world, one step), and every other command as
written; `-m slow` runs every command exactly as written, the calculator tool's and the workflow's training
runs included (both plug-ins are also checked outside Ray in tests/test_workflow.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```(\w+)(?: title=(\S+))?\n(.*?)```", re.DOTALL)
FAST_TRAIN = ["engine.model=tiny-random", "world.entities=30", "world.max_hops=1", "train.steps=1",
              "train.batch_size=2", "train.group_size=2", "train.eval_questions=2", "train.save_every=0",
              "train.engine_replicas=1", "train.rollout_workers=1", "train.time_budget_min=0",
              "agent.max_new_tokens=8"]


def doc_blocks() -> tuple[dict[str, str], list[str]]:
    files, commands = {}, []
    for lang, title, body in BLOCK.findall((ROOT / "docs" / "extending.md").read_text()):
        if title:
            files[title] = body
        elif lang == "bash":
            commands += [line for line in body.splitlines() if line.startswith("hexsearch ")]
    return files, commands


def run_docs(tmp_path: Path, fast: bool) -> dict[str, subprocess.CompletedProcess]:
    files, commands = doc_blocks()
    if fast:  # one training run in the default suite's time budget
        trains = [c for c in commands if c.startswith("hexsearch train")]
        commands = [c for c in commands if c not in trains[1:]]
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    (tmp_path / "configs").symlink_to(ROOT / "configs")  # "save the files in the repository root"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def run(command: str) -> subprocess.CompletedProcess:
        argv = shlex.split(command)
        extra = [*FAST_TRAIN, f"world.out={tmp_path / 'world'}"] if fast and argv[1] == "train" else []
        return subprocess.run([sys.executable, "-m", "hexsearch.cli", *argv[1:], *extra], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=1800)

    out = {commands[0]: run(commands[0])}  # the first one generates the world and its index
    # the rest are independent (each run has its own folder); two at a time keep both cores busy while
    # a command waits on Ray or a tool server
    with ThreadPoolExecutor(max_workers=2 if fast else 1) as pool:
        out.update(zip(commands[1:], pool.map(run, commands[1:]), strict=True))
    return out


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def runs_of(tmp_path: Path, kind: str) -> list[Path]:
    return sorted((tmp_path / "runs").glob(f"{kind}-*"))


def check(tmp_path: Path, results: dict[str, subprocess.CompletedProcess], fast: bool) -> None:
    files, commands = doc_blocks()
    commands = [c for c in commands if c in results]
    assert set(files) == {"my_reward.py", "calculator.py", "calculator.yaml", "weather_server.py", "weather.yaml",
                          "my_policy.py", "my_workflow.py", "my_suite.py", "preds.jsonl", "my_backend.py"}
    for name, body in files.items():
        if name.endswith(".py"):
            assert len(body.strip().splitlines()) < 30, name  # each example is short enough to read at once
    for command, res in results.items():
        ok = (0, 1) if command.startswith("hexsearch ask") else (0,)  # ask exits 1 when the model did not answer
        assert res.returncode in ok, (command, res.stderr[-3000:])
        assert "Traceback" not in res.stderr, (command, res.stderr[-3000:])
    call = {c: r.stdout for c, r in results.items() if c.startswith("hexsearch tools call")}
    assert any(out.strip().splitlines()[0] == "42" for out in call.values())
    assert any("Varnholt: sunny" in out for out in call.values())
    listing = "".join(r.stdout for c, r in results.items() if c.startswith("hexsearch tools list"))
    assert "calculator" in listing and "forecast" in listing and "component calculator:Calculator" in listing
    scored = "".join(r.stdout for c, r in results.items() if c.startswith("hexsearch eval score"))
    assert "RESULT eval_score suite=my_suite:LINES rows=2 correct=1 accuracy=0.5000" in scored
    assert [r["scores"] for r in rows(tmp_path / "scored.jsonl")] == [
        {"my_suite:same_number": 1.0, "em": 0.0}, {"my_suite:same_number": 0.0, "em": 0.0}]
    calls = [line.split() for line in (tmp_path / "engine_calls.log").read_text().splitlines()]
    assert calls and all(int(prompt) > 0 and int(out) > 0 for prompt, out in calls)  # the user's backend served
    asks = [rows(run / "trajectories" / "ask.jsonl")[0] for run in runs_of(tmp_path, "ask")]
    assert {a["meta"]["context_policy"] for a in asks} >= {"my_policy:NewestOnly"}
    assert any(a["meta"].get("hint") == " Answer with at most three words." for a in asks)
    trains = runs_of(tmp_path, "train")
    assert len(trains) == sum(c.startswith("hexsearch train") for c in commands) == (1 if fast else 3)
    trajs = [t for run in trains for t in rows(run / "trajectories" / "train.jsonl")]
    rewarded = [t for t in trajs if t["reward_info"]["metric"] == "my_reward:exact_or_contains"]
    assert rewarded and all(t["reward_info"]["why"] in ("no answer", "exact", "contains", "wrong") for t in rewarded)
    if not fast:  # the workflow's training run is in -m slow only
        assert any(t["meta"].get("hint") for t in trajs)  # the workflow ran inside the Ray rollout workers


def test_extending_examples_run(tmp_path):
    check(tmp_path, run_docs(tmp_path, fast=True), fast=True)


@pytest.mark.slow
def test_extending_examples_run_exactly_as_written(tmp_path):
    check(tmp_path, run_docs(tmp_path, fast=False), fast=False)
