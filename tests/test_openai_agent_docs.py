"""docs/extending.md "Bring your own agent": both agents run as written (the search function swapped for a
dictionary so that no world is built), each under 40 lines, each through the recording endpoint."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from agent.qa import QAItem
from agent.workflow import make_workflow
from hexsearch.config import HexConfig
from serving.engines.scripted import ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]
CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "Varnholt"}}\n</tool_call><|im_end|>'


def section_blocks() -> list[str]:
    text = (ROOT / "docs" / "extending.md").read_text()
    section = text.split("## Bring your own agent", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


@pytest.fixture()
def doc_agents(tmp_path, monkeypatch):
    plain, framework = section_blocks()
    for name, body in (("my_agent", plain), ("my_agents_sdk_agent", framework)):
        assert len(body.strip().splitlines()) < 40, name
        (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("my_agent", "my_agents_sdk_agent"):
        sys.modules.pop(name, None)
    my_agent = importlib.import_module("my_agent")
    queries = []

    async def search(query: str) -> str:
        queries.append(query)
        return "Varnholt is a city in the province of Qesmir. It was founded in 1642 by Dalia Orrent."
    monkeypatch.setattr(my_agent, "search", search)
    importlib.import_module("my_agents_sdk_agent")  # binds the swapped search as its tool
    yield queries
    for name in ("my_agent", "my_agents_sdk_agent"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("program", ["my_agent:solve", "my_agents_sdk_agent:solve"])
async def test_the_documented_agents_run_through_the_endpoint(doc_agents, tokenizer, program):
    engine = ScriptedEngine([CALL, "1642<|im_end|>"], tokenizer=tokenizer)
    cfg = HexConfig()
    cfg.agent.program = program
    workflow = make_workflow(cfg)
    traj = await workflow.arun_episode(engine, QAItem("q", "In what year was Varnholt founded?", ["1642"]), seed=0,
                                       request_id="doc/0")
    await workflow.aclose()
    assert traj.stop_reason == "answered" and traj.prediction == "1642" and traj.reward == 1.0
    assert doc_agents == ["Varnholt"] and len(traj.segments) == 1 and traj.num_turns == 2
