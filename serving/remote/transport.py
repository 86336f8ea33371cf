"""The HTTP layer of the remote engines: one call to a server, its one retry, and its failures classified.

`HttpTransport` holds a server's address, timeouts and control token and the loop-bound `httpx`
client; `RemoteEngine` (serving/remote/client.py) builds the engine protocol on top of it.

Errors, classified so that a pool can retry without ever duplicating a generation:
- `EngineUnavailable`: the request provably never reached a server (connect or write failure).
- `EngineRequestError`: the server answered with an error status (`retryable` for 5xx: no result
  exists; 4xx means the request itself is bad).
- `GenerationLost`: the request was sent and the reply never came (read timeout, dropped
  connection). The server may have finished (or still be running) the generation, so nothing here
  resubmits it; see `serving.engines.pool` for the one case where that is still safe.

Only idempotent reads (GET) are retried, once, on a fresh connection.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx


class EngineUnavailable(ConnectionError):
    """The request never reached the server (refused, unreachable, or its body could not be sent)."""


class EngineRequestError(RuntimeError):
    """The server answered with an HTTP error status."""

    def __init__(self, url: str, path: str, status: int, detail: str):
        super().__init__(f"{url}{path}: HTTP {status}: {detail[:500]}")
        self.status = status
        self.retryable = status >= 500 or status == 429
        """True when no result exists and resubmitting elsewhere is safe (server-side failure)."""


class GenerationLost(RuntimeError):
    """A generate call was sent but its reply never arrived; it may have completed on the server."""


class HttpTransport:
    """One server's address and the HTTP client that talks to it (re-made for each new event loop)."""

    def __init__(self, url: str, *, request_timeout_s: float = 600.0, connect_timeout_s: float = 5.0,
                 token: str | None = None):
        """`url` is the server's base URL (http:// is assumed when it has no scheme). `token`: the
        server's control token, sent as a bearer token (default: $HEXSEARCH_ENGINE_TOKEN when set)."""
        self.url = url.rstrip("/")
        if "://" not in self.url:
            self.url = "http://" + self.url
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.token = token
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None

    def _bind_loop(self) -> bool:
        """(Re)create loop-bound objects when called from a new event loop (tests, asyncio.run); True when
        this call did (subclasses then make their own loop-bound objects too)."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return False
        self._loop = loop
        # Idle connections are dropped after 2 s, before servers do (uvicorn closes them after 5 s):
        # reusing one the server is closing fails as "disconnected", which would look like a lost reply.
        limits = httpx.Limits(max_connections=4096, max_keepalive_connections=256, keepalive_expiry=2.0)
        # Environment proxies are ignored (as the tools do): engine traffic stays on the configured address.
        # The control token of our engine server, when set, goes with every call.
        token = self.token or os.environ.get("HEXSEARCH_ENGINE_TOKEN")
        self._client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(
            self.request_timeout_s, connect=self.connect_timeout_s), trust_env=False,
            headers={"Authorization": f"Bearer {token}"} if token else None)
        return True

    async def aclose(self) -> None:
        """Close the HTTP connections (the server keeps running)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _request(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
                       headers: dict | None = None, timeout: float | None = None,
                       generation: bool = False) -> Any:
        """One HTTP call, with failures mapped onto EngineUnavailable / EngineRequestError / GenerationLost."""
        if self._client is None:
            self._bind_loop()
        t = httpx.Timeout(timeout or self.request_timeout_s, connect=self.connect_timeout_s)
        for attempt in (0, 1):
            try:
                resp = await self._client.request(method, self.url + path, json=json, params=params,
                                                  headers=headers, timeout=t)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteError,
                    httpx.WriteTimeout, httpx.UnsupportedProtocol) as e:
                raise EngineUnavailable(f"{self.url}{path}: not reachable ({type(e).__name__}: {e})") from e
            except (httpx.ReadError, httpx.RemoteProtocolError) as e:
                if method == "GET" and attempt == 0:
                    continue  # reads are idempotent: one retry on a fresh connection
                what = "generation" if generation else "request"
                raise GenerationLost(f"{self.url}{path}: {what} sent but no reply ({type(e).__name__}: {e})") from e
            except httpx.ReadTimeout as e:
                what = "generation" if generation else "request"
                raise GenerationLost(f"{self.url}{path}: {what} sent but no reply ({type(e).__name__}: {e})") from e
        if resp.status_code >= 400:
            raise EngineRequestError(self.url, path, resp.status_code, resp.text)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text

    async def _generated_tokens(self, counter: str) -> dict[str, int]:
        """{"tokens_generated": n} from the server's Prometheus `/metrics` counter, {} when it has none."""
        try:
            metrics = await self._request("GET", "/metrics", timeout=10)
        except EngineRequestError:
            return {}
        total = prometheus_total(metrics if isinstance(metrics, str) else "", counter)
        return {} if total is None else {"tokens_generated": int(total)}


def parse_version(value: Any) -> int | None:
    """A server's weight-version label as an int: "3" -> 3; "default" (vLLM's and SGLang's label for
    the weights it started with, i.e. never updated) -> 0; None for any other label."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if value is None or str(value).strip() in ("", "default"):
        return 0
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def prometheus_total(text: str, name: str) -> float | None:
    """Sum of a Prometheus counter over all its label sets (None when absent)."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name) and (line[len(name):len(name) + 1] in ("{", " "))]
    return sum(values) if values else None
