"""The offline world: formats, determinism, and questions that need exactly their chain.

The soundness tests read only the written files: `world.reader` extracts facts from the
article text by the sentence templates and follows each question's relation path, so a fact the
renderer forgot, or a shortcut some page states, shows up here whatever the generator believed.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from agent.qa import load_qa
from world import FILES, default_world, generate_world, resolve_world
from world.reader import FactBase, Reader, check_question, read_world, solve

N = 300


def rows(world: Path, split: str | None = None) -> list[dict]:
    files = [f"qa_{split}.jsonl"] if split else ["qa_train.jsonl", "qa_dev.jsonl", "qa_test.jsonl"]
    return [json.loads(line) for name in files for line in (world / name).read_text("utf-8").splitlines()]


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world") / "w"
    generate_world(out, entities=N, seed=0, max_hops=4)
    return out


@pytest.fixture(scope="module")
def text(world):
    """(pages, facts) as read back from the article text."""
    pages, kb, unread = read_world(world)
    assert unread == []
    return pages, kb


def test_files_parse_in_the_documented_formats(world):
    summary = json.loads((world / "world.json").read_text())
    assert sorted(p.name for p in world.iterdir()) == sorted(FILES)
    pages = jsonl(world / "pages.jsonl")
    assert all(set(p) == {"url", "contents"} for p in pages)
    titles = {p["url"]: p["contents"].split("\n", 1)[0] for p in pages}
    assert len(titles) == len(pages) == N == sum(summary["entities"].values())
    for url, title in titles.items():  # stable URLs on the reserved TLD, derived from the unique title
        assert url == "https://hexwiki.test/wiki/" + title.replace(" ", "_")
    assert len(set(titles.values())) == N
    passages = jsonl(world / "corpus.jsonl")
    assert all(set(p) == {"id", "title", "url", "contents"} for p in passages)
    assert [p["id"] for p in passages] == [str(i) for i in range(len(passages))]
    for p in passages:
        assert titles[p["url"]] == p["title"]
        head, body = p["contents"].split("\n", 1)
        assert head == f'"{p["title"]}"' and body and "\n" not in body  # one paragraph per passage
    # every paragraph of every page is one passage, in order
    by_page = {url: [] for url in titles}
    for p in passages:
        by_page[p["url"]].append(p["contents"].split("\n", 1)[1])
    for page in pages:
        assert page["contents"].split("\n\n")[1:] == by_page[page["url"]]
    assert summary["passages"] == len(passages) > 2 * N  # full articles have several paragraphs
    qa = rows(world)
    assert summary["questions"]["total"] == len(qa) == len({r["id"] for r in qa}) == 3 * N
    for r in qa:
        assert isinstance(r["answer"], str) and r["answer"] in r["aug_answer"]
        assert r["hops"] == len(r["chain"]) and r["type"] in ("bridge", "comparison")
        assert set(r["chain"]) <= set(titles)
    for split in ("train", "dev", "test"):
        items = load_qa(world / f"qa_{split}.jsonl")
        assert len(items) == summary["questions"]["by_split"][split] > 0
        assert all(i.meta["split"] == split and i.answers == [r["answer"]] for i, r in zip(items, rows(world, split),
                                                                                          strict=True))


def test_hops_and_types_are_spread_evenly(world):
    qa = rows(world)
    hops = Counter(r["hops"] for r in qa)
    assert sorted(hops) == [1, 2, 3, 4] and max(hops.values()) - min(hops.values()) <= 4
    kinds = Counter((r["hops"], r["type"]) for r in qa)
    assert kinds[(1, "comparison")] == 0
    for k in (2, 3, 4):
        assert abs(kinds[(k, "bridge")] - kinds[(k, "comparison")]) <= 4
    answer_types = Counter(r["answer_type"] for r in qa)
    assert {"year", "number", "person", "city"} <= set(answer_types)


def test_every_answer_is_stated_in_its_chain_articles(world, text):
    pages, _ = text
    for r in rows(world):
        chain_text = "\n".join(pages[url] for url in r["chain"])
        assert re.search(rf"(?<![\w,]){re.escape(r['answer'])}(?!\w|,\d)", chain_text), r


def test_every_sentence_is_read_and_facts_never_conflict(world, text):
    pages, kb = text  # (the fixture already asserts that no sentence went unread)
    assert kb.conflicts() == []
    facts = [f for hits in kb.index.values() for f in hits]
    own = Counter(f.subject for f in facts if f.url == "https://hexwiki.test/wiki/" + f.subject.replace(" ", "_"))
    assert len(own) == N and min(own.values()) >= 3  # every page states at least 3 facts of its own
    elsewhere = len(facts) - sum(own.values())
    assert elsewhere > N / 2  # and pages restate facts of other entities (distractors, inverse mentions)


def test_generator_bookkeeping_matches_the_text():
    """The facts the renderer records per page (which the generator's shortcut rule relies on)
    are exactly the facts the reader finds in that page's text."""
    from world.graph import build_graph
    from world.render import render_page

    world = build_graph(N, seed=3)
    reader = Reader(e.name for e in world.entities)
    for e in world.entities:
        page = render_page(world, e)
        facts, unread = reader.read_page(e.url, page.contents)
        assert unread == []
        recorded = Counter((world.entities[s].name, f, world.text(world.entities[s], f)) for s, f in page.facts)
        assert Counter((f.subject, f.field, f.value) for f in facts) == recorded, e.name


def test_questions_need_exactly_their_chain(world, text):
    """Solved from the chain; unsolvable from every proper subset of it, and from all pages minus
    any one chain page (so no off-chain page gives a shortcut); no bridge entity named."""
    pages, kb = text
    everything = set(pages)
    titles = {url: c.split("\n", 1)[0] for url, c in pages.items()}
    for r in rows(world):
        chain, program = r["chain"], r["program"]
        got = solve(program, kb, set(chain))
        assert got is not None and got.answer == r["answer"], r
        assert {f.url for f in got.evidence} == set(chain)  # every chain page contributes a fact
        for size in range(len(chain)):
            for subset in itertools.combinations(chain, size):
                assert solve(program, kb, set(subset)) is None, (r["id"], subset)
        for url in chain:
            assert solve(program, kb, everything - {url}) is None, (r["id"], url)
        starts = {s["start"] for s in program["sides"]}
        for url in chain:
            named = re.search(rf"\b{re.escape(titles[url])}\b", r["question"])
            assert bool(named) == (titles[url] in starts), (r["id"], titles[url])
        assert check_question(r, pages, kb) == []


def test_checker_catches_a_planted_shortcut(world, text):
    """Negative control: the same checks fail once an off-chain page restates a hop fact."""
    pages, kb = text
    titles = {url: c.split("\n", 1)[0] for url, c in pages.items()}
    r = next(r for r in rows(world) if r["type"] == "bridge" and r["hops"] == 3
             and r["program"]["sides"][0]["path"][0] == "born_in")
    person = titles[r["chain"][0]]
    city = kb.get(person, "born_in").value
    other = next(url for url, t in titles.items() if url not in r["chain"] and kb.get(t, "born_in"))
    reader = Reader(titles.values())

    def with_line(line: str) -> tuple[dict, FactBase]:
        changed = {**pages, other: pages[other] + "\n\n" + line}
        return changed, FactBase(f for url, c in changed.items() for f in reader.read_page(url, c)[0])

    assert check_question(r, pages, kb) == []
    shortcut = with_line(f"{titles[other]} was a close friend of {person}, who was born in {city}.")
    assert f"answerable without {r['chain'][0]}" in check_question(r, *shortcut)
    wrong = next(t for url, t in titles.items() if t != city and kb.get(t, "located_in"))
    _, lying = with_line(f"{titles[other]} was a close friend of {person}, who was born in {wrong}.")
    assert lying.conflicts() == [(person, "born_in", sorted([city, wrong]))]
    assert reader.read_page(other, pages[other] + "\n\nAn unknown kind of sentence.")[1] == [
        "An unknown kind of sentence."]


def test_splits_are_by_start_entity(world):
    starts = {split: {s["start"] for r in rows(world, split) for s in r["program"]["sides"]}
              for split in ("train", "dev", "test")}
    assert not starts["train"] & starts["dev"] and not starts["train"] & starts["test"]
    assert not starts["dev"] & starts["test"]
    counts = Counter(r["split"] for r in rows(world))
    assert counts["train"] == 720 and counts["dev"] == counts["test"] == 90


def test_same_seed_is_byte_identical_across_processes(world, tmp_path):
    """A second generation in another process, with another hash seed, writes the same bytes."""
    code = ("import sys; from world import generate_world; "
            f"generate_world(sys.argv[1], entities={N}, seed=0, max_hops=4)")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "again")], check=True, env=env,
                   cwd=Path(__file__).resolve().parents[1])
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (world / name).read_bytes(), name


