"""The QA-synthesis agent with a scripted engine on a real (small) world: every action, every check's
accept and reject, the edit history, resume after a kill, and the dataset `hexsearch train` reads.

The ScriptedModel below answers each prompt of datagen/prompts.py by what the prompt asks, the way a
capable model would, and a test changes one behaviour at a time (a solver that knows the answer, a
validity verdict of NO, ...). It goes through the InferenceEngine protocol like any engine."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace

import pytest

from agent.qa import load_qa
from core.checkpoint import read_rows
from datagen.corpus import PageStore
from datagen.llm import open_models
from datagen.run import run_datagen
from datagen.synth import Synthesiser
from hexsearch.config import load_config
from serving.engines.scripted import ScriptedEngine


def _last(pattern: str, text: str) -> str:
    return re.findall(pattern, text)[-1].strip()


class ScriptedModel:
    """Replies to each synthesis prompt by its kind; the attributes are the behaviours tests change."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.solver_knows = lambda question: False
        self.valid = " YES"
        self.fits = " NO"
        self.covered = " NO"
        self.judge = "VERDICT: INCORRECT"
        self.rewrite = lambda question: question  # applied to the base question
        self.calls: list[str] = []
        self.answer = ""
        self.agent_knows = False  # the search agent (with tools) answers correctly

    def __call__(self, prompt_ids, request) -> str:
        text = self.tok.decode(prompt_ids)
        if "List the facts that this encyclopedia page states" in text:
            body = text.split("\nPage:\n")[-1].split("\nFacts:")[0].split("\n", 1)[1]
            sentences = [x for x in re.split(r"(?<=\.)\s+", body.replace("\n", " ")) if len(x.split()) > 3]
            return self._say("extract", " " + "\n- ".join(sentences))
        if "<answer> answer </answer>" in text:  # the search agent's system prompt: answer at once
            return self._say("agent", f"<answer>{self.answer if self.agent_knows else 'Qwerty'}</answer>")
        if "Write one question about" in text:
            return self._base(text)
        if "Make the question harder" in text:
            question = _last(r"\nQuestion: (.*)\nAnswer:", text)
            new = re.sub(r"^(\w+ \w+ \w+)", r"\1 a certain", question, count=1)
            return self._say("fuzz", f" {new}\nObscured: a detail")
        if "without naming it" in text:
            other = _last(r"Facts of the page of (.*):", text)
            return self._say("link", f" the subject of a fact on the page of {other}\nFact: 1")
        if "Rewrite the question, replacing" in text:
            entity, description = re.findall(r'replacing "(.*)" with the description "(.*)"\.', text)[-1]
            question = _last(r"\nQuestion: (.*)\nReply with one line", text)
            return self._say("combine", " " + question.replace(entity, description))
        if "Is the new fact already stated" in text:
            return self._say("coverage", self.covered)
        if "Check this quiz question" in text:
            return self._say("validity", self.valid)
        if "Answer the question from what you know" in text:
            question = _last(r"Question: (.*)\nReply with one line", text)
            return self._say("solve", " " + (self.answer if self.solver_knows(question) else "Qwerty"))
        if "Does the candidate answer also satisfy" in text:
            return self._say("alternative", self.fits)
        if "Does the predicted answer mean the same" in text:
            return self._say("judge", self.judge)
        raise AssertionError(f"unexpected prompt: {text[-300:]}")

    def _say(self, kind: str, reply: str) -> str:
        self.calls.append(kind)
        return reply

    def _base(self, text: str) -> str:
        facts = re.findall(r"^(\d+)\. (.*)$", text.split("\nFacts:\n")[-1], re.MULTILINE)
        for number, fact in facts:
            m = re.search(r"\b(1\d{3})\b", fact)
            if m:
                question = self.rewrite(
                    f"According to its page, which year goes with this: {fact.replace(m.group(1), '____')}?")
                self.answer = m.group(1)  # what a solver that "knows" says (single-item tests)
                return self._say("base", f" {question}\nAnswer: {m.group(1)}\nFact: {number}")
        return self._say("base", " What is it?\nAnswer: nothing\nFact: 1")  # no fact states it: rejected


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tmp_path_factory.mktemp("dgworld") / "w"


