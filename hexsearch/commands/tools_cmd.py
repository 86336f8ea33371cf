"""`hexsearch tools search|access`: call the agent's tools by hand."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import typer

from hexsearch.commands.common import UserError

tools_app = typer.Typer(help="Call search and page-access tools from the shell.", no_args_is_help=True)

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
    from datagen.world import resolve_world
    from hexsearch.config import load_config

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


def register(app: typer.Typer) -> None:
    app.add_typer(tools_app, name="tools")
