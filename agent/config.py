"""Search agent configuration (section `agent`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AgentConfig:
    action_format: str = "asearcher"
    """`asearcher` (<search>/<access>/<answer> tags) or `hermes` (<tool_call> JSON)."""
    context_policy: str = "read_once"
    """`read_once` (page chunks read once, then stubbed), `keep_last_k` (last K tool results) or `full`."""
    keep_last_k: int = 5
    """Tool results kept verbatim by the `keep_last_k` policy."""
    max_turns: int = 32
    """Most LLM calls per episode (reading turns count)."""
    max_new_tokens: int = 512
    """Most new tokens per LLM call."""
    max_context_tokens: int = 8192
    """Most tokens in one prompt; the episode stops when the next call would exceed it."""
    max_tool_calls: int = 64
    """Most tool calls per episode."""
    wall_clock_s: float = 1800.0
    """Wall-clock budget per episode, in seconds."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    prefill_tags: bool = False
    """Let the harness write the opening action tag (a CPU-scale trick so tiny models act)."""
    worked_example: bool = False
    """Put one worked example in the system prompt."""
    reward: str = "f1"
    """Answer reward: `f1`, `em`, `sub_em`, `set_f1` (ASearcher) or `judge` (LLM judge)."""
    format_gate: bool = True
    """Reward 0 when any turn had a format error."""
