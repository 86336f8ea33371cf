"""Search agent configuration (section `agent`).

One agent serves training, evaluation and the demo; everything that differs between those uses is
a field here. docs/agent.md explains the fields in context (turn types, budgets, context policies,
the CPU-learning recipe, rewards).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from core.ranges import ranged

if TYPE_CHECKING:
    from core.rundir import RunConfig
    from tools.config import ToolsConfig

FormatName = Literal["asearcher", "hermes"]
Prefill = Literal["none", "tags", "answer", "think"]
PromptLayout = Literal["system", "user"]


@dataclass
class JudgeConfig:
    """An LLM judge: any engine backend, or any OpenAI-compatible chat endpoint."""

    backend: str = "embedded"
    """An engine backend (serving/backends.py): `embedded` (the model in-process; in training one shared Ray
    actor), `http` (our server), `vllm`, `sglang` (servers at `urls`); or `openai` (any OpenAI-compatible
    chat-completions endpoint at `urls[0]`)."""
    model: str = "smollm2-135m-instruct"
    """Judge model: a model spec for the engine backends, the model name sent to an `openai` endpoint."""
    urls: list[str] = field(default_factory=list)
    """Server base URLs for `http`/`vllm`/`sglang`; for `openai` the API base, e.g. https://api.openai.com/v1."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key of an `openai` endpoint (keys never go in configs or logs)."""
    max_new_tokens: int = ranged(256, ge=1)
    """Most tokens of one verdict."""
    temperature: float = 0.0
    """Sampling temperature of the first attempt (retries of an unparseable verdict sample at >= 0.7)."""
    retries: int = 2
    """Extra attempts when a verdict cannot be parsed (it then scores 0, never guessed)."""
    cache: str = ""
    """SQLite file caching verdicts. Empty: `<cache dir>/judge.sqlite`."""
    timeout_s: float = ranged(120.0, gt=0)
    """Timeout of one judge call, in seconds."""


