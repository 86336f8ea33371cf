"""`hexsearch eval`: Evaluate an agent on benchmark suites."""

from __future__ import annotations

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, not_available


def register(app: typer.Typer) -> None:
    @app.command("eval", help="Evaluate an agent on benchmark suites.")
    def _cmd(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
        not_available("eval", "a later issue fills it")
