"""The agent's tools from a ToolsConfig: built-ins, user components and MCP servers' tools.

    tools = build_tools(cfg.tools, world_dir=world)      # {"search": SearchTool, "access": AccessTool, ...}
    obs = await tools["search"]({"query": "veyra lighthouse"})
    toolset = await open_toolset(cfg.tools)               # the same plus every MCP server's tools
    ...
    await toolset.aclose()

`tools.builtin` picks the built-ins (`search`, `access`); `tools.components` adds user tools by
import path, each wrapped so that it gets the built-in guarantees (ComponentTool); `open_toolset`
also connects to every `tools.mcp_servers` entry (tools/mcp.py). Names must be unique.

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
from typing import Any, get_args

from core.choices import check_choices
from core.registry import import_object
from tools.base import BaseTool, ToolError, ToolResult
from tools.cache import ToolCache
from tools.config import BuiltinTool, SearchBackend, ToolsConfig
from tools.docstore import PageStore
from tools.page_access import AccessTool, PageFetcher
from tools.protocol import Observation, Tool, check_tool_name
from tools.search import LocalSearch, RetrieveUrlSearch, SearchProvider, SearchTool, SerperSearch
from tools.urlguard import UrlGuard

BACKENDS: tuple[str, ...] = get_args(SearchBackend)
BUILTIN_TOOLS: tuple[str, ...] = get_args(BuiltinTool)


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
        fetcher = PageFetcher(UrlGuard(cfg.allow_hosts, ports=cfg.allow_ports), max_bytes=cfg.max_page_bytes, max_redirects=cfg.max_redirects,
                              content_types=cfg.content_types, read_timeout_s=cfg.timeout_s,
                              max_connections=max(cfg.max_concurrency, 1))
    return AccessTool(pages=pages, fetcher=fetcher, chunk_chars=cfg.page_chunk_chars, max_chunks=cfg.max_page_chunks,
                      **_base_kwargs(cfg, cache))


def build_tools(cfg: ToolsConfig, *, index_dir: str | Path | None = None, world_dir: str | Path | None = None,
                retriever: Any = None) -> dict[str, BaseTool]:
    """The built-in tools of `cfg.builtin` and the user `components` (see the module docstring).

    `retriever` lets callers share one loaded Retriever between tool sets (saves the encoder load).
    """
    return {tool.name: tool for tool, _ in _static_tools(cfg, index_dir, world_dir, retriever)}


def _static_tools(cfg: ToolsConfig, index_dir: str | Path | None, world_dir: str | Path | None,
                  retriever: Any) -> list[tuple[BaseTool, str]]:
    """(tool, where it comes from) for the built-ins and the components, names checked and unique."""
    try:
        check_choices(cfg, "tools")
    except ValueError as e:
        raise ToolConfigError(str(e)) from None
    cache = make_cache(cfg)
    tools: dict[str, BaseTool] = {}
    out: list[tuple[BaseTool, str]] = []
    if "search" in cfg.builtin or "access" in cfg.builtin:
        for tool in _builtin_tools(cfg, cache, index_dir, world_dir, retriever).values():
            tools[tool.name] = tool
            out.append((tool, "builtin"))
    for spec in cfg.components:
        tool = build_component(spec, cfg, cache)
        _add(tools, tool, "tools.components")
        out.append((tool, f"component {spec['_component_']}"))
    return out


def _builtin_tools(cfg: ToolsConfig, cache: ToolCache | None, index_dir: str | Path | None,
                   world_dir: str | Path | None, retriever: Any) -> dict[str, BaseTool]:
    want_search = "search" in cfg.builtin
    index: Path | None = None
    if retriever is None:
        if cfg.search_backend == "local" and want_search:
            index = resolve_index(cfg, index_dir, world_dir)  # builds the world's index on first use
        elif index_dir or cfg.index_dir:
            index = Path(index_dir or cfg.index_dir)  # only for its page store
    out: dict[str, BaseTool] = {}
    if want_search:
        out["search"] = SearchTool(_search_provider(cfg, index, retriever), topk=cfg.topk, show_urls=cfg.search_show_urls,
                                   **_base_kwargs(cfg, cache))
    if "access" in cfg.builtin:
        pages = None
        if not cfg.pages_path:
            if retriever is not None and getattr(retriever, "pages", None) is not None:
                pages = retriever.pages
            elif index is not None and (index / "pages.sqlite").exists():
                pages = PageStore(index / "pages.sqlite")
            elif world_dir is not None and (Path(world_dir) / "pages.jsonl").exists():
                pages = open_page_store(Path(world_dir) / "pages.jsonl")
        out["access"] = build_access_tool(cfg, pages, cache)
    return out


def _search_provider(cfg: ToolsConfig, index: Path | None, retriever: Any) -> SearchProvider:
    if cfg.search_backend == "local":
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


class ComponentTool(BaseTool):
    """A user tool (the Tool protocol) with BaseTool's guarantees: timeout, concurrency limit, retries on
    `TransientError`, latency and cost accounting, errors as observations. Its results are cached only when
    the component says so (`cacheable = True`): user tools may have side effects."""

    def __init__(self, inner: Tool, **base: Any):
        super().__init__(**base)
        self.inner = inner
        self.name = inner.name
        fn = (inner.schema or {}).get("function") or {}
        self.description = fn.get("description", "")
        self.parameters = fn.get("parameters") or {"type": "object", "properties": {}}
        self._cacheable = bool(getattr(inner, "cacheable", False))

    @property
    def schema(self) -> dict[str, Any]:
        return self.inner.schema

    def cache_namespace(self) -> str:
        return f"component:{type(self.inner).__module__}.{type(self.inner).__qualname__}:{self.name}"

    def cache_args(self, args: dict[str, Any]) -> dict[str, Any] | None:
        return args if self._cacheable else None

    async def run(self, args: dict[str, Any]) -> ToolResult:
        obs = await self.inner(args)
        if not isinstance(obs, Observation):
            raise ToolError(f"{self.name} returned {type(obs).__name__}, not an Observation")
        if obs.error:
            raise ToolError(obs.error if not obs.text else obs.text)
        return ToolResult(data={"text": obs.text, "data": obs.data}, cost=obs.cost, meta=dict(obs.meta))

    def render(self, data: Any, args: dict[str, Any]) -> str:
        return str(data.get("text", "")) if isinstance(data, dict) else str(data)

    async def __call__(self, args: dict[str, Any]) -> Observation:
        obs = await super().__call__(args)
        if obs.ok and isinstance(obs.data, dict) and "text" in obs.data:
            obs.data = obs.data.get("data")  # the component's own structured result
        return obs

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


def build_component(spec: dict[str, Any], cfg: ToolsConfig, cache: ToolCache | None = None) -> BaseTool:
    """A tool from `{_component_: "pkg.mod:Class", **kwargs}`: `Class(**kwargs)`; a BaseTool subclass also gets
    the configured timeout/retry/cache settings as defaults, any other Tool is wrapped in a ComponentTool."""
    if not isinstance(spec, dict) or not isinstance(spec.get("_component_"), str):
        raise ToolConfigError(f"tools.components: each entry needs `_component_: package.module:Class`, got {spec!r}")
    kwargs = {k: v for k, v in spec.items() if k != "_component_"}
    factory = import_object(spec["_component_"], "tool", "tools.components")
    try:
        if isinstance(factory, type) and issubclass(factory, BaseTool):
            tool: Any = factory(**{**_base_kwargs(cfg, cache), **kwargs})
        else:
            tool = factory(**kwargs)
    except TypeError as e:
        raise ToolConfigError(f"tools.components: cannot build {spec['_component_']}: {e}") from e
    if not isinstance(tool, Tool) or not isinstance(getattr(tool, "schema", None), dict):
        raise ToolConfigError(f"tools.components: {spec['_component_']} built a {type(tool).__name__}, which lacks "
                              "the Tool protocol (name, schema, async __call__(args) -> Observation)")
    return tool if isinstance(tool, BaseTool) else ComponentTool(tool, **_base_kwargs(cfg, None))


def _add(tools: dict[str, Any], tool: Any, where: str) -> None:
    try:
        check_tool_name(tool.name)
    except ValueError as e:
        raise ToolConfigError(f"{where}: {e}") from e
    if tool.name in tools:
        raise ToolConfigError(f"{where}: a tool named '{tool.name}' already exists; rename one (MCP servers: `prefix`)")
    tools[tool.name] = tool


class Toolset(dict):
    """name -> tool for every configured tool, plus what must be closed with them (MCP connections)."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: dict[str, str] = {}
        """name -> where the tool comes from (`builtin`, `component pkg.mod:Class`, `mcp <server>`)."""
        self._connections: list[Any] = []

    async def aclose(self) -> None:
        for tool in self.values():
            close = getattr(tool, "aclose", None)
            if close is not None:
                await close()
        for conn in self._connections:
            await conn.aclose()
        self._connections.clear()


async def open_toolset(cfg: ToolsConfig, *, index_dir: str | Path | None = None, world_dir: str | Path | None = None,
                       retriever: Any = None) -> Toolset:
    """Every configured tool: `build_tools` plus the tools of each `cfg.mcp_servers` entry (connected now)."""
    toolset = Toolset()
    for tool, source in _static_tools(cfg, index_dir, world_dir, retriever):
        toolset[tool.name] = tool
        toolset.sources[tool.name] = source
    try:
        for server in cfg.mcp_servers:
            from tools.mcp import open_mcp_tools

            conn, mcp_tools = await open_mcp_tools(server, _base_kwargs(cfg, None))
            toolset._connections.append(conn)
            for tool in mcp_tools:
                _add(toolset, tool, f"tools.mcp_servers[{server.name}]")
                toolset.sources[tool.name] = f"mcp {server.name}"
    except BaseException:
        await toolset.aclose()
        raise
    return toolset
