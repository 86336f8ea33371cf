"""The access tool against a real loopback web server: extraction, chunks, caps, failures, local pages."""

from __future__ import annotations

import asyncio
import socket

import pytest
from fixtures.corpus import url_of, write_corpus
from fixtures.web import PDF_TEXT, FixtureWeb, make_pdf

from tools.cache import ToolCache
from tools.config import ToolsConfig
from tools.docstore import CorpusError, PageStore, page_key
from tools.extract import chunk_text, extract_pdf
from tools.factory import build_access_tool
from tools.page_access import AccessTool, PageFetcher
from tools.urlguard import UrlGuard


@pytest.fixture(scope="module")
def web():
    with FixtureWeb() as server:
        yield server


def access(**kw) -> AccessTool:
    fetcher_kw = {k: kw.pop(k) for k in ("max_bytes", "max_redirects") if k in kw}
    kw.setdefault("retries", 1)
    kw.setdefault("backoff_initial_s", 0.01)
    return AccessTool(fetcher=PageFetcher(UrlGuard(["127.0.0.1"]), **fetcher_kw), **kw)


async def test_article_main_content_without_boilerplate(web):
    obs = await access()({"url": web.url("/article")})
    assert obs.ok, obs.error
    text = obs.text
    assert text.startswith("Title: Veyra Lighthouse\n")
    assert "completed in 1847 by the engineer Odile Marchetti" in text
    assert "| Mira Solvang | 1879 | 1921 |" in text  # the table survives as markdown
    for junk in ("SPONSORED", "Cheap flights", "Random article", "Copyright 2024", "cookies", "dataLayer"):
        assert junk not in text, junk
    assert obs.data["source"] == "web" and obs.data["num_chunks"] == 1 and obs.meta["status"] == 200


async def test_long_page_is_chunked_and_paged(web):
    tool = access(chunk_chars=1500, max_chunks=5)
    first = await tool({"url": web.url("/long?n=60")})
    assert first.ok and first.data["num_chunks"] == 5 and first.data["truncated"]
    assert "[Chunk 1 of 5]" in first.text and "page=2" in first.text
    third = await tool({"url": web.url("/long?n=60"), "page": 3})
    assert "[Chunk 3 of 5]" in third.text and third.data["chunks"][2] in third.text
    assert all(len(c) <= 1500 for c in first.data["chunks"])
    past = await tool({"url": web.url("/long?n=60"), "page": 9})
    assert past.error == "page 9 is past the end: this page has 5 chunk(s)"


async def test_pdf_plain_text_and_declared_charset(web):
    tool = access()
    pdf = await tool({"url": web.url("/pdf")})
    assert pdf.ok and PDF_TEXT in pdf.text and pdf.data["title"] == "Veyra Harbour Report"
    plain = await tool({"url": web.url("/plain")})
    assert "spring high tide of 4.2 metres" in plain.text
    latin = await tool({"url": web.url("/latin1")})
    assert "crème brûlée" in latin.text and latin.data["title"] == "Café Veyra"


async def test_oversized_bodies_are_cut_at_the_cap(web):
    tool = access(max_bytes=200_000)
    for path in ("/big?mb=3", "/big-chunked?mb=3"):
        obs = await tool({"url": web.url(path)})
        assert obs.ok, obs.error
        assert obs.meta["bytes"] == 200_000 and obs.data["body_truncated"]


async def test_refused_content(web):
    tool = access()
    cases = {"/binary": "unsupported content type 'application/octet-stream'",
             "/fake-html": "is binary, not text", "/empty": "no readable text",
             "/redirect/loop": "redirect loop", "/status/404": "HTTP 404"}
    for path, msg in cases.items():
        obs = await tool({"url": web.url(path)})
        assert obs.error and msg in obs.error, (path, obs.error)
    too_many = await access(max_redirects=2)({"url": web.url("/redirect/chain?n=4")})
    assert "too many redirects" in too_many.error


