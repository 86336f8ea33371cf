"""The InferenceEngine protocol: token ids in, token ids + behaviour log-probs + versions out.

One protocol serves the embedded engine (transformers in-process), our OpenAI-compatible server,
and remote vLLM/SGLang servers. Everything above `serving/` talks to engines only through it.

Interruption: `pause("abort")` makes in-flight `generate` calls return early with
`finish_reason="abort"` and the tokens produced so far. The client continues the request by
appending those tokens to the prompt (`generate_continuing`), so one answer may span several
weight versions; each token keeps the version that produced it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]
PauseMode = Literal["abort", "wait"]


@dataclass
class SamplingParams:
    """How to sample one completion."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    """Stop strings; the token that completes one is kept in the output (never re-tokenised)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Stop token ids (the engine adds the tokenizer's EOS itself)."""
    seed: int | None = None
    """Per-request seed for reproducible sampling (not forwarded to vLLM on CPU: it crashes there)."""
    ignore_eos: bool = False
    """Keep generating past EOS (vLLM's `ignore_eos`; benchmarks use it for fixed output lengths)."""


@dataclass
class GenerateRequest:
    """One generation call."""

    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Sticky routing key: all calls of one trajectory share it so a pool routes them to the same server."""


@dataclass
class Completion:
    """The result of one generation call."""

    output_ids: list[int]
    logprobs: list[float]
    """Behaviour log-prob of each output token under the weights that sampled it."""
    versions: list[int]
    """Weight version that produced each output token."""
    finish_reason: FinishReason
    stop_reason: str | int | None = None
    """The stop string or stop token id that ended generation (None for length/abort)."""

    def __post_init__(self) -> None:
        if not (len(self.output_ids) == len(self.logprobs) == len(self.versions)):
            raise ValueError(
                f"completion fields disagree: {len(self.output_ids)} ids, {len(self.logprobs)} logprobs, "
                f"{len(self.versions)} versions")


@dataclass(frozen=True)
class Transferred:
    """The weight source of an `nccl` sync: learner rank 0 already sent `version` to the servers, so an engine
    client only labels it (vLLM: /update_weight_version and a prefix-cache reset; SGLang set it itself;
    serving/remote/weight_transfer.py)."""

    version: int


WeightSource = Any
"""A state dict (name -> tensor) for in-memory updates, a path to an HF checkpoint folder, or `Transferred`."""


@runtime_checkable
class InferenceEngine(Protocol):
    """What every engine provides."""

    @property
    def version(self) -> int:
        """Current weight version (the version new tokens are produced under)."""

    @property
    def tokenizer(self) -> Any:
        """The HF tokenizer of the served model (clients tokenise tool text with it)."""

    async def generate(self, request: GenerateRequest) -> Completion:
        """Generate one completion. Blocks while the engine is paused."""

    async def pause(self, mode: PauseMode = "abort") -> None:
        """Stop decoding: `abort` returns in-flight requests now (finish_reason `abort`); `wait` lets them finish."""

    async def resume(self) -> None:
        """Resume decoding; requests that arrived while paused start now."""

    async def update_weights(self, source: WeightSource, version: int) -> None:
        """Load new weights (state dict or checkpoint folder) and set the version. Call while paused."""

    async def health(self) -> dict[str, Any]:
        """Liveness and load figures, e.g. {"ok": True, "version": 3, "running": 5, "waiting": 0}."""


async def generate_continuing(engine: InferenceEngine, request: GenerateRequest, max_restarts: int = 1000) -> Completion:
    """`engine.generate`, transparently continuing requests aborted by a weight update.

    The prompt of each continuation is the original prompt plus everything generated so far, and
    `max_new_tokens` shrinks accordingly; log-probs and versions of earlier tokens are kept as they
    were recorded. The result's finish reason is that of the last piece.
    """
    ids: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    budget = request.sampling.max_new_tokens
    for _ in range(max_restarts + 1):
        # The first piece sends the caller's list itself: copying a long agent context on every
        # call would make each turn's cost grow with the history.
        piece = await engine.generate(request if not ids else replace(
            request, prompt_ids=request.prompt_ids + ids,
            sampling=replace(request.sampling, max_new_tokens=budget - len(ids))))
        ids += piece.output_ids
        logprobs += piece.logprobs
        versions += piece.versions
        if piece.finish_reason != "abort" or len(ids) >= budget:
            reason: FinishReason = "length" if piece.finish_reason == "abort" else piece.finish_reason
            return Completion(ids, logprobs, versions, reason, piece.stop_reason)
    return Completion(ids, logprobs, versions, "abort", None)


def is_checkpoint_dir(source: WeightSource) -> bool:
    """True when a weight source names a checkpoint folder rather than an in-memory state dict."""
    return isinstance(source, (str, Path))
