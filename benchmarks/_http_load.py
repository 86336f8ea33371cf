"""The load generator of benchmarks/retrieval_service.py: plain keep-alive HTTP/1.1 JSON connections, as many
concurrent clients as asked sending a list of requests, and the CPU time a server's process tree used.
"""

import asyncio
import json
import os
import time
from pathlib import Path


class Connection:
    """One keep-alive HTTP/1.1 connection speaking JSON: a lightweight load-generating client.

    httpx's shared connection pool costs so much CPU per request that on 2 cores it cannot keep
    64 requests in flight (the server saw 2-3 at a time); 64 plain connections model 64
    independent agents and leave the CPU to the servers under test.
    """

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, obj: dict) -> dict:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        body = json.dumps(obj).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await self.writer.drain()
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        length = next(int(line.split(":", 1)[1]) for line in head[1:] if line.lower().startswith("content-length:"))
        data = await self.reader.readexactly(length)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
        return json.loads(data)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def hammer(url: str, requests: list[list[tuple[int, str]]], clients: int,
                 topk: int) -> tuple[float, list[float], dict[int, list]]:
    """Send `requests` (each a list of (query id, query)) over `clients` connections, each one request at
    a time; returns wall seconds, per-request latencies and each query's result row."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    todo = list(reversed(requests))
    results: dict[int, list] = {}
    latencies: list[float] = []

    async def client() -> None:
        conn = Connection(host, int(port))
        try:
            while todo:
                req = todo.pop()
                t0 = time.perf_counter()
                body = await conn.post("/retrieve", {"queries": [q for _, q in req], "topk": topk,
                                                     "return_scores": True})
                latencies.append(time.perf_counter() - t0)
                for (i, _), row in zip(req, body["result"], strict=True):
                    results[i] = row
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - t0, latencies, results


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and all its living descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total
