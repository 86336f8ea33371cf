"""benchmarks/data/realmh: the hand-written natural-text multi-hop set is sound as data (every question's chain
is in its corpus, the answer is stated where the chain ends, bridge questions do not give away their bridge or
answer) and loads through the local-QA path the eval harness uses."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "realmh"


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower())


def test_every_chain_is_in_the_corpus_and_ends_at_its_answer():
    corpus = {r["title"]: r for r in rows("corpus.jsonl")}
    assert len(corpus) == len(rows("corpus.jsonl"))  # one article per title
    assert all(r["contents"].startswith(f'"{title}"\n') for title, r in corpus.items())
    questions = rows("questions.jsonl")
    assert len({q["id"] for q in questions}) == len(questions) == 80
    assert Counter((q["type"], q["hops"]) for q in questions) == {
        ("bridge", 2): 30, ("comparison", 2): 25, ("bridge", 3): 15, ("bridge", 4): 10}
    for q in questions:
        chain = q["supporting"]
        assert len(chain) == q["hops"] and all(t in corpus for t in chain), q["id"]
        answers = [norm(a) for a in q["golden_answers"]]
        last = norm(corpus[chain[-1]]["contents"])
        if answers[0] not in ("yes", "no"):
            assert any(a in last for a in answers), q["id"]
        if q["type"] == "bridge":
            assert not any(a in norm(q["question"]) for a in answers), q["id"]  # no answer in the question
            for title in chain[1:]:  # each link is named by the article before it, never by the question
                assert norm(title.split(",")[0].split(" (")[0]) not in norm(q["question"]), (q["id"], title)


def test_the_set_loads_as_local_qa_with_its_hops():
    from agent.qa import load_qa

    items = load_qa(DATA / "questions.jsonl")
    assert len(items) == 80
    first = items[0]
    assert first.question and first.answers
    assert Counter(int(i.meta["hops"]) for i in items) == {2: 55, 3: 15, 4: 10}
