"""Rule-based answer scorers, each `fn(prediction: str | None, golds: list[str]) -> float`.

Every scorer is the max over gold aliases of a per-gold score in [0, 1], and 0.0 when the prediction is
None (the agent never answered) or there are no golds.

**gaia** — the GAIA leaderboard's quasi-exact match (`gaia-benchmark/leaderboard` `scorer.py`,
`question_scorer`), with its rules and no extra leniency. `float()` below is Python's: it accepts
surrounding whitespace, exponents ("1e3"), underscores ("1_000"), "inf" and "nan".

1. Number: when `float(gold)` succeeds, the prediction with every `$`, `%` and `,` removed must `float()`
   to exactly `float(gold)` (no tolerance): "$1,000" = "1000", "15%" = "15", "1.0" = "1", but "1 000",
   "17 km", "0.5" vs "1/2" are wrong. A prediction that does not parse is wrong. (The official code
   maps it to `inf`, which would equal a gold of "inf"; here it is simply wrong.)
2. List: else, when the gold contains `,` or `;`, both are split on `[,;]` (`re.split`, empty pieces
   kept); the lengths must match (the official scorer warns "Answer lists have different lengths,
   returning False." — the same UserWarning is raised here) and every position must match, in order:
   a gold element that `float()`s is compared as a number by rule 1; any other element by
   `normalize_str(x, remove_punct=False)`: lowercase and ALL whitespace removed, punctuation KEPT
   ("New York" = "newyork", "St. Louis" != "St Louis"). A gold like "1,000" is thus a two-element
   list ("1", "000"): "1,000" matches it and "1000" does not — as on the leaderboard.
3. String: else `normalize_str(x)` on both: lowercase, ALL whitespace removed, ASCII punctuation
   (`string.punctuation`) removed; "sea gull" = "Seagull", "U.S.A." = "usa". Articles are NOT removed
   ("the Beatles" != "Beatles").

**em / f1 / sub_em** — SQuAD normalisation (agent.rewards): lowercase, ASCII punctuation dropped, articles
a/an/the dropped, whitespace collapsed. em: normalised strings equal. f1: token F1 with multiset overlap.
sub_em: the normalised gold's tokens appear as a contiguous run in the prediction's (word-level; ASearcher's
`subem_check` tests character substrings, so "art" in "party" counts there and not here).

**cover_em** — ASearcher's CEM (`evaluation/evaluate.py`, `cover_exact_match_score_1`): with
`bool_mapping` ("True" -> "yes", "False" -> "no", exact strings only) and SQuAD normalisation,
    cover_em(p, g) = 1 if every token of norm(g).split(" ") is in norm(p).split(" ") else 0
i.e. all gold words appear somewhere in the prediction, in any order and not necessarily adjacent
("Paris France" covers "France, Paris"). A gold that normalises to "" (e.g. "the") is covered only by
a prediction that also normalises to "" (`"".split(" ") == [""]`), as in ASearcher.

**set_f1** — ASearcher's training reward F1 over token *sets* (agent.rewards.set_f1: punctuation to
spaces, no article removal, CJK characters as single tokens).
**asearcher_f1** — ASearcher's *evaluation* F1 (`evaluate.py` `f1_score`), which its tables report: the
same set F1 but without CJK splitting (a run of Chinese characters is one token) and 0 when either side has
no tokens.
"""

from __future__ import annotations

import re
import string
import warnings
from collections.abc import Callable, Sequence

from agent.rewards import best_over, exact_match, f1_score, normalize_answer, set_f1, sub_em
from core.registry import Registry

Scorer = Callable[[str | None, Sequence[str]], float]

SCORERS = Registry("scorer", "eval.scorers")
"""Scorers by name (what `eval.scorers` lists in a config; `pkg.mod:fn` names a user scorer)."""

_LIST_SPLIT = re.compile(r"[,;]")
_WHITESPACE = re.compile(r"\s")
_PUNCT_TABLE = str.maketrans("", "", string.punctuation)


# ---- GAIA ---------------------------------------------------------------------------------------------


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def gaia_number(text: str) -> float | None:
    """The official `normalize_number_str`: `$`, `%` and `,` removed, then `float()`; None when that fails."""
    for ch in ("$", "%", ","):
        text = text.replace(ch, "")
    try:
        return float(text)
    except ValueError:
        return None


def gaia_normalize_str(text: str, remove_punct: bool = True) -> str:
    """The official `normalize_str`: all whitespace removed, lowercased, ASCII punctuation optionally removed."""
    text = _WHITESPACE.sub("", text).lower()
    return text.translate(_PUNCT_TABLE) if remove_punct else text


