"""Answer rewards: EM, F1, sub-EM (SQuAD normalisation), ASearcher's set-F1, and the episode reward.

SQuAD normalisation (`normalize_answer`), applied in this order:
    lowercase -> drop ASCII punctuation -> drop the articles a/an/the (whole words) -> collapse whitespace

    em(p, g)     = 1 if norm(p) == norm(g) else 0
    f1(p, g)     = 2 P R / (P + R), P = |common| / |tokens(p)|, R = |common| / |tokens(g)|, where
                   common is the multiset intersection of the normalised tokens (SQuAD); 1 when both
                   are empty, 0 when only one is
    sub_em(p, g) = 1 if the tokens of norm(g) appear as a contiguous run in the tokens of norm(p)
                   (word-level containment: "1642" is in "in 1642", "art" is not in "party")
    set_f1(p, g) = F1 over token *sets* after ASearcher's normalisation (lowercase, punctuation to
                   spaces, no article removal), with CJK characters as single tokens (digit and Latin
                   runs stay whole): kept for comparability with ASearcher's numbers

Every answer score is a *reward function* in the REWARDS registry (`agent.reward_fn`: a name
below or `package.module:function`; see RewardInput). Built-ins: f1, em, sub_em, set_f1, judge.

Episode reward (`episode_reward`), with s(p, G) = max over gold aliases g in G of the metric:
    s     = s(p, answers)                                          without aug answers
    s     = (1 - w) s(p, answers) + w max(s(p, answers), s(p, aug)) with aug answers (ASearcher w = 0.3)
    r     = 0                        when the agent never answered
    r     = 0                        when `format_gate` and any turn had a format error
    r     = invalid_penalty (-0.5)   when the prompt was forced-valid and the answer says the question
                                     is invalid (overrides the gate, as in ASearcher)
    r     = under_search_penalty     when `agent.under_search_penalty` != 0 and the agent answered after
                                     fewer distinct successful tool calls than the question's
                                     `min_searches` (a guess: no fewer searches can answer it); off by default
So an answer matching only an aug alias earns w; matching a main answer earns 1.
"""

from __future__ import annotations

import inspect
import math
import re
import string
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent.config import AgentConfig
from agent.trajectory import call_key
from core.registry import ComponentError, Registry

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_INVALID_WORDS = {"invalid", "valid", "question", "appropriate"}