async def test_unknown_host_fails_fast_without_retries():
    """NXDOMAIN is permanent (no retries); a temporary DNS failure is retried."""
    calls: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        code = socket.EAI_NONAME if host.startswith("nx.") else socket.EAI_AGAIN
        raise socket.gaierror(code, "resolver says no")

    tool = AccessTool(fetcher=PageFetcher(UrlGuard(resolver=resolver)), retries=2, backoff_initial_s=0.01)
    obs = await tool({"url": "http://nx.hexsearch-nowhere.org/"})
    assert obs.error == "host 'nx.hexsearch-nowhere.org' does not exist (DNS)" and calls == ["nx.hexsearch-nowhere.org"]
    flaky = await tool({"url": "http://flaky.hexsearch-nowhere.org/"})
    assert "cannot resolve host" in flaky.error and calls.count("flaky.hexsearch-nowhere.org") == 3


async def test_pdf_over_the_cap_is_refused(web):
    obs = await access(max_bytes=len(make_pdf()) - 10)({"url": web.url("/pdf")})
    assert "exceeds" in obs.error


async def test_redirects_followed_and_recorded(web):
    obs = await access()({"url": web.url("/redirect/chain?n=3")})
    assert obs.ok and obs.data["final_url"].endswith("/article") and len(obs.meta["redirects"]) == 3


async def test_transient_failures_retried_slow_pages_time_out(web):
    flaky = await access(retries=3)({"url": web.url("/flaky/acc?fail=2&code=500")})
    assert flaky.ok and flaky.meta["attempts"] == 3
    limited = await access(retries=2)({"url": web.url("/ratelimited/acc?n=1&after=0.1")})
    assert limited.ok and limited.meta["attempts"] == 2
    slow = await access(timeout_s=0.5, retries=0)({"url": web.url("/drip?chunks=20&delay=0.2")})
    assert slow.error == "timed out after 0.5s"


async def test_cache_by_url_and_pages_served_from_cache(web, tmp_path):
    tool = access(cache=ToolCache(tmp_path / "t.sqlite"), chunk_chars=1500)
    await tool({"url": web.url("/long?n=30&c=1")})
    before = web.hits["/long"]
    again = await tool({"url": web.url("/long?n=30&c=1"), "page": 2})
    assert again.cached and "[Chunk 2 of" in again.text and web.hits["/long"] == before


async def test_many_concurrent_fetches(web):
    tool = access()
    results = await asyncio.gather(*(tool({"url": web.url(f"/article?i={i}")}) for i in range(20)))
    assert all(r.ok and "Veyra Lighthouse" in r.text for r in results)


# -- local world pages ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("world")
    write_corpus(folder)
    return PageStore.build(folder / "pages.jsonl", folder / "pages.sqlite")


def test_page_keys_normalise_what_agents_write():
    base = page_key("https://hexwiki.test/wiki/Port_Sable")
    for variant in ("http://hexwiki.test/wiki/Port_Sable/", "https://www.hexwiki.test/wiki/Port%20Sable",
                    "hexwiki.test/wiki/Port Sable#History", "https://HEXWIKI.test/wiki/Port_Sable"):
        assert page_key(variant) == base, variant
    assert page_key("https://w.org/index.php?title=X") == page_key("https://w.org/index.php/X")


async def test_local_pages_served_by_url_without_network(store):
    tool = AccessTool(pages=store, fetcher=None)
    obs = await tool({"url": "http://hexwiki.test/wiki/Port%20Sable"})
    assert obs.ok and obs.data["source"] == "local" and obs.data["title"] == "Port Sable"
    assert "salt trade" in obs.text and obs.data["final_url"] == url_of("Port Sable")
    missing = await tool({"url": "https://hexwiki.test/wiki/Nowhere"})
    assert missing.error == "no such page: https://hexwiki.test/wiki/Nowhere is not in the local page store"
    web_too = AccessTool(pages=store, fetcher=PageFetcher(UrlGuard()), retries=3)
    invented = await web_too({"url": "https://hexwiki.test/wiki/Invented_Place"})
    assert "not in the local page store" in invented.error and invented.meta["error_type"] == "ToolError"
    assert web_too.counters["retries"] == 0  # a reserved .test name is never looked up on the web
    no_web = await tool({"url": "https://example.com/"})
    assert no_web.error == "URL is not in the local page store and web access is disabled"


