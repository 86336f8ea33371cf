"""Lineage questions: N searches along a chain of masters, sound from the text, split by lineage.

Like test_world.py these tests read only the written files (`world.reader`), so a fact stated twice,
a stray mention of a chain member or a chain that does not end shows up whatever the generator meant.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from world import FILES, WorldConfig, generate_world, resolve_world, world_name
from world.reader import FactBase, Reader, check_question, mention_index, read_world, solve, verify_world

ENTITIES, SEED, LINEAGES = 120, 3, 12
DEPTHS = [2, 4, 8, 16, 32]


def rows(world: Path, split: str | None = None) -> list[dict]:
    files = [f"qa_{split}.jsonl"] if split else ["qa_train.jsonl", "qa_dev.jsonl", "qa_test.jsonl"]
    return [json.loads(line) for name in files for line in (world / name).read_text("utf-8").splitlines()]


def lineage_rows(world: Path, split: str | None = None) -> list[dict]:
    return [r for r in rows(world, split) if r["family"] == "lineage"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lineage") / "w"
    generate_world(out, entities=ENTITIES, seed=SEED, lineages=LINEAGES, lineage_length=32)
    return out


def test_every_question_is_sound_from_the_text(world):
    report = verify_world(world)
    assert report["problems"] == [] and report["unread_sentences"] == 0 and report["conflicts"] == 0
    assert report["sound"] == report["questions"] == len(rows(world))
    assert len(lineage_rows(world)) == LINEAGES * len(DEPTHS)


def test_rows_carry_family_n_and_min_searches(world):
    for r in rows(world):
        assert r["family"] == r["type"] in {"bridge", "comparison", "lineage"}
        assert r["n"] == r["hops"] == r["min_searches"] == len(r["chain"])
    pages, kb, _ = read_world(world)
    for r in lineage_rows(world):
        titles = [pages[url].partition("\n")[0] for url in r["chain"]]
        assert titles[0] in r["question"] and all(t not in r["question"] for t in titles[1:])
        assert r["answer"] == titles[-1] and r["answer_type"] == "person"
        # the chain is the line of masters in order: each page names the next, the last names no one
        got = solve(r["program"], kb, set(r["chain"]))
        assert [f.value for f in got.evidence] == [*titles[1:], "no one"]
        assert [f.url for f in got.evidence] == r["chain"]
    summary = json.loads((world / "world.json").read_text())
    assert {k: v for k, v in summary["questions"]["by_family_n"].items() if k.startswith("lineage")} == {
        f"lineage-{n}": LINEAGES for n in DEPTHS}
    assert summary["lineage_people"] == LINEAGES * 32
    assert summary["config"]["lineage_depths"] == DEPTHS


def test_each_lineage_goes_whole_to_one_split(world):
    people = {split: {url for r in lineage_rows(world, split) for url in r["chain"]} for split in ("train", "dev", "test")}
    answers = {split: {r["answer"] for r in rows(world, split)} for split in people}
    starts = {split: {r["program"]["sides"][0]["start"] for r in rows(world, split)} for split in people}
    assert all(people.values())  # every split has lineage questions
    for held_out in ("dev", "test"):
        assert not people[held_out] & people["train"]
        held_answers = {r["answer"] for r in lineage_rows(world, held_out)}
        assert not held_answers & (answers["train"] | starts["train"])
    assert not people["dev"] & people["test"]
    founders = [r["answer"] for split in people for r in lineage_rows(world, split)]
    assert len(set(founders)) == LINEAGES  # one founder per lineage, five questions each


def test_the_checks_catch_a_broken_lineage(world):
    """The soundness rules can fail: a stray mention, a restated master, or a line that never ends."""
    pages, kb, _ = read_world(world)
    row = max(lineage_rows(world), key=lambda r: r["n"])
    assert check_question(row, pages, kb) == []
    chain = row["chain"]
    titles = [pages[url].partition("\n")[0] for url in chain]
    off_chain = next(url for url in pages if url not in chain and "trained under" not in pages[url]
                     and "studied under" not in pages[url] and "apprenticed" not in pages[url]
                     and "learned the craft" not in pages[url] and "master" not in pages[url])

    def recheck(changes: dict[str, str]) -> list[str]:
        changed = {**pages, **changes}
        reader = Reader(c.partition("\n")[0] for c in changed.values())
        facts = [f for url, c in changed.items() for f in reader.read_page(url, c)[0]]
        return check_question(row, changed, FactBase(facts), mention_index(changed))

    founder = titles[-1]
    stray = recheck({off_chain: pages[off_chain] + f" {titles[0].split()[0]} was a rival of {founder}."})
    assert any("mentioned on 1 other page" in p for p in stray)
    # the reader takes "P trained under M" only from P's own page, so a restatement can only be there
    restated = recheck({chain[5]: pages[chain[5]] + f" {titles[5]} studied under {titles[6]}."})
    assert any(f"the master of {titles[5]!r} is stated 2 times" in p for p in restated)
    founder_page = pages[chain[-1]]
    endless = recheck({chain[-1]: founder_page[:founder_page.rindex(".", 0, -1) + 1]})  # drop "no master"
    assert any("chain pages give None" in p for p in endless)


def test_generation_is_deterministic_across_processes(world, tmp_path):
    code = ("import sys; from world import generate_world; "
            f"generate_world(sys.argv[1], entities={ENTITIES}, seed={SEED}, lineages={LINEAGES}, lineage_length=32)")
    env = {**os.environ, "PYTHONHASHSEED": "7"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "again")], check=True, env=env)
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (world / name).read_bytes(), name


def test_no_lineages_leaves_the_world_unchanged(world, tmp_path):
    """lineages=0 writes the files of a generator without lineages; lineages only append to a world."""
    generate_world(tmp_path / "plain", entities=ENTITIES, seed=SEED)
    generate_world(tmp_path / "zero", entities=ENTITIES, seed=SEED, lineages=0, lineage_length=5,
                   lineage_depths=[2, 3])
    for name in FILES:
        assert (tmp_path / "zero" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
    assert "lineage" not in (tmp_path / "plain" / "world.json").read_text()
    for name in ("pages.jsonl", "corpus.jsonl"):  # the other entities' pages are untouched, in the same order
        assert (world / name).read_bytes().startswith((tmp_path / "plain" / name).read_bytes())
    for split in ("train", "dev", "test"):
        assert [r for r in rows(world, split) if r["family"] != "lineage"] == rows(tmp_path / "plain", split)


def test_the_longest_lineage_is_sound(tmp_path):
    """N up to MAX_LENGTH (128): the questions behind episodes of more than 100 turns."""
    from world.lineage import MAX_LENGTH

    out = tmp_path / "long"
    generate_world(out, entities=40, seed=SEED, lineages=3, lineage_length=MAX_LENGTH, lineage_depths=[2, MAX_LENGTH])
    report = verify_world(out)
    assert report["problems"] == [] and report["sound"] == report["questions"]
    longest = [r for r in lineage_rows(out) if r["n"] == MAX_LENGTH]
    assert MAX_LENGTH == 128 and len(longest) == 3
    assert all(r["min_searches"] == len(set(r["chain"])) == 128 for r in longest)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lineage_length": 1}, "lineage_length must be between 2 and 128"),
    ({"lineage_length": 129}, "lineage_length must be between 2 and 128"),
    ({"lineage_length": 8, "lineage_depths": [2, 16]}, "lineage_depths: 16 must be between 2 and lineage_length=8"),
    ({"lineage_depths": [1, 4]}, "lineage_depths: 1 must be between 2"),
    ({"lineage_depths": [4, 4]}, "must not repeat a depth"),
    ({"lineage_depths": []}, "must name at least one N"),
    ({"lineages": -1}, "lineages must be 0 (none) or more"),
])
def test_bad_lineage_settings_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        generate_world(tmp_path, entities=40, seed=0, **{"lineages": 2, **kwargs})
    assert not (tmp_path / "world.json").exists()


def test_config_limits_and_cli(tmp_path):
    from hexsearch.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="world.lineage_length: 1 is out of range: it must be at least 2 and at most 128"):
        load_config(None, ["world.lineage_length=1"])
    assert load_config(None, ["world.lineages=4"]).world.lineage_depths == DEPTHS
    out = subprocess.run([sys.executable, "-m", "hexsearch.cli", "-q", "world", "generate", "--out", str(tmp_path / "w"),
                          "--entities", "40", "--lineages", "3", "--lineage-length", "9"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "w" / "world.json").read_text())
    assert summary["config"]["lineage_depths"] == [2, 4, 8]  # the default depths that fit 9 people
    bad = subprocess.run([sys.executable, "-m", "hexsearch.cli", "-q", "world", "generate", "--out", str(tmp_path / "b"),
                          "--lineages", "3", "--lineage-length", "9", "--lineage-depths", "2,10"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "lineage_depths: 10 must be between 2 and lineage_length=9" in bad.stderr


def test_resolve_world_keys_on_the_lineage_settings(tmp_path):
    cfg = WorldConfig(out=str(tmp_path / "w"), entities=40, lineages=3, lineage_length=8)
    path = resolve_world(cfg)
    stamp = (path / "pages.jsonl").stat().st_mtime_ns
    assert resolve_world(cfg) == path and (path / "pages.jsonl").stat().st_mtime_ns == stamp
    assert json.loads((path / "world.json").read_text())["config"]["lineage_depths"] == [2, 4, 8]
    resolve_world(WorldConfig(out=str(tmp_path / "w"), entities=40, lineages=4, lineage_length=8))
    assert json.loads((path / "world.json").read_text())["config"]["lineages"] == 4
    names = {world_name(40, 0, 4), world_name(40, 0, 4, lineages=3, lineage_length=8),
             world_name(40, 0, 4, lineages=3, lineage_length=16), world_name(40, 0, 4, lineages=4, lineage_length=8),
             world_name(40, 0, 4, lineages=3, lineage_length=8, lineage_depths=[2, 8])}
    assert len(names) == 5


def test_search_by_exact_name_finds_each_lineage_member(tmp_path):
    """The RL recipe searches a master's name with topk=1: the real index must return that person's page."""
    from tools.index import default_index
    from tools.retriever import Retriever

    folder = tmp_path / "w"
    generate_world(folder, entities=200, seed=1, lineages=8, lineage_length=32, lineage_depths=[32])
    members = {url for r in lineage_rows(folder) for url in r["chain"]}
    pages = {json.loads(line)["url"]: json.loads(line)["contents"] for line in open(folder / "pages.jsonl")}
    names = sorted((pages[url].partition("\n")[0], url) for url in members)
    hits = Retriever(default_index(folder)).search([name for name, _ in names], topk=1)
    found = sum(row[0].doc["url"] == url for (_, url), row in zip(names, hits, strict=True))
    print(f"lineage name search, topk=1: {found}/{len(names)} = {found / len(names):.3f}")
    assert len(names) == 8 * 32 and found / len(names) >= 0.95
