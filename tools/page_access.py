"""Page access: the `access` tool — local world pages by URL, the web through the URL guard.

Fetching (`PageFetcher`): httpx with `GuardedTransport` (every TCP connection is checked and
pinned to the checked address, see tools/urlguard.py); redirects are followed by hand so every
hop's URL is checked again and loops are caught; the body is streamed and cut at `max_bytes`
(decompressed bytes, inflated incrementally with an output limit, so a gzip bomb never allocates more than
the cap); only allowlisted content types are read;
cookies are never stored, so episodes cannot leak state into each other through a site.
HTML/text over the cap is kept up to the cap and marked truncated; a PDF over the cap is refused
(a PDF prefix is unreadable). The tool's per-attempt timeout caps the whole fetch, including
bodies that trickle in.

The tool returns the page as numbered chunks (`data["chunks"]`); the text shows chunk `page`
(1-based, default 1) and says how many remain, so an agent can read a long page one chunk per turn.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import weakref
import zlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from tools.base import BaseTool, ToolError, ToolResult, check_status
from tools.docstore import PageStore
from tools.extract import (
    DEFAULT_CONTENT_TYPES,
    HTML_TYPES,
    MAX_EXTRACT_HTML_BYTES,
    PDF_TYPES,
    chunk_text,
    extract,
    sniff_type,
)
from tools.urlguard import RESERVED_TLDS, GuardedTransport, UrlGuard, UrlRefused

REDIRECT_CODES = (301, 302, 303, 307, 308)
USER_AGENT = "Mozilla/5.0 (compatible; hexsearch/0.1; research search agent)"


@dataclass
class Fetched:
    url: str
    final_url: str
    status: int
    content_type: str
    charset: str | None
    body: bytes
    truncated: bool
    redirects: list[str] = field(default_factory=list)


class PageFetcher:
    """Guarded, capped HTTP GET with manual redirects. One httpx client per event loop."""

    def __init__(self, guard: UrlGuard, *, max_bytes: int = 5_000_000, max_redirects: int = 5,
                 content_types: tuple[str, ...] | list[str] = DEFAULT_CONTENT_TYPES, user_agent: str = USER_AGENT,
                 connect_timeout_s: float = 10.0, read_timeout_s: float = 20.0, max_connections: int = 64):
        self.guard = guard
        self.max_bytes = max_bytes
        self.max_redirects = max_redirects
        self.content_types = tuple(c.lower() for c in content_types)
        self.user_agent = user_agent
        self.timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=10.0, pool=30.0)
        self.max_connections = max_connections
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
            weakref.WeakKeyDictionary()

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            no_cookies = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
            client = httpx.AsyncClient(
                transport=GuardedTransport(self.guard, max_connections=self.max_connections),
                follow_redirects=False, trust_env=False, timeout=self.timeout, cookies=no_cookies,
                headers={"User-Agent": self.user_agent, "Accept-Encoding": "gzip, deflate",
                         "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,application/pdf;q=0.8,*/*;q=0.1"})
            self._clients[loop] = client
        return client

    async def fetch(self, url: str) -> Fetched:
        """GET `url`; raises UrlRefused, ToolError (permanent) or TransientError / httpx errors."""
        current = self.guard.check_url(url)
        seen = {str(current)}
        redirects: list[str] = []
        client = self.client()
        for _ in range(self.max_redirects + 1):
            async with client.stream("GET", current) as resp:
                location = resp.headers.get("location")
                if resp.status_code in REDIRECT_CODES and location:
                    try:
                        target = self.guard.check_url(current.join(location))
                    except UrlRefused as e:
                        raise UrlRefused(f"redirect to {location}: {e}") from e
                    if str(target) in seen:
                        raise ToolError(f"redirect loop at {target}")
                    seen.add(str(target))
                    redirects.append(str(target))
                    current = target
                    continue
                check_status(resp)
                return await self._read(url, current, resp, redirects)
        raise ToolError(f"too many redirects (more than {self.max_redirects})")

    async def _read(self, url: str, current: httpx.URL, resp: httpx.Response, redirects: list[str]) -> Fetched:
        raw_type = resp.headers.get("content-type", "")
        ctype = raw_type.split(";")[0].strip().lower()
        charset = resp.charset_encoding
        if ctype and ctype not in self.content_types:
            raise ToolError(f"unsupported content type '{ctype}'")
        declared = int(resp.headers.get("content-length") or 0) if resp.headers.get("content-length", "").isdigit() else 0
        if ctype in PDF_TYPES and declared > self.max_bytes:
            raise ToolError(f"PDF of {declared} bytes exceeds the {self.max_bytes}-byte cap")
        body, truncated = await self._body(resp)
        if not ctype:
            ctype = sniff_type(bytes(body))
            if ctype not in self.content_types:
                raise ToolError(f"unsupported content type '{ctype}' (sniffed)")
        if truncated and ctype in PDF_TYPES:
            raise ToolError(f"PDF exceeds the {self.max_bytes}-byte cap")
        return Fetched(url=url, final_url=str(current), status=resp.status_code, content_type=ctype,
                       charset=charset, body=bytes(body), truncated=truncated, redirects=redirects)

    async def _body(self, resp: httpx.Response) -> tuple[bytearray, bool]:
        """(at most `max_bytes` of decoded body, whether it was cut). Compressed bodies are inflated here,
        never more than the room left (`max_length`), so a gzip bomb costs no more memory than the cap;
        httpx's own decoder would inflate each network chunk whole."""
        encoding = resp.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "", "gzip", "x-gzip", "deflate"):
            raise ToolError(f"unsupported content encoding '{encoding}'")
        inflate = None if encoding in ("identity", "") else zlib.decompressobj(47 if "gzip" in encoding else 15)
        body = bytearray()
        async for raw in resp.aiter_raw():
            data = raw
            while data:
                room = self.max_bytes - len(body)
                if inflate is None:
                    chunk, data = data[:room], data[room:]
                else:
                    try:
                        chunk = inflate.decompress(data, max(room, 1))
                    except zlib.error as e:
                        raise ToolError(f"corrupt {encoding} body: {e}") from None
                    data = inflate.unconsumed_tail
                if len(chunk) > room or (data and len(body) + len(chunk) >= self.max_bytes):
                    body += chunk[:room]
                    return body, True
                body += chunk
        return body, False

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()


