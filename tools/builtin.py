"""The built-in tools (`search`, `access`) and the BUILTIN_TOOLS registry that `tools.builtin` names.

    @BUILTIN_TOOLS.register("search")
    def search_tool(ctx: BuildContext) -> BaseTool: ...

A built-in is a builder `fn(ctx) -> BaseTool` that gets the tools config, the shared result cache and the
index, world and retriever the caller has (BuildContext); a user registers one the same way or names a
builder by `pkg.mod:fn` in `tools.builtin`. Built-ins are built in registration order (search before
access: access reads its pages from the index that search resolved), user builders after, in config order.

Search backend `local` loads the index in this process (cfg.index_dir, else the world's default
index); `url` talks to a retrieval service (one shared encoder for many rollout workers); `serper`
calls Google through Serper. Access serves local-world pages (`https://hexwiki.test/wiki/...`) from
the page store and fetches everything else from the web through the URL guard (unless
`web_access` is off). Both tools share one persistent result cache.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.registry import ComponentError, Registry
from tools.base import BaseTool
from tools.cache import ToolCache
from tools.config import ToolsConfig
from tools.docstore import PageStore
from tools.page_access import AccessTool, PageFetcher
from tools.search import LocalSearch, RetrieveUrlSearch, SearchProvider, SearchTool, SerperSearch
from tools.urlguard import UrlGuard

BUILTIN_TOOLS = Registry("built-in tool", "tools.builtin")
"""Built-in tool builders by name (`tools.builtin`)."""


class ToolConfigError(ValueError):
    """A tools config that cannot produce working tools; one line naming the key to fix."""


def cache_root() -> Path:
    """hexsearch's cache folder (same rule as serving.models.cache_dir; tools does not import serving)."""
    return Path(os.environ.get("HEXSEARCH_CACHE") or Path.home() / ".cache" / "hexsearch")


