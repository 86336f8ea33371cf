"""The training loop: fully asynchronous RL over Ray actors, in the order things happen.

    controller.start()                       # rollout workers generate groups from now on, under the
                                             # staleness rule (trainer/staleness.py)
    dev_before = evaluate()                  # same questions, same seed as the final evaluation (or the
                                             # init_from run's own figures for these weights: init_from.py)
    for step in range(steps):                # or until train.time_budget_min
        groups  = next_batch(B)              # oldest accepted groups; too-stale ones are refused
        samples = advantages + filter(groups)
        stop if the learner's measured tokens/s says this batch would end past the time budget
                                             # (why: the log and results.json "stopped")
        learners.train_step(samples)         # decoupled PPO, packed micro-batches, data parallel
        version += 1
        sync.push(version)                   # engines pause, take the weights, resume
        log, evaluate every N, checkpoint every N
    dev_after = evaluate()
    RESULT train dev_reward_before=... dev_reward_after=... steps=... minutes=...

Generation never waits for training except through the staleness bound; training waits only for
B groups. max_staleness = 0 makes the same loop synchronous.

Faults: a dead rollout worker's groups are re-run (controller), a dead engine actor is restarted
with the current weights (engine_watch), and a dead learner rank restarts the run from its newest
checkpoint in this process, exactly as `--resume` would (`train.learner_max_restarts` times).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from core.log import get_logger
from core.progress import progress
from core.rundir import RunDir
from trainer import checkpoint
from trainer.batch import build_samples, rollout_metrics
from trainer.config import FullConfig
from trainer.learner_group import LearnerLost
from trainer.metrics import plot_reward_curve, plot_search_curve
from trainer.runtime import Runtime

log = get_logger(__name__)


def train(cfg: FullConfig, run: RunDir, resume: bool = False) -> dict[str, Any]:
    """Train (or continue the run in `run` when `resume`); returns the summary written to results.json."""
    from trainer.init_from import inherited_dev_eval, resolve_init_from

    cfg = resolve_init_from(cfg)  # `train.init_from`: the command did it already (then this is a no-op)
    inherited = inherited_dev_eval(cfg)
    for restart in range(cfg.train.learner_max_restarts + 1):
        t_start = time.time()  # minutes count from here: setup (Ray, world, models) included
        rt = Runtime.create(cfg, run)
        try:
            return asyncio.run(_loop(rt, resume, t_start, inherited))
        except Exception as e:
            lost = asyncio.run(_learner_lost(rt, e))
            if lost is None:
                raise
            if checkpoint.latest(run.checkpoints) is None:  # verifies the files: once
                raise RuntimeError(f"{lost}; no checkpoint to restart from yet (train.save_every)") from e
            if restart == cfg.train.learner_max_restarts:
                raise RuntimeError(f"{lost}; no restart left (train.learner_max_restarts={cfg.train.learner_max_restarts})") from e
            rt.ledger.record("learner_lost", error=lost, restart=restart + 1)
            log.warning("%s: restarting from the newest checkpoint (%d/%d)", lost, restart + 1,
                        cfg.train.learner_max_restarts)
            resume = True
        finally:
            rt.shutdown()
    raise AssertionError("unreachable")


async def _learner_lost(rt: Runtime, error: BaseException) -> str | None:
    """Why the learner is gone when `error` came from (or followed) a dead learner rank, else None."""
    if isinstance(error, LearnerLost):
        return str(error)
    dead = await rt.learners.dead_ranks()
    return f"learner rank(s) {dead} died ({type(error).__name__}: {str(error)[:200]})" if dead else None


async def _loop(rt: Runtime, resume: bool, t_start: float,
                inherited: tuple[dict[str, float], str] = ({}, "")) -> dict[str, Any]:
    settings, ctrl = rt.train_cfg, rt.controller
    resumed = resume and await rt.restore()
    state = rt.state
    ctrl.start()
    rt.supervisor.start()
    if rt.servers is not None:
        rt.servers.watch(rt.sync, rt.ledger.record, ctrl.fail)
    if not resumed:
        state.eval_before, source = inherited if inherited[0] else (await rt.evaluate(), "")
        if source:
            log.warning("dev evaluation before training: %s's, of the weights this run starts from", source)
        elif rt.train_cfg.init_from:
            log.info("dev evaluation before training: run here (%s)", inherited[1])
        rt.metrics.log(0, state.eval_before)
    learner_rate = _LearnerRate()
    stopped = ""  # why training ended before train.steps (results.json "stopped")
    with progress("training", total=settings.steps) as bar:
        bar.advance(state.step)
        while state.step < settings.steps:
            if stopped := _budget_stop(settings, state.elapsed_s + time.time() - t_start, state.step + 1):
                break
            t0 = time.perf_counter()
            groups = await ctrl.next_batch(settings.batch_size, state.version, state.step)
            t_wait = time.perf_counter() - t0
            samples, kept = build_samples(groups, settings.advantage, settings.filter_groups, settings.loss_agg)
            tokens = sum(map(len, samples))
            if stopped := _budget_stop(settings, state.elapsed_s + time.time() - t_start, state.step + 1, tokens,
                                       learner_rate):
                break
            stats = await rt.learners.train_step(samples, state.version)
            learner_rate.add(tokens, stats["time/train_s"])
            state.version += 1
            sync_s = await rt.sync.push(state.version, ctrl)
            state.step += 1
            roll, staleness = rollout_metrics(groups, state.version - 1)
            metrics = {**roll, **stats, "train/kept_groups": kept, "time/sync_s": sync_s, "time/wait_s": t_wait,
                       "time/step_s": time.perf_counter() - t0, **rt.rollout_figures(), **await rt.worker_stats()}
            if settings.eval_every and state.step % settings.eval_every == 0 and state.step < settings.steps:
                metrics.update(await rt.evaluate())
            rt.metrics.log(state.step, metrics, {"rollout/staleness": staleness})
            _save_trajectories(rt, groups, state.step)
            if settings.save_every and state.step % settings.save_every == 0 and state.step < settings.steps:
                state.elapsed_s += time.time() - t_start
                t_start = time.time()
                await rt.save()
            bar.advance(1)
            bar.update(description=f"step {state.step} reward {roll['train/reward']:.2f} kept {kept}/{len(groups)}")
    if stopped:
        log.warning("stopping %s", stopped)
    await ctrl.stop()
    after = await rt.evaluate()
    await rt.supervisor.stop()
    if rt.servers is not None:
        await rt.servers.stop_watch()
    state.elapsed_s += time.time() - t_start
    rt.metrics.log(state.step, after)
    await rt.save()
    summary = {"steps": state.step, "minutes": state.elapsed_s / 60, "dev_reward_before": state.eval_before.get("eval/reward"),
               "dev_reward_after": after.get("eval/reward"), "dev_accuracy_before": state.eval_before.get("eval/accuracy"),
               "dev_accuracy_after": after.get("eval/accuracy"), **rt.summary_state()}
    if inherited[0]:
        summary["dev_eval_before_from"] = inherited[1]
    if stopped:
        summary["stopped"] = stopped
    rt.run.write_json(rt.run.results, summary)
    plot_reward_curve(rt.run.metrics, rt.run.path / "reward_curve.png")
    plot_search_curve(rt.run.metrics, rt.run.path / "search_curve.png")  # None unless questions carry buckets
    return summary


def _out_of_time(t: Any, elapsed_s: float) -> bool:
    """The time budget is spent (training stops early; the final evaluation still runs)."""
    return t.time_budget_min > 0 and elapsed_s >= 60 * t.time_budget_min


def _budget_stop(t: Any, elapsed_s: float, next_step: int, tokens: int = 0, rate: _LearnerRate | None = None) -> str:
    """Why step `next_step` is not started under train.time_budget_min, '' when it may be: the budget is spent,
    or the batch in hand (`tokens`) would end past it at the learner's tokens/s so far (`rate`). The reason
    goes to the log and to results.json's "stopped"."""
    if _out_of_time(t, elapsed_s):
        return f"before step {next_step}: train.time_budget_min={t.time_budget_min:g} is spent"
    if rate is None:  # no batch in hand yet
        return ""
    predicted_s = rate.seconds(tokens)
    if _out_of_time(t, elapsed_s + predicted_s):
        return (f"before step {next_step}: its batch ({tokens} tokens, ~{predicted_s:.0f} s at the learner's "
                f"{rate.tokens_per_s:.0f} tokens/s so far) would end past train.time_budget_min={t.time_budget_min:g}")
    return ""


