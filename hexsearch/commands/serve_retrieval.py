"""`hexsearch serve retrieval`: Batched local retrieval service (Search-R1 wire format)."""

from __future__ import annotations

import typer

from hexsearch.commands.common import not_available


def register(serve_app: typer.Typer) -> None:
    @serve_app.command("retrieval", help="Batched local retrieval service (Search-R1 wire format).")
    def _cmd() -> None:
        not_available("serve retrieval", "in progress")
