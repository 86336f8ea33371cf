"""One connection to a Model Context Protocol server (stdio or streamable HTTP), kept alive and restarted.

Design. The SDK's clients (`stdio_client`, `streamable_http_client`, `ClientSession`) are async
context managers bound to the task that entered them, so each `MCPConnection` owns one background
task that enters them, runs `initialize()`, hands the session out and then just waits. Calls run
in the callers' tasks on that shared session (the SDK correlates concurrent requests). Stopping
sets an event that cancels the background task's *anyio* scope, so the SDK's shielded shutdown
(close stdin, SIGTERM, SIGKILL; every wait bounded) always runs — a native `task.cancel()` could
skip it and leak the server process, so it is only a last resort after `_STOP_TIMEOUT_S`.

Failures. A server that died or a dropped connection surfaces as `TransientError` from the call
that hits it (BaseTool then retries with backoff); the next call finds the connection dead and
restarts it — one restart attempt per call, spaced by exponential backoff after failed restarts.
Protocol errors and `isError` results are permanent `ToolError`s. Every await on the server is
bounded (connect_timeout_s to start, call_timeout_s per call, on top of BaseTool's own timeout).

Secrets. env_passthrough values and the bearer token reach only the server; the token goes over HTTPS, or
over plain HTTP only to a loopback host (anyone on the path could read it otherwise: refused at
construction), and redirects are not followed (they could carry it elsewhere); `scrub` removes them
(and the usual *KEY*/*TOKEN* variables, via `core.log.redact`) from every log line and error text.
The server's stderr is drained by a thread into debug logs, keeping a short tail for error messages.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import mcp_types as mt
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError as SDKError

from core.log import get_logger, redact
from tools.base import ToolError, TransientError
from tools.config import MCPServerConfig

log = get_logger(__name__)

_STOP_TIMEOUT_S = 10.0
"""How long a graceful stop may take (the SDK's stdio shutdown is bounded by ~6.5 s)."""
_STDERR_TAIL = 20
_CONNECTION_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, ConnectionError,
                      BrokenPipeError, httpx2.TransportError)


class MCPError(ValueError):
    """An MCP server that cannot be used (bad command, start timeout, missing tool): one line, no secrets."""


def _one_line(text: str, limit: int = 500) -> str:
    return " ".join(text.split())[:limit]


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (possibly nested) exception groups."""
    while isinstance(getattr(exc, "exceptions", None), tuple) and exc.exceptions:  # (Base)ExceptionGroup, 3.10-safe
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _describe(exc: BaseException) -> str:
    exc = _leaf(exc)
    if isinstance(exc, SDKError):
        return exc.message
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _cancel_when_set(stop: asyncio.Event, scope: anyio.CancelScope) -> None:
    """Turn the stop event into an anyio cancellation, under which the SDK's shielded shutdown runs."""
    await stop.wait()
    scope.cancel()


def server_label(server: MCPServerConfig) -> str:
    """The name a server goes by in messages: `name`, else the command's file name or the URL's host."""
    if server.name:
        return server.name
    if server.command:
        return Path(server.command).name
    return urlsplit(server.url).hostname or "mcp"


def _loopback_host(host: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1): traffic that never leaves this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_token_transport(server: MCPServerConfig, name: str) -> None:
    """MCPError when the server's bearer token would cross a network in clear (plain HTTP, non-loopback host)."""
    if not (server.url and server.bearer_token_env):
        return
    parts = urlsplit(server.url)
    if parts.scheme.lower() == "http" and not _loopback_host(parts.hostname or ""):
        raise MCPError(f"MCP server '{name}': refusing to send the bearer token ({server.bearer_token_env}) over "
                       f"plain HTTP to {parts.hostname or '?'}; use an https:// URL (plain HTTP is for loopback)")


