"""One request inside the embedded engine (`Seq`: its prompt, limits, stop conditions and everything
produced for it so far) and what the engine hands back for it (`EmbeddedCompletion`).

`serving.engines.embedded` makes a `Seq` per generate call and queues it; the batch
(`serving.engines.embedded_batch.BatchRunner`) gives it a KV row, appends its tokens and delivers it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from serving.protocol import Completion, GenerateRequest


@dataclass
class EmbeddedCompletion(Completion):
    """A Completion plus what only the embedded engine reports."""

    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per output token, the most likely (token id, log-prob) pairs, when requested."""
    prompt_ids: list[int] = field(default_factory=list)
    """The prompt this completion continues (echoed for the HTTP server)."""


@dataclass(eq=False)
class Seq:
    """One admitted or waiting request and everything produced for it so far."""

    request: GenerateRequest
    prompt: list[int]
    max_new: int
    stop_ids: frozenset[int]
    stops: list[str]
    stop_window: int
    generator: torch.Generator | None
    top_logprobs: int
    deliver: Callable[[Completion | BaseException], None]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    kv_len: int = 0
    row: int = -1
    epoch: int = 0
    done: bool = False
    finish: tuple[str, str | int | None] | None = None
    """(finish_reason, stop_reason) once a stop condition hit."""
    leader: Seq | None = None
    """Another waiting request with the same prompt whose prefill this one shares."""
    followers: list[Seq] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt)

    @property
    def n_out(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def projected_len(self) -> int:
        return len(self.prompt) + self.max_new
