"""Supervised fine-tuning configuration (section `sft`; `hexsearch sft`, trainer/sft.py).

SFT is the cold start before RL: the model, engine, agent, tools and world come from the same sections
training uses (and the learner from `train`: strategy, LoRA, precision, micro-batches), so an SFT run and
the RL run that follows it (`train.init_from`) share one YAML. Only what differs lives here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from core.ranges import ranged

SFTSource = Literal["oracle", "rft", "file"]


@dataclass
class SFTConfig:
    """Where the trajectories come from, how long to train on them, and when to stop."""

    source: SFTSource = "oracle"
    """`oracle`: a scripted policy follows each training question's known chain through the real agent loop
    (serving/engines/oracle.py; the world's QA rows carry `chain` and `answer`); `rft`: the policy's own episodes,
    sampled at `agent.temperature`, `rft_samples` per question, kept when they earn `rft_min_reward`;
    `file`: a trajectories JSONL in hexsearch's format (`data`)."""
    data: str = ""
    """Trajectories JSONL for `source=file` (what training writes under runs/<run>/trajectories/, or another
    model's episodes through vLLM or an OpenAI-compatible API, tokenised with this model's tokenizer)."""
    epochs: float = ranged(3.0, gt=0)
    """Passes over the trajectories (a fraction stops part-way); with `max_steps` the earlier limit wins."""
    max_steps: int = 0
    """Most optimizer steps (0: only `epochs` limits)."""
    lr: float = ranged(1e-5, gt=0)
    """Learning rate (AdamW) of the SFT steps; the rest of the optimizer settings come from `train`."""
    batch_size: int = ranged(8, ge=1)
    """Trajectories per optimizer step (each of their segments is one training sequence)."""
    eval_every: int = 5
    """Evaluate greedy dev reward and accuracy (the world's dev questions, `train.eval_questions` of them)
    every this many steps; the best evaluation's weights are the checkpoint the run keeps."""
    patience: int = 3
    """Stop after this many evaluations in a row without a better dev reward (0: never stop early)."""
    rft_samples: int = ranged(4, ge=1)
    """Episodes sampled per training question for `source=rft`."""
    rft_min_reward: float = 1.0
    """Keep an episode only when its reward is at least this (`oracle` and `rft`; an oracle episode is also
    dropped when a chain page was missing from the search results: retrieval can miss)."""
    max_items: int = 0
    """Training questions used for `oracle` and `rft`: N of the train split taken round-robin over the difficulty
    buckets (hops1.., n2..; trainer.runtime.spread_over_buckets), each in file order; 0: all."""
    bucket_weights: dict[str, int] = field(default_factory=dict)
    """Questions taken from a bucket per round of `max_items`' round-robin (default 1 each; 0 leaves a bucket
    out, and may name one the world lacks), e.g. `{hops1: 3, hops2: 3, hops3: 3}`: a lineage episode of N
    searches holds N follow-the-name decisions and one answer, a 1-3 hop episode about one of each, so with
    equal counts the token-mean loss is mostly "search the next name" and the policy learns never to stop."""
    concurrency: int = ranged(32, ge=1)
    """Episodes run at once while collecting (`oracle`, `rft`) and evaluating."""
