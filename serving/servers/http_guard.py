"""ASGI middlewares that keep our HTTP servers (engine, retrieval) to the clients they are meant for.

`BodyLimit`   413 for a request body over a limit, and the client gets to read it: the rest of the body is
              read and thrown away first (bounded in bytes and time), because a server that answers and
              closes while the client is still sending makes the kernel reset the connection, and the client
              then sees `Broken pipe` instead of the 413.
`LocalGuard`  what a web page the user happens to open must not be able to do: a Host that is not this
              server's name (DNS rebinding) gets 403, any cross-origin `Origin` gets 403, a POST body that is
              not `application/json` gets 415 (a form or `text/plain` POST needs no CORS preflight), and the
              control routes need `Authorization: Bearer <token>`, checked on the ASGI `scope["path"]` the
              router matches (never on a URL rebuilt from headers).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import re
import time
from typing import Any

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
DRAIN_MAX_BYTES = 256 << 20
"""Most bytes of an oversized body read and dropped so that its client can read the 413."""
DRAIN_MAX_S = 10.0
"""Longest time spent draining one oversized body (a slow sender then gets the 413 and a closed connection)."""


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or address, IPv6 with or without brackets) is a loopback one."""
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_HOST_HEADER = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(:[0-9]{1,5})?")


def host_name(value: str) -> str:
    """The host part of a `Host` header: `[::1]:8000` -> `::1`, `example.org:80` -> `example.org`; a value that
    is not `host[:port]` (`127.0.0.1:80/x#`) comes back whole, so that it matches no name."""
    value = value.strip().lower()
    match = _HOST_HEADER.fullmatch(value)
    return match.group(1).strip("[]") if match else value


async def send_json(send: Any, status: int, payload: Any, close: bool = False) -> None:
    """An ASGI JSON response, encoded as FastAPI's JSONResponse encodes it."""
    body = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def drain(receive: Any, seen: int, more: bool, max_bytes: int = DRAIN_MAX_BYTES,
                max_s: float = DRAIN_MAX_S) -> None:
    """Read and drop the rest of a request body (at most `max_bytes` more, for at most `max_s` seconds).
    Other requests are served meanwhile: this only awaits the event loop."""
    deadline = time.monotonic() + max_s
    while more and seen <= max_bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request":  # the client went away
            return
        seen += len(message.get("body", b""))
        more = message.get("more_body", False)


class BodyLimit:
    """ASGI middleware: 413 for a body over `limit` bytes, by its Content-Length or, for a chunked body,
    as soon as the bytes received pass the limit (at most `limit` bytes are ever held). The rest of the
    body is drained before the answer (see the module docstring), unless the client asked
    `Expect: 100-continue`: it then has sent nothing yet and reads the 413 instead of sending."""

    def __init__(self, app: Any, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            if headers.get(b"expect", b"").lower() != b"100-continue":
                await drain(receive, 0, True)
            return await self._too_large(send)
        messages, seen = [], 0  # read the body here, never past the limit, then hand it on
        while True:
            message = await receive()
            messages.append(message)
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await drain(receive, seen, message.get("more_body", False))
                return await self._too_large(send)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Any) -> None:
        await send_json(send, 413, {"detail": f"request body over {self.limit} bytes"}, close=True)


def _canonical_path(path: str) -> str:
    """`scope["path"]` as the router could still reach a route by it: repeated and trailing slashes folded."""
    return re.sub(r"/+", "/", path).rstrip("/") or "/"


class LocalGuard:
    """ASGI middleware (see the module docstring).

    `allowed_hosts`: names accepted in `Host` besides the loopback ones (e.g. the address the server binds);
    None accepts any Host (a wildcard bind, which needs a token anyway). `control_paths` need the bearer
    `token` when one is given; `error(status, message, kind)` shapes the JSON error body."""

    def __init__(self, app: Any, *, token: str | None, control_paths: frozenset[str],
                 allowed_hosts: frozenset[str] | None, error: Any):
        self.app, self.token, self.control_paths = app, token, control_paths
        self.allowed_hosts, self.error = allowed_hosts, error

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refusal = self.refusal(scope)
        if refusal is not None:
            status, message, kind = refusal
            return await send_json(send, status, self.error(status, message, kind))
        await self.app(scope, receive, send)

    def refusal(self, scope: dict) -> tuple[int, str, str] | None:
        """(status, message, error type) for a request to refuse, else None."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        host = host_name(headers.get("host", ""))
        if self.allowed_hosts is not None and not is_loopback(host) and host not in self.allowed_hosts:
            return 403, f"Host {host!r} is not this server's name (refused: DNS rebinding)", "PermissionError"
        origin = headers.get("origin")
        if origin is not None and origin.lower() != f"http://{headers.get('host', '').lower()}":
            return 403, f"cross-origin request from {origin!r} refused", "PermissionError"
        if scope.get("method") == "POST" and _has_body(headers):
            ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                return 415, f"POST bodies must be application/json, got {ctype or 'no content type'!r}", \
                    "UnsupportedMediaType"
        path = _canonical_path(scope.get("path", ""))
        if self.token and path in self.control_paths:
            sent = headers.get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {self.token}".encode()):
                return 401, f"{path} needs 'Authorization: Bearer <token>'", "AuthenticationError"
        return None


def _has_body(headers: dict[str, str]) -> bool:
    length = headers.get("content-length")
    return "chunked" in headers.get("transfer-encoding", "").lower() or (length is not None and length != "0")
