"""`hexsearch index build`: encode a corpus into a FAISS index with an on-disk document store."""

from __future__ import annotations

import typer

from hexsearch.commands.common import UserError

index_app = typer.Typer(help="Build local retrieval indexes.", no_args_is_help=True)


@index_app.command("build", help="Encode corpus.jsonl into a FAISS index folder.")
def build(
    corpus: str = typer.Option(..., "--corpus", help="Corpus JSONL: one {\"id\", \"title\", \"url\", \"contents\"} per line."),
    out: str = typer.Option(..., "--out", help="Index folder to create (written atomically)."),
    encoder: str = typer.Option("minilm", "--encoder", help="`minilm` (packaged), a sentence-transformers/HF folder, or a hub id."),
    index: str = typer.Option("flat", "--index", help="flat (exact), hnsw (graph) or ivf (clustered)."),
    pages: str = typer.Option("", "--pages", help="pages.jsonl for /access. Default: pages.jsonl next to the corpus, if any."),
    batch_size: int = typer.Option(64, "--batch-size", help="Passages encoded per forward pass."),
    query_prefix: str = typer.Option(None, "--query-prefix", help="Prefix added to queries (e5: 'query: ')."),
    passage_prefix: str = typer.Option(None, "--passage-prefix", help="Prefix added to passages (e5: 'passage: ')."),
    max_length: int = typer.Option(None, "--max-length", help="Truncate texts to this many tokens (default: the encoder's)."),
    pooling: str = typer.Option(None, "--pooling", help="mean or cls (default: the encoder folder's setting)."),
    hnsw_m: int = typer.Option(32, "--hnsw-m", help="HNSW graph degree."),
    ivf_nlist: int = typer.Option(0, "--ivf-nlist", help="IVF cluster count (0: about 4*sqrt(N))."),
    threads: int = typer.Option(0, "--threads", help="Torch/FAISS threads (0: library default)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing index folder."),
) -> None:
    from core.progress import console
    from tools.docstore import CorpusError
    from tools.encoder import EncoderError
    from tools.index import IndexFolderError, build_index, read_meta

    try:
        path = build_index(corpus, out, encoder=encoder, index_type=index, batch_size=batch_size, pages=pages or None,
                           overwrite=overwrite, query_prefix=query_prefix, passage_prefix=passage_prefix,
                           max_length=max_length, pooling=pooling, hnsw_m=hnsw_m, ivf_nlist=ivf_nlist, threads=threads)
    except (CorpusError, IndexFolderError, EncoderError) as e:
        raise UserError(str(e)) from e
    meta = read_meta(path)
    console().print(f"built {meta['index_type']} index of {meta['count']} passages ({meta['dim']}-d, "
                    f"encoder {meta['encoder']['spec']}) in {meta['build_seconds']}s")
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.add_typer(index_app, name="index")
