"""Instant in-memory tools that implement the Tool protocol (tests, benchmarks, examples).

`MemorySearch` ranks documents by word overlap with the query (a tiny lexical retriever);
`MemoryPages` serves whole pages by URL. They are real tools over real data held in memory, with
no I/O, so an episode's cost is the agent's own; the production tools are their neighbours in `tools/`.
"""

from __future__ import annotations

import re
import time
from typing import Any

from tools.protocol import Observation

_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


class MemorySearch:
    """Search over {"title", "url", "contents"} documents by word overlap (ties: corpus order)."""

    name = "search"

    def __init__(self, docs: list[dict[str, str]], topk: int = 3, name: str = "search"):
        self.name = name
        self.docs = docs
        self.topk = topk
        self._index = [_words(d.get("title", "") + " " + d.get("contents", "")) for d in docs]
        self.schema: dict[str, Any] = {"type": "function", "function": {
            "name": name, "description": "Search the document collection; returns the best-matching passages.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "Search query"}},
                           "required": ["query"]}}}
        self.calls = 0

    async def __call__(self, args: dict[str, Any]) -> Observation:
        t = time.perf_counter()
        self.calls += 1
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            return Observation(text="Error: the query is empty.", error="empty query")
        q = _words(query)
        scored = sorted(range(len(self.docs)), key=lambda i: (-len(q & self._index[i]), i))[: self.topk]
        hits = [self.docs[i] for i in scored if q & self._index[i]]
        if not hits:
            return Observation(text="No results found.", data=[], latency_s=time.perf_counter() - t)
        text = "\n".join(f"[{i + 1}] {d.get('title', '')} ({d.get('url', '')})\n{d.get('contents', '')}"
                         for i, d in enumerate(hits))
        return Observation(text=text, data=hits, latency_s=time.perf_counter() - t)


class MemoryPages:
    """Page access by URL over an in-memory {url: text} map."""

    name = "access"

    def __init__(self, pages: dict[str, str], name: str = "access"):
        self.name = name
        self.pages = pages
        self.schema: dict[str, Any] = {"type": "function", "function": {
            "name": name, "description": "Open a web page by URL and read its text.",
            "parameters": {"type": "object", "properties": {"url": {"type": "string", "description": "Page URL"}},
                           "required": ["url"]}}}

    async def __call__(self, args: dict[str, Any]) -> Observation:
        url = str(args.get("url", "")).strip()
        page = self.pages.get(url)
        if page is None:
            return Observation(text=f"No page is stored for {url}.", error="not found")
        return Observation(text=page, data={"url": url})