def normalize_answer(s: str) -> str:
    """SQuAD normalisation: lowercase, no punctuation, no articles, single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(pred: str, gold: str) -> float:
    return float(normalize_answer(pred) == normalize_answer(gold))


def f1_score(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def sub_em(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not g:
        return float(not p)
    return float(any(p[i:i + len(g)] == g for i in range(len(p) - len(g) + 1)))


def _set_tokens(s: str) -> set[str]:
    s = "".join(" " if ch in _PUNCT else ch for ch in s.lower())
    s = _CJK.sub(lambda m: f" {m.group(0)} ", s)
    return set(s.split())


def set_f1(pred: str, gold: str) -> float:
    p, g = _set_tokens(pred), _set_tokens(gold)
    if not p or not g:
        return float(p == g)
    same = len(p & g)
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


METRICS: dict[str, Callable[[str, str], float]] = {"em": exact_match, "f1": f1_score, "sub_em": sub_em,
                                                   "set_f1": set_f1}


def best_over(metric: Callable[[str, str], float], pred: str, golds: Sequence[str]) -> float:
    """Max of a metric over gold aliases (0 when there are none)."""
    return max((metric(pred, g) for g in golds), default=0.0)


def answer_score(pred: str, golds: Sequence[str], aug: Sequence[str] = (), metric: str = "f1",
                 aug_weight: float = 0.3) -> float:
    """s of the module docstring: the metric against the answers, with aug answers weighted by w."""
    fn = METRICS[metric]
    s = best_over(fn, pred, golds)
    if not aug:
        return s
    return (1 - aug_weight) * s + aug_weight * max(s, best_over(fn, pred, aug))


def says_invalid(pred: str) -> bool:
    """True when an answer declares the question invalid (ASearcher's keywords, matched as whole words)."""
    return bool(_INVALID_WORDS & set(normalize_answer(pred).split()))


def episode_reward(pred: str | None, golds: Sequence[str], aug: Sequence[str] = (), *, metric: str = "f1",
                   aug_weight: float = 0.3, format_errors: int = 0, format_gate: bool = True,
                   forced_valid: bool = True, invalid_penalty: float = -0.5,
                   score: float | None = None, searches: int = 0, min_searches: int = 0,
                   under_search_penalty: float = 0.0) -> tuple[float, dict[str, Any]]:
    """The reward of an episode and what it was made of. `score` overrides the metric (an LLM judge's);
    `searches` is the episode's distinct successful tool calls (`distinct_calls`), `min_searches` the
    question's (0: unknown)."""
    info: dict[str, Any] = {"metric": metric, "answered": pred is not None, "format_ok": format_errors == 0}
    if pred is not None:
        for name, fn in METRICS.items():
            info[name] = best_over(fn, pred, golds)
    if score is not None:  # a reward function's score stands even without an answer (its own rule)
        s = score
    else:
        s = 0.0 if pred is None else answer_score(pred, golds, aug, metric, aug_weight)
    info["score"] = s
    reward = s
    if format_gate and format_errors:
        reward = 0.0
    info["invalid"] = pred is not None and forced_valid and says_invalid(pred)
    if info["invalid"]:
        reward = invalid_penalty
    info["under_searched"] = pred is not None and searches < min_searches
    if under_search_penalty and info["under_searched"] and not info["invalid"]:
        reward = under_search_penalty
    return reward, info


def distinct_calls(traj: Any) -> int:
    """How many different tool calls (name and arguments) of a trajectory returned without an error: the
    searches `under_search_penalty` counts (a repeated or failed search reads nothing new)."""
    return len({call_key(c.name, c.args) for c in traj.tool_calls if not c.error})


@dataclass
class RewardInput:
    """What a reward function sees: the finished episode and everything needed to score it."""

    prediction: str | None
    """The agent's final answer (None when it never answered)."""
    golds: list[str]
    """Gold answers (aliases)."""
    aug_answers: list[str]
    """Alternative answers (ASearcher's `aug_answer`), usually scored with `config.aug_answer_weight`."""
    question: str
    trajectory: Any
    """The agent.trajectory.Trajectory (tool calls, turns, format errors, meta) before its reward is set."""
    config: AgentConfig
    """The AgentConfig of the episode."""
    judge: Any = None
    """The LLM judge (agent.judge.LLMJudge) when `agent.reward_fn=judge`, else None."""


RewardFn = Callable[[RewardInput], "float | tuple[float, dict[str, Any]] | Awaitable[Any]"]
REWARDS = Registry("reward function", "agent.reward_fn")
"""Reward functions by name; `agent.reward_fn` also takes an import path `package.module:function`.

A reward function takes a RewardInput and returns the answer score s (a float), or (s, info) where
info is a dict merged into the trajectory's `reward_info`; it may be `async`. The episode reward is
then `episode_reward(...)` with that score: the format gate and the invalid-answer penalty apply."""


def _metric_reward(metric: str) -> RewardFn:
    def reward(x: RewardInput) -> float:
        if x.prediction is None:
            return 0.0
        return answer_score(x.prediction, x.golds, x.aug_answers, metric, x.config.aug_answer_weight)

    reward.__name__ = reward.__qualname__ = f"{metric}_reward"
    reward.__doc__ = f"The {metric} score against the gold answers (aug answers weighted by w)."
    return reward


for _name in METRICS:
    REWARDS.add(_name, _metric_reward(_name))


@REWARDS.register("judge")
async def judge_reward(x: RewardInput) -> tuple[float, dict[str, Any]]:
    """1 when the LLM judge says the answer matches a gold answer, w when it matches only an aug answer."""
    if x.judge is None:
        raise ValueError("agent.reward_fn=judge but no judge was built (see agent.judge)")
    if x.prediction is None or not x.golds:
        return 0.0, {}
    from agent.judge import judge_info

    verdict = await x.judge.judge(x.question, list(x.golds), x.prediction)
    score, extra = float(bool(verdict.correct)), judge_info(verdict)
    if not verdict.correct and x.aug_answers:
        verdict_aug = await x.judge.judge(x.question, list(x.aug_answers), x.prediction)
        score = x.config.aug_answer_weight * float(bool(verdict_aug.correct))
        extra["judge_aug"] = verdict_aug.correct
    return score, extra


def resolve_reward(spec: str) -> RewardFn:
    """The reward function a spec names (a built-in or `package.module:function`)."""
    fn = REWARDS.resolve(spec)
    if not callable(fn):
        raise ComponentError(f"agent.reward_fn: '{spec}' is not callable")
    return fn


async def score_episode(traj: Any, golds: Sequence[str], aug: Sequence[str], config: AgentConfig, forced_valid: bool,
                        judge: Any = None, reward_fn: RewardFn | None = None) -> tuple[float, dict[str, Any]]:
    """The reward of a finished trajectory: the score of `reward_fn` (default: `config.reward_fn` resolved)
    through `episode_reward`'s format gate and invalid-answer penalty."""
    fn = reward_fn or resolve_reward(config.reward_fn)
    out = fn(RewardInput(traj.prediction, list(golds), list(aug), traj.question, traj, config, judge))
    if inspect.isawaitable(out):
        out = await out
    score, extra = out if isinstance(out, tuple) else (out, {})
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise TypeError(f"reward function {config.reward_fn!r} returned {score!r}; it must return a finite number")
    reward, info = episode_reward(traj.prediction, golds, aug, metric=config.reward_fn,
                                  aug_weight=config.aug_answer_weight, format_errors=traj.format_errors,
                                  format_gate=config.format_gate, forced_valid=forced_valid,
                                  invalid_penalty=config.invalid_penalty, score=float(score),
                                  searches=distinct_calls(traj),
                                  min_searches=int(traj.meta.get("min_searches") or 0),
                                  under_search_penalty=config.under_search_penalty)
    info.update(extra or {})
    if not golds:
        info["no_gold"] = True
    return reward, info