async def test_factory_access_tool_local_and_web(store, web):
    cfg = ToolsConfig(allow_hosts=["127.0.0.1"], cache_enabled=False, retries=0)
    tool = build_access_tool(cfg, pages=store)
    local = await tool({"url": url_of("Glass Orchard")})
    remote = await tool({"url": web.url("/article")})
    assert local.data["source"] == "local" and remote.data["source"] == "web"
    refused = await build_access_tool(ToolsConfig(cache_enabled=False), pages=store)({"url": web.url("/article")})
    assert "refused loopback address 127.0.0.1" in refused.error


def test_bad_pages_line_names_file_and_line(tmp_path):
    bad = tmp_path / "pages.jsonl"
    bad.write_text('{"url": "https://a.test/x", "contents": "ok"}\n{"url": "https://a.test/y"}\n')
    with pytest.raises(CorpusError, match=r"pages.jsonl:2: page has no 'contents'"):
        PageStore.build(bad, tmp_path / "p.sqlite")
    assert not list(tmp_path.glob("*.sqlite*"))  # nothing half-written


def test_chunking_respects_boundaries():
    text = "\n\n".join(f"Paragraph {i}. " + "word " * 60 for i in range(30))
    chunks, truncated = chunk_text(text, 1000, 100)
    assert not truncated and all(len(c) <= 1000 for c in chunks)
    assert " ".join(" ".join(chunks).split()) == " ".join(text.split())  # nothing lost, nothing split mid-word
    assert extract_pdf(make_pdf("Hello PDF")).text == "Hello PDF"


async def test_gzip_is_inflated_and_a_bomb_costs_no_more_than_the_cap(web):
    import tracemalloc

    tool = access(max_bytes=1_000_000)
    plain = await tool({"url": web.url("/gzip")})
    assert plain.ok and "Veyra Lighthouse" in plain.text
    web.url("/gzip-bomb?mb=300")  # the server builds its ~300 KB body before we measure
    tracemalloc.start()
    try:
        obs = await tool({"url": web.url("/gzip-bomb?mb=300")})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert obs.ok and obs.meta["bytes"] == 1_000_000 and obs.data["body_truncated"]
    assert peak < 30_000_000  # httpx's decoder would inflate a whole 64 KB network chunk: ~64 MB


async def test_ports_other_than_80_and_443_are_refused():
    from tools.urlguard import UrlGuard, UrlRefused

    guard = UrlGuard()
    for url in ("http://example.com:8080/", "https://example.com:6379/x", "http://93.184.215.14:22/"):
        with pytest.raises(UrlRefused, match="refused port"):
            guard.check_url(url)
    assert guard.check_url("https://example.com:443/a").port in (None, 443)
    assert str(UrlGuard(ports=[8443]).check_url("https://example.com:8443/")).endswith(":8443/")
    obs = await AccessTool(fetcher=PageFetcher(guard))({"url": "http://example.com:5432/"})
    assert not obs.ok and "refused port 5432" in obs.error


async def test_slow_extraction_is_a_permanent_error_not_retried(web, monkeypatch):
    import time as _time

    import tools.page_access as pa

    def slow_extract(*args):
        _time.sleep(1.0)
        raise AssertionError("not reached in time")

    monkeypatch.setattr(pa, "extract", slow_extract)
    tool = access(timeout_s=1.0, retries=3)
    obs = await tool({"url": web.url("/flaky/slow-extract?fail=0")})  # the article, on a path of its own
    assert not obs.ok and "text extraction took longer than 0.5s" in obs.error
    assert tool.counters["retries"] == 0 and web.hits["/flaky/slow-extract"] == 1