def test_different_seed_gives_a_different_world(world, tmp_path):
    generate_world(tmp_path / "other", entities=N, seed=1)
    for name in ("corpus.jsonl", "pages.jsonl", "qa_train.jsonl"):
        assert (tmp_path / "other" / name).read_bytes() != (world / name).read_bytes()
    names = {json.loads(line)["url"] for line in (tmp_path / "other" / "pages.jsonl").read_text().splitlines()}
    assert len(names & {p["url"] for p in jsonl(world / "pages.jsonl")}) < 5


def test_names_are_made_of_unique_pronounceable_stems(world):
    from world.names import EVENT_KINDS, ORG_NAME_FORMS, TITLE_NOUNS

    vocab = {"Letters", *TITLE_NOUNS, *(n + "s" for n in TITLE_NOUNS), *EVENT_KINDS}
    vocab |= {w for forms in ORG_NAME_FORMS.values() for f in forms for w in f.split() if w != "{}"}
    titles = [p["contents"].split("\n", 1)[0] for p in jsonl(world / "pages.jsonl")]
    stems = Counter(w for t in titles for w in t.split() if w not in vocab and w not in ("The", "of", "from"))
    assert stems and max(stems.values()) == 1  # no stem is reused, so no name hides inside another
    assert all(re.fullmatch(r"[A-Z][a-z]{4,8}", w) and re.search(r"[aeiou]", w) for w in stems)


