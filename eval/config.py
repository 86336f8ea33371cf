"""Evaluation configuration (section `eval`); `hexsearch eval` options override these fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from core.ranges import ranged

SuiteName = Literal["world", "world-test", "world-dev", "localqa", "gaia", "xbench", "browsecomp", "frames"]
ScorerName = Literal["gaia", "em", "f1", "sub_em", "cover_em", "set_f1", "asearcher_f1"]
JudgeName = Literal["xbench", "browsecomp", "gaia", "asearcher", "default"]


@dataclass
class EvalConfig:
    suite: SuiteName = "world"
    """Suite to evaluate: `world` (the offline world's test split), `localqa` (FlashRAG/Search-R1/ASearcher
    JSONL), `gaia`, `xbench`, `browsecomp` or `frames` (see eval/loaders.py for the file formats)."""
    data: str = ""
    """The suite's data file (or world folder). Empty: only `world` has a default (the configured world)."""
    limit: int = 0
    """Evaluate only the first N questions (0: all)."""
    n: int = ranged(1, ge=1)
    """Samples per question, drawn in one pass (question i, sample j always gets the same seed)."""
    k: list[int] = field(default_factory=lambda: [1])
    """Pass@k / Avg@k values to report, each at most `n` (Pass@k uses the unbiased estimator over n samples)."""
    temperature: float = ranged(-1.0, ge=None)
    """Sampling temperature; -1: greedy (0) when n = 1, else `agent.temperature`."""
    concurrency: int = ranged(16, ge=1)
    """Episodes run at once."""
    scorers: list[ScorerName] = field(default_factory=list)
    """Rule-based scorers (`gaia`, `em`, `f1`, `sub_em`, `cover_em`, `set_f1`, `asearcher_f1`). Empty: the suite's own."""
    judge: Literal["auto", "none", JudgeName] = "auto"
    """LLM judge prompt: `auto` (the suite's published judge: xbench, browsecomp, gaia for GAIA and Frames;
    none for local QA and the world), `none`, or a prompt name (`xbench`, `browsecomp`, `gaia`, `asearcher`,
    `default`). The judge model is `agent.judge`."""
    primary: Literal["auto", "judge", ScorerName] = "auto"
    """What decides whether a sample is correct (Pass@k, majority vote): `judge` or a scorer name (a sample is
    correct when that score is 1). `auto`: the judge when one is used, else the suite's first scorer."""
    write_plaintext: bool = False
    """Encrypted suites (xBench, BrowseComp) are decrypted in memory only: results.jsonl keeps ids, predictions and
    scores but not the questions, gold answers or the judge's output (which quotes the gold), the judge's cache
    keeps verdicts without output, and no trajectories are saved. True writes them in clear."""
    tool_cache: bool = True
    """Cache tool results in the run folder (`tools.sqlite`), so a resumed or repeated run never re-queries the web."""
