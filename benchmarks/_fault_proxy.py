"""A fault-injecting HTTP proxy on loopback: a share of requests fail the ways web APIs fail.

A `rate` share of the requests (spread evenly: request n fails when floor((n+1)·rate) > floor(n·rate))
is answered by one fault, taken in turn from:

    500     an internal server error
    503     unavailable, with `Retry-After: 1`
    429     too many requests, with `Retry-After: 1`
    timeout the proxy holds the request past the client's timeout (`hang_s`), then closes
    drop    the connection is closed without an answer

With `outage_every=N`, request N, 2N, ... also starts an outage: for `outage_s` seconds every request is
answered 503 (no Retry-After), back-to-back failures that outlast a client's retries. Outages wait until
every kind of fault has been injected once (when `rate` > 0): a client retrying through an outage makes
most of the requests, and a short run must still meet each kind. Otherwise requests are forwarded to
`upstream` (a real service, e.g. `hexsearch serve retrieval`). The same
requests fail in every run, and every kind of fault occurs once five have been injected. Plain
asyncio sockets (HTTP/1.1 with keep-alive), so "drop" really resets the connection. Counts are in `stats`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx

FAULTS = ("500", "503", "429", "timeout", "drop")


class FaultProxy:
    def __init__(self, upstream: str, *, rate: float = 0.3, hang_s: float = 3.0, outage_every: int = 0,
                 outage_s: float = 0.0):
        self.upstream, self.rate, self.hang_s = upstream.rstrip("/"), rate, hang_s
        self.outage_every, self.outage_s = outage_every, outage_s
        self.outage_until = 0.0
        self.injected = 0
        self.stats: dict[str, int] = {"requests": 0, "forwarded": 0, "outages": 0, "outage": 0,
                                      **{f: 0 for f in FAULTS}}
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()

    # -- lifecycle (a background thread with its own event loop) ----------------------------------
    def start(self) -> str:
        threading.Thread(target=self._run, daemon=True, name="fault-proxy").start()
        if not self._started.wait(30):
            raise RuntimeError("fault proxy did not start")
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.client = httpx.AsyncClient(timeout=60, trust_env=False)
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._started.set()
        async with server:
            await self._stop.wait()
        await self.client.aclose()

    # -- one connection: requests until the client closes it (or a fault drops it) --------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                if not await self._answer(writer, *request):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, method: str, path: str, headers: dict[str, str],
                      body: bytes) -> bool:
        """Answer one request; False when the connection must be closed."""
        self.stats["requests"] += 1
        now = time.monotonic()
        faults_pending = self.rate > 0 and self.injected < len(FAULTS)
        if (self.outage_every and not faults_pending and self.stats["requests"] % self.outage_every == 0
                and now >= self.outage_until):
            self.outage_until = now + self.outage_s
            self.stats["outages"] += 1
        if now < self.outage_until:
            self.stats["outage"] += 1
            await _respond(writer, 503, b'{"error": "injected outage"}', {})
            return True
        n = self.stats["requests"] - self.stats["outage"] - 1  # the spread-out faults count the other requests
        fault = None
        if int((n + 1) * self.rate) > int(n * self.rate):
            fault = FAULTS[self.injected % len(FAULTS)]
            self.injected += 1
            self.stats[fault] += 1
        if fault == "drop":
            writer.transport.abort()
            return False
        if fault == "timeout":
            await asyncio.sleep(self.hang_s)
            return False
        if fault in ("500", "503", "429"):
            extra = {"Retry-After": "1"} if fault != "500" else {}
            await _respond(writer, int(fault), b'{"error": "injected fault"}', extra)
            return True
        resp = await self.client.request(method, self.upstream + path, content=body,
                                         headers={"content-type": headers.get("content-type", "application/json")})
        self.stats["forwarded"] += 1
        await _respond(writer, resp.status_code, resp.content, {})
        return True


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, path, headers, body


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes, headers: dict[str, Any]) -> None:
    head = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", "content-type: application/json",
            *(f"{k}: {v}" for k, v in headers.items())]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