@dataclass
class AgentConfig:
    action_format: FormatName = "asearcher"
    """`asearcher` (<search>/<access>/<answer> tags, results in <information>) or `hermes`
    (<tool_call>{"name", "arguments"}</tool_call> checked against each tool's JSON schema)."""
    context_policy: str = "read_once"
    """`read_once` (a page chunk is shown in one read turn, then only a stub and the agent's notes stay),
    `keep_last_k` (the last K tool results verbatim, older ones stubbed) or `full` (nothing is removed)."""
    keep_last_k: int = 5
    """Tool results kept verbatim by the `keep_last_k` policy."""
    compact_to: float = ranged(0.5, le=0.95)
    """Under `read_once`/`keep_last_k`: when the next call would not fit in `max_context_tokens`, the oldest
    turns are dropped (one omission line remains) until the context is at most this fraction of it, and a
    new segment begins. 0 disables dropping: the episode stops with `max_context`, as under `full`."""
    stub_chars: int = 100
    """Characters of a stubbed tool result that stay in context (ASearcher keeps 100)."""
    stub_search_results: bool = False
    """`read_once` also stubs search results after their read turn (ASearcher keeps them in full)."""
    read_search_results: bool = True
    """Give every search result its own read turn (`<think>` notes) before the next action, as ASearcher
    does; false appends results and goes straight to the next action (the CPU recipe)."""
    page_tools: list[str] = field(default_factory=lambda: ["access"])
    """Tools whose results are pages, split into chunks that are read one chunk per read turn."""
    page_chunk_chars: int = ranged(4000, ge=1)
    """Characters per page chunk when the tool did not chunk the page itself (ASearcher: 25,000)."""
    max_page_chunks: int = ranged(10, ge=1)
    """Most chunks of one page that are shown (ASearcher: 10)."""
    max_obs_chars: int = ranged(20000, ge=1)
    """Longest tool text shown in one observation; longer text is cut with a note."""
    max_turns: int = ranged(32, ge=1, le=1000)
    """Most LLM calls per episode (read turns count), up to 1,000."""
    max_new_tokens: int = ranged(512, ge=1)
    """Most new tokens per LLM call."""
    max_context_tokens: int = ranged(8192, ge=1)
    """Most tokens in one prompt plus `max_new_tokens` (capped by the engine's `max_model_len` when it reports
    one); see `compact_to` for what happens at the limit."""
    max_tool_calls: int = 64
    """Most tool calls per episode; the episode stops when the model asks for more."""
    max_repeated_calls: int = ranged(0, le=1000)
    """Close the tool budget when the model makes the same tool call (name and arguments) this many times in a
    row (0: never): the repeat is not run, and the episode goes on as if `max_tool_calls` were spent (with the
    `tags`/`answer` prefill the next act turn is `<answer>`). A greedy policy that repeats a call sees the same
    result and almost always loops to the budget: with the 40+ call budgets of long-horizon recipes those loops
    are most of an evaluation's time and most of a rollout batch's tokens, all for reward 0."""
    max_call_revisits: int = ranged(0, le=1000)
    """Close the tool budget, as `max_repeated_calls` does, when the model makes a tool call it has made this many
    times in the episode, in a row or not (counting this one; 0: never). It catches the cycles `max_repeated_calls`
    lets through (A, B, A, B, ...): a policy that walks on past the answer ends in them, and with read-once
    context a call made twice returns what the context already holds (or held before a compaction)."""
    max_calls_per_turn: int = ranged(4, ge=1)
    """Most tool calls in one turn (they run concurrently); more is a format error."""
    max_cost_usd: float = 0.0
    """Most dollars of tool calls (paid search APIs) per episode; the episode stops (`max_cost`) once spent
    (0: no limit)."""
    max_generated_tokens: int = 0
    """Most tokens the model generates over the whole episode; it stops (`max_tokens`) once reached (0: no
    limit)."""
    max_format_errors: int = 8
    """The episode stops (`format_errors`) after this many malformed turns (0: no limit)."""
    wall_clock_s: float = ranged(1800.0, gt=0)
    """Wall-clock budget per episode, in seconds (LLM calls and tool calls are cut at the limit)."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (0: greedy)."""
    top_p: float = ranged(1.0, gt=0, le=1)
    """Nucleus sampling threshold."""
    top_k: int = 0
    """Top-k sampling (0: off)."""
    prefill: Prefill = "none"
    """Text the harness writes for the model (never trained on): `none`; `tags` (the CPU-learning recipe:
    the opening action tag (`<search>`) at the first act turn and `<answer>` at the act turn after the
    last allowed tool call); `answer` (only the `<answer>` part); `think` (`<think>` at every act turn)."""
    prefill_tags: bool = False
    """Shorthand for `prefill=tags` (kept for configs that set it)."""
    lenient_tags: bool = False
    """Accept a final action tag left open because the turn ended (end-of-turn or token cap) as if closed,
    instead of a format error (the CPU-learning recipe scores this way)."""
    worked_example: bool = False
    """Put one worked example (question, search, information, answer) in the system prompt."""
    worked_example_text: str = ""
    """A custom worked example (used verbatim when `worked_example` is on); empty: the built-in one."""
    system_prompt: str = ""
    """Replace the built-in instructions (tool descriptions and the example are still appended)."""
    prompt_layout: PromptLayout = "system"
    """`system`: instructions in the system message, the question in the user message; `user`: both in one
    user message (ASearcher's layout, for models trained on it; put their instruction text in `system_prompt`)."""
    valid_inst_ratio: float = ranged(1.0, le=1)
    """Probability that the prompt says every question has an answer (forced-valid); otherwise it allows
    answering "the question is invalid" (ASearcher's training used 0.3)."""
    reward_fn: str = "f1"
    """Answer score: a built-in (`f1`, `em`, `sub_em`, `set_f1` (ASearcher's), `judge` (the LLM judge of
    `agent.judge`)) or an import path `package.module:function` (signature in agent/rewards.py and
    docs/extending.md). The format gate and the invalid-answer penalty below apply to every one."""
    aug_answer_weight: float = ranged(0.3, le=1)
    """Weight w of `aug_answer` aliases: reward = (1-w) s_gold + w max(s_gold, s_aug) (ASearcher: 0.3)."""
    format_gate: bool = True
    """Reward 0 when any turn had a format error."""
    invalid_penalty: float = ranged(-0.5, ge=None)
    """Reward when the prompt was forced-valid and the answer says the question is invalid."""
    under_search_penalty: float = ranged(0.0, ge=None, le=0)
    """Reward of an answer given after fewer distinct successful tool calls than the question's
    `min_searches` (a QA row field; the world's questions carry it), whatever the answer; 0: off. Why: under
    RL the 1-hop questions reward answering after one search, and multi-hop episodes copy it (a guess that
    scores 0, like a wrong answer after a full search, so their groups say nothing against it); -0.5 makes
    the guess worse than a full search that failed. On the long-horizon recipe it halved the guesses without
    raising accuracy, so no shipped recipe sets it (docs/training.md#long-horizon-search)."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """The LLM judge used by `reward_fn=judge` (and by evaluation)."""
    program: str = ""
    """Bring your own agent (agent/openai_agent.py): an import path `package.module:function` of
    `async def solve(base_url, api_key, item) -> str | tuple[str, float]`, run once per episode against the
    recording OpenAI-compatible endpoint. Setting it (or `command`) selects `train.workflow=openai_agent`."""
    command: list[str] = field(default_factory=list)
    """Bring your own agent as a process, e.g. `[python, my_agent.py]`: it gets OPENAI_BASE_URL and
    OPENAI_API_KEY in a minimal environment, the item as one JSON line on stdin, and prints its final answer
    as the last line of stdout. Exclusive with `program`."""
    command_env: list[str] = field(default_factory=list)
    """Names of further environment variables passed to `command` (it gets only PATH, locale and TMPDIR)."""
    command_cwd: str = ""
    """Folder `command` runs in; empty: the folder the config was loaded from (so a relative script path
    works inside Ray workers too)."""


class WorkflowTrainConfig(Protocol):
    """What a workflow reads of `train` (trainer.config.TrainConfig, a package above this one)."""

    workflow: str


class WorkflowConfig(Protocol):
    """The sections of the whole config (hexsearch.config.HexConfig) a workflow (agent/workflow.py) reads."""

    run: RunConfig
    agent: AgentConfig
    tools: ToolsConfig

    @property
    def train(self) -> WorkflowTrainConfig: ...