def _gaia_number_match(prediction: str, gold: str) -> bool:
    value = gaia_number(prediction)
    return value is not None and value == float(gold)


def gaia_match(prediction: str, gold: str) -> bool:
    """GAIA's `question_scorer(prediction, gold)` (rules 1-3 of the module docstring)."""
    if _is_float(gold):
        return _gaia_number_match(prediction, gold)
    if "," in gold or ";" in gold:
        gold_elems, pred_elems = _LIST_SPLIT.split(gold), _LIST_SPLIT.split(prediction)
        if len(gold_elems) != len(pred_elems):
            warnings.warn("Answer lists have different lengths, returning False.", UserWarning, stacklevel=2)
            return False
        return all(_gaia_number_match(p, g) if _is_float(g)
                   else gaia_normalize_str(p, remove_punct=False) == gaia_normalize_str(g, remove_punct=False)
                   for p, g in zip(pred_elems, gold_elems, strict=True))
    return gaia_normalize_str(prediction) == gaia_normalize_str(gold)


@SCORERS.register("gaia")
def gaia(prediction: str | None, golds: Sequence[str]) -> float:
    """GAIA quasi-exact match, max over gold aliases."""
    if prediction is None:
        return 0.0
    return max((float(gaia_match(prediction, g)) for g in golds), default=0.0)


# ---- SQuAD and ASearcher --------------------------------------------------------------------------------


def _over_golds(metric: Callable[[str, str], float], name: str) -> Scorer:
    """A scorer from a per-gold metric, registered in SCORERS as `name`."""

    def scorer(prediction: str | None, golds: Sequence[str]) -> float:
        return 0.0 if prediction is None else float(best_over(metric, prediction, list(golds)))

    return SCORERS.register(name)(scorer)


em = _over_golds(exact_match, "em")
em.__doc__ = "SQuAD exact match, max over gold aliases."
f1 = _over_golds(f1_score, "f1")
f1.__doc__ = "SQuAD token F1 (multiset overlap), max over gold aliases."
sub_em_scorer = _over_golds(sub_em, "sub_em")
sub_em_scorer.__doc__ = "SQuAD sub-EM (gold tokens as a contiguous run in the prediction), max over gold aliases."
set_f1_scorer = _over_golds(set_f1, "set_f1")
set_f1_scorer.__doc__ = "ASearcher's set-token F1 (training reward), max over gold aliases."


def _bool_mapping(text: str) -> str:
    """ASearcher's `bool_mapping`: the exact strings "True"/"False" become "yes"/"no"."""
    return {"True": "yes", "False": "no"}.get(text, text)


def cover_match(prediction: str, gold: str) -> float:
    """ASearcher's `cover_exact_match_score_1` for one gold (see the module docstring)."""
    pred_tokens = normalize_answer(_bool_mapping(prediction)).split(" ")
    gold_tokens = normalize_answer(_bool_mapping(gold)).split(" ")
    return float(all(t in pred_tokens for t in gold_tokens))


cover_em = _over_golds(cover_match, "cover_em")
cover_em.__doc__ = "ASearcher's cover exact match (every gold word appears in the prediction), max over golds."


def _asearcher_eval_tokens(text: str) -> set[str]:
    """ASearcher's `normalize_text`: punctuation to spaces, whitespace collapsed, lowercased, then split."""
    return set(text.translate(str.maketrans(string.punctuation, " " * len(string.punctuation))).lower().split())


def asearcher_f1_match(prediction: str, gold: str) -> float:
    """ASearcher's evaluation `f1_score` for one gold: set-token F1, 0 when either side has no tokens."""
    p, g = _asearcher_eval_tokens(prediction), _asearcher_eval_tokens(gold)
    same = len(p & g)
    if not p or not g or not same:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


asearcher_f1 = _over_golds(asearcher_f1_match, "asearcher_f1")
asearcher_f1.__doc__ = "ASearcher's evaluation F1 (set tokens, no CJK splitting), max over gold aliases."


def get_scorer(name: str) -> Scorer:
    """The scorer a name or `pkg.mod:fn` names; ComponentError (a ValueError) naming the valid ones otherwise."""
    return SCORERS.resolve(name)


def score_all(prediction: str | None, golds: Sequence[str], names: Sequence[str]) -> dict[str, float]:
    """{name: score} for each named scorer (unknown names raise ValueError before anything is scored)."""
    fns = [(name, get_scorer(name)) for name in names]
    golds = list(golds)
    return {name: fn(prediction, golds) for name, fn in fns}
