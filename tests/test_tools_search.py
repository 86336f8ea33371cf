"""The search tool over real backends: local FAISS index, our service via /retrieve, a Serper-compatible API."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys

import pytest
from fixtures.corpus import url_of, write_corpus
from fixtures.web import SERPER_KEY, SERPER_RESULTS, FixtureWeb
from fixtures.world import questions, world_index

from serving.servers.retrieval_server import ServerThread, create_app
from tools.config import ToolsConfig
from tools.factory import ToolConfigError, build_tools
from tools.retriever import Retriever
from tools.search import RetrieveUrlSearch, SearchTool, SerperSearch, hit_from_doc, split_contents


@pytest.fixture(scope="module")
def world():
    return world_index()


@pytest.fixture(scope="module")
def retriever(world):
    return Retriever(world[1])


@pytest.fixture(scope="module")
def service(retriever):
    """A retrieval service sharing this process's Retriever (the process worker is tested elsewhere)."""
    with ServerThread(create_app(retriever)) as srv:
        yield srv


@pytest.fixture(scope="module")
def web():
    with FixtureWeb() as server:
        yield server


def cfg(tmp_path, **kw) -> ToolsConfig:
    return ToolsConfig(cache_path=str(tmp_path / "tools.sqlite"), **kw)


async def test_local_search_returns_normalised_hits(world, retriever, tmp_path):
    tools = build_tools(cfg(tmp_path, topk=5), retriever=retriever)
    assert set(tools) >= {"search", "access"}
    q = questions(world[0], hops=1)[0]
    obs = await tools["search"]({"query": q["question"]})
    assert obs.ok and obs.cost == 0 and len(obs.data) == 5
    hit = obs.data[0]
    assert set(hit) == {"title", "url", "snippet", "score", "id"}
    assert hit["url"].startswith("https://hexwiki.test/wiki/") and not hit["snippet"].startswith('"')
    assert q["chain"][0] in [h["url"] for h in obs.data]
    assert obs.text.startswith(f"[1] {hit['title']}\nURL: {hit['url']}\n")
    page = await tools["access"]({"url": q["chain"][0]})  # search -> access a result: the local page store
    assert page.ok and page.data["source"] == "local" and page.data["title"]
    bare = build_tools(cfg(tmp_path, topk=5, search_show_urls=False), retriever=retriever)["search"]
    text = (await bare({"query": q["question"]})).text
    assert text.startswith(f"[1] {hit['title']}\n{hit['snippet'][:20]}") and "URL:" not in text


async def test_local_search_batches_concurrent_episodes(world, retriever, tmp_path):
    tools = build_tools(cfg(tmp_path, cache_enabled=False, retrieval_max_wait_ms=20), retriever=retriever)
    qs = [q["question"] for q in questions(world[0])][:40]
    results = await asyncio.gather(*(tools["search"]({"query": q, "topk": 3}) for q in qs))
    assert all(r.ok and len(r.data) == 3 for r in results)
    stats = tools["search"].provider._batchers.get().stats()
    assert stats["queries"] == 40 and stats["batches"] < 40
    direct = retriever.search(qs, 3)
    assert [[h["id"] for h in r.data] for r in results] == [[h.doc["id"] for h in row] for row in direct]
    await tools["search"].aclose()


async def test_url_backend_matches_local(world, retriever, service, tmp_path):
    qs = [q["question"] for q in questions(world[0])][:5]
    local = build_tools(cfg(tmp_path, cache_enabled=False), retriever=retriever)["search"]
    for base in (service.url, service.url + "/retrieve"):
        remote = build_tools(cfg(tmp_path, search_backend="url", retrieval_url=base, cache_enabled=False))["search"]
        for q in qs:
            a, b = await local({"query": q}), await remote({"query": q})
            assert [(h["title"], h["url"], h["id"]) for h in a.data] == [(h["title"], h["url"], h["id"]) for h in b.data]
        await remote.aclose()


async def test_url_backend_coalesces_concurrent_searches(world, retriever, service, tmp_path):
    """Many concurrent episodes -> a few /retrieve requests carrying many queries each."""
    qs = [q["question"] for q in questions(world[0])][:30]
    tool = build_tools(cfg(tmp_path, search_backend="url", retrieval_url=service.url, cache_enabled=False,
                           retrieval_max_wait_ms=20))["search"]
    results = await asyncio.gather(*(tool({"query": q, "topk": 2 + i % 2}) for i, q in enumerate(qs)))
    runner = tool.provider._batchers.get().runner
    assert all(r.ok for r in results) and runner.requests < len(qs)
    for i, (q, r) in enumerate(zip(qs, results, strict=True)):
        assert [h["id"] for h in r.data] == [h.doc["id"] for h in retriever.search([q], 2 + i % 2)[0]]
    await tool.aclose()


async def test_local_backend_in_a_worker_process(world, retriever, tmp_path):
    tool = build_tools(cfg(tmp_path, index_dir=str(world[1]), retrieval_worker="process", cache_enabled=False))["search"]
    qs = [q["question"] for q in questions(world[0])][:6]
    results = await asyncio.gather(*(tool({"query": q, "topk": 3}) for q in qs))
    assert [[h["id"] for h in r.data] for r in results] == [[h.doc["id"] for h in row] for row in retriever.search(qs, 3)]
    await tool.aclose()
    with pytest.raises(ToolConfigError, match="retrieval_worker"):
        build_tools(cfg(tmp_path, index_dir=str(world[1]), retrieval_worker="gpu"))


