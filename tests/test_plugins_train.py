"""Plug-ins in real training runs: a user's reward function and tool named by import path in YAML are
used by `hexsearch train` inside the Ray rollout workers (tiny model, one step), and a judge-rewarded
run completes its steps with the judge on its own Ray engine actor."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
"""A user's plug-ins, imported by path inside every rollout worker (not installed, only in the cwd)."""
import ast
import operator

from tools.protocol import Observation

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _eval(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("only + - * / on numbers")


class Calculator:
    name = "calculator"
    schema = {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate arithmetic such as 2 * (3 + 4).",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}}

    def __init__(self, precision=3):
        self.precision = precision

    async def __call__(self, args):
        try:
            value = _eval(ast.parse(args["expression"], mode="eval").body)
        except Exception as e:
            return Observation(text=f"cannot evaluate: {e}", error="bad expression")
        return Observation(text=str(round(value, self.precision)), data={"value": value})


def calculator_reward(x):
    """0.5 for every episode, +0.25 when it called the calculator (visible in train/reward)."""
    calls = sum(c.name == "calculator" for c in x.trajectory.tool_calls)
    return 0.5 + 0.25 * min(calls, 1), {"calculator_calls": calls}
'''

TINY = ["engine.model=tiny-random", "world.entities=30", "world.max_hops=1", "world.short_articles=true",
        "train.steps=1", "train.batch_size=2", "train.group_size=2", "train.eval_questions=2",
        "train.eval_every=0", "train.save_every=0", "train.engine_replicas=1", "train.rollout_workers=1",
        "train.filter_groups=none", "agent.max_new_tokens=8", "agent.max_turns=3", "agent.max_tool_calls=1",
        "agent.max_context_tokens=1024"]


def _train(tmp_path: Path, config: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hexsearch.cli", "train", str(config), f"run.root={tmp_path}",
                           "run.name=r", f"world.out={tmp_path / 'world'}", *TINY, *overrides],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow  # the default suite trains with an import-path reward and tool in tests/test_docs_extending.py
def test_custom_reward_and_tool_by_import_path_train(tmp_path):
    (tmp_path / "my_plugins.py").write_text(PLUGIN)
    config = tmp_path / "plugins.yaml"
    config.write_text(textwrap.dedent("""\
        tools:
          builtin: []
          components:
            - _component_: my_plugins:Calculator
              precision: 2
        agent:
          reward_fn: my_plugins:calculator_reward
          prefill: tags
          lenient_tags: true
          format_gate: false
        """))
    out = _train(tmp_path, config, "train.eval_suite=world-dev")
    assert out.returncode == 0, out.stderr[-4000:]
    run = tmp_path / "r"
    trajs = _rows(run / "trajectories" / "train.jsonl")
    assert len(trajs) == 4
    dev = [r for r in _rows(run / "metrics.jsonl") if "eval/reward" in r]
    assert len(dev) == 2 and all({"eval/em", "eval/f1", "eval/cover_em"} <= set(r) for r in dev)  # the suite's scorers
    for traj in trajs:  # every reward came from the user's function, inside the Ray worker
        calls = sum(c["name"] == "calculator" for c in traj["tool_calls"])
        assert traj["reward_info"]["calculator_calls"] == calls
        assert traj["reward"] == 0.5 + 0.25 * min(calls, 1)
    called = sum(any(c["name"] == "calculator" for c in t["tool_calls"]) for t in trajs)
    assert called >= 1  # the prefilled <calculator> tag made the tiny model call the tool
    step = next(r for r in _rows(run / "metrics.jsonl") if "train/reward" in r)
    assert abs(step["train/reward"] - (0.5 + 0.25 * called / len(trajs))) < 1e-6
    assert step["tools/calculator/calls"] >= called  # the tool's own counters reach the metrics
    assert "tools/search/calls" not in step  # tools.builtin: [] left the built-ins out


def test_judge_rewarded_training_completes_steps(tmp_path):
    config = ROOT / "configs" / "quickstart.yaml"
    out = _train(tmp_path, config, "agent.reward_fn=judge", "agent.judge.backend=embedded",
                 "agent.judge.model=tiny-random", "agent.judge.max_new_tokens=8", "agent.judge.retries=0",
                 f"agent.judge.cache={tmp_path / 'judge.sqlite'}", "agent.worked_example=false",
                 "train.time_budget_min=0", "train.steps=2", "train.batch_size=1")
    assert out.returncode == 0, out.stderr[-4000:]
    run = tmp_path / "r"
    assert json.loads((run / "results.json").read_text())["steps"] == 2
    judge = json.loads((run / "judge.json").read_text())
    assert judge["model"] == "tiny-random" and judge["prompt_version"]
    trajs = _rows(run / "trajectories" / "train.jsonl")
    assert trajs and all(t["reward_info"]["metric"] == "judge" for t in trajs)
    answered = [t for t in trajs if t["prediction"] is not None]
    assert all("judge" in t["reward_info"] for t in answered)  # each answer went to the judge actor
    metrics = [r for r in _rows(run / "metrics.jsonl") if "train/reward" in r]
    assert len(metrics) == 2
    if answered:
        assert metrics[-1]["judge/calls"] >= 1
