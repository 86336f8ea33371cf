"""`hexsearch plan`: Plan GPU placement for a heterogeneous cluster."""

from __future__ import annotations

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, not_available


def register(app: typer.Typer) -> None:
    @app.command("plan", help="Plan GPU placement for a heterogeneous cluster.")
    def _cmd(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
        not_available("plan", "a later issue fills it")
