"""The agent's tools from a ToolsConfig: built-ins, user components and MCP servers' tools.

    tools = build_tools(cfg.tools, world_dir=world)      # {"search": SearchTool, "access": AccessTool, ...}
    obs = await tools["search"]({"query": "veyra lighthouse"})
    toolset = await open_toolset(cfg.tools)               # the same plus every MCP server's tools
    ...
    await toolset.aclose()

`tools.builtin` picks the built-ins (the BUILTIN_TOOLS registry of tools/builtin.py: `search`, `access`,
or a builder by import path); `tools.components` adds user tools by import path, each wrapped so
that it gets the built-in guarantees (ComponentTool); `open_toolset` also connects to every
`tools.mcp_servers` entry (tools/mcp.py). Names must be unique. All tools share one result cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.choices import check_choices
from core.ranges import check_ranges
from core.registry import import_object
from tools.base import BaseTool, ToolError, ToolResult
from tools.builtin import BuildContext, ToolConfigError, base_kwargs, build_builtins, cache_root
from tools.builtin import build_access_tool as build_access_tool  # re-exported: callers build `access` alone
from tools.cache import ToolCache
from tools.config import ToolsConfig
from tools.protocol import Observation, Tool, check_tool_name


def make_cache(cfg: ToolsConfig) -> ToolCache | None:
    """The shared result cache of a config (None when disabled)."""
    if not cfg.cache_enabled:
        return None
    return ToolCache(cfg.cache_path or cache_root() / "tools.sqlite", ttl_s=cfg.cache_ttl_s)


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
        check_ranges(cfg, "tools")
    except ValueError as e:
        raise ToolConfigError(str(e)) from None
    cache = make_cache(cfg)
    tools: dict[str, BaseTool] = {}
    out: list[tuple[BaseTool, str]] = []
    for tool in build_builtins(BuildContext(cfg, cache, index_dir, world_dir, retriever)):
        _add(tools, tool, "tools.builtin")
        out.append((tool, "builtin"))
    for spec in cfg.components:
        tool = build_component(spec, cfg, cache)
        _add(tools, tool, "tools.components")
        out.append((tool, f"component {spec['_component_']}"))
    return out


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
            tool: Any = factory(**{**base_kwargs(cfg, cache), **kwargs})
        else:
            tool = factory(**kwargs)
    except TypeError as e:
        raise ToolConfigError(f"tools.components: cannot build {spec['_component_']}: {e}") from e
    if not isinstance(tool, Tool) or not isinstance(getattr(tool, "schema", None), dict):
        raise ToolConfigError(f"tools.components: {spec['_component_']} built a {type(tool).__name__}, which lacks "
                              "the Tool protocol (name, schema, async __call__(args) -> Observation)")
    return tool if isinstance(tool, BaseTool) else ComponentTool(tool, **base_kwargs(cfg, None))


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

            conn, mcp_tools = await open_mcp_tools(server, base_kwargs(cfg, None))
            toolset._connections.append(conn)
            for tool in mcp_tools:
                _add(toolset, tool, f"tools.mcp_servers[{server.name}]")
                toolset.sources[tool.name] = f"mcp {server.name}"
    except BaseException:
        await toolset.aclose()
        raise
    return toolset
