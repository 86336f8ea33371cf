"""`hexsearch train`: Train a search agent with asynchronous RL."""

from __future__ import annotations

import typer

from hexsearch.commands.common import CONFIG_ARG, OVERRIDES_ARG, not_available


def register(app: typer.Typer) -> None:
    @app.command("train", help="Train a search agent with asynchronous RL.")
    def _cmd(config: str = CONFIG_ARG, overrides: list[str] = OVERRIDES_ARG) -> None:
        not_available("train", "a later issue fills it")