def open_page_store(path: str | Path) -> PageStore:
    """A PageStore from pages.sqlite, or from pages.jsonl (converted once into the cache folder)."""
    p = Path(path)
    if not p.is_file():
        raise ToolConfigError(f"tools.pages_path: {p} does not exist")
    if p.suffix in (".sqlite", ".db"):
        return PageStore(p)
    st = p.stat()
    tag = hashlib.sha256(f"{p.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_root() / "pagestores" / f"{tag}.sqlite"
    if out.exists():
        return PageStore(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return PageStore.build(p, out)


def resolve_index(cfg: ToolsConfig, index_dir: str | Path | None, world_dir: str | Path | None) -> Path | None:
    """The local index folder: the one given, else `tools.index_dir`, else the world's (built on first use)."""
    if index_dir:
        return Path(index_dir)
    if cfg.index_dir:
        return Path(cfg.index_dir)
    if world_dir:
        from tools.index import default_index

        return default_index(world_dir)
    return None


def base_kwargs(cfg: ToolsConfig, cache: ToolCache | None) -> dict[str, Any]:
    """BaseTool's keyword arguments from the config: timeout, concurrency, retries and backoff, cache."""
    return dict(timeout_s=cfg.timeout_s, max_concurrency=cfg.max_concurrency, retries=cfg.retries, cache=cache,
                backoff_initial_s=cfg.backoff_initial_s, backoff_max_s=cfg.backoff_max_s,
                max_retry_after_s=cfg.max_retry_after_s)


@dataclass
class BuildContext:
    """What a built-in tool's builder gets: the config and what the caller already has loaded."""

    cfg: ToolsConfig
    cache: ToolCache | None = None
    """The shared result cache (None: disabled)."""
    index_dir: str | Path | None = None
    """An index folder the caller names (wins over `tools.index_dir`)."""
    world_dir: str | Path | None = None
    """The offline world's folder (its default index and pages), if any."""
    retriever: Any = None
    """A loaded Retriever to share between tool sets (saves the encoder load)."""
    index: Path | None = None
    """The index folder resolved so far (set by `search_index`)."""

    def search_index(self) -> Path | None:
        """The local search index (resolved once; the world's is built on first use)."""
        if self.index is None and self.retriever is None:
            self.index = resolve_index(self.cfg, self.index_dir, self.world_dir)
        return self.index

    def known_index(self) -> Path | None:
        """An index folder that exists without building one: the one search resolved, else the one named."""
        if self.index is None and self.retriever is None and (self.index_dir or self.cfg.index_dir):
            self.index = Path(self.index_dir or self.cfg.index_dir)
        return self.index

    def base_kwargs(self) -> dict[str, Any]:
        return base_kwargs(self.cfg, self.cache)


def build_builtins(ctx: BuildContext) -> list[BaseTool]:
    """The tools `ctx.cfg.builtin` names: registered ones in registration order, then import paths in config
    order (ToolConfigError naming the valid names for an unknown one)."""
    wanted = list(dict.fromkeys(ctx.cfg.builtin))
    names = BUILTIN_TOOLS.names()
    try:  # every name checked before anything is built
        builders = [BUILTIN_TOOLS.resolve(spec) for spec in [n for n in names if n in wanted] +
                    [s for s in wanted if s not in names]]
    except ComponentError as e:
        raise ToolConfigError(str(e)) from None
    return [build(ctx) for build in builders]


@BUILTIN_TOOLS.register("search")
def search_tool(ctx: BuildContext) -> BaseTool:
    """Web search through the configured backend (`tools.search_backend`)."""
    cfg = ctx.cfg
    return SearchTool(_search_provider(ctx), topk=cfg.topk, show_urls=cfg.search_show_urls, **ctx.base_kwargs())


@BUILTIN_TOOLS.register("access")
def access_tool(ctx: BuildContext) -> BaseTool:
    """Page access: local-world pages from the retriever's, the index's or the world's page store."""
    pages = None
    if not ctx.cfg.pages_path:
        index = ctx.known_index()
        if ctx.retriever is not None and getattr(ctx.retriever, "pages", None) is not None:
            pages = ctx.retriever.pages
        elif index is not None and (index / "pages.sqlite").exists():
            pages = PageStore(index / "pages.sqlite")
        elif ctx.world_dir is not None and (Path(ctx.world_dir) / "pages.jsonl").exists():
            pages = open_page_store(Path(ctx.world_dir) / "pages.jsonl")
    return build_access_tool(ctx.cfg, pages, ctx.cache)


def build_access_tool(cfg: ToolsConfig, pages: PageStore | None = None, cache: ToolCache | None = None) -> AccessTool:
    """The `access` tool: `pages` serves local-world URLs; the web goes through the URL guard."""
    if pages is None and cfg.pages_path:
        pages = open_page_store(cfg.pages_path)
    fetcher = None
    if cfg.web_access:
        fetcher = PageFetcher(UrlGuard(cfg.allow_hosts, ports=cfg.allow_ports), max_bytes=cfg.max_page_bytes,
                              max_redirects=cfg.max_redirects, content_types=cfg.content_types,
                              read_timeout_s=cfg.timeout_s, max_connections=max(cfg.max_concurrency, 1))
    return AccessTool(pages=pages, fetcher=fetcher, chunk_chars=cfg.page_chunk_chars, max_chunks=cfg.max_page_chunks,
                      **base_kwargs(cfg, cache))


def _search_provider(ctx: BuildContext) -> SearchProvider:
    cfg, retriever = ctx.cfg, ctx.retriever
    if cfg.search_backend == "local":
        index = ctx.search_index()
        if retriever is None and index is None:
            raise ToolConfigError("tools.index_dir is empty and no world was given: build an index with "
                                  "`hexsearch index build` and set tools.index_dir")
        return LocalSearch(retriever if retriever is not None else index, worker=cfg.retrieval_worker,
                           max_batch=cfg.retrieval_max_batch, max_wait_ms=cfg.retrieval_max_wait_ms,
                           snippet_chars=cfg.snippet_chars,
                           **({} if retriever is not None else {"threads": cfg.threads,
                                                                "query_cache_size": cfg.query_cache_size}))
    if cfg.search_backend == "url":
        if not cfg.retrieval_url:
            raise ToolConfigError("tools.retrieval_url is empty: the `url` backend needs a /retrieve service URL")
        return RetrieveUrlSearch(cfg.retrieval_url, timeout_s=cfg.timeout_s, snippet_chars=cfg.snippet_chars,
                                 max_batch=cfg.retrieval_max_batch, max_wait_ms=cfg.retrieval_max_wait_ms)
    return SerperSearch(url=cfg.serper_url, api_key_env=cfg.serper_api_key_env,
                        cost_per_query=cfg.serper_cost_per_query, timeout_s=cfg.timeout_s)
