"""`hexsearch datagen`: Synthesise hard, verified QA with the QA-synthesis agent."""

from __future__ import annotations

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, not_available


def register(app: typer.Typer) -> None:
    @app.command("datagen", help="Synthesise hard, verified QA with the QA-synthesis agent.")
    def _cmd(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
        not_available("datagen", "a later issue fills it")