class _LearnerRate:
    """The learner's tokens/s over this run's steps so far, to predict what the next batch will cost.

    The budget is checked again once a batch is in hand: a step whose predicted end (tokens / rate) falls
    past it is not started. Why: a step's cost varies 20x with its episodes (an N = 32 lineage group held
    a 2-core learner 471 s, a step of hop groups 20-50 s), so a budget checked only between steps overran
    by a whole long step. The first step is never refused (nothing measured yet)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.seconds_spent = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds_spent += seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds_spent if self.seconds_spent > 0 else 0.0

    def seconds(self, tokens: int) -> float:
        """Predicted learner seconds for `tokens` (0 before any step was measured)."""
        return tokens / self.tokens_per_s if self.tokens_per_s > 0 else 0.0


def _save_trajectories(rt: Runtime, groups: list, step: int) -> None:
    if not rt.train_cfg.save_trajectories:
        return
    if getattr(rt, "tokenizer_id", None) is None:  # once: trajectory files say which tokenizer made their ids
        from serving.models import load_tokenizer, tokenizer_id

        rt.tokenizer_id = tokenizer_id(load_tokenizer(rt.cfg.engine.model))
    with (rt.run.trajectories / "train.jsonl").open("a") as f:
        for g in groups:
            for tr in g.trajectories:
                tr.meta.update(step=step, key=g.key, tokenizer=rt.tokenizer_id)
                f.write(tr.to_json() + "\n")
