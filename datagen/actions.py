"""The synthesis agent's actions: extract facts, write a base question, fuzz it, inject a hop.

Each action is one or more generator calls (prompts in datagen/prompts.py) and returns the new
question state, or None with a note saying why it produced nothing; it never raises for a reply
that does not parse. An action's result is only kept if the checks (datagen/checks.py) accept it.

- **extract**: the page's facts ("information points"), cached per page for the run.
- **base**: a question answered by one fact of the seed page; its statement is that fact.
- **fuzz**: rewrite the question so one revealing detail becomes vaguer; answer and statements stay.
- **inject**: pick an entity A named in the question (a source page's title, not the answer), a
  linked page B not yet used, and a fact of B's page that mentions A; describe A through that fact
  (LINK), reject the fact when the known statements already cover it (the `coverage` check), then
  put the description in place of A (COMBINE). The question now needs B's page too: one hop more.

`datagen.actions` draws from the ACTIONS registry: a built-in name or `pkg.mod:name`. An action is
`async run(ctx: ActionContext, state) -> (new state | None, Edit)`, registered with `@action(name)`
(`adds_hop=True` for one that adds a source page: it is chosen while the question is shallower than
`datagen.target_hops` and never drawn at `max_hops`). A user action is an `Action` object in a module.
"""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from agent.rewards import normalize_answer
from core.registry import ComponentError, Registry
from datagen import prompts as P
from datagen.corpus import Page, PageStore
from datagen.llm import ChatLLM, Usage
from datagen.record import CheckResult, Edit, Statement


@dataclass
class QAState:
    """The current question, its answer and where its support comes from."""

    question: str
    answer: str
    statements: list[Statement]
    pages: list[str]
    """Source page urls, seed first; `len(pages)` is the hop count."""
    difficulty: dict[str, Any] | None = None
    """The last difficulty record {correct, attempts, predictions} (set by checks.difficulty)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """Accepted (question, answer, difficulty) so far."""

    @property
    def hops(self) -> int:
        return len(self.pages)


@dataclass
class ActionContext:
    """What an edit action may use besides the question state."""

    gen: ChatLLM
    """The generator model."""
    store: PageStore
    usage: Usage
    """The item's token and cost accounting (pass it to every call)."""
    facts_of: Callable[[str, Usage], Awaitable[list[str] | None]]
    """A page's extracted facts (cached per run), by url."""
    rng: random.Random
    """The item's random draws (deterministic, so a resumed run draws the same)."""
    seed: int
    """Sampling seed of this edit's calls."""


ActionFn = Callable[[ActionContext, QAState], Awaitable[tuple[QAState | None, Edit]]]


@dataclass(frozen=True)
class Action:
    """An edit action of the synthesis agent (see the module docstring)."""

    name: str
    run: ActionFn
    adds_hop: bool = False
    """It adds a source page: chosen first while too shallow, never at `max_hops`."""


ACTIONS = Registry("datagen action", "datagen.actions")
"""Edit actions by name (`datagen.actions`)."""


def action(name: str, *, adds_hop: bool = False) -> Callable[[ActionFn], ActionFn]:
    """Decorator: register the coroutine function it wraps as action `name` (returned unchanged)."""

    def deco(run: ActionFn) -> ActionFn:
        ACTIONS.add(name, Action(name, run, adds_hop))
        return run

    return deco


def get_action(spec: str) -> Action:
    """The Action a name or `pkg.mod:attr` names; ComponentError listing the valid names otherwise."""
    found = ACTIONS.resolve(spec)
    if not isinstance(found, Action):
        raise ComponentError(f"datagen.actions: '{spec}' is a {type(found).__name__}, not a datagen.actions.Action")
    return found