def _cfg(world, **datagen):
    overrides = [f"world.out={world}", "world.entities=40", "world.max_hops=2",
                 *(f"datagen.{k}={json.dumps(v) if isinstance(v, (list, str)) else v}" for k, v in datagen.items())]
    return load_config(None, overrides)


def _engine(tokenizer):
    model = ScriptedModel(tokenizer)
    return ScriptedEngine(responder=model, tokenizer=tokenizer, record=False), model


async def _one_item(cfg, engine, index: int = 0) -> dict:
    from datagen.run import corpus_files

    pages, _ = corpus_files(cfg)
    models = open_models(replace(cfg.datagen, judge=replace(cfg.datagen.judge, cache="none")), engine=engine)
    try:
        return await Synthesiser(cfg.datagen, PageStore.open(pages), models, run_seed=cfg.run.seed).item(index)
    finally:
        await models.aclose()


def test_base_inject_fuzz_history(world, tokenizer):
    """A question the solver answers is deepened by inject and obscured by fuzz until it is hard."""
    engine, model = _engine(tokenizer)
    model.solver_knows = lambda q: "a certain" not in q
    cfg = _cfg(world, min_hops=2, target_hops=2, max_hops=2, max_edits=4, actions=["fuzz", "inject"])
    item = asyncio.run(_one_item(cfg, engine, index=1))
    assert item["status"] == "accepted", item["reason"]
    assert [e["action"] for e in item["edits"]] == ["base", "inject", "fuzz"]
    assert all(e["accepted"] for e in item["edits"])
    base, inject, fuzz = item["edits"]
    assert [c["name"] for c in base["checks"]] == ["guard", "validity", "difficulty", "uniqueness"]
    assert base["checks"][2]["detail"]["correct"] == 4
    assert inject["checks"][0] == {"name": "coverage", "passed": True, "reason": "", "detail": inject["checks"][0]["detail"]}
    assert inject["pages"] and inject["pages"][0] == item["pages"][1] and "via" in inject["note"]
    assert "the subject of a fact on the page of" in inject["question"]
    assert fuzz["note"].startswith("obscured:") and "a certain" in fuzz["question"]
    assert item["hops"] == 2 and len(item["statements"]) == 2
    assert item["statements"][1]["url"] == item["pages"][1]
    assert item["difficulty"]["correct"] == 0 and item["question"] == fuzz["question"]
    assert item["usage"]["calls"] > 10 and item["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("case", ["two_answers", "concatenation", "invalid", "unreadable", "solver_knows",
                                  "judge_says_correct", "covered"])
def test_each_check_rejects(world, tokenizer, case):
    engine, model = _engine(tokenizer)
    settings = {"max_edits": 0}
    if case == "two_answers":
        model.fits, settings["uniqueness_judge"] = " YES", "llm"
    elif case == "concatenation":
        model.rewrite = lambda question: question + " And who made it?"
    elif case == "invalid":
        model.valid = " NO, two answers fit"
    elif case == "unreadable":
        model.valid = " perhaps"
    elif case == "solver_knows":
        model.solver_knows = lambda q: True
    elif case == "judge_says_correct":
        model.judge, settings["difficulty_judge"] = "It matches.\nVERDICT: CORRECT", "llm"
    elif case == "covered":
        model.covered = " YES"
        settings.update(max_edits=1, min_hops=2, target_hops=2, actions=["inject"])
    item = asyncio.run(_one_item(_cfg(world, **settings), engine, index=1))
    assert item["status"] == "rejected"
    last = item["edits"][-1]
    failed = next((c for c in last["checks"] if not c["passed"]), None)
    expected = {"two_answers": ("uniqueness", "another answer fits: 'Qwerty'"),
                "concatenation": ("guard", "not exactly one question"), "invalid": ("validity", "judged invalid"),
                "unreadable": ("validity", "unreadable verdict"), "covered": ("coverage", "already covered")}
    if case in expected:
        name, reason = expected[case]
        assert failed is not None and failed["name"] == name and reason in failed["reason"], last
    else:  # a question the tool-free solver answers is too easy: every check passes, the item does not
        assert last["accepted"] and item["difficulty"]["correct"] == 4
        assert item["reason"].startswith("final: 1 hop(s), 4/4")
    if case == "judge_says_correct":
        # the four identical attempts ("Qwerty", which does not match the answer) share one judge call
        assert model.calls.count("judge") == 1


