"""Data generation configuration (section `datagen`; the world's section is `world.config.WorldConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from agent.config import JudgeConfig, WorkflowConfig
from core.ranges import ranged

if TYPE_CHECKING:
    from serving.config import EngineConfig
    from world.config import WorldConfig

LinkSource = Literal["mentions", "file"]
DifficultyJudge = Literal["llm", "match"]
UniquenessJudge = Literal["llm", "statements"]
Extractor = Literal["llm", "sentences"]


@dataclass
class LLMConfig:
    """One model of the synthesis pipeline (generator or solver): any engine backend or OpenAI endpoint."""

    backend: str = "embedded"
    """An engine backend (serving/backends.py): `embedded` (in this process; roles naming the same embedded
    model share one copy), `http`, `vllm`, `sglang` (servers at `urls`); or `openai` (any OpenAI-compatible
    chat endpoint at `urls[0]`)."""
    model: str = "smollm2-135m-instruct"
    """A model spec for the engine backends, the model name sent to an `openai` endpoint."""
    urls: list[str] = field(default_factory=list)
    """Server base URLs (`http`/`vllm`/`sglang`), or the API base of an `openai` endpoint."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding an `openai` endpoint's key (never written to configs or logs)."""
    max_new_tokens: int = ranged(384, ge=1)
    """Most tokens of one reply."""
    temperature: float = 0.7
    """Sampling temperature (the solver's attempts use `DatagenConfig.solver_temperature`)."""
    timeout_s: float = ranged(300.0, gt=0)
    """Timeout of one call, in seconds; a call that times out ends the item as an `error`, never a verdict."""
    usd_per_mtok_in: float = 0.0
    """Price of a million prompt tokens, for the run's cost accounting (0 for local models)."""
    usd_per_mtok_out: float = 0.0
    """Price of a million generated tokens."""


@dataclass
class DatagenConfig:
    """The QA-synthesis pipeline (`hexsearch datagen`); see docs/datagen.md for each stage and check."""

    out: str = ""
    """Output folder (qa.jsonl, qa_{train,dev,test}.jsonl, items.jsonl, report.json/md). `--out` sets it."""
    num_questions: int = ranged(20, ge=1)
    """Accepted questions to produce (`--n`); the run stops when it has them or `max_items` are spent."""
    max_items: int = 0
    """Most items (seed pages) to attempt in total; 0: 5 x num_questions."""
    concurrency: int = ranged(8, ge=1)
    """Items synthesised at the same time (their LLM calls are batched by the engine)."""
    corpus: str = "world"
    """`world` (the offline world of the `world` section, with ground truth), or a JSONL of pages
    ({url, contents} with the title as the first line, or {url, title, text}); passages of a search corpus
    ({url or title, contents}) are joined into pages by url."""
    seeds: str = ""
    """Optional QA JSONL of seed questions to edit instead of writing base questions from sampled pages. Each
    row needs `question`, `answer` and its source pages as `pages` or `chain` (corpus urls; the world's
    qa_*.jsonl rows have `chain`). Item i starts from row i (cycling)."""
    links: str = ""
    """Optional JSONL {url, links: [url, ...]} of the corpus's link graph (`link_source: file`)."""
    link_source: LinkSource = "mentions"
    """`mentions`: a page links to every page whose title it mentions (both directions), or `file`: `links`."""
    extract: Extractor = "sentences"
    """How a page's facts ("information points") are found: `llm` (the generator lists them, as ASearcher
    does) or `sentences` (the page's sentences, a leading pronoun replaced by the title: no LLM call, and the
    only extractor a 135M model can drive; the world's pages state one fact per sentence)."""
    max_page_chars: int = ranged(12000, ge=1)
    """Characters of a page shown to the extraction prompt."""
    max_info_points: int = ranged(16, ge=1)
    """Most information points kept per page."""
    actions: list[str] = field(default_factory=lambda: ["fuzz", "inject"])
    """Edit actions to draw from after the base question: names in datagen.actions.ACTIONS (`fuzz` obscures a
    revealing detail, `inject` chains in a fact about a linked entity, one hop more) or `pkg.mod:attr`."""
    max_edits: int = 4
    """Most edit attempts per item after the base question (accepted or not)."""
    min_hops: int = ranged(1, ge=1, at_most="max_hops")
    """Fewest source pages an accepted question needs."""
    target_hops: int = ranged(2, ge=1, at_most="max_hops")
    """Depth the agent edits towards: `inject` is chosen while the question has fewer source pages, and
    editing stops once it has this many and is hard enough (or `max_edits` are spent)."""
    max_hops: int = ranged(4, ge=1)
    """Most source pages; `inject` is not drawn beyond it."""
    solver_attempts: int = ranged(4, ge=1)
    """Tool-free attempts per difficulty check (n in k/n)."""
    solver_temperature: float = 0.6
    """Sampling temperature of the solver's attempts."""
    max_solver_accuracy: float = ranged(0.25, le=1)
    """An item is accepted only if at most this fraction of the final question's tool-free attempts are
    correct; an item stops editing once it is both this hard and `min_hops` deep."""
    difficulty_judge: DifficultyJudge = "match"
    """How a tool-free attempt is judged: `llm` (the judge model, `datagen.judge`) or `match` (normalised
    exact match or the gold answer contained in the attempt, no LLM). A 135M judge calls most attempts
    correct, so the CPU default is `match`; use `llm` with a capable judge (free-form answers)."""
    uniqueness_judge: UniquenessJudge = "statements"
    """How a wrong attempt is checked as a second answer: `llm` (the generator weighs it against every
    condition of the question, ASearcher's check) or `statements` (no LLM: it fits when a supporting
    statement states it). A 135M model answers YES to nearly every candidate, so the CPU default is
    `statements`; use `llm` with a capable generator."""
    max_alternatives: int = 3
    """Wrong attempts checked for uniqueness per edit (the distinct ones, most frequent first)."""
    search_check: bool = False
    """Also let the search agent (the training workflow, with tools) answer each accepted question."""
    search_attempts: int = ranged(2, ge=1)
    """Search-agent attempts per question when `search_check` is on."""
    require_search_solvable: bool = False
    """Reject a question none of whose search attempts is correct (needs `search_check`)."""
    dedup_threshold: float = ranged(0.92, gt=0, le=1)
    """Question-embedding cosine similarity (MiniLM) at or above which a later question is a near-duplicate;
    1.0 keeps near-duplicates (exact duplicates of question and answer are always removed)."""
    splits: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1])
    """Train/dev/test fractions; split by answer, so no answer appears in two splits."""
    source: str = "hexsearch-synth"
    """The `source` field of every row."""
    generator: LLMConfig = field(default_factory=LLMConfig)
    """The model that extracts facts, writes, fuzzes and chains questions, and checks validity and coverage."""
    solver: LLMConfig = field(default_factory=lambda: LLMConfig(max_new_tokens=64))
    """The tool-free solver of the difficulty check (and the source of the uniqueness check's candidates)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """The judge of solver attempts (any backend, verdicts cached) and of the uniqueness check."""


class DatagenRunConfig(WorkflowConfig, Protocol):
    """The sections of the whole config (hexsearch.config.HexConfig) a synthesis run (datagen/run.py) reads:
    its own, the corpus world's, and the policy engine and workflow of the search check."""

    engine: EngineConfig
    world: WorldConfig
    datagen: DatagenConfig
