"""`hexsearch sft`: supervised fine-tuning on token-exact trajectories, the cold start before RL.

    trajs   = oracle | rft | file                # trainer/sft_data.py; dev/test questions refused
    before  = evaluate()                         # greedy dev reward/accuracy, same questions and seeds as train
    for step in 1..: learners.train_step(batch, objective="sft")    # the RL learner, its SFT loss
        every sft.eval_every steps: engine <- weights, evaluate; a better dev reward -> checkpoint (the best
        one is kept); sft.patience evaluations without one -> stop
    --resume: trajs <- the run's trajectories/sft.jsonl; learner <- its kept (best) checkpoint, step and data
        order as they were there; the steps after it are done again (so sft.epochs=... extends a finished run)
    RESULT sft dev_reward_before=... dev_reward_after=... dev_accuracy_after=... steps=... trajectories=... minutes=...

The learner is trainer/learner.py, the one RL trains (LoRA, precision, micro-batches, `train.learner`): one
rank runs in this process, several are a LearnerGroup on Ray (DDP/FSDP2). Its checkpoints are the trainer's
(trainer/checkpoint.py, learner_state.py), so `hexsearch export` exports the run and `train.init_from` starts
RL from it. Evaluation and `rft` sampling run the embedded engine in this process through the same workflow
as training (agent.workflow), whose weights follow the learner's at each evaluation.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import replace
from typing import Any

from core.log import get_logger
from core.progress import progress
from core.rundir import RunDir
from trainer import checkpoint
from trainer.batch import eval_figures
from trainer.config import FullConfig, TrainConfig
from trainer.metrics import MetricsLogger, eval_row_at, read_metrics, truncate_after
from trainer.sft_data import (
    SFTDataError,
    collect,
    heldout_questions,
    read_trajectories,
    refuse_heldout,
    to_samples,
    write_trajectories,
)

log = get_logger(__name__)


def sft(cfg: FullConfig, run: RunDir, resume: bool = False) -> dict[str, Any]:
    """Run SFT into `run` (or continue the run in it, `resume`); returns the summary written to results.json."""
    return asyncio.run(_sft(cfg, run, time.time(), resume))


async def _sft(cfg: FullConfig, run: RunDir, t_start: float, resume: bool = False) -> dict[str, Any]:
    from agent.workflow import make_workflow
    from serving.factory import build_engine
    from trainer.runtime import load_questions, spread_over_buckets
    from world import with_world_index

    s = cfg.sft
    if cfg.engine.backend != "embedded":
        raise SFTDataError(f"hexsearch sft evaluates and samples with the embedded engine; engine.backend="
                           f"{cfg.engine.backend} is not supported yet (run the SFT stage with engine.backend=embedded)")
    train_items, dev_items = load_questions(cfg)
    heldout = heldout_questions(cfg)
    cfg, world = with_world_index(cfg)
    engine = build_engine(cfg.engine)
    workflow = make_workflow(cfg, world_dir=world)
    try:
        if resume:  # exactly what the run trained on, whatever sft.source would draw now
            resumed = _Resume(run)
            trajs = read_trajectories(run.trajectories / "sft.jsonl", engine.tokenizer)
            refuse_heldout(trajs, heldout, f"resumed run {run.path}")
            return await _train(cfg, run, trajs, resumed.counts, engine, workflow, dev_items, t_start, resumed)
        if s.source == "file":
            if not s.data:
                raise SFTDataError("sft.source=file needs sft.data: a trajectories JSONL")
            trajs = read_trajectories(s.data, engine.tokenizer)
            counts = {"sft/kept": float(len(trajs))}
            where = f"sft.data {s.data}"
        else:
            items = spread_over_buckets(train_items, s.max_items, s.bucket_weights) if s.max_items else train_items
            trajs, counts = await collect(cfg, items, workflow, engine)
            where = f"sft.source={s.source}"
        refuse_heldout(trajs, heldout, where)
        if not trajs:
            raise SFTDataError(f"{where}: no trajectory to train on ({counts}); lower sft.rft_min_reward or check the tools")
        write_trajectories(run.trajectories / "sft.jsonl", trajs)  # what was trained on: reusable as sft.data
        return await _train(cfg, run, trajs, counts, engine, workflow, dev_items, t_start)
    finally:
        await workflow.aclose()
        close = getattr(engine, "aclose", None)
        if close is not None:
            await close()


async def _train(cfg: FullConfig, run: RunDir, trajs: list, counts: dict[str, float], engine: Any, workflow: Any,
                 dev_items: list, t_start: float, resumed: _Resume | None = None) -> dict[str, Any]:
    s = cfg.sft
    per_epoch = math.ceil(len(trajs) / s.batch_size)
    total = max(1, math.ceil(s.epochs * per_epoch))
    total = min(total, s.max_steps) if s.max_steps else total
    tcfg = replace(cfg.train, lr=s.lr, steps=total)
    learners = _learners(replace(cfg, train=tcfg))
    metrics = MetricsLogger(run.metrics, run.tb if tcfg.tensorboard else None,
                            tcfg.wandb_project if tcfg.wandb else None, run.path.name)
    evaluator = _Evaluator(workflow.with_temperature(tcfg.eval_temperature), engine, dev_items, tcfg.eval_seed,
                           s.concurrency)
    order, rng = [], random.Random(cfg.run.seed)

    def next_batch() -> list:
        nonlocal order
        if len(order) < s.batch_size:  # the next epoch, shuffled, after what is left of this one
            nxt = list(range(len(trajs)))
            rng.shuffle(nxt)
            order += nxt
        batch, order = [trajs[i] for i in order[: s.batch_size]], order[s.batch_size:]
        return batch

    try:
        if resumed is None:
            before = await evaluator()
            metrics.log(0, {**before, **counts, "sft/trajectories": float(len(trajs))})
            best: dict[str, Any] = {"reward": -math.inf, "step": 0, "eval": before}
            step = 0
        else:
            before, best, step = resumed.before, resumed.best, resumed.step
            await learners.load(str(resumed.checkpoint))
            truncate_after(run.metrics, step)  # the steps after the checkpoint are done again
            for _ in range(step):  # the data order the checkpoint's steps consumed
                next_batch()
            log.warning("sft: resumed at step %d (its best checkpoint) of %d", step, total)
        since_best = 0
        with progress("sft", total=total) as bar:
            bar.advance(step)
            while step < total:
                batch = next_batch()
                stats = await learners.train_step(to_samples(batch), step, "sft")
                step += 1
                row = {"sft/loss": stats["train/nll"], "sft/tokens": stats["train/policy_tokens"],
                       "sft/lr": stats["train/lr"], "sft/grad_norm": stats["train/grad_norm"],
                       "sft/epoch": step / per_epoch, "time/train_s": stats["time/train_s"]}
                if (s.eval_every and step % s.eval_every == 0) or step == total:
                    await engine.pause("wait")
                    await engine.update_weights(await learners.weights(cfg.engine.dtype), step)
                    await engine.resume()
                    ev = await evaluator()
                    row.update(ev)
                    if ev.get("eval/reward", 0.0) > best["reward"]:
                        best, since_best = {"reward": ev.get("eval/reward", 0.0), "step": step, "eval": ev}, 0
                        await _save(learners, run, step, best, tcfg)
                    else:
                        since_best += 1
                metrics.log(step, row)
                bar.advance(1)
                bar.update(description=f"step {step} loss {row['sft/loss']:.3f}")
                if s.patience and since_best >= s.patience:
                    log.warning("sft: %d evaluations without a better dev reward; stopping at step %d (best: step %d)",
                                since_best, step, best["step"])
                    break
    finally:
        metrics.close()
        learners.close()
    after = best["eval"]
    summary = {"steps": step, "best_step": best["step"], "trajectories": len(trajs), "minutes": (time.time() - t_start) / 60,
               "dev_reward_before": before.get("eval/reward"), "dev_accuracy_before": before.get("eval/accuracy"),
               "dev_reward_after": after.get("eval/reward"), "dev_accuracy_after": after.get("eval/accuracy"),
               "source": s.source, **{k.split("/", 1)[1]: int(v) for k, v in counts.items()}}
    if resumed is not None:
        summary["resumed_at_step"] = resumed.step
    run.write_json(run.results, summary)
    return summary


async def _save(learners: Any, run: RunDir, step: int, best: dict[str, Any], tcfg: TrainConfig) -> None:
    """The checkpoint of the best evaluation so far (the only one kept: `latest` is the best)."""
    tmp = checkpoint.begin(run.checkpoints, step)
    await learners.save(str(tmp))
    state = {"loop": {"step": step, "version": step}, "sft": {"best_step": step, "dev_reward": best["reward"]}}
    checkpoint.commit(tmp, step, state, [], keep=1)


def _eval_part(row: dict[str, Any]) -> dict[str, Any]:
    """The evaluation figures of a metrics.jsonl row."""
    return {k: v for k, v in row.items() if k.startswith(("eval/", "time/eval"))}


class _Resume:
    """Where a stopped or finished SFT run goes on from: its one kept checkpoint (the best evaluation so far),
    whose step and dev figures, the evaluation before training and the source's counts come back from
    state.json and metrics.jsonl (read once, here)."""

    def __init__(self, run: RunDir):
        path = checkpoint.latest(run.checkpoints)
        if path is None:
            raise SFTDataError(f"{run.path}: no checkpoint to resume from (SFT keeps one at each better evaluation)")
        state, _ = checkpoint.load(path)
        rows = read_metrics(run.metrics)
        if not rows or rows[0].get("step") != 0:
            raise SFTDataError(f"{run.path}: no metrics.jsonl row of step 0 (not an SFT run folder?)")
        self.checkpoint, self.step = path, int(state["loop"]["step"])
        at = eval_row_at(rows, self.step)
        if at is None:
            raise SFTDataError(f"{run.path}: metrics.jsonl has no evaluation at the checkpoint's step {self.step}")
        self.best = {"reward": float(state["sft"]["dev_reward"]), "step": self.step, "eval": _eval_part(at)}
        self.before = _eval_part(rows[0])
        self.counts = {k: v for k, v in rows[0].items() if k.startswith("sft/") and k != "sft/trajectories"}


class _Evaluator:
    """Greedy dev reward and accuracy of the engine's current weights (the same questions and seeds each time,
    as `Runtime.evaluate` and the rollout workers' `run_eval` use)."""

    def __init__(self, workflow: Any, engine: Any, items: list, seed: int, concurrency: int):
        self.workflow, self.engine, self.items, self.seed = workflow, engine, items, seed
        self.slots = asyncio.Semaphore(max(1, concurrency))

    async def __call__(self) -> dict[str, float]:
        if not self.items:
            return {}
        t0 = time.perf_counter()

        async def one(k: int, q: Any):
            async with self.slots:
                return await self.workflow.arun_episode(self.engine, q, seed=self.seed + k,
                                                        request_id=f"eval-{self.seed}-{k}-{time.monotonic_ns()}")

        trajs = await asyncio.gather(*(one(k, q) for k, q in enumerate(self.items)))
        return {**eval_figures(trajs), "time/eval_s": time.perf_counter() - t0}


