"""`hexsearch index build`: encode a corpus into a FAISS index with an on-disk document store."""

from __future__ import annotations

import typer

from hexsearch.commands.common import not_available

index_app = typer.Typer(help="Build local retrieval indexes.", no_args_is_help=True)


@index_app.command("build", help="Encode corpus.jsonl into a FAISS index folder.")
def build() -> None:
    not_available("index build", "the search-tools issue fills it")


def register(app: typer.Typer) -> None:
    app.add_typer(index_app, name="index")
