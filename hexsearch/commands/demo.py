"""`hexsearch demo`: the most complete main job that exists, on the embedded CPU default (`make demo`)."""

from __future__ import annotations

import typer

from hexsearch.commands.common import not_available


def register(app: typer.Typer) -> None:
    @app.command("demo", help="Run the quickstart main job (what `make demo` runs).")
    def _demo() -> None:
        not_available("demo", "in progress")
