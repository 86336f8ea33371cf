"""SFT trajectories: where they come from (oracle, rft, file), the checks they pass, and training samples.

    trajs = await collect(cfg, items, workflow, engine)      # `sft.source`: oracle or rft
    trajs = read_trajectories(path, tokenizer)                # `sft.source=file`
    refuse_heldout(trajs, heldout_questions(cfg))             # dev and test questions never feed SFT
    samples = to_samples(trajs)                               # one Sample per segment; loss on loss_mask == 1

Every trajectory carries the identity of the tokenizer that made its token ids (`meta.tokenizer`,
`serving.models.tokenizer_id`); training's trajectory files carry it too. A file row of another tokenizer is
refused; a row without one (written by an earlier hexsearch or another tool) is accepted when its ids fit the
vocabulary. Every refusal is one line that names the file and line, or the question.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agent.trajectory import Trajectory
from trainer.config import FullConfig
from trainer.packing import Sample


class SFTDataError(ValueError):
    """SFT data that cannot be used; the message names the file and line, or the question."""


def read_trajectories(path: str | Path, tokenizer: Any) -> list[Trajectory]:
    """Every trajectory of a JSONL file (blank lines skipped), checked row by row (see module docstring)."""
    from serving.models import tokenizer_id

    path, want, vocab = Path(path), tokenizer_id(tokenizer), len(tokenizer)
    if not path.is_file():
        raise SFTDataError(f"sft.data: {path} is not a file")
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                traj = Trajectory.from_json(line)
                _check_segments(traj, vocab)
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                raise SFTDataError(f"{path}:{n}: not a trajectory: {str(e).splitlines()[0][:200]}") from None
            got = traj.meta.get("tokenizer") if isinstance(traj.meta, dict) else None
            if got is not None and got != want:
                raise SFTDataError(f"{path}:{n}: its token ids come from another tokenizer ({got}); the model's is "
                                   f"{want}: re-tokenise the episodes with the model being trained")
            out.append(traj)
    return out


def _check_segments(traj: Trajectory, vocab: int) -> None:
    if not isinstance(traj.meta, dict):
        raise ValueError("meta must be an object")
    for i, seg in enumerate(traj.segments):
        n = len(seg.token_ids)
        if not (len(seg.loss_mask) == len(seg.logprobs) == len(seg.versions) == n):
            raise ValueError(f"segment {i}: token_ids, loss_mask, logprobs and versions differ in length")
        if any(m not in (0, 1) for m in seg.loss_mask):
            raise ValueError(f"segment {i}: loss_mask holds values other than 0 and 1")
        if any(not isinstance(t, int) or t < 0 or t >= vocab for t in seg.token_ids):
            raise ValueError(f"segment {i}: token ids outside the model's vocabulary of {vocab}")


def write_trajectories(path: Path, trajs: list[Trajectory]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for tr in trajs:
            f.write(tr.to_json() + "\n")


def heldout_questions(cfg: FullConfig) -> tuple[set[str], set[str]]:
    """(ids, normalised texts) of every question SFT must not see: the world's dev and test splits (when the
    world is the data, `train.data` or `train.dev_data` empty) and the `train.dev_data` file."""
    from agent.qa import load_qa

    items = []
    if not (cfg.train.data and cfg.train.dev_data):
        from world import QA_FILES, resolve_world

        world = resolve_world(cfg.world)
        items += [q for split in ("dev", "test") if (world / QA_FILES[split]).exists()
                  for q in load_qa(world / QA_FILES[split])]
    if cfg.train.dev_data and not cfg.train.eval_suite:
        items += load_qa(cfg.train.dev_data)
    return {q.id for q in items}, {_norm(q.question) for q in items}


def _norm(text: str) -> str:
    return " ".join(str(text).split()).casefold()


def refuse_heldout(trajs: list[Trajectory], heldout: tuple[set[str], set[str]], source: str) -> None:
    """Refuse (one line) an SFT set with any dev or test question, by id or by question text."""
    ids, texts = heldout
    bad = [t for t in trajs if t.question_id in ids or _norm(t.question) in texts]
    if bad:
        raise SFTDataError(f"{source}: {len(bad)} trajectories are of dev or test questions (first: "
                           f"{bad[0].question_id!r}, {bad[0].question[:80]!r}); dev questions never feed SFT")


def to_samples(trajs: list[Trajectory]) -> list[Sample]:
    """One Sample per segment with policy tokens (advantage unused by the SFT loss)."""
    return [Sample(list(s.token_ids), list(s.loss_mask), list(s.logprobs), list(s.versions), 0.0,
                   meta={"question": t.question_id})
            for t in trajs for s in t.segments if s.num_generated]


async def collect(cfg: FullConfig, items: list[Any], workflow: Any, engine: Any) -> tuple[list[Trajectory], dict[str, float]]:
    """(kept trajectories, counts) of `sft.source` oracle or rft over `items` (see trainer/sft_config.py)."""
    from serving.models import tokenizer_id

    s = cfg.sft
    slots = asyncio.Semaphore(max(1, s.concurrency))
    if s.source == "oracle":
        from serving.engines.oracle import OracleEngine

        oracle = OracleEngine(engine.tokenizer, cfg.agent.action_format)
        usable = [q for q in items if isinstance(q.meta.get("chain"), list) and q.answers]
        jobs = [(q, f"oracle/{q.id}", cfg.run.seed + k) for k, q in enumerate(usable)]
        for q, rid, _ in jobs:
            oracle.expect(rid, q)
        runner, run_engine = workflow, oracle
    else:
        oracle, usable = None, items
        jobs = [(q, f"rft/{q.id}/{i}", cfg.run.seed * 1_000_003 + k * s.rft_samples + i)
                for k, q in enumerate(items) for i in range(s.rft_samples)]
        runner, run_engine = workflow, engine

    async def one(q: Any, rid: str, seed: int) -> Trajectory:
        async with slots:
            return await runner.arun_episode(run_engine, q, seed=seed, request_id=rid)

    trajs = await asyncio.gather(*(one(*job) for job in jobs))
    kept, missed, low = [], 0, 0
    for (_, rid, _), tr in zip(jobs, trajs, strict=True):
        if oracle is not None and not oracle.complete(rid):
            missed += 1
        elif tr.reward < s.rft_min_reward or not tr.segments:
            low += 1
        else:
            tr.meta.update(tokenizer=tokenizer_id(engine.tokenizer), sft_source=s.source)
            kept.append(tr)
    counts = {"sft/questions": float(len(usable)), "sft/episodes": float(len(trajs)), "sft/kept": float(len(kept)),
              "sft/dropped_low_reward": float(low), "sft/dropped_incomplete": float(missed)}
    return kept, counts
