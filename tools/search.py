"""The `search` tool and its providers: the local index, any Search-R1 `/retrieve` URL, Serper (Google).

Every provider answers `await provider.search(query, topk) -> [SearchHit(title, url, snippet)]`,
so the agent sees the same result shape whatever the backend; the tool adds the timeout, retries,
cache and cost accounting of BaseTool. Costs are per query (`cost_per_query`, dollars).

- `LocalSearch`: an index searched by this process (worker thread or worker process), behind a
  RetrievalBatcher, so many concurrent episodes share encoder batches like service clients do.
- `RetrieveUrlSearch`: POSTs Search-R1's `{"queries": [...], "topk": k, "return_scores": true}`
  to a retrieval service (ours or any peer's) and reads `{"result": [[{document, score}]]}`;
  concurrent searches are coalesced into one request.
- `SerperSearch`: POST https://google.serper.dev/search with `X-API-KEY` from the environment
  variable named in the config (the key is never logged; log records are redacted as well).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import httpx

from tools.base import BaseTool, ToolError, ToolResult, TransientError, check_status


@dataclass
class SearchHit:
    title: str
    url: str
    snippet: str
    score: float | None = None
    id: str | None = None


def split_contents(contents: str) -> tuple[str, str]:
    """Search-R1 `contents` is `"Title"\\ntext`: return (title, text); ('', contents) otherwise."""
    first, _, rest = contents.partition("\n")
    first = first.strip()
    if rest and len(first) > 1 and first[0] == first[-1] == '"':
        return first[1:-1], rest.strip()
    return "", contents.strip()


def hit_from_doc(doc: dict[str, Any], score: float | None, snippet_chars: int) -> SearchHit:
    """Normalise a corpus row (Search-R1 / ASearcher / our world) into a SearchHit."""
    contents = str(doc.get("contents") or doc.get("text") or "")
    title, body = split_contents(contents)
    title = str(doc.get("title") or title)
    if title and body.startswith(title + "\n"):
        body = body[len(title) + 1:]
    snippet = " ".join(body.split())
    if len(snippet) > snippet_chars:
        snippet = snippet[:snippet_chars].rsplit(" ", 1)[0] + " ..."
    doc_id = doc.get("id")
    return SearchHit(title=title, url=str(doc.get("url") or ""), snippet=snippet, score=score,
                     id=None if doc_id is None else str(doc_id))


class SearchProvider(Protocol):
    name: str
    namespace: str
    """Identity for the result cache (changes when results would change)."""
    cost_per_query: float

    async def search(self, query: str, topk: int) -> list[SearchHit]: ...

    async def aclose(self) -> None: ...


class _PerLoop:
    """One object per running event loop (httpx clients and batchers are bound to a loop)."""

    def __init__(self, factory):
        self._factory = factory
        self._items: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self):
        loop = asyncio.get_running_loop()
        item = self._items.get(loop)
        if item is None or getattr(item, "is_closed", False):
            item = self._items[loop] = self._factory()
        return item

    def pop(self):
        return self._items.pop(asyncio.get_running_loop(), None)


class LocalSearch:
    """Search a local index in-process, batched across concurrent callers.

    `source` is a loaded Retriever (shared; runs on a worker thread) or an index folder, loaded
    on a worker thread (`worker="thread"`) or in a worker process (`worker="process"`: the
    encoder then never competes with this process's event loop for the GIL).
    """

    name = "local"

    def __init__(self, source: Any, *, worker: str = "thread", max_batch: int = 64, max_wait_ms: float = 2.0,
                 snippet_chars: int = 1000, **retriever_kwargs: Any):
        from tools.batcher import RetrievalBatcher
        from tools.index import read_meta
        from tools.retriever import Retriever
        from tools.runners import ProcessRunner, ThreadRunner

        if isinstance(source, Retriever):
            meta, make_runner = source.meta, (lambda: ThreadRunner(source))
        elif worker == "process":
            meta = read_meta(source)
            make_runner = lambda: ProcessRunner(source, batch_size=max_batch, **retriever_kwargs)  # noqa: E731
        elif worker == "thread":
            retriever = Retriever(source, batch_size=max_batch, **retriever_kwargs)
            meta, make_runner = retriever.meta, (lambda: ThreadRunner(retriever))
        else:
            raise ToolError(f"retrieval worker must be 'thread' or 'process', got {worker!r}")
        self.namespace = f"local:{meta['id']}"
        self.cost_per_query = 0.0
        self.snippet_chars = snippet_chars
        self._batchers = _PerLoop(lambda: RetrievalBatcher(make_runner(), max_batch=max_batch, max_wait_ms=max_wait_ms))

    async def search(self, query: str, topk: int) -> list[SearchHit]:
        hits = (await self._batchers.get().search([query], topk))[0]
        return [hit_from_doc(h.doc, h.score, self.snippet_chars) for h in hits]

    async def aclose(self) -> None:
        batcher = self._batchers.pop()
        if batcher is not None:
            await batcher.aclose()


class _HttpProvider:
    def __init__(self, timeout_s: float):
        self._clients = _PerLoop(lambda: httpx.AsyncClient(timeout=timeout_s, trust_env=False))

    async def aclose(self) -> None:
        client = self._clients.pop()
        if client is not None:
            await client.aclose()


class RemoteRunner:
    """Batch runner that sends a whole batch to a `/retrieve` service as one Search-R1 request per top-k."""

    def __init__(self, url: str, timeout_s: float):
        self.url = url
        self.client = httpx.AsyncClient(timeout=timeout_s, trust_env=False)
        self.requests = 0

    async def _post(self, queries: list[str], topk: int) -> list[list[Any]]:
        from tools.retriever import Hit

        self.requests += 1
        resp = await self.client.post(self.url, json={"queries": queries, "topk": topk, "return_scores": True})
        check_status(resp, "retrieval service HTTP")
        try:
            rows = resp.json()["result"]
            if len(rows) != len(queries):
                raise ValueError(f"{len(rows)} results for {len(queries)} queries")
            return [[Hit(-1, r.get("score"), r["document"]) if isinstance(r, dict) and "document" in r
                     else Hit(-1, None, r) for r in row] for row in rows]  # type: ignore[arg-type]
        except (ValueError, KeyError, TypeError) as e:
            raise ToolError(f"retrieval service returned an unexpected body: {resp.text[:200]!r}") from e

    async def run(self, batch: list[tuple[str, int]]) -> list[list[Any]]:
        by_k: dict[int, list[int]] = {}
        for pos, (_, k) in enumerate(batch):
            by_k.setdefault(k, []).append(pos)
        groups = list(by_k.items())
        answers = await asyncio.gather(*(self._post([batch[p][0] for p in pos], k) for k, pos in groups))
        out: list[list[Any]] = [[] for _ in batch]
        for (_, positions), rows in zip(groups, answers, strict=True):
            for pos, row in zip(positions, rows, strict=True):
                out[pos] = row
        return out

    async def warmup(self) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"requests": self.requests}

    async def aclose(self) -> None:
        await self.client.aclose()


class RetrieveUrlSearch:
    """Any Search-R1-compatible retrieval service (`POST <url>/retrieve`).

    Concurrent searches from many episodes in this process are coalesced (for up to
    `max_wait_ms`) into one request carrying all their queries — the format allows any number —
    so a rollout worker with hundreds of episodes sends a few large requests, not hundreds.
    """

    name = "url"

    def __init__(self, url: str, *, timeout_s: float = 30.0, snippet_chars: int = 1000, cost_per_query: float = 0.0,
                 max_batch: int = 64, max_wait_ms: float = 2.0):
        from tools.batcher import RetrievalBatcher

        if not url:
            raise ToolError("search backend 'url' needs tools.retrieval_url (e.g. http://127.0.0.1:8000)")
        self.url = url.rstrip("/") if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self.namespace = f"url:{self.url}"
        self.cost_per_query = cost_per_query
        self.snippet_chars = snippet_chars
        self._batchers = _PerLoop(lambda: RetrievalBatcher(RemoteRunner(self.url, timeout_s), max_batch=max_batch,
                                                           max_wait_ms=max_wait_ms))

    async def search(self, query: str, topk: int) -> list[SearchHit]:
        hits = (await self._batchers.get().search([query], topk))[0]
        return [hit_from_doc(h.doc, h.score, self.snippet_chars) for h in hits]

    async def aclose(self) -> None:
        batcher = self._batchers.pop()
        if batcher is not None:
            await batcher.aclose()


class SerperSearch(_HttpProvider):
    """Google results through serper.dev (organic results only)."""

    name = "serper"

    def __init__(self, *, url: str = "https://google.serper.dev/search", api_key_env: str = "SERPER_API_KEY",
                 cost_per_query: float = 0.001, timeout_s: float = 30.0):
        super().__init__(timeout_s)
        self.url = url
        self.api_key_env = api_key_env
        self.namespace = "serper"
        self.cost_per_query = cost_per_query

    async def search(self, query: str, topk: int) -> list[SearchHit]:
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise ToolError(f"Serper search needs an API key in the environment variable {self.api_key_env}")
        resp = await self._clients.get().post(self.url, json={"q": query[:2000], "num": topk},
                                              headers={"X-API-KEY": key, "Content-Type": "application/json"})
        if resp.status_code in (401, 403):
            raise ToolError(f"Serper rejected the API key in {self.api_key_env} (HTTP {resp.status_code})")
        check_status(resp, "Serper HTTP")
        try:
            organic = resp.json().get("organic", [])
        except ValueError as e:
            raise TransientError(f"Serper returned an unparseable body (HTTP {resp.status_code})") from e
        return [SearchHit(title=str(r.get("title", "")), url=str(r.get("link", "")), snippet=str(r.get("snippet", "")),
                          score=None, id=None) for r in organic[:topk]]


class SearchTool(BaseTool):
    """`search(query, topk?)`: top results as title / URL / snippet."""

    name = "search"
    description = "Search for documents relevant to a query. Returns titles, URLs and snippets."
    parameters = {"type": "object", "properties": {
        "query": {"type": "string", "description": "What to search for."},
        "topk": {"type": "integer", "description": "How many results to return."}},
        "required": ["query"]}

    def __init__(self, provider: SearchProvider, *, topk: int = 5, max_topk: int = 50, show_urls: bool = True,
                 **base: Any):
        super().__init__(**base)
        self.provider, self.show_urls = provider, show_urls
        self.topk = topk
        self.max_topk = max_topk

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        clean = super().validate(args)
        clean["query"] = " ".join(clean["query"].split())
        if not clean["query"]:
            raise ToolError("missing required argument 'query'")
        clean["topk"] = min(max(1, int(clean.get("topk") or self.topk)), self.max_topk)
        return clean

    def cache_namespace(self) -> str:
        return f"search:{self.provider.namespace}"

    async def run(self, args: dict[str, Any]) -> ToolResult:
        hits = await self.provider.search(args["query"], args["topk"])
        return ToolResult([asdict(h) for h in hits], cost=self.provider.cost_per_query,
                          meta={"provider": self.provider.name, "results": len(hits)})

    def render(self, data: list[dict[str, Any]], args: dict[str, Any]) -> str:
        if not data:
            return f"No results found for: {args['query']}"
        parts = []
        for i, hit in enumerate(data, start=1):
            head = f"[{i}] {hit['title'] or '(untitled)'}"
            url = f"URL: {hit['url']}\n" if hit["url"] and self.show_urls else ""
            parts.append(f"{head}\n{url}{hit['snippet']}")
        return "\n\n".join(parts)

    async def aclose(self) -> None:
        await self.provider.aclose()
