"""Corpus reading and links for QA synthesis, the rule-based extractor, and the reply parsers."""

from __future__ import annotations

import json
import random

import pytest

from agent.qa import DataError
from datagen import prompts as P
from datagen.actions import sentence_facts
from datagen.corpus import Page, PageStore
from world import generate_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpusworld") / "w"
    generate_world(out, entities=40, seed=5, max_hops=2)
    return out


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_world_pages_titles_and_mention_links(world):
    store = PageStore.open(world / "pages.jsonl")
    rows = [json.loads(line) for line in (world / "pages.jsonl").read_text().splitlines()]
    assert len(store) == len(rows)
    row = rows[0]
    page = store.page(row["url"])
    assert page.title == row["contents"].split("\n")[0] and page.text == row["contents"].split("\n", 1)[1].strip()
    for url in store.urls[:10]:
        text = store.page(url).text
        for other in store.mentions(url):
            assert store.titles[other] in text and other != url
        for other in store.neighbours(url):  # both directions: either page names the other
            assert store.titles[other] in text or store.titles[url] in store.page(other).text
    assert store.sample(random.Random(0)) == store.sample(random.Random(0))


def test_passages_are_joined_into_pages(world):
    store = PageStore.open(world / "corpus.jsonl")
    passages = [json.loads(line) for line in (world / "corpus.jsonl").read_text().splitlines()]
    url = passages[0]["url"]
    parts = [p for p in passages if p["url"] == url]
    assert len(parts) >= 2
    page = store.page(url)
    assert page.title == parts[0]["title"] and not page.text.startswith('"')
    for part in parts:
        assert part["contents"].split("\n", 1)[1] in page.text


def test_links_file_and_its_errors(tmp_path):
    corpus = _write(tmp_path / "c.jsonl", [{"url": "a", "title": "Alpha", "text": "Alpha is a town in Beta."},
                                          {"url": "b", "title": "Beta", "text": "Beta is a region."},
                                          {"url": "c", "title": "Gamma", "text": "Gamma is a river."}])
    links = _write(tmp_path / "l.jsonl", [{"url": "a", "links": ["c", "zz"], "in_links": ["b"]}])
    store = PageStore.open(corpus, links=links)
    assert store.neighbours("a") == ["c", "b"]  # unknown urls dropped, in-links too
    assert PageStore.open(corpus).neighbours("a") == ["b"]  # mentions: Alpha's text names Beta
    assert PageStore.open(corpus).neighbours("b") == ["a"]  # and the reverse link
    bad = _write(tmp_path / "bad.jsonl", [{"url": "a", "links": ["c"]}, {"links": ["a"]}])
    with pytest.raises(DataError, match=r"bad\.jsonl:2: a links row needs 'url'"):
        PageStore.open(corpus, links=bad)


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"), ('["a"]', "expected a JSON object"),
    ('{"url": "x", "contents": 3}', "needs a 'contents' or 'text' string")])
def test_malformed_corpus_row_names_file_and_line(tmp_path, line, message):
    path = _write(tmp_path / "p.jsonl", [{"url": "a", "contents": "A\nA is here."}, line])
    with pytest.raises(DataError, match=rf"p\.jsonl:2: .*{message}"):
        PageStore.open(path)
    with pytest.raises(DataError, match="no such corpus file"):
        PageStore.open(tmp_path / "missing.jsonl")


def test_sentence_facts_name_their_subject():
    page = Page("u", "Varo Lake", "Varo Lake is a lake in Tesmia. It was named in 1820.\n\nIts shore is long "
                                  "and rocky. Short one.")
    assert sentence_facts(page, max_chars=10_000, limit=10) == [
        "Varo Lake is a lake in Tesmia.", "Varo Lake was named in 1820.", "Varo Lake's shore is long and rocky."]
    assert sentence_facts(page, max_chars=10_000, limit=1) == ["Varo Lake is a lake in Tesmia."]
    assert sentence_facts(Page("u", "T", "Too short."), max_chars=100, limit=5) is None


def test_reply_parsers():
    assert P.labelled("**Question:** Who is it?\nAnswer: Bo\nFact: 2", "Question", "Answer", "Fact") == {
        "question": "Who is it?", "answer": "Bo", "fact": "2"}
    assert P.labelled("Question: Who?\nAnswer:", "Question", "Answer") is None
    assert P.fact_number("fact 3", 3) == 2 and P.fact_number("7", 3) is None and P.fact_number("none", 3) is None
    assert P.yes_no("reasoning...\nVALID: NO - two answers", "VALID") is False
    assert P.yes_no("VALID: yes", "VALID") is True and P.yes_no("I think so", "VALID") is None
    assert P.parse_facts("- Alpha is a town.\n- Alpha is a town.\n* Beta has a river.\nnoise\n- x", 5) == [
        "Alpha is a town.", "Beta has a river."]
    assert P.parse_facts("nothing here", 5) is None
