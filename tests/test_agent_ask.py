"""`hexsearch ask`: the live trace, and the real command end to end (tiny model, small offline world)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from agent.config import AgentConfig
from agent.qa import QAItem
from agent.trajectory import Trajectory
from agent.workflow import SearchAgentWorkflow
from hexsearch.commands.ask import TracePrinter, ask_episode
from hexsearch.config import HexConfig
from serving.engines.scripted import ScriptedEngine
from tools.memory import MemorySearch

DOCS = [{"title": "Varnholt", "url": "https://hexwiki.test/wiki/Varnholt",
         "contents": "Varnholt is a city in the province of Qesmir. It was founded in 1642 by Dalia Orrent."}]
SMALL_WORLD = ["world.entities=60", "world.max_hops=1", "world.short_articles=true"]


def _workflow() -> SearchAgentWorkflow:
    return SearchAgentWorkflow(HexConfig(agent=AgentConfig()), tools={"search": MemorySearch(DOCS)})


async def test_trace_shows_thoughts_calls_results_and_answer(tokenizer):
    engine = ScriptedEngine(["<think>find the city</think><search>Varnholt founded</search>",
                             "It says 1642.</think>", "<answer>1642</answer>"], tokenizer=tokenizer)
    console = Console(record=True, width=300, color_system=None)
    item = QAItem("v", "When was Varnholt founded?", ["1642"])
    traj = await ask_episode(item, engine, _workflow(), printer=TracePrinter(console=console))
    out = console.export_text()
    assert traj.reward == 1.0
    for needle in ("Question: When was Varnholt founded?", "think find the city", '-> search(query="Varnholt founded")',
                   "<- [1] Varnholt (https://hexwiki.test/wiki/Varnholt) Varnholt is a city", "notes It says 1642.",
                   "Answer: 1642"):
        assert needle in out, (needle, out)
    quiet = Console(record=True, width=300)
    engine.push("<answer>x</answer>")
    await ask_episode("Anything?", engine, _workflow(), printer=TracePrinter(quiet=True, console=quiet))
    assert quiet.export_text() == ""


def _small_world_question() -> tuple[str, list[str]]:
    from hexsearch.config import load_config
    from world import resolve_world

    world = resolve_world(load_config(None, SMALL_WORLD).world)
    row = json.loads((world / "qa_dev.jsonl").read_text().splitlines()[0])
    answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
    return row["question"], answers


def test_ask_command_runs_and_saves_the_trajectory(tmp_path):
    question, answers = _small_world_question()
    cmd = [sys.executable, "-m", "hexsearch.cli", "ask", question, f"run.root={tmp_path}", "run.name=one",
           "engine.model=tiny-random", "agent.max_new_tokens=8", *SMALL_WORLD]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: the random model did not answer
    assert f"Question: {question}" in proc.stdout and "-> search(" in proc.stdout  # the recipe made it search
    lines = (tmp_path / "one" / "trajectories" / "ask.jsonl").read_text().splitlines()
    traj = Trajectory.from_json(lines[0])
    assert traj.question == question and traj.gold[: len(answers)] == answers  # found in the world: scored
    assert traj.tool_calls and traj.tool_calls[0].name == "search" and traj.tool_calls[0].error is None
    assert traj.segments and traj.num_generated > 0
    results = json.loads((tmp_path / "one" / "results.json").read_text())
    assert results["stop_reason"] == traj.stop_reason and Path(results["trajectory"]).exists()
    assert (tmp_path / "one" / "config.yaml").read_text().count("prefill: tags") == 1  # the recipe was applied


def test_ask_rejects_bad_override(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hexsearch.cli", "ask", "Q?", "agent.max_turnz=3",
                           f"run.root={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "agent.max_turnz" in proc.stderr and "max_turns" in proc.stderr