async def test_search_cache_is_per_provider(retriever, service, tmp_path):
    local = build_tools(cfg(tmp_path), retriever=retriever)["search"]
    first, second = await local({"query": "capital of a region"}), await local({"query": " capital of  a region "})
    assert not first.cached and second.cached and second.data == first.data
    remote = build_tools(cfg(tmp_path, search_backend="url", retrieval_url=service.url))["search"]
    assert not (await remote({"query": "capital of a region"})).cached  # another provider: another namespace
    await remote.aclose()


async def test_serper_provider(web, monkeypatch, caplog):
    monkeypatch.setenv("SERPER_API_KEY", SERPER_KEY)
    caplog.set_level(logging.DEBUG)
    tool = SearchTool(SerperSearch(url=web.url("/serper/search"), cost_per_query=0.001), topk=2, retries=0)
    obs = await tool({"query": "veyra lighthouse"})
    assert obs.ok and obs.cost == pytest.approx(0.001)
    assert obs.data == [{"title": r["title"], "url": r["link"], "snippet": r["snippet"], "score": None, "id": None}
                        for r in SERPER_RESULTS[:2]]
    path, headers, raw = web.posts[-1]
    assert path == "/serper/search" and json.loads(raw) == {"q": "veyra lighthouse", "num": 2}
    assert headers["X-API-KEY"] == SERPER_KEY
    assert SERPER_KEY not in caplog.text and SERPER_KEY not in obs.text
    assert tool.stats()["tools/search/cost"] == pytest.approx(0.001)


async def test_serper_key_problems(web, monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    tool = SearchTool(SerperSearch(url=web.url("/serper/search")), retries=2, backoff_initial_s=0.01)
    before = web.hits["/serper/search"]
    missing = await tool({"query": "x"})
    assert "SERPER_API_KEY" in missing.error and web.hits["/serper/search"] == before
    monkeypatch.setenv("SERPER_API_KEY", "wrong-key-000000")
    wrong = await tool({"query": "x"})
    assert "rejected the API key" in wrong.error and "wrong-key" not in wrong.error
    assert web.hits["/serper/search"] == before + 1  # a bad key is permanent: not retried


async def test_web_backends_still_serve_world_pages(service, tmp_path):
    world = tmp_path / "world"
    write_corpus(world)
    tools = build_tools(cfg(tmp_path, search_backend="url", retrieval_url=service.url), world_dir=world)
    assert not (world / "index").exists()  # a web/url backend never builds the world's index
    page = await tools["access"]({"url": url_of("Port Sable")})
    assert page.ok and page.data["source"] == "local" and "salt trade" in page.text
    await tools["search"].aclose()


def test_factory_config_errors(tmp_path):
    with pytest.raises(ToolConfigError, match="tools.search_backend: invalid value 'bing'; valid: local, url, serper"):
        build_tools(cfg(tmp_path, search_backend="bing"))
    with pytest.raises(ToolConfigError, match="tools.index_dir is empty"):
        build_tools(cfg(tmp_path))
    with pytest.raises(ToolConfigError, match="tools.retrieval_url is empty"):
        build_tools(cfg(tmp_path, search_backend="url"))


async def test_argument_handling(retriever, tmp_path):
    tool = build_tools(cfg(tmp_path, cache_enabled=False), retriever=retriever)["search"]
    assert len((await tool({"query": "city", "topk": "2"})).data) == 2
    assert len((await tool({"query": "city", "topk": 500})).data) == 50  # clamped to max_topk
    assert (await tool({"query": "   "})).error == "missing required argument 'query'"


def test_hit_normalisation_of_peer_rows():
    assert split_contents('"Veyra"\nThe tower.') == ("Veyra", "The tower.")
    assert split_contents("no title line") == ("", "no title line")
    hit = hit_from_doc({"id": 7, "contents": '"Veyra"\nThe tower ' + "word " * 400}, 0.5, 100)
    assert hit.title == "Veyra" and hit.id == "7" and hit.url == "" and hit.snippet.endswith(" ...")
    assert len(hit.snippet) <= 104
    assert RetrieveUrlSearch("http://h:1").url == "http://h:1/retrieve"


def test_cli_tools_search(world, service):
    base = [sys.executable, "-m", "hexsearch.cli", "-q", "tools", "search"]
    local = subprocess.run(base + ["capital of a region", "--index", str(world[1]), "--topk", "2", "--json",
                                   "--no-cache"], capture_output=True, text=True)
    assert local.returncode == 0, local.stderr
    hits = json.loads(local.stdout)
    assert len(hits) == 2 and hits[0]["url"].startswith("https://hexwiki.test/")
    remote = subprocess.run(base + ["capital of a region", "--backend", "url", "--url", service.url, "--topk", "2",
                                    "--no-cache"], capture_output=True, text=True)
    assert remote.returncode == 0 and remote.stdout.startswith(f"[1] {hits[0]['title']}")
    env = {k: v for k, v in os.environ.items() if k != "SERPER_API_KEY"}
    serper = subprocess.run(base + ["x", "--backend", "serper", "--no-cache"], capture_output=True, text=True, env=env)
    lines = [line for line in serper.stderr.splitlines() if line.strip()]
    assert serper.returncode == 1 and len(lines) == 1 and "SERPER_API_KEY" in lines[0]
    missing = subprocess.run(base + ["x", "--index", str(world[1] / "nope")], capture_output=True, text=True)
    assert missing.returncode == 2 and "not an index folder" in missing.stderr
