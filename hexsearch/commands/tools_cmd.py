"""`hexsearch tools search|access|list|call`: call the agent's tools by hand.

`list` and `call` work on the tools a config gives the agent (built-ins, components, MCP servers' tools),
opened and closed the way a rollout worker does (`tools.factory.open_toolset`).
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, UserError, config_from_cli

tools_app = typer.Typer(help="List and call the agent's tools (search, page access, MCP tools) from the shell.", no_args_is_help=True)

NO_CACHE = typer.Option(False, "--no-cache", help="Do not read or write the tool result cache.")
AS_JSON = typer.Option(False, "--json", help="Print the structured result as JSON.")


def _call(tools: dict, name: str, args: dict, as_json: bool) -> None:
    from core.progress import console

    async def go():
        try:
            return await tools[name](args)
        finally:
            for tool in tools.values():
                await tool.aclose()

    obs = asyncio.run(go())
    if obs.error:
        raise UserError(f"{name} failed: {obs.error}", exit_code=1)
    typer.echo(json.dumps(obs.data, indent=2, ensure_ascii=False) if as_json else obs.text)
    console().print(f"[dim]{name}: {obs.latency_s:.2f}s, cost ${obs.cost:.4f}{', cached' if obs.cached else ''}[/dim]")


def _default_world():
    """The default offline world folder (generated on first use, like `hexsearch ask` does)."""
    from hexsearch.config import load_config
    from world import resolve_world

    return resolve_world(load_config().world)


def _build(cfg, **kw) -> dict:
    from tools.factory import ToolConfigError, build_tools
    from tools.index import IndexFolderError

    try:
        return build_tools(cfg, **kw)
    except (ToolConfigError, IndexFolderError) as e:
        raise UserError(str(e)) from e


@tools_app.command("search", help="Search with a configured backend.")
def search(
    query: str = typer.Argument(..., help="The search query."),
    backend: str = typer.Option("local", "--backend", help="local (index folder), url (a /retrieve service) or serper."),
    topk: int = typer.Option(5, "--topk", help="Results to return."),
    index: str = typer.Option("", "--index", help="Index folder for the local backend."),
    world: str = typer.Option("", "--world", help="World folder whose index to use (built if needed). Default: the default world."),
    url: str = typer.Option("", "--url", help="Retrieval service base URL for the url backend."),
    no_cache: bool = NO_CACHE,
    as_json: bool = AS_JSON,
) -> None:
    from core.progress import console
    from tools.config import ToolsConfig

    if backend == "local" and not index and not world:
        world = str(_default_world())
        console().print(f"[dim]searching the default world's index ({world}); --index DIR picks another[/dim]")
    cfg = ToolsConfig(search_backend=backend, index_dir=index, retrieval_url=url, topk=topk, cache_enabled=not no_cache)
    _call(_build(cfg, world_dir=world or None), "search", {"query": query, "topk": topk}, as_json)


@tools_app.command("access", help="Fetch a page safely and print its chunks.")
def access(
    url: str = typer.Argument(..., help="Page URL (http/https); hexwiki.test URLs come from the default world unless --index/--pages."),
    page: int = typer.Option(1, "--page", help="Chunk number to print (1-based)."),
    allow_host: list[str] = typer.Option([], "--allow-host", help="Host or CIDR to allow even if private (repeatable)."),
    index: str = typer.Option("", "--index", help="Index folder whose page store serves local world URLs."),
    pages: str = typer.Option("", "--pages", help="pages.jsonl / pages.sqlite serving local world URLs."),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds per attempt."),
    retries: int = typer.Option(2, "--retries", help="Retries on transient errors."),
    no_cache: bool = NO_CACHE,
    as_json: bool = AS_JSON,
) -> None:
    from pathlib import Path

    from tools.config import ToolsConfig
    from tools.factory import ToolConfigError, build_access_tool, make_cache

    if not pages and index and (Path(index) / "pages.sqlite").exists():
        pages = str(Path(index) / "pages.sqlite")
    if not pages and not index and urlsplit(url).hostname == "hexwiki.test":
        pages = str(_default_world() / "pages.jsonl")  # the offline world's pages
    cfg = ToolsConfig(allow_hosts=list(allow_host), timeout_s=timeout, retries=retries, cache_enabled=not no_cache,
                      pages_path=pages)
    try:
        tool = build_access_tool(cfg, cache=make_cache(cfg))
    except ToolConfigError as e:
        raise UserError(str(e)) from e
    _call({"access": tool}, "access", {"url": url, "page": page}, as_json)


async def _open_configured(cfg):
    """The toolset of a loaded HexConfig (built-ins, components, MCP servers' tools); one-line errors."""
    from tools.factory import ToolConfigError, open_toolset
    from tools.index import IndexFolderError
    from tools.mcp import MCPError
    from world import tools_world

    try:
        return await open_toolset(cfg.tools, world_dir=tools_world(cfg))  # index built on first use
    except (ToolConfigError, IndexFolderError, MCPError) as e:
        raise UserError(str(e)) from None


@tools_app.command("list", help="List every configured tool (built-ins, components, MCP servers' tools) and its schema.")
def list_tools(
    config: str | None = CONFIG_ARG,
    overrides: list[str] | None = OVERRIDES_ARG,
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of the tools' function schemas."),
) -> None:
    cfg = config_from_cli(config, overrides)

    async def go():
        toolset = await _open_configured(cfg)
        try:
            return [(name, toolset.sources.get(name, ""), tool.schema) for name, tool in toolset.items()]
        finally:
            await toolset.aclose()

    rows = asyncio.run(go())
    if as_json:
        typer.echo(json.dumps([schema for _, _, schema in rows], indent=2, ensure_ascii=False))
        return
    if not rows:
        typer.echo("no tools configured (tools.builtin, tools.components, tools.mcp_servers)")
    for name, source, schema in rows:
        fn = schema.get("function", {})
        typer.echo(f"{name}  [{source}]")
        typer.echo(f"  {' '.join(str(fn.get('description', '')).split())}")
        typer.echo(f"  parameters: {json.dumps(fn.get('parameters', {}), ensure_ascii=False)}")


@tools_app.command("call", help="Call one configured tool with JSON arguments and print its observation.")
def call_tool(
    name: str = typer.Argument(..., help="Tool name (see `hexsearch tools list`)."),
    args_json: str = typer.Argument(..., metavar="JSON_ARGS", help="""Arguments as a JSON object, e.g. '{"query": "x"}'."""),
    config: str | None = CONFIG_ARG,
    overrides: list[str] | None = OVERRIDES_ARG,
    as_json: bool = typer.Option(False, "--json", help="Print the structured result as JSON."),
) -> None:
    from core.progress import console

    try:
        args = json.loads(args_json)
    except json.JSONDecodeError as e:
        raise UserError(f"JSON_ARGS is not valid JSON: {e}") from None
    if not isinstance(args, dict):
        raise UserError(f"JSON_ARGS must be a JSON object, got {type(args).__name__}")
    cfg = config_from_cli(config, overrides)

    async def go():
        toolset = await _open_configured(cfg)
        try:
            if name not in toolset:
                valid = ", ".join(sorted(toolset)) or "none"
                raise UserError(f"unknown tool '{name}' (configured tools: {valid})")
            return await toolset[name](args)
        finally:
            await toolset.aclose()

    obs = asyncio.run(go())
    if obs.error:
        raise UserError(f"{name} failed: {obs.error}", exit_code=1)
    typer.echo(json.dumps(obs.data, indent=2, ensure_ascii=False, default=str) if as_json else obs.text)
    console().print(f"[dim]{name}: {obs.latency_s:.2f}s, cost ${obs.cost:.4f}{', cached' if obs.cached else ''}[/dim]")


def register(app: typer.Typer) -> None:
    app.add_typer(tools_app, name="tools")