def names(text: str, name: str) -> bool:
    """Whether `text` names `name` (whole words, case-insensitive)."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None


def contains_answer(question: str, answer: str) -> bool:
    """Whether the normalised answer appears in the normalised question (a give-away)."""
    a = normalize_answer(answer)
    return bool(a) and re.search(rf"(?<!\w){re.escape(a)}(?!\w)", normalize_answer(question)) is not None


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
_PRONOUN = re.compile(r"^(He|She|It|They|His|Her|Its|Their)\b")


def sentence_facts(page: Page, *, max_chars: int, limit: int) -> list[str] | None:
    """The page's sentences as facts (the `sentences` extractor, no LLM): sentences of 4+ words, a leading
    pronoun replaced by the page title so that each fact names its subject."""
    out: list[str] = []
    for paragraph in page.text[:max_chars].split("\n"):
        for sentence in _SENTENCE.split(paragraph.strip()):
            if len(sentence.split()) < 4:
                continue
            sentence = _PRONOUN.sub(lambda m: page.title + ("'s" if m.group(1) in ("His", "Her", "Its", "Their")
                                                            else ""), sentence)
            if sentence not in out:
                out.append(sentence)
    return out[:limit] or None


async def extract(gen: ChatLLM, page: Page, usage: Usage, *, max_chars: int, limit: int, seed: int) -> list[str] | None:
    """The page's facts as the generator lists them (the `llm` extractor), or None when the reply has no
    `- fact` lines."""
    reply = await gen.complete(P.messages(P.EXTRACT, title=page.title, text=page.text[:max_chars]), usage,
                               temperature=0.0, seed=seed, prefill="-")
    return P.parse_facts(reply, limit)


async def base_question(gen: ChatLLM, page: Page, facts: list[str], usage: Usage, *, seed: int
                        ) -> tuple[QAState | None, Edit]:
    """A first question from one fact of the seed page."""
    reply = await gen.complete(P.messages(P.BASE_QA, title=page.title, facts=P.numbered(facts)), usage, seed=seed,
                               prefill="Question:")
    got = P.labelled(reply, "Question", "Answer")
    if got is None:
        return None, Edit("base", False, note=f"unparseable reply: {reply[:200]!r}")
    # The statement is the fact that states the answer: the one the reply names if it does, else the first
    # that does; a reply whose answer no fact states is rejected (it would be unsupported).
    named = P.fact_number((P.labelled(reply, "Fact") or {}).get("fact", ""), len(facts))
    stating = [j for j, f in enumerate(facts) if names(f, got["answer"])]
    i = named if named in stating else (stating[0] if stating else None)
    if i is None:
        return None, Edit("base", False, got["question"], got["answer"], note="no fact of the page states the answer")
    state = QAState(got["question"], got["answer"], [Statement(facts[i], page.url, page.title)], [page.url])
    return state, Edit("base", True, state.question, state.answer, note=f"fact {i + 1}", pages=[page.url])


async def seed_question(seed: Any, store: PageStore, usage: Usage, *, facts_of: Any) -> tuple[QAState | None, Edit]:
    """A seed QA (an agent.qa.QAItem whose `meta["pages"]` are corpus urls) as the first question. Its
    statements are the facts of its pages that name the answer or another of its pages' titles."""
    pages = list(seed.meta["pages"])
    titles = [store.titles[u] for u in pages]
    answer = seed.answers[0]
    statements = []
    for url in pages:
        for fact in await facts_of(url, usage) or []:
            if names(fact, answer) or any(t != store.titles[url] and names(fact, t) for t in titles):
                statements.append(Statement(fact, url, store.titles[url]))
    if not any(names(st.text, answer) for st in statements):
        return None, Edit("base", False, seed.question, answer, note=f"seed QA {seed.id}: no fact of its pages "
                          "states the answer")
    state = QAState(seed.question, answer, statements, pages)
    return state, Edit("base", True, state.question, answer, note=f"seed QA {seed.id}", pages=pages)


