"""`hexsearch serve retrieval`: Batched local retrieval service (Search-R1 wire format)."""

from __future__ import annotations

import typer

from hexsearch.commands.common import UserError


def register(serve_app: typer.Typer) -> None:
    @serve_app.command("retrieval", help="Batched local retrieval service (Search-R1 wire format).")
    def _cmd(
        index: str = typer.Option(..., "--index", help="Index folder from `hexsearch index build`."),
        port: int = typer.Option(8000, "--port", help="TCP port (0: any free port; see --addr-file)."),
        host: str = typer.Option("127.0.0.1", "--host", help="Bind address (0.0.0.0 exposes it to the network)."),
        topk: int = typer.Option(3, "--topk", help="Results per query when a request omits topk."),
        max_batch: int = typer.Option(64, "--max-batch", help="Most queries encoded together."),
        max_wait_ms: float = typer.Option(2.0, "--max-wait-ms", help="How long a batch waits for more queries."),
        threads: int = typer.Option(0, "--threads", help="Torch/FAISS threads (0: library default)."),
        query_cache: int = typer.Option(10_000, "--query-cache", help="Query embeddings kept in the LRU cache."),
        encoder_dtype: str = typer.Option("float32", "--encoder-dtype",
                                          help="float32, bfloat16 (the CPU's half precision: ~1.7x the queries/s "
                                               "on AVX512_BF16/AMX CPUs, top-k may differ from fp32 on near ties) "
                                               "or auto (bfloat16 where fast)."),
        addr_file: str = typer.Option("", "--addr-file", help="Write host:port here once listening."),
        worker: str = typer.Option("process", "--worker", help="process (encoder in its own process) or thread."),
        workers: int = typer.Option(0, "--workers", help="Encoder processes, one batch in flight each "
                                                           "(0: one per core, at most 4)."),
    ) -> None:
        from core.progress import console
        from serving.servers.retrieval_server import run_retrieval_server
        from tools.encoder import EncoderError
        from tools.index import IndexFolderError

        def ready(h: str, p: int, meta: dict) -> None:
            console().print(f"retrieval service on http://{h}:{p} ({meta['count']} passages, "
                            f"encoder {meta['encoder']['spec']})")

        try:
            run_retrieval_server(index, host=host, port=port, default_topk=topk, max_batch=max_batch,
                                 max_wait_ms=max_wait_ms, threads=threads, query_cache_size=query_cache, worker=worker,
                                 workers=workers, encoder_dtype=encoder_dtype,
                                 addr_file=addr_file or None, on_ready=ready)
        except (IndexFolderError, EncoderError) as e:
            raise UserError(str(e)) from e
        except OSError as e:
            raise UserError(f"cannot serve on {host}:{port}: {e.strerror or e}") from e
