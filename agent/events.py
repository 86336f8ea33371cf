"""Events of an episode as it plays (agent/loop.py emits them): live traces (`hexsearch ask`), logging and
tests read them; they are never training data (the Trajectory is)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AgentEvent:
    """Something that happened in an episode."""

    kind: str
    """start, append (harness text entering the context), llm, thought, notes, tool_call, tool_result,
    repeated_call, answer, format_error, stub, compact, stop."""
    turn: int
    """The episode's LLM-call count when it happened."""
    data: dict[str, Any] = field(default_factory=dict)
    t: float = 0.0
    """Seconds since the episode started."""


EventFn = Callable[[AgentEvent], None]
