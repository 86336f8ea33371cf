"""Build a retrieval index folder from corpus.jsonl (`hexsearch index build`).

    build_index("corpus.jsonl", "idx/", encoder="minilm", index_type="flat")

An index folder holds:
    index.faiss    FAISS inner-product index over unit vectors (Flat, HNSW or IVF)
    docs.sqlite    FAISS row id -> the corpus row as given (the on-disk document store)
    pages.sqlite   URL -> page (from pages.jsonl next to the corpus, when there is one)
    meta.json      encoder settings, index type and parameters, counts, corpus fingerprint

The build streams the corpus twice and never holds it in memory: pass 1 validates every line
and writes the document store (a bad line stops the build with `file:line: reason` before any
encoding); pass 2 encodes passages in batches into an on-disk float32 memmap, then FAISS is
built from the memmap chunk by chunk (IVF trains on a sample first). Everything is written
into a temporary sibling folder that is renamed into place only when complete, so a crash or
an error never leaves a half-written index where a reader could find it.

Passage text: `contents` (Search-R1/ASearcher rows, often `"Title"\\ntext`); with only `text`,
the title (if any) is prepended on its own line — the title carries much of the signal.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from core.progress import progress
from tools.docstore import CorpusError, DocStoreWriter, PageStore, iter_jsonl

if TYPE_CHECKING:
    from tools.encoder import Encoder

INDEX_TYPES = ("flat", "hnsw", "ivf")
FORMAT_VERSION = 1


class IndexFolderError(ValueError):
    """A problem with an index folder or build request; one-line message."""


def passage_text(row: dict[str, Any], where: str) -> str:
    """The text to embed for one corpus row (see module docstring)."""
    contents = row.get("contents")
    if isinstance(contents, str) and contents.strip():
        return contents
    text, title = row.get("text"), row.get("title")
    if isinstance(text, str) and text.strip():
        return f"{title}\n{text}" if isinstance(title, str) and title.strip() else text
    raise CorpusError(f"{where}: row has no non-empty 'contents' (or 'text') string")


def corpus_fingerprint(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_docs(corpus: Path, docs_path: Path) -> int:
    writer = DocStoreWriter(docs_path)
    try:
        for lineno, row in iter_jsonl(corpus):
            writer.add(row, passage_text(row, f"{corpus}:{lineno}"))
    finally:
        writer.close()
    if writer.count == 0:
        raise CorpusError(f"{corpus}: no passages (the file is empty)")
    return writer.count


def _make_index(index_type: str, dim: int, n: int, hnsw_m: int, ivf_nlist: int) -> tuple[Any, dict[str, Any]]:
    import faiss

    if index_type == "flat":
        return faiss.IndexFlatIP(dim), {}
    if index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        return index, {"hnsw_m": hnsw_m, "ef_construction": 80, "ef_search": 128}
    nlist = ivf_nlist or max(1, min(int(4 * math.sqrt(n)), n // 39 or 1))
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    return index, {"nlist": nlist, "nprobe": min(nlist, 32)}


def build_index(corpus: str | Path, out: str | Path, *, encoder: str | Encoder = "minilm", index_type: str = "flat",
                batch_size: int = 64, pages: str | Path | None = None, overwrite: bool = False,
                query_prefix: str | None = None, passage_prefix: str | None = None, max_length: int | None = None,
                pooling: str | None = None, hnsw_m: int = 32, ivf_nlist: int = 0, threads: int = 0) -> Path:
    """Build an index folder at `out`; returns its path. See the module docstring.

    `encoder` is a spec (`minilm`, a folder, a hub id) or a loaded `Encoder` to reuse.
    """
    corpus, out = Path(corpus), Path(out)
    if index_type not in INDEX_TYPES:
        raise IndexFolderError(f"unknown index type '{index_type}' (choose from {', '.join(INDEX_TYPES)})")
    if not corpus.is_file():
        raise IndexFolderError(f"corpus not found: {corpus}")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise IndexFolderError(f"{out} already exists and is not empty (pass --overwrite to replace it)")
    pages_path = Path(pages) if pages else corpus.parent / "pages.jsonl"
    if pages and not pages_path.is_file():
        raise IndexFolderError(f"pages file not found: {pages_path}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        t0 = time.time()
        n = _write_docs(corpus, tmp / "docs.sqlite")
        has_pages = pages_path.is_file()
        if has_pages:
            PageStore.build(pages_path, tmp / "pages.sqlite")
        from tools.encoder import Encoder

        if isinstance(encoder, Encoder):
            enc = encoder  # an already-loaded encoder (its own settings apply)
        else:
            enc = Encoder(encoder, batch_size=batch_size, threads=threads, query_prefix=query_prefix,
                          passage_prefix=passage_prefix, max_length=max_length, pooling=pooling)
        emb = _encode_all(enc, tmp, n, batch_size)
        index, params = _make_index(index_type, enc.dim, n, hnsw_m, ivf_nlist)
        _fill_index(index, emb, index_type)
        import faiss

        faiss.write_index(index, str(tmp / "index.faiss"))
        del emb
        (tmp / "embeddings.npy").unlink()
        meta = {"format": FORMAT_VERSION, "id": uuid.uuid4().hex, "count": n, "dim": enc.dim,
                "index_type": index_type, "params": params, "metric": "inner_product",
                "encoder": enc.describe(), "corpus": corpus_fingerprint(corpus),
                "pages": str(pages_path.resolve()) if has_pages else None,
                "build_seconds": round(time.time() - t0, 2), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _encode_all(enc: Any, tmp: Path, n: int, batch_size: int) -> np.memmap:
    from tools.docstore import DocStore

    emb = np.lib.format.open_memmap(tmp / "embeddings.npy", mode="w+", dtype=np.float32, shape=(n, enc.dim))
    store = DocStore(tmp / "docs.sqlite")
    with progress("encoding passages", total=n) as bar:
        for rows in store.iter_texts(batch=max(batch_size * 16, 1024)):
            vecs = enc.encode([t for _, t in rows], kind="passage", batch_size=batch_size)
            emb[rows[0][0]:rows[-1][0] + 1] = vecs
            bar.advance(len(rows))
    store.db().close()
    emb.flush()
    return emb


def _fill_index(index: Any, emb: np.ndarray, index_type: str, chunk: int = 65_536) -> None:
    n = emb.shape[0]
    if index_type == "ivf":
        rng = np.random.default_rng(0)
        sample = np.sort(rng.choice(n, size=min(n, 256 * index.nlist), replace=False))
        index.train(np.ascontiguousarray(emb[sample]))
    with progress("adding to index", total=n) as bar:
        for start in range(0, n, chunk):
            index.add(np.ascontiguousarray(emb[start:start + chunk]))
            bar.advance(min(chunk, n - start))


def _publish(tmp: Path, out: Path) -> None:
    """Rename tmp into place; an existing folder is swapped out first and removed after."""
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)


def read_meta(index_dir: str | Path) -> dict[str, Any]:
    """meta.json of an index folder, with a one-line error when it is not one."""
    path = Path(index_dir) / "meta.json"
    if not path.is_file():
        raise IndexFolderError(f"{index_dir} is not an index folder (no meta.json); build one with `hexsearch index build`")
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT_VERSION:
        raise IndexFolderError(f"{index_dir} has index format {meta.get('format')}, expected {FORMAT_VERSION}; rebuild it")
    return meta


@contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def default_index(world_dir: str | Path, encoder: str = "minilm", index_type: str = "flat") -> Path:
    """The index of a world folder (`<world>/index`), built once and reused while the corpus is unchanged.

    Safe under concurrency: an exclusive file lock serialises builders across processes, and the
    build itself publishes atomically, so readers see either no index or a complete one.
    """
    world = Path(world_dir)
    corpus = world / "corpus.jsonl"
    if not corpus.is_file():
        raise IndexFolderError(f"{world} has no corpus.jsonl (generate a world with `hexsearch world generate`)")
    out = world / "index"
    with _file_lock(world / ".index.lock"):
        try:
            meta = read_meta(out)
            fp = corpus_fingerprint(corpus)
            if (meta["corpus"]["size"], meta["corpus"]["mtime_ns"]) == (fp["size"], fp["mtime_ns"]) \
                    and meta["encoder"]["spec"] == encoder and meta["index_type"] == index_type:
                return out
        except (IndexFolderError, KeyError, json.JSONDecodeError):
            pass
        return build_index(corpus, out, encoder=encoder, index_type=index_type, overwrite=True)
