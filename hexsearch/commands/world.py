"""`hexsearch world generate`: the offline fictional encyclopedia with multi-hop QA."""

from __future__ import annotations

import typer

from hexsearch.commands.common import not_available

world_app = typer.Typer(help="Generate the offline world (corpus, pages, multi-hop QA).", no_args_is_help=True)


@world_app.command("generate", help="Write corpus.jsonl, pages.jsonl and qa_{train,dev,test}.jsonl.")
def generate() -> None:
    not_available("world generate", "in progress")


def register(app: typer.Typer) -> None:
    app.add_typer(world_app, name="world")
