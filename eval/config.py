"""Evaluation configuration (section `eval`); `hexsearch eval` options override these fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agent.config import WorkflowConfig
from core.ranges import ranged

if TYPE_CHECKING:
    from serving.config import EngineConfig
    from world.config import WorldConfig

JUDGE_KEYWORDS = ("auto", "none")
"""What `eval.judge` accepts besides a judge prompt."""
PRIMARY_KEYWORDS = ("auto", "judge")
"""What `eval.primary` accepts besides a scorer."""


@dataclass
class EvalConfig:
    suite: str = "world"
    """Suite to evaluate: a name in eval.suites.SUITES (`hexsearch config keys eval.suite` lists them; eval/loaders.py
    has the file formats; `world` is the offline world's test split) or `pkg.mod:attr` naming a `Suite`."""
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
    scorers: list[str] = field(default_factory=list)
    """Rule-based scorers: names in eval.scorers.SCORERS or `pkg.mod:fn`. Empty: the suite's own."""
    judge: str = "auto"
    """LLM judge prompt: `auto` (the suite's published judge, none for local QA and the world), `none`, a
    name in eval.judges.JUDGE_PROMPTS or `pkg.mod:attr`. The judge model is `agent.judge`."""
    primary: str = "auto"
    """What decides whether a sample is correct (Pass@k, majority vote): `judge` or a scorer name (a sample is
    correct when that score is 1). `auto`: the judge when one is used, else the suite's first scorer."""
    write_plaintext: bool = False
    """Encrypted suites (xBench, BrowseComp) are decrypted in memory only: results.jsonl keeps ids, predictions and
    scores but not the questions, gold answers or the judge's output (which quotes the gold), the judge's cache
    keeps verdicts without output, and no trajectories are saved. True writes them in clear."""
    tool_cache: bool = True
    """Cache tool results in the run folder (`tools.sqlite`), so a resumed or repeated run never re-queries the web."""
    unseen_hops: bool = True
    """`hexsearch demo-long`: its test evaluations also ask the world's test questions of more hops than
    `world.max_hops` (up to 4; `world.unseen_hop_questions`), which no stage trains on, in columns of their own."""


class EvalRunConfig(WorkflowConfig, Protocol):
    """The sections of the whole config (hexsearch.config.HexConfig) an evaluation (eval/evaluate.py, eval/runner.py)
    reads: its own, the policy engine, the world of the `world` suites, and the workflow's."""

    engine: EngineConfig
    world: WorldConfig
    eval: EvalConfig