class MCPConnection:
    """One connection to one MCP server (stdio subprocess or streamable HTTP); see the module docstring."""

    def __init__(self, server: MCPServerConfig, *, call_timeout_s: float = 300.0, restart_backoff_s: float = 0.5,
                 restart_backoff_max_s: float = 8.0):
        self.server = server
        self.name = server_label(server)
        if bool(server.command) == bool(server.url):
            raise MCPError(f"MCP server '{self.name}': set exactly one of `command` (stdio) or `url` (HTTP)")
        _check_token_transport(server, self.name)
        self.call_timeout_s = call_timeout_s
        self.restart_backoff_s = restart_backoff_s
        self.restart_backoff_max_s = restart_backoff_max_s
        self.restarts = 0
        """Successful restarts after the first start."""
        self._session: ClientSession | None = None
        self._task: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._gen = 0
        self._broken = False
        self._closed = False
        self._failures = 0
        self._last_failure = 0.0
        self._lock = asyncio.Lock()
        self._reapers: set[asyncio.Task] = set()
        self._secrets: set[str] = set()
        self._stderr: deque[str] = deque(maxlen=_STDERR_TAIL)

    # -- secrets --------------------------------------------------------------------------------
    def _secret_values(self) -> list[str]:
        names = list(self.server.env_passthrough) + ([self.server.bearer_token_env] if self.server.bearer_token_env else [])
        values = [os.environ.get(n, "") for n in names] + list(self._secrets)
        return sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)  # longest first: no partial leftovers

    def scrub(self, text: str) -> str:
        """`text` without this server's secrets or any secret-looking environment value."""
        for value in self._secret_values():
            text = text.replace(value, "***")
        return redact(text)

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True while the session is up and no call has seen it break."""
        return (self._session is not None and not self._broken and self._task is not None
                and not self._task.done())

    async def start(self) -> None:
        """Start the server (or connect) and `initialize`, within connect_timeout_s; raises MCPError."""
        async with self._lock:
            if not self.alive:
                await self._launch()

    async def aclose(self) -> None:
        """End the session and the server process (bounded); later calls fail with ToolError."""
        self._closed = True
        self._retire()
        if self._reapers:
            await asyncio.wait(set(self._reapers), timeout=2 * _STOP_TIMEOUT_S + 1)

    async def _launch(self) -> None:
        if self.server.bearer_token_env and not os.environ.get(self.server.bearer_token_env):
            raise MCPError(f"MCP server '{self.name}': environment variable {self.server.bearer_token_env} "
                           "(bearer_token_env) is not set")
        self._retire()
        self._stderr.clear()
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()
        task = asyncio.create_task(self._serve(ready, stop), name=f"mcp-{self.name}")
        try:
            session = await asyncio.wait_for(asyncio.shield(ready), self.server.connect_timeout_s)
        except BaseException as exc:
            timed_out = isinstance(exc, asyncio.TimeoutError) and not ready.done()
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved: no "exception never retrieved" warning
            else:
                ready.cancel()
            reaper = self._retire(task, stop)
            if isinstance(exc, asyncio.CancelledError):
                raise
            await asyncio.wait({reaper}, timeout=3.0)  # let the process exit so its stderr tail is complete
            await asyncio.sleep(0.05)
            why = f"did not start within {self.server.connect_timeout_s:g}s" if timed_out else \
                f"could not start: {_describe(exc)}"
            tail = " | ".join(list(self._stderr)[-3:])
            message = f"MCP server '{self.name}' {why}" + (f" (stderr: {tail})" if tail else "")
            raise MCPError(self.scrub(_one_line(message, 800))) from None
        self._task, self._stop, self._session = task, stop, session
        self._gen += 1
        self._broken = False
        if self._closed:  # aclose() ran while we were starting: do not leave this one running
            self._retire()
            raise ToolError(f"MCP server '{self.name}': connection is closed")

    def _retire(self, task: asyncio.Task | None = None, stop: asyncio.Event | None = None) -> asyncio.Task:
        """Stop a background task (the current one by default) in the background; returns the reaper."""
        if task is None:
            task, stop = self._task, self._stop
            self._task = self._stop = self._session = None
        reaper = asyncio.create_task(self._reap(task, stop))
        self._reapers.add(reaper)
        reaper.add_done_callback(self._reapers.discard)
        return reaper

    async def _reap(self, task: asyncio.Task | None, stop: asyncio.Event | None) -> None:
        if task is None:
            return
        if stop is not None:
            stop.set()
        done, _ = await asyncio.wait({task}, timeout=_STOP_TIMEOUT_S)
        if not done:  # the SDK's shutdown is bounded, so this means something is badly stuck
            log.warning("MCP server '%s': did not stop within %gs; cancelling", self.name, _STOP_TIMEOUT_S)
            task.cancel()
            await asyncio.wait({task}, timeout=_STOP_TIMEOUT_S)

    async def _serve(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        """The background task: holds the transport and session open until `stop` is set."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_when_set, stop, tg.cancel_scope)
                async with AsyncExitStack() as stack:
                    read, write = await stack.enter_async_context(self._transport())
                    session = await stack.enter_async_context(ClientSession(
                        read, write, client_info=mt.Implementation(name="hexsearch", version="1")))
                    await session.initialize()
                    if not ready.done():
                        ready.set_result(session)
                    await anyio.sleep_forever()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except BaseException as exc:  # noqa: BLE001 - reported through `ready` or the log, never lost
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(_describe(exc)))
            elif not stop.is_set():
                log.warning("MCP server '%s': connection ended: %s", self.name, self.scrub(_describe(exc)))
        if not ready.done():
            ready.set_exception(ConnectionError("stopped before initialize finished"))

    def _transport(self):
        return self._stdio() if self.server.command else self._http()

    @asynccontextmanager
    async def _stdio(self) -> AsyncIterator[Any]:
        env = dict(self.server.env)
        for var in self.server.env_passthrough:
            value = os.environ.get(var)
            if value is None:
                log.warning("MCP server '%s': env_passthrough variable %s is not set", self.name, var)
            else:
                env[var] = value
                self._secrets.add(value)
        params = StdioServerParameters(command=self.server.command, args=list(self.server.args), env=env)
        rfd, wfd = os.pipe()
        threading.Thread(target=self._drain_stderr, args=(rfd,), daemon=True, name=f"mcp-stderr-{self.name}").start()
        errlog = os.fdopen(wfd, "w")
        try:
            async with stdio_client(params, errlog=errlog) as streams:
                errlog.close()  # the child holds its own copy; ours would keep the pipe from ever ending
                yield streams
        finally:
            errlog.close()

    def _drain_stderr(self, fd: int) -> None:
        """Thread: the server's stderr into debug logs (scrubbed) and a short tail for error messages."""
        with os.fdopen(fd, "r", errors="replace") as stream:
            for line in stream:
                line = self.scrub(line.rstrip())[:300]
                if line:
                    self._stderr.append(line)
                    log.debug("MCP server '%s' stderr: %s", self.name, line)

    @asynccontextmanager
    async def _http(self) -> AsyncIterator[Any]:
        headers = {}
        if self.server.bearer_token_env:
            token = os.environ.get(self.server.bearer_token_env, "")
            self._secrets.add(token)
            headers["Authorization"] = f"Bearer {token}"
        timeout = httpx2.Timeout(self.server.connect_timeout_s, read=max(self.call_timeout_s, 60.0))
        async with httpx2.AsyncClient(headers=headers, timeout=timeout, follow_redirects=False) as client:
            async with streamable_http_client(self.server.url, http_client=client) as streams:
                yield streams

    # -- calls ----------------------------------------------------------------------------------
    def _restart_delay(self) -> float:
        if not self._failures:
            return 0.0
        wait = min(self.restart_backoff_max_s, self.restart_backoff_s * 2 ** (self._failures - 1))
        return max(0.0, wait - (time.monotonic() - self._last_failure))

    async def _session_for_call(self) -> tuple[ClientSession, int]:
        """The live session, restarting a dead one first (one attempt, after backoff)."""
        if self._closed:
            raise ToolError(f"MCP server '{self.name}': connection is closed")
        if self.alive:
            return self._session, self._gen  # type: ignore[return-value]
        async with self._lock:  # one restart at a time; waiters then find it alive
            if self._closed:
                raise ToolError(f"MCP server '{self.name}': connection is closed")
            if not self.alive:
                await asyncio.sleep(self._restart_delay())
                if self._gen:
                    log.warning("MCP server '%s': connection lost; restarting", self.name)
                try:
                    await self._launch()
                except MCPError as exc:
                    self._failures += 1
                    self._last_failure = time.monotonic()
                    raise TransientError(str(exc)) from None
                self.restarts += self._gen > 1
                self._failures = 0
            return self._session, self._gen  # type: ignore[return-value]

    def _lost(self, gen: int, exc: BaseException) -> TransientError:
        if gen == self._gen:
            self._broken = True  # the next call restarts the server
        return TransientError(f"MCP server '{self.name}': connection lost ({self.scrub(_describe(exc))})")

    async def _request(self, fn, *args: Any, timeout_s: float) -> Any:
        session, gen = await self._session_for_call()
        try:
            return await asyncio.wait_for(fn(session, *args), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError() from None  # the builtin one (asyncio's differs on 3.10): BaseTool's "timed out"
        except SDKError as exc:
            if exc.code == mt.CONNECTION_CLOSED:
                raise self._lost(gen, exc) from None
            if exc.code == mt.REQUEST_TIMEOUT:
                raise TimeoutError() from None
            raise ToolError(self.scrub(_one_line(f"MCP server '{self.name}': {exc.message}"))) from None
        except _CONNECTION_ERRORS as exc:
            raise self._lost(gen, exc) from None
        except ToolError:
            raise
        except Exception as exc:  # a malformed reply, an unexpected result type: permanent, described
            raise ToolError(self.scrub(_one_line(f"MCP server '{self.name}': {_describe(exc)}"))) from None

    async def list_tools(self) -> list[mt.Tool]:
        """Every tool the server offers (all pages), within connect_timeout_s."""

        async def all_pages(session: ClientSession) -> list[mt.Tool]:
            tools: list[mt.Tool] = []
            cursor = None
            while True:
                params = mt.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_tools(params=params)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools

        return await self._request(all_pages, timeout_s=self.server.connect_timeout_s)

    async def call_tool(self, name: str, args: dict[str, Any]) -> mt.CallToolResult:
        """Call one tool by its server-side name; TransientError when the connection broke."""
        return await self._request(lambda s: s.call_tool(name, args), timeout_s=self.call_timeout_s)
