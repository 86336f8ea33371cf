"""`hexsearch serve engine`: OpenAI-compatible server (with vLLM's RL endpoints) over the embedded engine.

OMP_WAIT_POLICY defaults to PASSIVE here (set before torch loads OpenMP): on cores shared with other
processes — a trainer, rollout workers, tests — spinning OpenMP threads made forward passes 4-8x slower
in our measurements, while sleeping ones cost only a few percent on an idle machine.
"""

from __future__ import annotations

import os

import typer

from hexsearch.commands.common import UserError


def register(serve_app: typer.Typer) -> None:
    @serve_app.command("engine", help="OpenAI-compatible server over the embedded engine (vLLM-shaped RL endpoints).")
    def _cmd(
        model: str = typer.Option("smollm2-135m-instruct", "--model", help="Model spec: alias, HF folder or hub id."),
        host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind."),
        port: int = typer.Option(8000, "--port", help="Port to bind (0: any free port; the address is printed)."),
        dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 where fast, else fp32), bfloat16, float32."),
        device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
        max_batch_size: int = typer.Option(64, "--max-batch-size", help="Most sequences decoded together."),
        max_model_len: int = typer.Option(4096, "--max-model-len", help="Longest prompt + output, in tokens."),
        kv_cache_gb: float = typer.Option(2.0, "--kv-cache-gb", help="Memory bound of the running batch's KV."),
        prefix_cache_gb: float = typer.Option(1.0, "--prefix-cache-gb", help="KV kept for sticky request ids."),
        prefill_chunk_tokens: int = typer.Option(1024, "--prefill-chunk-tokens", help="Prompt tokens per prefill pass."),
        threads: int = typer.Option(0, "--threads", help="Torch CPU threads (0: torch's default)."),
        served_model_name: str = typer.Option("", "--served-model-name", help="Model name in the API (default: spec)."),
        log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
        weights_root: str = typer.Option("", "--weights-root", help="Only load weight updates from folders "
                                         "inside this one (default: any folder)."),
    ) -> None:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from serving.engines.embedded import EmbeddedEngine
        from serving.models import ModelNotFound
        from serving.servers.engine_server import serve

        try:
            engine = EmbeddedEngine(model, dtype=dtype, device=device, max_batch_size=max_batch_size,
                                    max_model_len=max_model_len, kv_cache_gb=kv_cache_gb,
                                    prefix_cache_gb=prefix_cache_gb, prefill_chunk_tokens=prefill_chunk_tokens,
                                    threads=threads)
        except (ModelNotFound, ValueError) as e:
            raise UserError(str(e)) from e
        from serving.servers.engine_server import TOKEN_ENV

        try:
            serve(engine, host=host, port=port, model_name=served_model_name or model, log_level=log_level,
                  control_token=os.environ.get(TOKEN_ENV) or None, weights_root=weights_root or None)
        except ValueError as e:
            raise UserError(str(e)) from e
