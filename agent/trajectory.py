"""Trajectories: what one episode produced, token-exact, ready for RL.

A trajectory is a list of segments. A segment is one or more LLM calls whose prompts extend
each other exactly; its `token_ids` are the prompt tokens, then each call's generated tokens as
generated, then the tokenised tool text / turn markers, and so on. `loss_mask` is 1 exactly on
tokens the policy generated; `logprobs` and `versions` hold the behaviour log-prob and weight
version of those tokens (0.0 and -1 elsewhere). When the context policy rewrites earlier context
a new segment begins. Every segment shares the trajectory's reward and advantage.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Segment:
    """One token sequence the learner trains on."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def append_prompt(self, ids: list[int]) -> None:
        """Append tokens the policy did not generate (prompt, tool results, turn markers)."""
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def append_generated(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        """Append tokens the policy generated, exactly as generated."""
        if not (len(ids) == len(logprobs) == len(versions)):
            raise ValueError("generated ids, logprobs and versions must have equal lengths")
        self.token_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += list(logprobs)
        self.versions += list(versions)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)


def call_key(name: str, args: Any) -> str:
    """A tool call's identity, name and arguments in any order: what makes two calls the same call
    (`agent.max_repeated_calls` in the loop, `agent.under_search_penalty`'s distinct searches)."""
    return repr((name, sorted(args.items()) if isinstance(args, dict) else args))


@dataclass
class ToolCallRecord:
    """One tool call made during the episode."""

    turn: int
    name: str
    args: dict[str, Any]
    latency_s: float = 0.0
    cost: float = 0.0
    error: str | None = None
    cached: bool = False
    summary: str = ""
    """Short description of the result (first characters), for traces and debugging."""


@dataclass
class Trajectory:
    """One episode of the search agent."""

    question_id: str
    question: str
    gold: list[str] = field(default_factory=list)
    """Gold answers (aliases)."""
    segments: list[Segment] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    prediction: str | None = None
    """The extracted final answer, None when the agent never answered."""
    stop_reason: str = ""
    """Why the episode ended: answered, max_turns, max_tool_calls, max_context, wall_clock, length, engine_error, ..."""
    num_turns: int = 0
    format_errors: int = 0
    reward: float = 0.0
    reward_info: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent: total, llm, tools."""
    group_id: str = ""
    """Trajectories sampled for the same question in one step share a group id."""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def versions(self) -> list[int]:
        """Versions of all policy tokens, in order."""
        return [v for s in self.segments for v, m in zip(s.versions, s.loss_mask, strict=True) if m]

    @property
    def min_version(self) -> int:
        """Oldest weight version of any policy token (-1 when none was generated)."""
        vs = self.versions
        return min(vs) if vs else -1

    @property
    def max_version(self) -> int:
        vs = self.versions
        return max(vs) if vs else -1

    @property
    def num_generated(self) -> int:
        return sum(s.num_generated for s in self.segments)

    def to_json(self) -> str:
        """One JSONL line; `from_json` restores an equal object."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str | dict) -> Trajectory:
        d = json.loads(line) if isinstance(line, str) else dict(line)
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown trajectory fields: {sorted(unknown)}")
        d["segments"] = [Segment(**s) for s in d.get("segments", [])]
        d["tool_calls"] = [ToolCallRecord(**t) for t in d.get("tool_calls", [])]
        return cls(**d)
