"""Dataset assembly (dedupe, answer-disjoint splits, files) and the ground-truth check on a real world.

The ground-truth items are built from a small generated world: its own bridge questions, with
the facts the world reader finds as the supporting statements, must all verify; the broken
variants (answer missing from the pages, a false statement, a wrong hop count) must not. The
near-duplicate tests use the real MiniLM encoder, loaded offline from its installed package.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from agent.qa import load_qa
from agent.rewards import normalize_answer
from datagen.dataset import dedupe, normalise_question, split_by_answer, write_dataset
from datagen.ground_truth import WorldTruth, summarise
from datagen.record import CheckResult, Edit, to_dict
from world import generate_world
from world.reader import read_world, solve
from world.templates import PRONOUNS

# --- helpers -------------------------------------------------------------------------------------


def make_item(index: int, question: str, answer: str, *, status: str = "accepted", hops: int = 1,
              pages: list[str] | None = None, statements: list[dict] | None = None) -> dict:
    """A finished item shaped as datagen/record.py documents it."""
    edit = Edit("base", True, question, answer, note="seed fact",
                checks=[CheckResult("guard", True), CheckResult("validity", True)])
    return {
        "id": f"dg-{index:06d}", "index": index, "seed_url": (pages or ["https://x.test/a"])[0],
        "status": status, "reason": "" if status == "accepted" else "final: too easy",
        "question": question, "answer": answer, "aug_answer": [], "hops": hops,
        "pages": pages or ["https://x.test/a"], "statements": statements or [],
        "edits": [to_dict(edit)], "difficulty": {"correct": 1, "attempts": 4, "predictions": ["x"]},
        "search": None, "models": {"generator": "g", "solver": "s", "judge": "j"},
        "usage": {"calls": 3, "prompt_tokens": 10, "completion_tokens": 5, "cost_usd": 0.0}, "seconds": 1.0,
    }


def as_statement(fact) -> dict:
    """A fact's sentence as the extract stage would state it: self-contained, the pronoun named."""
    first, _, rest = fact.sentence.partition(" ")
    return {"text": f"{fact.subject} {rest}" if first in PRONOUNS else fact.sentence, "url": fact.url}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world") / "w"
    generate_world(out, entities=40, seed=3, max_hops=2)
    return out


@pytest.fixture(scope="module")
def truth(world) -> WorldTruth:
    return WorldTruth(world)


@pytest.fixture(scope="module")
def world_items(world) -> list[tuple[dict, dict]]:
    """(world question row, item built from it) for every bridge question of the world."""
    _, kb, _ = read_world(world)
    out = []
    for name in ("qa_train.jsonl", "qa_dev.jsonl", "qa_test.jsonl"):
        for line in (world / name).read_text("utf-8").splitlines():
            row = json.loads(line)
            evidence = solve(row["program"], kb, set(row["chain"])).evidence
            item = make_item(len(out), row["question"], row["answer"], hops=row["hops"], pages=row["chain"],
                             statements=[as_statement(f) for f in evidence])
            out.append((row, item | {"evidence": evidence}))
    return out


def first(world_items, qtype: str, hops: int) -> dict:
    return next(item for row, item in world_items if row["type"] == qtype and row["hops"] == hops)


# --- ground truth --------------------------------------------------------------------------------


def test_world_bridge_questions_all_verify(truth, world_items):
    bridges = [(row, item) for row, item in world_items if row["type"] == "bridge"]
    assert {row["hops"] for row, _ in bridges} == {1, 2}
    checks = []
    for row, item in bridges:
        c = truth.check(item)
        checks.append(c)
        assert c["agrees"], (row["question"], c)
        assert c["world_hops"] == row["hops"]
        last = item["evidence"][-1]
        assert (c["answer_fact"]["subject"], c["answer_fact"]["field"], c["answer_fact"]["value"]) == (
            last.subject, last.field, last.value)
    s = summarise(checks)
    assert s["verified"] == s["items"] == len(bridges) and s["verified_fraction"] == 1.0
    assert s["hops_measured"] == s["hops_agree"] == len(bridges) and s["statements_supported_mean"] == 1.0