def test_easy_mode_is_one_hop_over_short_articles(tmp_path):
    summary = generate_world(tmp_path, entities=120, seed=4, max_hops=1, short_articles=True)
    assert summary["questions"]["by_hops"] == {"1": 360}
    assert summary["passages"] == summary["pages"] == 120  # one paragraph per article
    pages, kb, unread = read_world(tmp_path)
    assert unread == [] and kb.conflicts() == []
    for r in rows(tmp_path):
        assert r["hops"] == 1 and len(r["question"]) < 90
        assert check_question(r, pages, kb) == []


def test_min_hops_and_question_count_dials(tmp_path):
    summary = generate_world(tmp_path, entities=150, seed=2, max_hops=3, min_hops=2, questions_per_entity=1.0)
    assert set(summary["questions"]["by_hops"]) == {"2", "3"}
    assert summary["questions"]["total"] == 150


@pytest.mark.parametrize("kwargs, message", [
    ({"entities": 5}, "at least 20"), ({"max_hops": 5}, "max_hops"), ({"max_hops": 2, "min_hops": 3}, "min_hops"),
    ({"splits": (0.5, 0.1, 0.1)}, "summing to 1"), ({"questions_per_entity": 0}, "positive")])
def test_bad_arguments_are_explained(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_world(tmp_path, **kwargs)


def test_default_world_is_cached_and_published_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("HEXSEARCH_CACHE", str(tmp_path))
    first = default_world(entities=60, seed=5, max_hops=2)
    assert first.parent == tmp_path / "worlds" and (first / "world.json").exists()
    stamp = (first / "corpus.jsonl").stat().st_mtime_ns
    assert default_world(entities=60, seed=5, max_hops=2) == first
    assert (first / "corpus.jsonl").stat().st_mtime_ns == stamp  # reused, not regenerated
    assert [p.name for p in (tmp_path / "worlds").iterdir()] == [first.name]  # no temp folders left
    other = default_world(entities=60, seed=6, max_hops=2)
    assert other != first and json.loads((other / "world.json").read_text())["seed"] == 6


def test_resolve_world_follows_the_config(tmp_path):
    from world.config import WorldConfig

    cfg = WorldConfig(out=str(tmp_path / "w"), entities=60, seed=1, max_hops=2)
    path = resolve_world(cfg)
    stamp = (path / "pages.jsonl").stat().st_mtime_ns
    assert resolve_world(cfg) == path and (path / "pages.jsonl").stat().st_mtime_ns == stamp
    cfg.seed = 2  # different settings: regenerated in place
    resolve_world(cfg)
    assert json.loads((path / "world.json").read_text())["seed"] == 2


def test_unseen_hop_questions_are_held_out_and_sound_in_the_world_that_lacks_them(tmp_path):
    """A 2-hop world with lineages gets the 3- and 4-hop test questions of the same world asked up to 4
    hops: each starts from one of its own test entities (never a train one), reads pages whose text is its
    own, and its reader finds each sound there; ids never collide. A 4-hop world has none to add."""
    from world import unseen_hop_questions
    from world.config import WorldConfig

    cfg = WorldConfig(out=str(tmp_path / "w"), entities=60, max_hops=2, short_articles=True, lineages=3,
                      lineage_length=8, lineage_depths=[2, 4, 8])
    extra = unseen_hop_questions(cfg)
    assert {r["hops"] for r in extra} == {3, 4} and all(r["family"] in ("bridge", "comparison") for r in extra)
    assert (tmp_path / "w-hops4" / "world.json").exists()  # the wider world sits beside the configured one
    own = resolve_world(cfg)
    starts = {split: {s["start"] for r in rows(own, split) if r["family"] != "lineage" for s in r["program"]["sides"]}
              for split in ("train", "dev", "test")}
    extra_starts = {s["start"] for r in extra for s in r["program"]["sides"]}
    assert extra_starts and not extra_starts & (starts["train"] | starts["dev"])
    pages, kb, _ = read_world(own)
    wider = {p["url"]: p["contents"] for p in jsonl(tmp_path / "w-hops4" / "pages.jsonl")}
    for r in extra:
        assert all(pages[url] == wider[url] for url in r["chain"])
        assert check_question(r, pages, kb) == []
    ids = {r["id"] for r in rows(own)}
    assert len({r["id"] for r in extra}) == len(extra) and not ids & {r["id"] for r in extra}
    assert unseen_hop_questions(WorldConfig(out=str(tmp_path / "w4"), entities=60, max_hops=4)) == []
    # the held-out claim is checked each time, not assumed: a train question starting where one of them does
    leak = {**extra[0], "split": "train"}
    with open(own / "qa_train.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(leak) + "\n")
    start = extra[0]["program"]["sides"][0]["start"]
    with pytest.raises(ValueError, match=f"not held out and sound here: '{start}' starts a train question"):
        unseen_hop_questions(cfg)


def hexsearch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hexsearch.cli", *args], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])


def test_cli_generate_show_verify(tmp_path):
    out = tmp_path / "w"
    done = hexsearch("world", "generate", "--out", str(out), "--entities", "80", "--seed", "7", "--max-hops", "3")
    assert done.returncode == 0, done.stderr
    assert "questions" in done.stdout and "comparison" in done.stdout and "240" in done.stdout
    summary = json.loads((out / "world.json").read_text())
    assert summary["seed"] == 7 and summary["config"]["max_hops"] == 3
    shown = hexsearch("world", "show", str(out), "--n", "2", "--split", "train")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("answer:") == 2 and "https://hexwiki.test/wiki/" in shown.stdout
    checked = hexsearch("world", "verify", str(out))
    assert checked.returncode == 0 and "240/240 questions sound" in checked.stdout
    quiet = hexsearch("--quiet", "world", "generate", "--out", str(tmp_path / "q"), "-n", "40", "--easy")
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout.count("\n") == 1
    bad = hexsearch("world", "generate", "--out", str(tmp_path / "bad"), "--max-hops", "9")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "max_hops" in bad.stderr
    missing = hexsearch("world", "show", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no world" in missing.stderr


@pytest.mark.slow
def test_two_thousand_entities_verify(tmp_path):
    summary = generate_world(tmp_path, entities=2000, seed=0)
    assert summary["questions"]["total"] == 6000
    pages, kb, unread = read_world(tmp_path)
    assert unread == [] and kb.conflicts() == []
    assert all(check_question(r, pages, kb) == [] for r in rows(tmp_path))


def test_one_rule_decides_when_the_world_is_the_tools_default(tmp_path):
    """train, eval, ask and `hexsearch tools` share `world.with_world_index`: the world's index is the
    default exactly when the local search has no index of its own, and never behind a named index or
    a web backend."""
    from dataclasses import replace

    from fixtures.world import WORLD_ENTITIES, WORLD_SEED, world_index

    from hexsearch.config import HexConfig
    from world import tools_world, with_world_index
    from world.config import WorldConfig

    folder, index = world_index()
    base = HexConfig(world=WorldConfig(entities=WORLD_ENTITIES, seed=WORLD_SEED))
    cfg, world = with_world_index(base)
    assert world == folder and cfg.tools.index_dir == str(index)
    assert tools_world(cfg) is None  # an index is named now: nothing is decided twice
    named = replace(base, tools=replace(base.tools, index_dir=str(tmp_path / "mine")))
    assert with_world_index(named) == (named, None)
    web = replace(base, tools=replace(base.tools, search_backend="serper"))
    assert with_world_index(web) == (web, None)
    no_search = replace(base, tools=replace(base.tools, builtin=["access"]))
    cfg, world = with_world_index(no_search)
    assert world == folder and cfg.tools.index_dir == ""  # access reads the world's pages; no index built


def test_a_world_folder_in_the_working_directory_does_not_shadow_the_package(tmp_path):
    """`hexsearch train world.out=world` leaves a `world/` folder in the working directory; Python puts the
    working directory first on `sys.path` under `python -m hexsearch.cli`, and our packages must still win."""
    import subprocess
    import sys

    for name in ("world", "tools", "eval"):
        (tmp_path / name).mkdir()
    code = "import world, tools, eval; print(world.__file__, tools.__file__, eval.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    root = str(Path(__file__).resolve().parents[1])
    assert all(f.startswith(root) for f in out.stdout.split()), out.stdout
