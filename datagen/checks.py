"""The checks run after every edit, each a separate, logged `CheckResult`, in this order (the first
failure rejects the edit and the rest are not run):

1. **guard** (rules, no LLM): one question (a single `?`, at the end), a short answer (at most 12
   words), the answer not given away in the question, a question of 4-120 words.
2. **validity** (generator, VALIDITY prompt): asks for one thing, answerable from the statements, one
   answer only. Passes only on an explicit `VALID: YES`.
3. **difficulty** (solver + judge): `solver_attempts` tool-free answers at `solver_temperature`, each
   judged against the answer (the LLM judge of agent/judge.py, or `match`: normalised exact match or the
   answer contained in the attempt; an unreadable LLM verdict falls back to `match`); k/n is recorded.
   It fails when the edit made the question easier (more correct attempts than before the edit).
4. **uniqueness** (generator, ALTERNATIVE prompt): each distinct wrong attempt (the `max_alternatives`
   most frequent) is checked against every condition of the question; any `FITS: YES` rejects the edit,
   and so does a verdict that cannot be read (a check that cannot confirm uniqueness does not pass).
   With `uniqueness_judge: statements` no LLM is asked: a candidate fits when a supporting statement
   states it.

`coverage` (inject only) runs inside the action (datagen/actions.py); `search` (optional) runs once
on the final question (`search_solvable`), through the same workflow as training.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from agent.rewards import normalize_answer
from datagen import prompts as P
from datagen.actions import QAState, contains_answer
from datagen.config import DatagenConfig
from datagen.llm import ChatLLM, Usage
from datagen.record import CheckResult


def guard(state: QAState) -> CheckResult:
    """Rule-based sanity of a question/answer pair (see module docstring)."""
    q, a = state.question.strip(), state.answer.strip()
    problems = []
    if q.count("?") != 1 or not q.endswith("?"):
        problems.append("not exactly one question ending in '?'")
    if not 4 <= len(q.split()) <= 120:
        problems.append(f"question of {len(q.split())} words")
    if not a or len(a.split()) > 12:
        problems.append(f"answer of {len(a.split())} words")
    if contains_answer(q, a):
        problems.append("the question contains the answer")
    return CheckResult("guard", not problems, "; ".join(problems))


async def validity(gen: ChatLLM, state: QAState, usage: Usage, *, seed: int) -> CheckResult:
    """The generator's verdict on validity; only an explicit YES passes."""
    reply = await gen.complete(P.messages(P.VALIDITY, question=state.question, answer=state.answer,
                                          facts=P.numbered([s.text for s in state.statements])),
                               usage, temperature=0.0, seed=seed, prefill="VALID:")
    verdict = P.yes_no(reply, "VALID")
    reason = "" if verdict else ("judged invalid" if verdict is False else "unreadable verdict")
    return CheckResult("validity", bool(verdict), reason, {"raw": reply[-300:]})


def match(prediction: str, answer: str) -> bool:
    """Normalised exact match, or the answer contained in the prediction (cover-EM)."""
    p, a = normalize_answer(prediction), normalize_answer(answer)
    return bool(a) and (p == a or f" {a} " in f" {p} ")


async def _judged(judge: Any, mode: str, question: str, answer: str, prediction: str) -> tuple[bool, bool | None]:
    """(correct, the LLM verdict or None) of one attempt."""
    if mode == "match" or not prediction:
        return match(prediction, answer), None
    verdict = (await judge.judge(question, [answer], prediction)).correct
    return (match(prediction, answer) if verdict is None else verdict), verdict


async def difficulty(solver: ChatLLM, judge: Any, state: QAState, usage: Usage, *, attempts: int,
                     temperature: float, mode: str, seed: int, previous: dict | None) -> CheckResult:
    """k/n tool-free attempts correct; fails when the edit made the question easier than `previous`."""
    replies = await asyncio.gather(*(
        solver.complete(P.messages(P.SOLVE, question=state.question), usage, temperature=temperature, seed=seed + i,
                         prefill="Answer:")
        for i in range(attempts)))
    predictions = [_answer_line(r) for r in replies]
    judged = await asyncio.gather(*(_judged(judge, mode, state.question, state.answer, p) for p in predictions))
    correct = sum(ok for ok, _ in judged)
    record = {"correct": correct, "attempts": attempts, "predictions": predictions,
              "correct_each": [ok for ok, _ in judged],
              "unparsed_verdicts": sum(1 for p, (_, v) in zip(predictions, judged, strict=True) if p and mode == "llm" and v is None)}
    state.difficulty = record
    easier = previous is not None and correct > previous["correct"]
    reason = f"easier than before the edit ({correct}/{attempts} > {previous['correct']}/{attempts})" if easier else ""
    return CheckResult("difficulty", not easier, reason, record)


