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
