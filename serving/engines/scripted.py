"""ScriptedEngine: an InferenceEngine whose outputs a test (or a benchmark) decides.

It is the one allowed test double of the project: it implements `serving.protocol.InferenceEngine`
exactly, so agent, trainer and evaluation code run against it unchanged. What it "generates" comes
from a script (a list of outputs, consumed one per call) or from a responder callback that receives
the prompt ids and the request. An output is text (tokenised with the engine's tokenizer, the way a
model would have produced those tokens), token ids, a `ScriptedOutput` with explicit log-probs, or
an exception to raise (to test engine-error handling).

It behaves like a real engine where it matters to clients:

- tokens are emitted one at a time; stop strings end generation on the token that completes them
  (that token is kept), EOS and `stop_token_ids` end it too, `max_new_tokens` gives `length`;
- every token carries a synthetic behaviour log-prob and the weight version current when it was
  emitted;
- `pause("abort")` makes in-flight calls return what they have with `finish_reason="abort"`; a
  continuation (same request id, prompt extended by the partial output, as
  `serving.protocol.generate_continuing` sends it) resumes the same scripted output, so one answer
  can span weight versions; `pause("wait")` lets them finish; calls made while paused block until
  `resume()`; `update_weights(source, version)` records the source and sets the version.

`ScriptedOutput(hold_after=k)` parks a call after k tokens until the engine is paused, which makes
"abort in the middle of a call" deterministic: `await engine.wait_held()` then pause/update/resume.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from serving.protocol import Completion, GenerateRequest, PauseMode, SamplingParams, WeightSource


@dataclass
class ScriptedOutput:
    """One scripted completion."""

    text: str | None = None
    """Text to emit (tokenised with the engine's tokenizer); ignored when `ids` is given."""
    ids: list[int] | None = None
    """Token ids to emit."""
    logprobs: list[float] | None = None
    """Behaviour log-probs of those tokens (default: a deterministic synthetic value per token)."""
    hold_after: int | None = None
    """Park the call after emitting this many tokens until the engine is paused (abort tests)."""


ScriptItem = str | list[int] | ScriptedOutput | BaseException
Responder = Callable[[list[int], GenerateRequest], Any]
"""`responder(prompt_ids, request) -> ScriptItem` (may be async)."""


@dataclass
class ScriptedCall:
    """One `generate` call as the engine saw it (recorded when `record=True`)."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    completion: Completion | None = None
    error: str | None = None


@dataclass
class _Pending:
    """An aborted call whose remaining scripted tokens wait for the continuation."""

    expect_prompt_len: int
    ids: list[int]
    logprobs: list[float]
    hold_after: int | None = None


def synthetic_logprob(token_id: int, position: int) -> float:
    """A deterministic log-prob in [-1.0, -0.001] for a token at an output position."""
    return -(((token_id * 7919 + position * 104729) % 1000) + 1) / 1000.0


@dataclass
class _State:
    version: int = 0
    paused: bool = False
    abort_epoch: int = 0
    running: int = 0
    waiting: int = 0
    num_calls: int = 0
    weight_updates: list[tuple[Any, int]] = field(default_factory=list)


class ScriptedEngine:
    """An InferenceEngine that emits scripted outputs (see module docstring)."""

    def __init__(self, outputs: Iterable[ScriptItem] | None = None, *, responder: Responder | None = None,
                 tokenizer: Any = None, version: int = 0, token_delay_s: float = 0.0, record: bool = True,
                 eos_token_id: int | None = None, logprob_fn: Callable[[int, int], float] = synthetic_logprob):
        if tokenizer is None:
            from serving.models import TINY_RANDOM, load_tokenizer

            tokenizer = load_tokenizer(TINY_RANDOM)
        self._tokenizer = tokenizer
        self._script: deque[ScriptItem] = deque(outputs or [])
        self._responder = responder
        self._token_delay_s = token_delay_s
        self.record = record
        self.calls: list[ScriptedCall] = []
        """Every call, in arrival order (when `record` is true)."""
        self._eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        self._logprob_fn = logprob_fn
        self._state = _State(version=version)
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._abort_event = asyncio.Event()
        self._held = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._pending: dict[str, _Pending] = {}
        self._pieces: dict[int, str] = {}

    # --- protocol ---------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._state.version

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def weight_updates(self) -> list[tuple[Any, int]]:
        """(source, version) of every `update_weights` call."""
        return self._state.weight_updates

    @property
    def num_calls(self) -> int:
        return self._state.num_calls

    def push(self, *items: ScriptItem) -> None:
        """Append outputs to the script."""
        self._script.extend(items)

    async def generate(self, request: GenerateRequest) -> Completion:
        st = self._state
        st.waiting += 1
        try:
            while st.paused:
                await self._resumed.wait()
        finally:
            st.waiting -= 1
        st.running += 1
        self._idle.clear()
        st.num_calls += 1
        call = ScriptedCall(request.request_id, list(request.prompt_ids), request.sampling) if self.record else None
        if call is not None:
            self.calls.append(call)
        try:
            ids, logprobs, hold_after = await self._next_output(request)
            completion = await self._emit(request, ids, logprobs, hold_after)
        except BaseException as e:
            if call is not None:
                call.error = f"{type(e).__name__}: {e}"
            raise
        finally:
            st.running -= 1
            if st.running == 0:
                self._idle.set()
        if call is not None:
            call.completion = completion
        return completion

    async def pause(self, mode: PauseMode = "abort") -> None:
        self._state.paused = True
        self._resumed.clear()
        if mode == "abort":
            self._state.abort_epoch += 1
            self._abort_event.set()
            await asyncio.sleep(0)  # let held / in-flight calls observe the abort
        else:
            await self._idle.wait()

    async def resume(self) -> None:
        self._state.paused = False
        self._abort_event.clear()
        self._held.clear()
        self._resumed.set()

    async def update_weights(self, source: WeightSource, version: int) -> None:
        self._state.weight_updates.append((source, version))
        self._state.version = version

    async def health(self) -> dict[str, Any]:
        st = self._state
        return {"ok": True, "version": st.version, "running": st.running, "waiting": st.waiting,
                "paused": st.paused, "calls": st.num_calls}

    async def wait_held(self) -> None:
        """Wait until some call is parked by `ScriptedOutput.hold_after`."""
        await self._held.wait()

    # --- internals --------------------------------------------------------------------------------

    async def _next_output(self, request: GenerateRequest) -> tuple[list[int], list[float], int | None]:
        pending = self._pending.pop(request.request_id, None)
        if pending is not None and len(request.prompt_ids) == pending.expect_prompt_len:
            return pending.ids, pending.logprobs, pending.hold_after
        if self._script:
            item = self._script.popleft()
        elif self._responder is not None:
            item = self._responder(request.prompt_ids, request)
            if inspect.isawaitable(item):
                item = await item
        else:
            raise RuntimeError(f"ScriptedEngine: script exhausted after {self._state.num_calls - 1} calls")
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, ScriptedOutput):
            ids = list(item.ids) if item.ids is not None else self._encode(item.text or "")
            lps = list(item.logprobs) if item.logprobs is not None else self._synthetic(ids)
            if len(lps) != len(ids):
                raise ValueError(f"ScriptedOutput has {len(ids)} ids but {len(lps)} logprobs")
            return ids, lps, item.hold_after
        ids = self._encode(item) if isinstance(item, str) else [int(i) for i in item]
        return ids, self._synthetic(ids), None

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _synthetic(self, ids: list[int]) -> list[float]:
        return [self._logprob_fn(t, i) for i, t in enumerate(ids)]

    def _stop_hit(self, out: list[int], stops: list[str], longest: int) -> str | None:
        """The stop string completed by the last token, if any (only the tail is decoded)."""
        piece = self._pieces.get(out[-1])
        if piece is None:
            piece = self._pieces[out[-1]] = self._tokenizer.decode(out[-1:], skip_special_tokens=False)
        if "\ufffd" not in piece and not any(s[-1] in piece for s in stops):
            return None  # cheap filter: a token that completes a stop string contains its last character
        tail = self._tokenizer.decode(out[-(longest + 1):], skip_special_tokens=False)
        prev = self._tokenizer.decode(out[-(longest + 1):-1], skip_special_tokens=False) if len(out) > 1 else ""
        for s in stops:
            if s in tail and s not in prev:
                return s
        return None

    async def _emit(self, request: GenerateRequest, ids: list[int], logprobs: list[float],
                    hold_after: int | None) -> Completion:
        sp = request.sampling
        stops = [s for s in sp.stop if s]
        longest = max((len(s) for s in stops), default=0)
        stop_ids = set(sp.stop_token_ids)
        if self._eos is not None:
            stop_ids.add(self._eos)
        epoch = self._state.abort_epoch
        out: list[int] = []
        lps: list[float] = []
        vers: list[int] = []

        def aborted(i: int) -> Completion:
            rest = _Pending(len(request.prompt_ids) + len(out), ids[i:], logprobs[i:],
                            None if hold_after is None or hold_after <= i else hold_after - i)
            self._pending[request.request_id] = rest
            return Completion(out, lps, vers, "abort", None)

        for i, (tok, lp) in enumerate(zip(ids, logprobs, strict=True)):
            if hold_after is not None and i == hold_after and self._state.abort_epoch == epoch:
                self._held.set()
                await self._abort_event.wait()
            if self._state.abort_epoch != epoch:
                return aborted(i)
            if len(out) >= sp.max_new_tokens:
                return Completion(out, lps, vers, "length", None)
            out.append(tok)
            lps.append(lp)
            vers.append(self._state.version)
            if tok in stop_ids:
                return Completion(out, lps, vers, "stop", tok)
            if stops:
                hit = self._stop_hit(out, stops, longest)
                if hit is not None:
                    return Completion(out, lps, vers, "stop", hit)
            if self._token_delay_s > 0:
                await asyncio.sleep(self._token_delay_s)
        if self._state.abort_epoch != epoch:
            return aborted(len(ids))
        return Completion(out, lps, vers, "stop", None)
