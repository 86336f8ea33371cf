"""`build_tools(cfg)`: the agent's `search` and `access` tools from a ToolsConfig.

    tools = build_tools(cfg.tools, world_dir=world)      # {"search": SearchTool, "access": AccessTool}
    obs = await tools["search"]({"query": "veyra lighthouse"})

Search backend `local` loads the index in this process (cfg.index_dir, else the world's default
index); `url` talks to a retrieval service (one shared encoder for many rollout workers); `serper`
calls Google through Serper. Access serves local-world pages (`https://hexwiki.test/wiki/...`) from
the page store and fetches everything else from the web through the URL guard (unless
`web_access` is off). Both tools share one persistent result cache.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from tools.base import BaseTool
from tools.cache import ToolCache
from tools.config import ToolsConfig
from tools.docstore import PageStore
from tools.page_access import AccessTool, PageFetcher
from tools.search import LocalSearch, RetrieveUrlSearch, SearchProvider, SearchTool, SerperSearch
from tools.urlguard import UrlGuard

BACKENDS = ("local", "url", "serper")


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
    if index_dir:
        return Path(index_dir)
    if cfg.index_dir:
        return Path(cfg.index_dir)
    if world_dir:
        from tools.index import default_index

        return default_index(world_dir)
    return None


def make_cache(cfg: ToolsConfig) -> ToolCache | None:
    """The shared result cache of a config (None when disabled)."""
    if not cfg.cache_enabled:
        return None
    return ToolCache(cfg.cache_path or cache_root() / "tools.sqlite", ttl_s=cfg.cache_ttl_s)


def _base_kwargs(cfg: ToolsConfig, cache: ToolCache | None) -> dict[str, Any]:
    return dict(timeout_s=cfg.timeout_s, max_concurrency=cfg.max_concurrency, retries=cfg.retries, cache=cache,
                backoff_initial_s=cfg.backoff_initial_s, backoff_max_s=cfg.backoff_max_s,
                max_retry_after_s=cfg.max_retry_after_s)


def build_access_tool(cfg: ToolsConfig, pages: PageStore | None = None, cache: ToolCache | None = None) -> AccessTool:
    """The `access` tool: `pages` serves local-world URLs; the web goes through the URL guard."""
    if pages is None and cfg.pages_path:
        pages = open_page_store(cfg.pages_path)
    fetcher = None
    if cfg.web_access:
        fetcher = PageFetcher(UrlGuard(cfg.allow_hosts), max_bytes=cfg.max_page_bytes, max_redirects=cfg.max_redirects,
                              content_types=cfg.content_types, read_timeout_s=cfg.timeout_s,
                              max_connections=max(cfg.max_concurrency, 1))
    return AccessTool(pages=pages, fetcher=fetcher, chunk_chars=cfg.page_chunk_chars, max_chunks=cfg.max_page_chunks,
                      **_base_kwargs(cfg, cache))


def build_tools(cfg: ToolsConfig, *, index_dir: str | Path | None = None, world_dir: str | Path | None = None,
                retriever: Any = None) -> dict[str, BaseTool]:
    """The agent's tools: at least `search` and `access` (see the module docstring).

    `retriever` lets callers share one loaded Retriever between tool sets (saves the encoder load).
    """
    if cfg.search_backend not in BACKENDS:
        raise ToolConfigError(f"tools.search_backend: unknown backend '{cfg.search_backend}' "
                              f"(choose from {', '.join(BACKENDS)})")
    if cfg.retrieval_worker not in ("thread", "process"):
        raise ToolConfigError(f"tools.retrieval_worker: must be 'thread' or 'process', got '{cfg.retrieval_worker}'")
    cache = make_cache(cfg)
    index: Path | None = None
    if retriever is None:
        if cfg.search_backend == "local":
            index = resolve_index(cfg, index_dir, world_dir)  # builds the world's index on first use
        elif index_dir or cfg.index_dir:
            index = Path(index_dir or cfg.index_dir)  # only for its page store
    provider: SearchProvider
    if cfg.search_backend == "local":
        if retriever is None and index is None:
            raise ToolConfigError("tools.index_dir is empty and no world was given: build an index with "
                                  "`hexsearch index build` and set tools.index_dir")
        provider = LocalSearch(retriever if retriever is not None else index, worker=cfg.retrieval_worker,
                               max_batch=cfg.retrieval_max_batch, max_wait_ms=cfg.retrieval_max_wait_ms,
                               snippet_chars=cfg.snippet_chars,
                               **({} if retriever is not None else {"threads": cfg.threads,
                                                                    "query_cache_size": cfg.query_cache_size}))
    elif cfg.search_backend == "url":
        if not cfg.retrieval_url:
            raise ToolConfigError("tools.retrieval_url is empty: the `url` backend needs a /retrieve service URL")
        provider = RetrieveUrlSearch(cfg.retrieval_url, timeout_s=cfg.timeout_s, snippet_chars=cfg.snippet_chars,
                                     max_batch=cfg.retrieval_max_batch, max_wait_ms=cfg.retrieval_max_wait_ms)
    else:
        provider = SerperSearch(url=cfg.serper_url, api_key_env=cfg.serper_api_key_env,
                                cost_per_query=cfg.serper_cost_per_query, timeout_s=cfg.timeout_s)

    pages = None
    if not cfg.pages_path:
        if retriever is not None and getattr(retriever, "pages", None) is not None:
            pages = retriever.pages
        elif index is not None and (index / "pages.sqlite").exists():
            pages = PageStore(index / "pages.sqlite")
        elif world_dir is not None and (Path(world_dir) / "pages.jsonl").exists():
            pages = open_page_store(Path(world_dir) / "pages.jsonl")
    return {
        "search": SearchTool(provider, topk=cfg.topk, **_base_kwargs(cfg, cache)),
        "access": build_access_tool(cfg, pages, cache),
    }