def _learners(cfg: FullConfig) -> Any:
    """One rank in this process, or a LearnerGroup of `train.learner_workers` ranks on Ray (DDP/FSDP2)."""
    if cfg.train.learner_workers > 1:
        return _RayLearners(cfg)
    return _LocalLearner(cfg)


class _LocalLearner:
    def __init__(self, cfg: FullConfig):
        from trainer.learner import Learner
        from trainer.placement import actor_device

        self.learner = Learner(cfg.train, cfg.engine.model, device=actor_device(cfg.engine.device, "learner"),
                               seed=cfg.run.seed)

    async def train_step(self, samples: list, version: int, objective: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.learner.train_step, samples, version, objective)

    async def weights(self, dtype: str) -> dict[str, Any]:
        from serving.models import torch_dtype

        return await asyncio.to_thread(self.learner.export_weights, torch_dtype(dtype, "cpu"))

    async def save(self, folder: str) -> None:
        from trainer import learner_state

        await asyncio.to_thread(learner_state.save, self.learner, folder)

    async def load(self, folder: str) -> None:
        from trainer import learner_state

        await asyncio.to_thread(learner_state.load, self.learner, folder)

    def close(self) -> None:
        self.learner = None


class _RayLearners:
    def __init__(self, cfg: FullConfig):
        import ray

        from trainer.learner_group import LearnerGroup
        from trainer.placement import init_ray, ray_options, role_threads

        t = cfg.train
        init_ray(t, True, False)
        self.group = LearnerGroup(cfg, ray_options(t.learner_resources), role_threads(t.learner_resources),
                                  timeout_s=t.learner_step_timeout_s)
        self._ray, self._shared = ray, bool(t.ray_address)

    async def train_step(self, samples: list, version: int, objective: str) -> dict[str, Any]:
        return await self.group.train_step(samples, version, objective)

    async def weights(self, dtype: str) -> dict[str, Any]:
        return await self.group.export_ref()  # rank 0 exports in the engine's dtype (LearnerWorker.export_weights)

    async def save(self, folder: str) -> None:
        await self.group.save(folder)

    async def load(self, folder: str) -> None:
        await self.group.load(folder)

    def close(self) -> None:
        for actor in self.group.actors:  # a shared cluster outlives the run: its actors must not
            self._ray.kill(actor, no_restart=True)
        if not self._shared:
            self._ray.shutdown()