def local_page(row: dict[str, Any]) -> tuple[str, str]:
    """(title, text) of a page-store row.

    The `title` field when present; else the first line when it looks like a heading: `# Title`,
    `"Title"` (Search-R1 style), or a short unpunctuated line followed by a blank line.
    """
    contents = str(row.get("contents", row.get("text", "")))
    title = str(row.get("title") or "")
    if not title:
        first, _, rest = contents.partition("\n")
        first = first.strip()
        if first.startswith("#"):
            title = first.lstrip("#").strip()
        elif len(first) > 1 and first[0] == first[-1] == '"':
            title = first[1:-1]
        elif 0 < len(first) <= 150 and first[-1] not in ".!?:;," and rest.startswith("\n"):
            title = first
    return title, contents


class AccessTool(BaseTool):
    """`access(url, page?)`: read a web page (or a local world page) as numbered chunks."""

    name = "access"
    description = ("Open a web page by URL and read its main text. Long pages are split into numbered "
                   "chunks; pass `page` to read a later chunk.")
    parameters = {"type": "object", "properties": {
        "url": {"type": "string", "description": "The page URL (http or https)."},
        "page": {"type": "integer", "description": "Chunk number to read, starting at 1 (default 1)."}},
        "required": ["url"]}

    def __init__(self, *, pages: PageStore | None = None, fetcher: PageFetcher | None = None,
                 chunk_chars: int = 4000, max_chunks: int = 10, **base: Any):
        super().__init__(**base)
        self.pages = pages
        self.fetcher = fetcher
        self.chunk_chars = chunk_chars
        self.max_chunks = max_chunks

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        clean = super().validate(args)
        clean["url"] = clean["url"].strip()
        if clean.get("page", 1) < 1:
            raise ToolError("argument 'page' must be 1 or more")
        return clean

    def cache_args(self, args: dict[str, Any]) -> dict[str, Any] | None:
        if self.pages is not None and self.pages.get(args["url"]) is not None:
            return None  # local pages are already on disk; caching them would only go stale
        return {"url": args["url"], "chunk_chars": self.chunk_chars, "max_chunks": self.max_chunks}

    async def run(self, args: dict[str, Any]) -> ToolResult:
        url = args["url"]
        row = await asyncio.to_thread(self.pages.get, url) if self.pages is not None else None
        if row is not None:
            title, text = local_page(row)
            return ToolResult(self._page(url, str(row.get("url", url)), title, text, "text/markdown", "local"),
                              meta={"source": "local"})
        host = (urlsplit(url if "://" in url else "//" + url).hostname or "").rstrip(".")
        if host.endswith(RESERVED_TLDS) and not (self.fetcher and self.fetcher.guard.host_allowed(host)):
            raise ToolError(f"no such page: {url} is not in the local page store")
        if self.fetcher is None:
            raise ToolError("URL is not in the local page store and web access is disabled")
        got = await self.fetcher.fetch(url)
        # Extraction is CPU work in a thread no timeout can stop: its input is capped so it cannot run long,
        # and a slow one is a permanent failure (retrying would start a second thread on the same page).
        body = got.body[:MAX_EXTRACT_HTML_BYTES] if got.content_type in HTML_TYPES else got.body
        try:
            ex = await asyncio.wait_for(asyncio.to_thread(extract, body, got.content_type, got.charset,
                                                          got.final_url), self.timeout_s / 2)
        except TimeoutError:
            raise ToolError(f"text extraction took longer than {self.timeout_s / 2:g}s") from None
        if not ex.text.strip():
            raise ToolError("page has no readable text")
        data = self._page(url, got.final_url, ex.title, ex.text, got.content_type, "web")
        data["body_truncated"] = got.truncated or len(body) < len(got.body)
        return ToolResult(data, meta={"source": "web", "status": got.status, "redirects": got.redirects,
                                      "final_url": got.final_url, "bytes": len(got.body)})

    def _page(self, url: str, final_url: str, title: str, text: str, ctype: str, source: str) -> dict[str, Any]:
        chunks, truncated = chunk_text(text, self.chunk_chars, self.max_chunks)
        return {"url": url, "final_url": final_url, "title": title, "content_type": ctype, "source": source,
                "chunks": chunks, "num_chunks": len(chunks), "truncated": truncated}

    def render(self, data: dict[str, Any], args: dict[str, Any]) -> str:
        n = data["num_chunks"]
        page = args.get("page", 1)
        if n == 0:
            raise ToolError("page has no readable text")
        if page > n:
            raise ToolError(f"page {page} is past the end: this page has {n} chunk(s)")
        lines = [f"Title: {data['title'] or '(untitled)'}", f"URL: {data['final_url']}",
                 f"[Chunk {page} of {n}]", data["chunks"][page - 1]]
        if page < n:
            lines.append(f"[{n - page} more chunk(s): access this URL with page={page + 1} to continue]")
        elif data.get("truncated") or data.get("body_truncated"):
            lines.append("[The page continues beyond what was kept]")
        return "\n".join(lines)

    async def aclose(self) -> None:
        if self.fetcher is not None:
            await self.fetcher.aclose()
