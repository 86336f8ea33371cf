"""Running tool calls for an episode and turning their observations into what the model reads.

A tool that raises, times out, returns the wrong type or is unknown yields an error Observation;
the model sees its text and the trajectory records the error. A page (a result of one of
`AgentConfig.page_tools`) becomes one delivery per chunk, each read in its own read turn: the
tool's own chunks (`Observation.data["chunks"]`) when it provides them, else the text cut into
`page_chunk_chars` pieces at whitespace, at most `max_page_chunks`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from agent.config import AgentConfig
from agent.parser import ToolCall
from agent.trajectory import ToolCallRecord
from tools.protocol import Observation


@dataclass
class Delivery:
    """Text waiting to be shown to the model."""

    text: str
    stub: str
    """What stays after a policy stubs it."""
    read: bool
    """Shown in its own read turn."""
    page: bool = False


async def call_tool(tool: Any, call: ToolCall, timeout_s: float) -> Observation:
    """Run one call; never raises (except cancellation)."""
    if tool is None:
        return Observation(text=f"Unknown tool '{call.name}'.", error="unknown tool")
    t = time.perf_counter()
    try:
        obs = await asyncio.wait_for(tool(call.args), timeout_s)
    except asyncio.TimeoutError:
        return Observation(text="The tool did not answer before the episode's time ran out.", error="timeout",
                           latency_s=time.perf_counter() - t)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        return Observation(text=f"Tool error: {type(e).__name__}: {e}"[:500], error=f"{type(e).__name__}: {e}"[:300],
                           latency_s=time.perf_counter() - t)
    if not isinstance(obs, Observation):
        return Observation(text="Tool error: the tool returned no observation.",
                           error=f"tool returned {type(obs).__name__}", latency_s=time.perf_counter() - t)
    if not obs.latency_s and not obs.cached:
        obs.latency_s = time.perf_counter() - t
    return obs


def clip(text: str, limit: int) -> str:
    """Text cut to `limit` characters with a note saying how much was left out."""
    if limit <= 0 or len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"


def split_chunks(text: str, size: int, limit: int) -> list[str]:
    """Cut text into pieces of at most `size` characters, preferring whitespace boundaries."""
    chunks: list[str] = []
    rest = text.strip()
    while rest and len(chunks) < max(limit, 1):
        if len(rest) <= size:
            chunks.append(rest)
            break
        cut = rest.rfind(" ", size // 2, size)
        cut = size if cut <= 0 else cut
        chunks.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    return chunks


def page_chunks(obs: Observation, config: AgentConfig, start: int = 0) -> list[str]:
    """The chunks of a page result from chunk `start` on (0-based), at most `max_page_chunks`."""
    data = obs.data if isinstance(obs.data, dict) else {}
    chunks = data.get("chunks")
    if isinstance(chunks, list) and chunks and all(isinstance(c, dict) for c in chunks):
        chunks = [c.get("text") for c in chunks]
    if isinstance(chunks, list) and chunks and all(isinstance(c, str) for c in chunks):
        chunks = chunks[start:] or chunks[-1:]
        return [clip(c, config.max_obs_chars) for c in chunks[: config.max_page_chunks]]
    return split_chunks(obs.text, config.page_chunk_chars, config.max_page_chunks) or [obs.text]


def _stub(text: str, config: AgentConfig) -> str:
    head = " ".join(text[: config.stub_chars].split())
    return head + (" …" if len(text) > config.stub_chars else "")


def deliveries_for(call: ToolCall, obs: Observation, turn: int,
                   config: AgentConfig) -> tuple[ToolCallRecord, list[Delivery]]:
    """The trajectory record of a call and the deliveries that show its result."""
    text = obs.text or (f"Error: {obs.error}" if obs.error else "(no result)")
    record = ToolCallRecord(turn=turn, name=call.name, args=dict(call.args), latency_s=float(obs.latency_s or 0.0),
                            cost=float(obs.cost or 0.0), error=obs.error, cached=bool(obs.cached),
                            summary=" ".join(text[:160].split()))
    if call.name in config.page_tools and obs.ok:
        first = call.args.get("page", 1)
        first = first - 1 if isinstance(first, int) and first >= 1 else 0
        chunks = page_chunks(obs, config, first)
        data = obs.data if isinstance(obs.data, dict) else {}
        where = str(data.get("final_url") or call.args.get("url") or next(iter(call.args.values()), call.name))
        title = f"{data['title']} " if isinstance(data.get("title"), str) and data["title"] else ""
        out = []
        for i, chunk in enumerate(chunks):
            label = f"[{title}({where}) part {i + 1} of {len(chunks)}]"
            out.append(Delivery(f"{label}\n{chunk}", f"{label} (read) {_stub(chunk, config)}", read=True, page=True))
        return record, out
    text = clip(text, config.max_obs_chars)
    return record, [Delivery(text, _stub(text, config), read=config.read_search_results and obs.ok)]


def as_item(question: Any) -> tuple[str, str, list[str], list[str]]:
    """(id, question, answers, aug answers) of a QAItem-like object or a plain string."""
    if isinstance(question, str):
        return uuid.uuid5(uuid.NAMESPACE_URL, question).hex[:16], question, [], []
    answers = getattr(question, "answers", None) or []
    aug = getattr(question, "aug_answers", None) or []
    return (str(question.id), question.question, [answers] if isinstance(answers, str) else list(answers),
            [aug] if isinstance(aug, str) else list(aug))


_CHECKED_SCHEMAS: set[str] = set()


def check_schema(name: str, params: dict[str, Any]) -> None:
    """Raise ValueError when a tool's parameters are not a valid JSON schema (valid ones are remembered)."""
    import jsonschema

    key = json.dumps(params, sort_keys=True, default=str)
    if key in _CHECKED_SCHEMAS:
        return
    try:
        jsonschema.Draft202012Validator.check_schema(params)
    except jsonschema.SchemaError as e:
        raise ValueError(f"tool '{name}' has an invalid parameters schema: {e.message}") from e
    _CHECKED_SCHEMAS.add(key)