def _answer_line(reply: str) -> str:
    got = P.labelled(reply, "Answer")
    if got is not None:
        return got["answer"]
    lines = [ln.strip() for ln in reply.strip().splitlines() if ln.strip()]
    return lines[0][:200] if lines else ""


async def uniqueness(gen: ChatLLM, state: QAState, usage: Usage, *, max_alternatives: int, seed: int,
                     mode: str = "llm") -> CheckResult:
    """No wrong attempt also satisfies the question (see module docstring). `mode="statements"` asks no
    LLM: a candidate fits when a supporting statement states it (whole words), i.e. the evidence itself
    offers a second answer."""
    record = state.difficulty or {"predictions": [], "correct_each": []}
    wrong = Counter(normalize_answer(p) for p, ok in zip(record["predictions"], record["correct_each"], strict=True)
                    if not ok and normalize_answer(p))
    originals = {normalize_answer(p): p for p in record["predictions"]}
    candidates = [originals[w] for w, _ in wrong.most_common(max_alternatives)]
    if mode == "statements":
        stated = [c for c in candidates if any(contains_answer(s.text, c) for s in state.statements)]
        detail = {"candidates": candidates, "stated": stated, "mode": mode}
        return CheckResult("uniqueness", not stated, f"another answer fits: {stated[0]!r}" if stated else "", detail)
    facts = P.numbered([s.text for s in state.statements])
    replies = await asyncio.gather(*(
        gen.complete(P.messages(P.ALTERNATIVE, question=state.question, answer=state.answer, facts=facts,
                                candidate=c), usage, temperature=0.0, seed=seed, prefill="FITS:")
        for c in candidates))
    verdicts = [P.yes_no(r, "FITS") for r in replies]
    detail = {"candidates": candidates, "verdicts": verdicts}
    fits = [c for c, v in zip(candidates, verdicts, strict=True) if v]
    if fits:
        return CheckResult("uniqueness", False, f"another answer fits: {fits[0]!r}", detail)
    if any(v is None for v in verdicts):
        return CheckResult("uniqueness", False, "unreadable verdict", detail | {"raw": replies[verdicts.index(None)][-200:]})
    return CheckResult("uniqueness", True, "", detail)


async def search_solvable(workflow: Any, engine: Any, judge: Any, state: QAState, *, attempts: int, mode: str,
                          item_id: str, seed: int) -> CheckResult:
    """The search agent, through the training workflow, answers the question with tools; k/n recorded."""
    from agent.qa import QAItem

    item = QAItem(id=item_id, question=state.question, answers=[state.answer])
    trajs = await asyncio.gather(*(workflow.arun_episode(engine, item, seed=seed + i, request_id=f"{item_id}/search/{i}")
                                   for i in range(attempts)))
    predictions = [t.prediction or "" for t in trajs]
    judged = await asyncio.gather(*(_judged(judge, mode, state.question, state.answer, p) for p in predictions))
    correct = sum(ok for ok, _ in judged)
    record = {"correct": correct, "attempts": attempts, "predictions": predictions,
              "stop_reasons": [t.stop_reason for t in trajs]}
    return CheckResult("search", correct > 0, "" if correct else "the search agent never found the answer", record)


async def run_edit_checks(edit: Any, state: QAState, previous: dict | None, *, gen: ChatLLM, solver: ChatLLM,
                          judge: Any, cfg: DatagenConfig, usage: Usage, seed: int) -> None:
    """Run guard, validity, difficulty, uniqueness on the edit's result in order, appending each result to
    `edit.checks`, until one fails; `edit.accepted` ends up true only when all passed."""
    async def in_order():  # lazily, so a failed check spares the LLM calls of the ones after it
        yield guard(state)
        yield await validity(gen, state, usage, seed=seed)
        yield await difficulty(solver, judge, state, usage, attempts=cfg.solver_attempts,
                               temperature=cfg.solver_temperature, mode=cfg.difficulty_judge, seed=seed,
                               previous=previous)
        yield await uniqueness(gen, state, usage, max_alternatives=cfg.max_alternatives, seed=seed,
                               mode=cfg.uniqueness_judge)

    edit.accepted = True
    async for result in in_order():
        edit.checks.append(result)
        if not result.passed:
            edit.accepted = False
            return