@action("fuzz")
async def fuzz(ctx: ActionContext, state: QAState) -> tuple[QAState | None, Edit]:
    """The question with one revealing detail made vaguer (same answer, same statements)."""
    reply = await ctx.gen.complete(P.messages(P.FUZZ, question=state.question, answer=state.answer,
                                              facts=P.numbered([s.text for s in state.statements])), ctx.usage,
                                   seed=ctx.seed, prefill="Question:")
    got = P.labelled(reply, "Question", "Obscured")
    if got is None:
        return None, Edit("fuzz", False, note=f"unparseable reply: {reply[:200]!r}")
    if normalize_answer(got["question"]) == normalize_answer(state.question):
        return None, Edit("fuzz", False, got["question"], state.answer, note="the question did not change")
    new = replace(state, question=got["question"])
    return new, Edit("fuzz", True, new.question, new.answer, note=f"obscured: {got['obscured']}")


def inject_candidates(store: PageStore, state: QAState, rng: random.Random) -> list[tuple[str, str]]:
    """(entity A, linked page B) pairs: A a source page's title named in the question and not the answer,
    B a neighbour of A's page not yet among the sources; shuffled by `rng`."""
    pairs = []
    for url in state.pages:
        title = store.titles[url]
        if not names(state.question, title) or normalize_answer(title) == normalize_answer(state.answer):
            continue
        pairs += [(title, b) for b in store.neighbours(url) if b not in state.pages]
    rng.shuffle(pairs)
    return pairs


@action("inject", adds_hop=True)
async def inject(ctx: ActionContext, state: QAState, tries: int = 3) -> tuple[QAState | None, Edit]:
    """One more hop (see module docstring); the returned edit carries the `coverage` check's result."""
    gen, store, usage, facts_of, rng, seed = ctx.gen, ctx.store, ctx.usage, ctx.facts_of, ctx.rng, ctx.seed
    for entity, other in inject_candidates(store, state, rng)[:tries]:
        facts = [f for f in (await facts_of(other, usage) or []) if names(f, entity)]
        if facts:
            break
    else:
        return None, Edit("inject", False, note="no linked page has a fact that names an entity of the question")
    b = store.page(other)
    reply = await gen.complete(P.messages(P.LINK, entity=entity, other=b.title, facts=P.numbered(facts)), usage,
                               seed=seed, prefill="Description:")
    got = P.labelled(reply, "Description", "Fact")
    i = P.fact_number(got["fact"], len(facts)) if got else None
    if got is None or i is None:
        return None, Edit("inject", False, note=f"unparseable link reply: {reply[:200]!r}", pages=[other])
    description, fact = got["description"], facts[i]
    if names(description, entity) or contains_answer(description, state.answer):
        return None, Edit("inject", False, note=f"the description {description!r} names {entity!r} or the answer",
                          pages=[other])
    known = P.numbered([s.text for s in state.statements])
    reply = await gen.complete(P.messages(P.COVERAGE, facts=known, fact=fact), usage, temperature=0.0, seed=seed,
                               prefill="COVERED:")
    covered = P.yes_no(reply, "COVERED")
    coverage = CheckResult("coverage", covered is False,
                           "" if covered is False else ("the new fact is already covered" if covered
                                                        else "unreadable verdict"),
                           {"fact": fact, "raw": reply[-200:]})
    edit = Edit("inject", False, note=f"{entity} via {b.title}: {description}", pages=[other], checks=[coverage])
    if not coverage.passed:
        return None, edit
    reply = await gen.complete(P.messages(P.COMBINE, question=state.question, entity=entity, description=description),
                               usage, seed=seed, prefill="Question:")
    got = P.labelled(reply, "Question")
    if got is None or names(got["question"], entity):
        edit.note += (f"; unparseable combine reply: {reply[:200]!r}" if got is None
                      else f"; the combined question still names {entity!r}: {got['question']!r}")
        return None, edit
    new = replace(state, question=got["question"], statements=[*state.statements, Statement(fact, other, b.title)],
                  pages=[*state.pages, other])
    edit.accepted, edit.question, edit.answer = True, new.question, new.answer
    return new, edit
