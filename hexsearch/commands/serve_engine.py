"""`hexsearch serve engine`: OpenAI-compatible server over the embedded engine."""

from __future__ import annotations

import typer

from hexsearch.commands.common import not_available


def register(serve_app: typer.Typer) -> None:
    @serve_app.command("engine", help="OpenAI-compatible server over the embedded engine.")
    def _cmd() -> None:
        not_available("serve engine", "in progress")
