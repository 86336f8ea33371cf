"""EnginePool: one InferenceEngine over several remote servers (vLLM, SGLang or ours).

Routing. A call whose `request_id` was seen before goes back to the same server (an LRU map of
`sticky_size` ids), so a multi-turn trajectory reuses that server's prefix KV cache. Any other call
goes to the live server with the smallest expected wait

    score_i = (in_flight_i + 1) / throughput_i

where in_flight_i counts this pool's calls on server i and throughput_i is its measured output rate
while busy, decayed with time constant tau (seconds):

    tokens_i(t) = sum_k n_k exp(-(t - t_k) / tau)              (n_k tokens finished at t_k)
    busy_i(t)   = integral 1[in_flight_i(s) > 0] exp(-(t - s) / tau) ds
    throughput_i = tokens_i / busy_i    (servers not yet measured get the median of the others)

so a server twice as fast receives about twice the calls, and a backed-up one is skipped.

Health. Every `health_interval_s` each server's `health()` is polled; a server that refuses
connections, or fails `down_after` checks in a row, is taken out of routing (its sticky ids are
forgotten) and polled until it answers again. A call that cannot connect takes it out at once. Before it rejoins
it is brought to the pool's state: paused if the pool is paused, and reloaded from the last
checkpoint folder if the pool's weights moved on while it was away.

Retries never duplicate a generation. A call is resubmitted to another server only when no result
of it can exist or ever be delivered:
- `EngineUnavailable`: the request never reached the server (connection refused, unreachable);
- `EngineRequestError` with a 5xx status: the server answered that it failed;
- `GenerationLost` (sent, no reply) *and* a probe of the server is refused: the server is dead, so
  the generation died with it.
A call whose reply was lost while the server is still up (read timeout, dropped connection) is
never resubmitted: the server may have finished it or still be running it, and resubmitting would
spend the work twice and — since long generations are the ones that time out — bias the sample
towards short answers. It raises `GenerationLost` to the caller, which drops the episode.
An abort (`finish_reason="abort"`, from a pause) is an answer, not a failure: it goes back to the
caller, and `serving.protocol.generate_continuing` continues it (on the same server, or another
one if that server left the pool).

`pause`, `resume` and `update_weights` fan out to every live server concurrently.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import statistics
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from serving.protocol import Completion, GenerateRequest, PauseMode, WeightSource, is_checkpoint_dir
from serving.remote.client import RemoteEngine
from serving.remote.transport import EngineRequestError, EngineUnavailable, GenerationLost

log = logging.getLogger(__name__)


@dataclass
class _Meter:
    """Decayed tokens and busy time of one server (see the module docstring)."""

    tau: float
    in_flight: int = 0
    tokens: float = 0.0
    busy: float = 0.0
    last: float = field(default_factory=time.monotonic)

    def _advance(self) -> None:
        now = time.monotonic()
        decay = math.exp(-(now - self.last) / self.tau)
        self.tokens *= decay
        self.busy = self.busy * decay + (self.tau * (1 - decay) if self.in_flight > 0 else 0.0)
        self.last = now

    def start(self) -> None:
        self._advance()
        self.in_flight += 1

    def finish(self, tokens: int) -> None:
        self._advance()
        self.in_flight -= 1
        self.tokens += tokens

    def throughput(self) -> float | None:
        """Tokens per busy second, or None before one second of busy time was seen."""
        self._advance()
        return self.tokens / self.busy if self.busy >= 1.0 and self.tokens > 0 else None


@dataclass
class _Server:
    engine: RemoteEngine
    meter: _Meter
    up: bool = True
    last_error: str = ""
    failed_checks: int = 0
    """Consecutive failed health checks (a live server leaves routing after `down_after` of them)."""


class NoLiveServer(EngineUnavailable):
    """Every server of the pool is down (or was already tried for this call)."""


class EnginePool:
    """InferenceEngine over several remote engines: sticky + throughput-weighted routing, health, fan-out."""

    backend = "pool"

    def __init__(self, engines: list[RemoteEngine], *, sticky_size: int = 10_000, health_interval_s: float = 5.0,
                 max_attempts: int = 3, tau_s: float = 30.0, probe_timeout_s: float = 3.0, down_after: int = 2):
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self._servers = [_Server(e, _Meter(tau_s)) for e in engines]
        self.sticky_size = sticky_size
        self.health_interval_s = health_interval_s
        self.max_attempts = max_attempts
        self.probe_timeout_s = probe_timeout_s
        self.down_after = down_after
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._version = max(e.version for e in engines)
        self._paused = False
        self._last_weights: tuple[WeightSource, int] | None = None
        self._health_task: asyncio.Task | None = None
        self._syncing: set[int] = set()
        self.stats = {"calls": 0, "resubmitted": 0, "lost": 0, "rejoined": 0}
        """Counters: calls answered, calls resubmitted to another server, replies lost (raised), rejoins."""

    # ---- protocol surface -------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def tokenizer(self) -> Any:
        return self._servers[0].engine.tokenizer

    @property
    def engines(self) -> list[RemoteEngine]:
        return [s.engine for s in self._servers]

    def live(self) -> list[str]:
        """URLs of the servers currently in routing."""
        return [s.engine.url for s in self._servers if s.up]

    async def generate(self, request: GenerateRequest) -> Completion:
        self._ensure_health_task()
        tried: set[int] = set()
        failure = ""
        for attempt in range(self.max_attempts):
            i = self._route(request.request_id, tried)
            server = self._servers[i]
            server.meter.start()
            tokens = 0
            try:
                completion = await server.engine.generate(request)
                tokens = len(completion.output_ids)
                self._remember(request.request_id, i)
                self.stats["calls"] += 1
                return completion
            except EngineUnavailable as e:
                failure = str(e)
                self._mark_down(i, e)
            except EngineRequestError as e:
                if not e.retryable:
                    raise
                failure = str(e)
                if await self._probe(i) != "up":
                    self._mark_down(i, e)
            except GenerationLost as e:
                if await self._settled_probe(i) != "down":
                    self.stats["lost"] += 1
                    raise  # the server lives: the generation may exist there, so never resubmit
                failure = str(e)
                self._mark_down(i, e)
            finally:
                server.meter.finish(tokens)
            tried.add(i)
            if attempt + 1 < self.max_attempts:
                self.stats["resubmitted"] += 1
                log.warning("pool: %s failed for %s (%s); resubmitting elsewhere", server.engine.url,
                            request.request_id, failure)
        raise NoLiveServer(f"generate {request.request_id}: failed on {len(tried)} server(s); last: {failure}")

    async def pause(self, mode: PauseMode = "abort") -> None:
        self._paused = True
        await self._fan_out(lambda e: e.pause(mode), "pause")

    async def resume(self) -> None:
        self._paused = False
        await self._fan_out(lambda e: e.resume(), "resume")

    async def update_weights(self, source: WeightSource, version: int) -> None:
        from serving.protocol import Transferred

        if not is_checkpoint_dir(source) and not isinstance(source, Transferred):
            raise TypeError("an engine pool loads weights from a checkpoint folder every server can read, "
                            f"not a {type(source).__name__}")
        # a server that refuses (a path outside its weights root, say) fails the whole update: the pool keeps
        # its version and the weights a rejoining server is given
        await self._fan_out(lambda e: e.update_weights(source, version), "update_weights")
        self._last_weights = (source, int(version))
        self._version = int(version)

    async def health(self) -> dict[str, Any]:
        self._ensure_health_task()
        reports = await asyncio.gather(*(self._health_of(i) for i in range(len(self._servers))))
        return {"ok": any(s.up for s in self._servers), "version": self._version, "paused": self._paused,
                "running": sum(s.meter.in_flight for s in self._servers),
                "servers": [{**r, "up": s.up, "in_flight": s.meter.in_flight, "throughput": s.meter.throughput()}
                            for r, s in zip(reports, self._servers, strict=True)]}

    async def aclose(self) -> None:
        """Stop health checks and close every engine's connections."""
        if self._health_task is not None:
            self._health_task.cancel()
            try:
                await self._health_task
            except (asyncio.CancelledError, RuntimeError):
                pass
            self._health_task = None
        for s in self._servers:
            await s.engine.aclose()

    # ---- routing ----------------------------------------------------------------------------

    def _route(self, request_id: str, exclude: set[int]) -> int:
        live = [i for i, s in enumerate(self._servers) if s.up and i not in exclude]
        if not live:
            raise NoLiveServer(f"no live server for {request_id} (down: "
                               f"{[s.engine.url for s in self._servers if not s.up]}, tried: {sorted(exclude)})")
        sticky = self._sticky.get(request_id)
        if sticky in live:
            self._sticky.move_to_end(request_id)
            return sticky
        measured = {i: self._servers[i].meter.throughput() for i in live}
        known = [t for t in measured.values() if t is not None]
        prior = statistics.median(known) if known else 1.0
        scores = {i: (self._servers[i].meter.in_flight + 1) / (measured[i] or prior) for i in live}
        best = min(scores.values())
        return random.choice([i for i, s in scores.items() if s <= best * (1 + 1e-9)])

    def _remember(self, request_id: str, i: int) -> None:
        self._sticky[request_id] = i
        self._sticky.move_to_end(request_id)
        while len(self._sticky) > self.sticky_size:
            self._sticky.popitem(last=False)

    # ---- health -----------------------------------------------------------------------------

    def _mark_down(self, i: int, error: Exception | str) -> None:
        s = self._servers[i]
        s.last_error = str(error)
        if s.up:
            log.warning("pool: taking %s out of routing: %s", s.engine.url, s.last_error)
        s.up = False
        for rid in [r for r, j in self._sticky.items() if j == i]:
            del self._sticky[rid]

    async def _probe(self, i: int) -> str:
        """'up', 'down' (connection refused: the server process is gone) or 'unknown' (slow, erroring)."""
        engine = self._servers[i].engine
        try:
            await engine._request("GET", engine._health_path, timeout=self.probe_timeout_s)
            return "up"
        except EngineUnavailable:
            return "down"
        except (EngineRequestError, GenerationLost):
            return "unknown"

    async def _settled_probe(self, i: int, tries: int = 4, pause_s: float = 0.25) -> str:
        """`_probe`, asked again while it says 'unknown': a server killed this instant can still take a
        connection and then drop it (its listening socket outlives the process by a moment), which reads
        'unknown' until the port is closed and the answer becomes 'down'."""
        state = await self._probe(i)
        for _ in range(tries - 1):
            if state != "unknown":
                break
            await asyncio.sleep(pause_s)
            state = await self._probe(i)
        return state

    async def _health_of(self, i: int) -> dict[str, Any]:
        s = self._servers[i]
        try:
            report = await asyncio.wait_for(s.engine.health(), self.probe_timeout_s + 10)
        except asyncio.TimeoutError:
            report = {"ok": False, "url": s.engine.url, "error": "health check timed out"}
        if not report.get("ok"):
            s.failed_checks += 1
            if report.get("unreachable") or s.failed_checks >= self.down_after:  # refused: proof enough
                self._mark_down(i, report.get("error", "unhealthy"))
            return report
        s.failed_checks = 0
        if not s.up and i not in self._syncing:
            self._syncing.add(i)
            try:
                await self._rejoin(i)
            finally:
                self._syncing.discard(i)
        return report

    async def _rejoin(self, i: int) -> None:
        """Bring a recovered server to the pool's state (weights, pause), then route to it again."""
        s = self._servers[i]
        try:
            if self._last_weights is not None and s.engine.version != self._version:
                from serving.protocol import Transferred

                if isinstance(self._last_weights[0], Transferred):  # labelling it would hide its old weights
                    raise RuntimeError("its weights came over the NCCL group it has left (train.weight_transfer=nccl)")
                await s.engine.update_weights(*self._last_weights)
            if self._paused and not s.engine.paused:
                await s.engine.pause("abort")
            elif not self._paused and s.engine.paused:
                await s.engine.resume()
        except Exception as e:  # still not usable; try again at the next health round
            s.last_error = f"rejoin failed: {type(e).__name__}: {e}"
            log.warning("pool: %s answers but could not rejoin: %s", s.engine.url, s.last_error)
            return
        s.up = True
        self.stats["rejoined"] += 1
        log.warning("pool: %s is back in routing (version %d)", s.engine.url, s.engine.version)

    def _ensure_health_task(self) -> None:
        loop = asyncio.get_running_loop()
        task = self._health_task
        if task is not None and not task.done() and task.get_loop() is loop:
            return
        self._health_task = loop.create_task(self._health_loop())

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await asyncio.gather(*(self._health_of(i) for i in range(len(self._servers))))
            except Exception as e:  # a health round must never kill the loop
                log.warning("pool: health round failed: %s", e)

    async def _fan_out(self, action, what: str) -> None:
        """Run `action(engine)` on every live server; unreachable ones leave the pool (and resync later)."""
        live = [i for i, s in enumerate(self._servers) if s.up]
        results = await asyncio.gather(*(action(self._servers[i].engine) for i in live), return_exceptions=True)
        failures = []
        for i, r in zip(live, results, strict=True):
            if isinstance(r, EngineUnavailable):
                self._mark_down(i, r)
            elif isinstance(r, BaseException):
                failures.append(f"{self._servers[i].engine.url}: {type(r).__name__}: {r}")
        if failures:
            raise RuntimeError(f"pool {what} failed on {len(failures)} server(s): " + "; ".join(failures))
        if not any(s.up for s in self._servers):
            raise NoLiveServer(f"pool {what}: no live server")


