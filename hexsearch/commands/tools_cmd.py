"""`hexsearch tools search|access`: call the agent's tools by hand."""

from __future__ import annotations

import typer

from hexsearch.commands.common import not_available

tools_app = typer.Typer(help="Call search and page-access tools from the shell.", no_args_is_help=True)


@tools_app.command("search", help="Search with a configured backend.")
def search() -> None:
    not_available("tools search", "the search-tools issue fills it")


@tools_app.command("access", help="Fetch a page safely and print its chunks.")
def access() -> None:
    not_available("tools access", "the search-tools issue fills it")


def register(app: typer.Typer) -> None:
    app.add_typer(tools_app, name="tools")
