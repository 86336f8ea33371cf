"""The Tool protocol: a name, an OpenAI function schema, and `async __call__(args) -> Observation`.

Tools never raise to the agent: every failure (timeout, HTTP error, refused URL, bad arguments)
comes back as an Observation with `error` set, so an episode is never lost to a tool.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
"""What a tool name may be: it is also an action tag (`<name>…</name>`) and an OpenAI function name."""


def check_tool_name(name: Any) -> None:
    """Raise ValueError unless `name` is a valid tool name (letters, digits, '_' and '-', at most 64)."""
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise ValueError(f"tool name {name!r} is not valid: use letters, digits, '_' or '-' (at most 64), "
                         "starting with a letter or '_'")


@dataclass
class Observation:
    """What a tool call returns."""

    text: str
    """Text shown to the model."""
    data: Any = None
    """Structured result (search hits, page chunks, ...), JSON-serialisable."""
    latency_s: float = 0.0
    """Wall-clock seconds the call took (0 for a cache hit's lookup time only)."""
    cost: float = 0.0
    """Money the call cost (e.g. a paid search API), in dollars."""
    error: str | None = None
    """One-line error when the call failed; `text` then explains it to the model."""
    cached: bool = False
    """True when served from the tool cache."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Extra details (retries, HTTP status, final URL after redirects)."""

    @property
    def ok(self) -> bool:
        return self.error is None


@runtime_checkable
class Tool(Protocol):
    """What every tool provides."""

    name: str
    """Name the model calls the tool by (`search`, `access`, ...)."""
    schema: dict[str, Any]
    """OpenAI function schema: {"type": "function", "function": {"name", "description", "parameters"}}."""

    async def __call__(self, args: dict[str, Any]) -> Observation:
        """Run the tool; never raises for tool-side failures."""