def build_remote(backend: str, urls: list[str], model: str, *, request_timeout_s: float = 600.0,
                 token: str | None = None, **pool_kwargs: Any) -> Any:
    """A client for `backend` (`http`, `vllm`, `sglang`): one engine for one URL, an EnginePool for several.
    `token`: the servers' control token (default: $HEXSEARCH_ENGINE_TOKEN)."""
    if not urls:
        raise ValueError(f"engine backend '{backend}' needs engine.urls (start a server with "
                         "`hexsearch serve engine|vllm` and name its URL, e.g. engine.urls=[http://127.0.0.1:8000])")
    from serving.backends import ENGINE_BACKENDS, engine_backend

    client = engine_backend(backend).client
    if client is None:
        remote = [n for n in ENGINE_BACKENDS.names() if engine_backend(n).remote]
        raise ValueError(f"engine backend '{backend}' runs in-process, not as a client of servers; the remote "
                         f"backends: {', '.join(remote)}")
    engines: list[RemoteEngine] = [client(u, model, request_timeout_s=request_timeout_s, token=token) for u in urls]
    if len(engines) == 1:
        return engines[0]
    tokenizer = engines[0].tokenizer  # one tokenizer for all: the servers serve the same model
    for e in engines:
        e._tokenizer = tokenizer
    return EnginePool(engines, **pool_kwargs)