def test_correct_one_and_two_hop_items(truth, world_items):
    one, two = first(world_items, "bridge", 1), first(world_items, "bridge", 2)
    c1 = truth.check(one)
    assert c1 == {"answer_supported": True, "answer_fact": c1["answer_fact"], "statements_supported": 1.0,
                  "world_hops": 1, "hops_agree": True, "agrees": True}
    assert c1["answer_fact"]["url"] in one["pages"]
    c2 = truth.check(two)
    assert (c2["world_hops"], c2["hops_agree"], c2["agrees"]) == (2, True, True)
    # The answer is on the second page; the question names the first page's entity only.
    assert c2["answer_fact"]["url"] == two["pages"][1]
    named = truth.named_pages(two["question"])
    assert two["pages"][0] in named and two["pages"][1] not in named


def test_answer_not_in_its_pages(truth, world_items):
    item = first(world_items, "bridge", 1)
    answer = normalize_answer(item["answer"])
    elsewhere = next(url for url, facts in sorted(truth.facts_by_url.items())
                     if facts and all(answer not in (normalize_answer(f.value), normalize_answer(f.subject))
                                      for f in facts))
    c = truth.check(item | {"pages": [elsewhere]})
    assert c["answer_supported"] is False and c["answer_fact"] is None
    assert c["world_hops"] is None and c["hops_agree"] is None and c["agrees"] is False
    c = truth.check(item | {"answer": "Qwxzy Vronk"})
    assert c["answer_supported"] is False and c["agrees"] is False


def test_false_statement_and_wrong_hops(truth, world_items):
    item = first(world_items, "bridge", 2)
    last = item["evidence"][-1]
    false = {"text": item["statements"][-1]["text"].replace(last.value, "Qwxzy"), "url": last.url}
    c = truth.check(item | {"statements": [item["statements"][0], false]})
    assert c["statements_supported"] == 0.5 and c["answer_supported"] is True and c["agrees"] is False
    # A true sentence cited from a page that does not state it is unsupported too.
    c = truth.check(item | {"statements": [{**item["statements"][0], "url": item["pages"][1]}]})
    assert c["statements_supported"] == 0.0 and c["agrees"] is False
    assert truth.check(item | {"statements": []})["statements_supported"] == 0.0
    c = truth.check(item | {"hops": 3})
    assert (c["world_hops"], c["hops_agree"], c["agrees"]) == (2, False, False)


def test_obscured_question_has_unmeasured_hops(truth, world_items):
    item = first(world_items, "bridge", 2)
    question = item["question"]
    for url in truth.named_pages(question):
        question = question.replace(truth.pages[url].partition("\n")[0], "a certain place")
    c = truth.check(item | {"question": question})
    assert c["world_hops"] is None and c["hops_agree"] is None
    assert c["answer_supported"] is True and c["agrees"] is True
    s = summarise([c, truth.check(item | {"hops": 3})])
    assert (s["items"], s["verified"], s["hops_measured"], s["hops_agree"], s["hops_agree_fraction"]) == (
        2, 1, 1, 0, 0.0)


def test_numbers_compare_without_thousands_separators(truth, world_items):
    item = next(item for row, item in world_items
                if row["type"] == "bridge" and re.fullmatch(r"\d{1,3}(,\d{3})+", row["answer"]))
    plain = item["answer"].replace(",", "")
    statements = [{**s, "text": s["text"].replace(item["answer"], plain)} for s in item["statements"]]
    c = truth.check(item | {"answer": plain, "statements": statements})
    assert c["answer_supported"] and c["statements_supported"] == 1.0 and c["agrees"]
    assert c["answer_fact"]["value"] == item["answer"]


def test_question_naming_its_answer_measures_one_hop(truth, world_items):
    item = first(world_items, "comparison", 2)
    assert item["answer"] in item["question"]
    assert truth.check(item)["world_hops"] == 1


