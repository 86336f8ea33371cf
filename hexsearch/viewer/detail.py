"""One trajectory as the trajectory and group pages show it: a turn-by-turn timeline and a token view.

A trajectory stores tokens, not text (agent/trajectory.py). Its segments are cut into runs of equal
loss mask: a run of 1s is one LLM call's output (turn k is the k-th such run, matched with
`meta.turns[k]` and the tool calls of turn k), a run of 0s is text the policy did not write (the
prompt, tool results as the model saw them, stubs, prefilled tags). Runs are decoded with the
tokenizer of the run's model (`engine.model` in its config.yaml); when it cannot be loaded the pages
show token ids and say why.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)
MAX_TOKENS = 60_000
"""Token views longer than this are cut (the page says so)."""


_LOAD_LOCK = threading.Lock()
"""One tokenizer load at a time: two threads importing transformers at once can see it half-initialised."""


@functools.lru_cache(maxsize=4)
def _load(spec: str) -> Any:
    from serving.models import load_tokenizer

    return load_tokenizer(spec)


def _tokenizer(spec: str) -> Any:
    with _LOAD_LOCK:
        return _load(spec)


def tokenizer_for(spec: str) -> tuple[Any, str | None]:
    """(tokenizer or None, why not)."""
    if not spec:
        return None, "the run's config.yaml names no engine.model"
    try:
        return _tokenizer(spec), None
    except Exception as e:  # any loading problem: the page shows ids instead of text
        log.warning("viewer: tokenizer of %s not loaded: %s", spec, e)
        return None, f"tokenizer of {spec!r} not loaded ({type(e).__name__}: {str(e)[:160]})"


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(mask value, start, end) of each maximal run of equal mask values."""
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def _decode(tok: Any, ids: list[int]) -> str:
    if tok is None:
        return " ".join(map(str, ids))
    return tok.decode(ids, skip_special_tokens=False)


def _segments(d: dict[str, Any]) -> list[dict[str, Any]]:
    segs = d.get("segments") or []
    if not isinstance(segs, list):
        raise ValueError("`segments` is not a list")
    for i, s in enumerate(segs):
        n = len(s.get("token_ids") or [])
        for key in ("loss_mask", "logprobs", "versions"):
            if len(s.get(key) or []) != n:
                raise ValueError(f"segment {i}: {key} has {len(s.get(key) or [])} entries for {n} tokens")
    return segs


def timeline(d: dict[str, Any], tok: Any) -> list[dict[str, Any]]:
    """The episode in order: prompt, each turn (its text, tool calls, timing), what came back, segment starts."""
    segs = _segments(d)
    turns = (d.get("meta") or {}).get("turns") or []
    calls = d.get("tool_calls") or []
    out: list[dict[str, Any]] = []
    k = 0
    for si, seg in enumerate(segs):
        if si > 0:
            out.append({"kind": "segment", "segment": si,
                        "text": "new segment: the context policy rewrote earlier context (stubs below)"})
        for value, a, b in _runs(seg["loss_mask"]):
            text = _decode(tok, seg["token_ids"][a:b])
            if value:
                info = turns[k] if k < len(turns) and isinstance(turns[k], dict) else {}
                out.append({"kind": "turn", "turn": k, "segment": si, "text": text, "tokens": b - a,
                            "finish": info.get("finish"), "llm_s": info.get("llm_s"), "call": info.get("kind"),
                            "tool_calls": [c for c in calls if isinstance(c, dict) and c.get("turn") == k]})
                k += 1
            else:
                out.append({"kind": "prompt" if si == 0 and a == 0 else "context", "segment": si,
                            "text": text, "tokens": b - a})
    if not segs:  # a trajectory without tokens (an engine error before the first call): the calls alone
        out += [{"kind": "turn", "turn": c.get("turn"), "text": "", "tokens": 0, "tool_calls": [c]} for c in calls]
    return out


def token_view(d: dict[str, Any], tok: Any) -> dict[str, Any]:
    """Every token of every segment: its text, loss mask, behaviour log-prob and weight version."""
    segs, out, total = _segments(d), [], 0
    for seg in segs:
        ids = seg["token_ids"][: max(0, MAX_TOKENS - total)]
        total += len(ids)
        pieces = tok.batch_decode([[i] for i in ids]) if tok is not None and ids else [str(i) for i in ids]
        n = len(ids)
        out.append({"ids": ids, "text": pieces, "mask": seg["loss_mask"][:n], "logprobs": seg["logprobs"][:n],
                    "versions": seg["versions"][:n]})
    all_tokens = sum(len(s["token_ids"]) for s in segs)
    trained = sum(sum(s["loss_mask"]) for s in segs)
    return {"segments": out, "tokens": all_tokens, "trained": trained, "cut": all_tokens > total}


def detail(d: dict[str, Any], model: str, *, tokens: bool = True) -> dict[str, Any]:
    """What the trajectory page shows (everything but the token arrays when `tokens` is False)."""
    tok, why = tokenizer_for(model)
    head = {k: d.get(k) for k in ("question_id", "question", "gold", "prediction", "stop_reason", "num_turns",
                                  "format_errors", "reward", "reward_info", "timings", "group_id")}
    meta = d.get("meta") or {}
    head["meta"] = {k: v for k, v in meta.items() if k != "turns"}
    out = {"head": head, "timeline": timeline(d, tok), "tokenizer_problem": why}
    if tokens:
        out["tokens"] = token_view(d, tok)
    else:
        segs = _segments(d)
        out["trained"] = sum(sum(s["loss_mask"]) for s in segs)
    return out


def group_view(members: list[tuple[int, dict[str, Any]]], estimator: str, model: str) -> dict[str, Any]:
    """A group's trajectories with their rewards and the advantages the trainer gave them."""
    from trainer.advantages import ESTIMATORS, group_advantages, has_signal

    rewards = [float(d.get("reward") or 0.0) for _, d in members]
    estimator = estimator if estimator in ESTIMATORS else "grpo"
    advantages = group_advantages(rewards, estimator)
    return {"estimator": estimator, "signal": has_signal(rewards), "rewards": rewards,
            "members": [{"n": n, "advantage": a, **detail(d, model, tokens=False)}
                        for (n, d), a in zip(members, advantages, strict=True)]}
