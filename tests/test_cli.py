"""The CLI lists every command group; unfinished commands fail with one line."""

from __future__ import annotations

import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "hexsearch.cli", *args], capture_output=True, text=True)


def test_help_lists_all_commands():
    out = run("--help")
    assert out.returncode == 0
    for cmd in ("train", "ask", "serve", "index", "tools", "world", "datagen", "eval", "plan", "config"):
        assert f" {cmd} " in out.stdout, cmd


def test_incomplete_command_fails_with_one_line():
    out = run("plan")
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "plan.cluster is required" in lines[0]


def test_resume_takes_every_override_and_refuses_a_config_file(tmp_path):
    """`hexsearch train|eval|sft --resume RUN a=b c=d`: the CLI hands the first override over as the config
    argument; it must still apply (it was dropped without a word), and a config file besides --resume is refused."""
    import pytest

    from hexsearch.commands.common import UserError, open_run, resumed_config
    from hexsearch.config import load_config

    folder = open_run(load_config("configs/quickstart.yaml", [f"run.root={tmp_path}", "run.name=r"]), "train")
    cfg = resumed_config(str(folder.path), "train.steps=7", ["train.lr=0.5"])
    assert cfg.train.steps == 7 and cfg.train.lr == 0.5
    assert cfg.agent.max_turns == load_config("configs/quickstart.yaml", []).agent.max_turns  # the run's own config
    with pytest.raises(UserError, match="not the config file configs/quickstart.yaml"):
        resumed_config(str(folder.path), "configs/quickstart.yaml", [])
    with pytest.raises(UserError, match="not a run folder"):
        resumed_config(str(tmp_path / "none"), None, [])
    out = run("train", "--resume", str(folder.path), "train.steps=oops")  # the real CLI: the override is read
    assert out.returncode != 0 and "train.steps" in out.stderr
