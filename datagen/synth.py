"""The QA-synthesis agent: one item = one seed page turned into a hard, verified question, or rejected.

    seed page --extract--> facts --base--> question      (checks: guard, validity, difficulty, uniqueness)
    (or a seed QA from `datagen.seeds`, with its pages' facts as statements, checked the same way)
    repeat up to max_edits, until hops >= target_hops and k/n <= max_solver_accuracy:
        action = inject while hops < target_hops, else a draw from `actions` (no inject at max_hops;
                 any action of the ACTIONS registry, datagen/actions.py)
        new = action(question)                            (inject also runs the coverage check)
        checks(new); keep it only if every check passed
    accept if hops >= min_hops and k/n <= max_solver_accuracy (and, optionally, the search agent solves it)

Everything an item does is recorded (datagen/record.py): every edit with its checks, the final
difficulty, tokens and cost. Randomness is drawn from `Random(f"{run_seed}:{index}")`, so a resumed
run draws what the killed run would have. A reply that does not parse ends an action, never the item;
an exception (a dead server, a timeout) ends the item with status `error`, which a resumed run retries.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict
from typing import Any

from core.log import get_logger
from datagen import actions, checks
from datagen.actions import QAState
from datagen.config import DatagenConfig
from datagen.corpus import PageStore
from datagen.llm import Models, Usage
from datagen.record import Edit

log = get_logger(__name__)


class Synthesiser:
    """Runs items (see module docstring). `workflow`/`engine`: the search agent for `search_check`."""

    def __init__(self, cfg: DatagenConfig, store: PageStore, models: Models, *, run_seed: int = 0, workflow: Any = None,
                 engine: Any = None, seeds: list[Any] | None = None):
        """`seeds`: seed QAs (datagen.run.load_seeds); item i edits seed i (cycling) instead of writing a base
        question from a sampled page."""
        self.seeds = seeds or []
        self.cfg = cfg
        self.store = store
        self.models = models
        self.run_seed = run_seed
        self.workflow = workflow
        self.engine = engine
        self._facts: dict[str, asyncio.Future] = {}

    async def facts_of(self, url: str, usage: Usage) -> list[str] | None:
        """The page's extracted facts, extracted once per run (concurrent askers share the call)."""
        if url not in self._facts:
            future: asyncio.Future = asyncio.get_running_loop().create_future()
            self._facts[url] = future
            try:
                if self.cfg.extract == "sentences":
                    got = actions.sentence_facts(self.store.page(url), max_chars=self.cfg.max_page_chars,
                                                 limit=self.cfg.max_info_points)
                else:
                    got = await actions.extract(self.models.generator, self.store.page(url), usage,
                                            max_chars=self.cfg.max_page_chars, limit=self.cfg.max_info_points,
                                            seed=self.run_seed)
            except BaseException as e:
                del self._facts[url]
                future.set_exception(e)
                future.exception()
                raise
            future.set_result(got)
        return await asyncio.shield(self._facts[url])

    def hard_enough(self, state: QAState, hops: int) -> bool:
        """At least `hops` deep and at most `max_solver_accuracy` of the tool-free attempts correct."""
        d = state.difficulty
        return (state.hops >= hops and d is not None
                and d["correct"] <= self.cfg.max_solver_accuracy * d["attempts"])

    def choose(self, state: QAState, rng: random.Random) -> actions.Action | None:
        """The next edit: a hop-adding action while the question is too shallow, else a draw from
        `datagen.actions` (hop-adding ones only below `max_hops`); None when none may run."""
        allowed = [a for a in map(actions.get_action, self.cfg.actions) if not a.adds_hop or state.hops < self.cfg.max_hops]
        deepen = [a for a in allowed if a.adds_hop]
        if deepen and state.hops < max(self.cfg.min_hops, self.cfg.target_hops):
            return deepen[0] if len(deepen) == 1 else rng.choice(deepen)
        return rng.choice(allowed) if allowed else None

    async def _checked(self, edit: Edit, new: QAState | None, state: QAState | None, usage: Usage, seed: int) -> None:
        if new is None or not edit.accepted:
            edit.accepted = False
            return
        previous = state.difficulty if state is not None else None
        await checks.run_edit_checks(edit, new, previous, gen=self.models.generator, solver=self.models.solver,
                                     judge=self.models.judge, cfg=self.cfg, usage=usage, seed=seed)
        log.info("item edit %s %s: %s", edit.action, "accepted" if edit.accepted else "rejected",
                 ", ".join(f"{c.name}={'pass' if c.passed else 'fail'}" for c in edit.checks) or edit.note)

    async def item(self, index: int) -> dict[str, Any]:
        """Synthesise item `index` (deterministic draws) and return its record."""
        rng = random.Random(f"{self.run_seed}:{index}")
        seed = rng.randrange(2**31)
        usage, t0 = Usage(), time.monotonic()
        seed_qa = self.seeds[index % len(self.seeds)] if self.seeds else None
        url = seed_qa.meta["pages"][0] if seed_qa is not None else self.store.sample(rng)
        record: dict[str, Any] = {
            "id": f"dg-{index:06d}", "index": index, "seed_url": url, "status": "rejected", "reason": "",
            "question": "", "answer": "", "aug_answer": [], "hops": 0, "pages": [url], "statements": [],
            "edits": [], "difficulty": None, "search": None, "models": self.models.names()}
        edits: list[Edit] = []
        state: QAState | None = None
        try:
            state = await self._run(url, seed_qa, rng, seed, usage, edits, record)
        except Exception as e:  # noqa: BLE001 - infrastructure failure: recorded, retried on resume
            log.warning("item %d failed: %s: %s", index, type(e).__name__, e)
            record.update(status="error", reason=f"error: {type(e).__name__}: {str(e)[:300]}")
        if state is None and edits:  # rejected at base: keep what the base action wrote, for the report
            record.update(question=edits[-1].question, answer=edits[-1].answer)
        if state is not None:
            record.update(question=state.question, answer=state.answer, hops=state.hops, pages=state.pages,
                          statements=[asdict(s) for s in state.statements], difficulty=state.difficulty)
        record.update(edits=[asdict(e) for e in edits], seconds=round(time.monotonic() - t0, 3),
                      usage={**asdict(usage), "cost_usd": round(usage.cost_usd, 6)})
        return record

    async def _run(self, url: str, seed_qa: Any, rng: random.Random, seed: int, usage: Usage, edits: list[Edit],
                   record: dict[str, Any]) -> QAState | None:
        """The item's pipeline; sets `record['status'/'reason'/'search']` and returns the last accepted state."""
        if seed_qa is not None:
            new, edit = await actions.seed_question(seed_qa, self.store, usage, facts_of=self.facts_of)
        else:
            facts = await self.facts_of(url, usage)
            if facts is None:
                record["reason"] = "extract: no facts could be read from the seed page's extraction"
                return None
            new, edit = await actions.base_question(self.models.generator, self.store.page(url), facts, usage,
                                                    seed=seed)
        await self._checked(edit, new, None, usage, seed)
        edits.append(edit)
        if not edit.accepted:
            record["reason"] = _why("base", edit)
            return new
        state = new
        for turn in range(self.cfg.max_edits):
            if self.hard_enough(state, max(self.cfg.min_hops, self.cfg.target_hops)):
                break
            action = self.choose(state, rng)
            if action is None:
                break
            ctx = actions.ActionContext(self.models.generator, self.store, usage, self.facts_of, rng, seed + turn + 1)
            new, edit = await action.run(ctx, state)
            await self._checked(edit, new, state, usage, seed + 1000 * (turn + 1))
            edits.append(edit)
            if edit.accepted:
                state = new
        if not self.hard_enough(state, self.cfg.min_hops):
            d = state.difficulty
            record["reason"] = (f"final: {state.hops} hop(s), {d['correct']}/{d['attempts']} tool-free attempts "
                                f"correct (needs >= {self.cfg.min_hops} hops and <= "
                                f"{self.cfg.max_solver_accuracy:g} correct)")
            return state
        if self.cfg.search_check and self.workflow is not None:
            result = await checks.search_solvable(self.workflow, self.engine, self.models.judge, state,
                                                  attempts=self.cfg.search_attempts, mode=self.cfg.difficulty_judge,
                                                  item_id=record["id"], seed=seed)
            record["search"] = result.detail
            if self.cfg.require_search_solvable and not result.passed:
                record["reason"] = f"search: {result.reason}"
                return state
        record["status"] = "accepted"
        return state


def _why(stage: str, edit: Edit) -> str:
    failed = edit.failed_check()
    return f"{stage}: {failed.name}: {failed.reason}" if failed is not None else f"{stage}: {edit.note}"
