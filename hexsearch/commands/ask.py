"""`hexsearch ask`: Run one agent episode on a question and show the trace."""

from __future__ import annotations

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, not_available


def register(app: typer.Typer) -> None:
    @app.command("ask", help="Run one agent episode on a question and show the trace.")
    def _cmd(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
        not_available("ask", "a later issue fills it")
