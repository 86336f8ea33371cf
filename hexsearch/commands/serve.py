"""`hexsearch serve engine|retrieval|vllm`: long-running HTTP services.

Each service's command lives in its own module (serve_engine.py, serve_retrieval.py, serve_vllm.py).
"""

from __future__ import annotations

import typer

from hexsearch.commands import serve_engine, serve_retrieval, serve_vllm

serve_app = typer.Typer(help="Run an inference engine or the retrieval service over HTTP.", no_args_is_help=True)
for module in (serve_engine, serve_retrieval, serve_vllm):
    module.register(serve_app)


def register(app: typer.Typer) -> None:
    app.add_typer(serve_app, name="serve")