def _strip_volatile(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("seconds",)}


def test_killed_run_resumes_without_duplicates(world, tokenizer, tmp_path):
    """Cancel a run after a few items are written, tear its last line, resume: nothing finished is lost or
    redone, no index appears twice, and the target is reached."""
    out = tmp_path / "qa"
    cfg = _cfg(world, num_questions=6, max_items=30, concurrency=3, dedup_threshold=1.0, max_edits=1)
    items = out / "items.jsonl"

    async def killed() -> None:
        engine, _ = _engine(tokenizer)
        task = asyncio.ensure_future(run_datagen(cfg, out, engine=engine))
        while len(read_rows(items)) < 3:
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(killed())
    before = read_rows(items)
    assert 3 <= len(before) < 30
    with items.open("a") as f:
        f.write('{"index": 99, "status": "acc')  # the line being written when the process died
    engine, _ = _engine(tokenizer)
    report = asyncio.run(run_datagen(cfg, out, engine=engine))
    after = read_rows(items)
    assert [_strip_volatile(r) for r in after[:len(before)]] == [_strip_volatile(r) for r in before]
    indices = [r["index"] for r in after]
    assert len(indices) == len(set(indices)) and 99 not in indices
    assert report["items"]["accepted"] >= 6
    rows = [json.loads(line) for line in (out / "qa.jsonl").read_text().splitlines()]
    # exact duplicates (two seeds drawing the same page and fact) are removed; nothing else is lost
    duplicates = report["dataset"]["duplicates"]
    assert len(rows) == report["dataset"]["kept"] == report["items"]["accepted"] - len(duplicates)
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(d["kind"] == "exact" for d in duplicates)
    assert {r["split"] for r in rows} <= {"train", "dev", "test"}
    assert report["ground_truth"]["items"] == 6


def test_changed_settings_refuse_to_resume(world, tokenizer, tmp_path):
    engine, _ = _engine(tokenizer)
    cfg = _cfg(world, num_questions=1, max_items=3, dedup_threshold=1.0, max_edits=0)
    asyncio.run(run_datagen(cfg, tmp_path / "qa", engine=engine))
    with pytest.raises(ValueError, match="other settings .*solver_attempts"):
        asyncio.run(run_datagen(_cfg(world, num_questions=1, max_items=3, dedup_threshold=1.0, max_edits=0,
                                     solver_attempts=2), tmp_path / "qa", engine=engine))


def test_dataset_is_read_by_train_and_eval_loaders(world, tokenizer, tmp_path):
    engine, _ = _engine(tokenizer)
    out = tmp_path / "qa"
    report = asyncio.run(run_datagen(_cfg(world, num_questions=4, max_items=20, dedup_threshold=1.0, max_edits=0),
                                     out, engine=engine))
    items = load_qa(out / "qa.jsonl")
    # items that finish together are all kept, so a run can end a little above its target
    assert len(items) == report["dataset"]["kept"] >= 4
    assert all(i.meta["provenance"]["models"]["generator"] for i in items)
    assert all(i.meta["provenance"]["statements"] and i.meta["hops"] >= 1 for i in items)
    # every accepted answer is a fact of the world's pages it cites: the scripted model copies it from one
    assert report["ground_truth"]["answer_supported_fraction"] == 1.0
    md = (out / "report.md").read_text()
    assert "Verified against the world" in md and "| guard |" in md