def test_longest_title_is_the_named_one(world, tmp_path):
    rows = [json.loads(line) for line in (world / "pages.jsonl").read_text("utf-8").splitlines()]
    title = rows[0]["contents"].partition("\n")[0]
    longer = f"{title} Harbour"
    harbour = "https://hexwiki.test/wiki/Harbour"
    rows.append({"url": harbour, "contents": f"{longer}\n\n{longer} is a harbour."})
    (tmp_path / "pages.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    t = WorldTruth(tmp_path)
    assert t.named_pages(f"Who runs {longer}?") == [harbour]
    assert t.named_pages(f"Who runs {longer} near {title}?") == [harbour, rows[0]["url"]]
    assert t.named_pages(f"Who runs {title}s?") == []


# --- dedupe --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm():
    from tools.encoder import Encoder

    enc = Encoder("minilm")
    return lambda texts: enc.encode(texts, kind="query")


def test_normalise_question():
    assert normalise_question("  Who founded   the city of Stokaim?! ") == "who founded city of stokaim"


def test_exact_duplicates_removed_first_by_index_kept():
    items = [make_item(3, "who founded  Stokaim", "rarfeho lamdros."),
             make_item(1, "Who founded Stokaim?", "Rarfeho Lamdros"),
             make_item(2, "Who founded Stokaim?", "Brozes Revol"),  # same question, other answer: kept
             make_item(4, "When was Sebror founded?", "1503")]
    kept, removed = dedupe(items, threshold=1.0)
    assert [i["id"] for i in kept] == ["dg-000001", "dg-000002", "dg-000004"]
    assert removed == [{"id": "dg-000003", "duplicate_of": "dg-000001", "kind": "exact", "similarity": 1.0}]


def test_near_duplicates_removed_by_minilm(minilm):
    items = [make_item(0, "In what year was the city of Sebror founded?", "1503"),
             make_item(1, "In which year was the city Sebror founded?", "1503"),
             make_item(2, "What is the population of Nampo?", "2,800,000"),
             make_item(3, "Who founded Stokaim?", "Rarfeho Lamdros"),
             make_item(4, "Which person founded the city of Stokaim?", "Rarfeho Lamdros"),
             make_item(5, "In what year was the city of Pultedra founded?", "1430")]
    kept, removed = dedupe(items, threshold=0.9, encode=minilm)
    assert [i["index"] for i in kept] == [0, 2, 3, 5]
    assert [(r["id"], r["duplicate_of"], r["kind"]) for r in removed] == [
        ("dg-000001", "dg-000000", "embedding"), ("dg-000004", "dg-000003", "embedding")]
    assert all(0.9 <= r["similarity"] <= 1.0 for r in removed)
    # Threshold 1.0 (or no encoder) keeps near-duplicates: only exact ones go.
    assert len(dedupe(items, threshold=1.0, encode=minilm)[0]) == 6
    assert len(dedupe(items, threshold=0.9)[0]) == 6


def test_blocked_dedupe_matches_one_by_one_greedy():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(150, 48))
    vecs = {}
    items = []
    for i in range(300):  # every other item is a copy of an earlier base vector, some too noisy to match
        noise = rng.normal(scale=rng.uniform(0.1, 0.7), size=48)
        v = base[i // 2] if i % 2 == 0 else base[rng.integers(0, i // 2 + 1)] + noise
        vecs[f"q{i}"] = v / np.linalg.norm(v)
        items.append(make_item(i, f"q{i}", f"a{i}"))

    def encode(texts):
        return np.stack([vecs[t] for t in texts])

    kept_ids, expected = [], []
    for item in items:
        sims = [float(vecs[item["question"]] @ vecs[k]) for k in kept_ids]
        if sims and max(sims) >= 0.9:
            expected.append((item["question"], kept_ids[int(np.argmax(sims))]))
        else:
            kept_ids.append(item["question"])
    assert 20 < len(expected) < 150
    for block in (7, 64, 1024):
        kept, removed = dedupe(items, threshold=0.9, encode=encode, block_size=block)
        assert [i["question"] for i in kept] == kept_ids
        by_id = {i["id"]: i["question"] for i in items}
        assert [(by_id[r["id"]], by_id[r["duplicate_of"]]) for r in removed] == expected


def test_dedupe_rejects_bad_threshold_and_encoder_shape():
    with pytest.raises(ValueError, match="threshold"):
        dedupe([], threshold=0.0)
    with pytest.raises(ValueError, match="shape"):
        dedupe([make_item(0, "q", "a")], threshold=0.9, encode=lambda t: np.zeros((2, 4)))


# --- splits and files ----------------------------------------------------------------------------


def synthetic(n: int = 200) -> list[dict]:
    """n items over ~n/2 answers, with spellings that normalise together ("The Nampo." == "nampo")."""
    rng = np.random.default_rng(1)
    spell = ["{}", "The {}.", "{}!", " {} "]
    return [make_item(i, f"Question number {i}?", spell[i % 4].format(f"Answer {rng.integers(0, n // 2)}"))
            for i in range(n)]


def test_split_by_answer_is_disjoint_deterministic_and_near_fractions():
    items = synthetic()
    split = split_by_answer(items, (0.8, 0.1, 0.1), seed=0)
    assert set(split) == {i["id"] for i in items}
    where: dict[str, set[str]] = {}
    for item in items:
        where.setdefault(normalize_answer(item["answer"]), set()).add(split[item["id"]])
    assert all(len(s) == 1 for s in where.values())
    assert any(len([i for i in items if normalize_answer(i["answer"]) == a]) > 1 for a in where)
    counts = Counter(split.values())
    assert abs(counts["train"] - 160) <= 10
    assert abs(counts["dev"] - 20) <= 10 and abs(counts["test"] - 20) <= 10
    assert split_by_answer(list(reversed(items)), (0.8, 0.1, 0.1), seed=0) == split
    assert split_by_answer(items, (0.8, 0.1, 0.1), seed=1) != split


def test_split_gives_every_nonzero_split_a_group():
    items = [make_item(i, f"q{i}", f"a{i}") for i in range(3)]
    assert sorted(split_by_answer(items, (0.98, 0.01, 0.01)).values()) == ["dev", "test", "train"]
    assert set(split_by_answer(synthetic(20), (1, 0, 0)).values()) == {"train"}
    assert set(split_by_answer(synthetic(20), (0.5, 0, 0.5)).values()) == {"train", "test"}
    with pytest.raises(ValueError):
        split_by_answer(items, (0.8, 0.2))
    with pytest.raises(ValueError, match="unique"):
        split_by_answer(items + items[:1])


def test_write_dataset_files_load_with_load_qa(tmp_path):
    items = synthetic(60)
    items[5]["status"] = "rejected"
    items.append(make_item(100, items[0]["question"].upper(), items[0]["answer"]))  # exact duplicate
    summary = write_dataset(items, tmp_path / "data", source="hexsearch-datagen", fractions=(0.8, 0.1, 0.1),
                            seed=0, threshold=1.0)
    assert summary["accepted"] == 60 and summary["kept"] == 59
    assert summary["duplicates"] == [{"id": "dg-000100", "duplicate_of": "dg-000000", "kind": "exact",
                                      "similarity": 1.0}]
    out = tmp_path / "data"
    files = ["qa.jsonl", "qa_dev.jsonl", "qa_test.jsonl", "qa_train.jsonl"]
    assert sorted(p.name for p in out.iterdir()) == files  # no .tmp left behind
    every = load_qa(out / "qa.jsonl")
    assert len(every) == 59 and "dg-000005" not in {q.id for q in every}
    assert every[0].meta["source"] == "hexsearch-datagen"
    assert every[0].meta["provenance"]["edits"][0]["checks"] == ["guard:pass", "validity:pass"]
    for name in ("train", "dev", "test"):
        part = load_qa(out / f"qa_{name}.jsonl")
        assert len(part) == summary["splits"][name] > 0
        assert all(q.meta["split"] == name for q in part)
    assert sum(summary["splits"].values()) == 59