@pytest.mark.parametrize("solves", [True, False])
def test_llm_extractor_and_search_check(world, tokenizer, solves):
    """`extract: llm` takes the generator's `- fact` lines; `search_check` runs the search agent through the
    training workflow and `require_search_solvable` rejects what it never solves."""
    from agent.workflow import make_workflow
    from datagen.run import corpus_files

    engine, model = _engine(tokenizer)
    model.agent_knows = solves
    cfg = _cfg(world, extract="llm", max_edits=0, search_check=True, search_attempts=2, require_search_solvable=True)
    pages, world_dir = corpus_files(cfg)
    workflow = make_workflow(cfg, world_dir=world_dir)

    async def run() -> dict:
        models = open_models(replace(cfg.datagen, judge=replace(cfg.datagen.judge, cache="none")), engine=engine)
        try:
            synth = Synthesiser(cfg.datagen, PageStore.open(pages), models, workflow=workflow, engine=engine)
            return await synth.item(1)
        finally:
            await workflow.aclose()
            await models.aclose()

    item = asyncio.run(run())
    assert model.calls[0] == "extract" and model.calls.count("agent") == 2
    assert item["search"]["attempts"] == 2 and item["search"]["correct"] == (2 if solves else 0)
    assert item["status"] == ("accepted" if solves else "rejected"), item["reason"]
    if not solves:
        assert item["reason"] == "search: the search agent never found the answer"


def test_seed_questions_from_the_world_are_edited(world, tokenizer, tmp_path):
    """`datagen.seeds`: a world question (its `chain` = source pages) is the base; its statements are its
    pages' facts that name the answer or another chain page; a seed without pages is a clear error."""
    from datagen.run import corpus_files, load_seeds
    from world import QA_FILES

    cfg = _cfg(world, max_edits=0)
    pages, world_dir = corpus_files(cfg)
    store = PageStore.open(pages)
    seeds = load_seeds(world_dir / QA_FILES["train"], store)
    engine, model = _engine(tokenizer)
    models = open_models(replace(cfg.datagen, judge=replace(cfg.datagen.judge, cache="none")), engine=engine)
    synth = Synthesiser(cfg.datagen, store, models, seeds=seeds)
    item = asyncio.run(synth.item(len(seeds) + 2))  # cycles: seed 2
    seed = seeds[2]
    assert "base" not in model.calls and item["edits"][0]["note"] == f"seed QA {seed.id}"
    assert item["question"] == seed.question and item["answer"] == seed.answers[0]
    assert item["pages"] == seed.meta["pages"] and item["hops"] == len(seed.meta["pages"])
    assert any(seed.answers[0] in s["text"] for s in item["statements"])
    assert {s["url"] for s in item["statements"]} <= set(item["pages"])
    bad = tmp_path / "seeds.jsonl"
    bad.write_text(json.dumps({"question": "Who?", "answer": "Bo", "id": "s1"}) + "\n")
    with pytest.raises(Exception, match="seed 's1' needs its source pages"):
        load_seeds(bad, store)


def test_the_resume_check_covers_every_setting_that_changes_the_output(tmp_path):
    from datagen.run import _check_same_run, run_settings
    from hexsearch.config import load_config

    base = ["datagen.search_check=true"]
    out = tmp_path / "qa"
    _check_same_run(out, run_settings(load_config(None, base)))
    for change, key in [("engine.model=tiny-random", "search_agent.engine.model"),
                        ("engine.seed=7", "search_agent.engine.seed"),
                        ("agent.temperature=0.3", "search_agent.agent.temperature"),
                        ("agent.max_turns=2", "search_agent.agent.max_turns"),
                        ("tools.index_dir=/elsewhere", "search_agent.tools.index_dir"),
                        ("train.workflow=agent.workflow:SearchAgentWorkflow", "search_agent.workflow"),
                        ("datagen.search_attempts=5", "datagen.search_attempts"), ("run.seed=3", "seed")]:
        with pytest.raises(ValueError, match=rf"other settings \({re.escape(key)}\)"):
            _check_same_run(out, run_settings(load_config(None, [*base, change])))
    for pace in ["engine.urls=[http://127.0.0.1:9]", "engine.threads=3", "datagen.concurrency=2",
                 "datagen.num_questions=99", "datagen.max_items=500"]:
        _check_same_run(out, run_settings(load_config(None, [*base, pace])))  # where and how fast: resumable
    assert "search_agent" not in run_settings(load_config(None, []))  # no search agent: its settings do not matter
