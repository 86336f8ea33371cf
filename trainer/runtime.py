"""Everything the training loop drives, built from config: Ray actors, data, controller, sync, logs.

`Runtime.create(cfg, run)` starts (in this order) Ray, the data (world, index, QA splits), the
engines (embedded engine actors, or clients of remote servers), the learner ranks, the rollout
workers, and wires the controller, buffer, staleness rule and weight sync. It also owns the
periodic dev evaluation and checkpoint save/restore, so `trainer/train.py` reads as the loop alone.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.rundir import RunDir
from trainer import checkpoint
from trainer.batch import eval_figures
from trainer.buffer import GroupBuffer
from trainer.config import FullConfig
from trainer.controller import RolloutController
from trainer.data import QuestionStream
from trainer.ledger import RolloutLedger
from trainer.metrics import MetricsLogger, truncate_after
from trainer.placement import init_ray, plan_gpus, ray_options, role_threads
from trainer.staleness import StalenessController
from trainer.weight_sync import WeightSync


@dataclass
class LoopState:
    """Counters of the training loop that a checkpoint carries."""

    step: int = 0
    version: int = 0
    eval_before: dict[str, float] = field(default_factory=dict)
    elapsed_s: float = 0.0


def load_questions(cfg: FullConfig) -> tuple[list[Any], list[Any]]:
    """(train items, dev items): the given files, else the configured world's splits."""
    from agent.qa import load_qa

    world = None
    if not (cfg.train.data and cfg.train.dev_data):
        from world import QA_FILES, resolve_world

        world = resolve_world(cfg.world)
    train = load_qa(cfg.train.data or world / QA_FILES["train"])
    if cfg.train.eval_suite:  # the evaluation harness's loader: any suite format as the dev set
        from eval.loaders import load_suite

        data = load_suite(cfg.train.eval_suite, cfg.train.dev_data or None, limit=cfg.train.eval_questions,
                          world_config=cfg.world)
        return train, data.items
    dev = load_qa(cfg.train.dev_data or world / QA_FILES["dev"])
    return train, spread_over_buckets(dev, cfg.train.eval_questions)


def spread_over_buckets(items: list[Any], n: int, weights: dict[str, int] | None = None) -> list[Any]:
    """The first `n` items taken round-robin over difficulty buckets (agent.qa.question_bucket), each bucket
    in file order, `weights[bucket]` items per round (default 1): a dev subset that covers every bucket;
    with one bucket it is simply `items[:n]`."""
    from agent.qa import is_bucket_name, question_bucket

    by: dict[Any, list[Any]] = {}
    for item in items:
        by.setdefault(question_bucket(getattr(item, "meta", {}) or {}), []).append(item)
    present = {str(b) for b in by}
    # a weight of 0 may name a bucket this world lacks (it is left out either way); any other name must exist
    unknown = sorted(b for b, w in (weights or {}).items() if b not in present and (w or not is_bucket_name(b)))
    if unknown:
        raise ValueError(f"bucket weights name buckets with no question: {unknown}; the buckets are {sorted(map(str, by))}")
    queues, out = [(q, max(0, int((weights or {}).get(str(b), 1)))) for b, q in by.items()], []
    queues = [(q, w) for q, w in queues if w]
    while len(out) < n and queues:
        for q, w in queues:
            take = min(w, n - len(out))
            out += q[:take]
            del q[:take]
        queues = [(q, w) for q, w in queues if q]
    return out


def mix_buckets(items: list[Any], weights: dict[str, int]) -> list[Any]:
    """The training questions in the proportions `weights` gives their buckets (train.bucket_weights; 1 for
    a bucket it does not name): spread_over_buckets over as many whole rounds as the scarcest weighted bucket
    fills, so every bucket keeps its share; no weights: the items as they are."""
    from agent.qa import question_bucket

    if not weights:
        return items
    sizes = Counter(str(question_bucket(getattr(i, "meta", {}) or {})) for i in items)
    per_round = {b: max(0, int(weights.get(b, 1))) for b in sizes}
    rounds = min((sizes[b] // w for b, w in per_round.items() if w), default=0)
    return spread_over_buckets(items, max(1, rounds) * sum(per_round.values()), weights)


class Runtime:
    def __init__(self, cfg: FullConfig, run: RunDir):
        self.cfg, self.run, self.train_cfg = cfg, run, cfg.train
        self.state = LoopState()
        self.servers: Any = None
        """Inference servers this run started itself (trainer/managed_servers.py), or None."""
        self.ledger = RolloutLedger(run.path / "rollouts.jsonl")
        self._last_gen: tuple[int, float] = (0, time.perf_counter())  # rollout_figures: tokens/s since then

    @classmethod
    def create(cls, cfg: FullConfig, run: RunDir) -> Runtime:
        rt = cls(cfg, run)
        rt._build()
        return rt

    def _build(self) -> None:
        cfg, t = self.cfg, self.train_cfg
        embedded = cfg.engine.backend == "embedded"
        judge_actor = cfg.agent.reward_fn == "judge" and cfg.agent.judge.backend == "embedded"
        if t.weight_transfer == "nccl":  # before anything starts: vLLM's trainer side must import here
            from serving.remote.weight_transfer import check_nccl

            check_nccl(cfg.engine.backend)
        init_ray(t, embedded, judge_actor)
        import ray

        from serving.backends import engine_backend

        managed = engine_backend(cfg.engine.backend).gpu_server and not cfg.engine.urls  # servers started here, on GPUs
        t = plan_gpus(t, cfg.engine.device, embedded or managed, float(ray.cluster_resources().get("GPU", 0.0)),
                      tp=max(1, cfg.engine.tensor_parallel_size) if managed else 1)
        cfg = self.cfg = replace(cfg, train=t)
        self.train_cfg = t
        if t.weight_transfer == "nccl":
            from serving.remote.weight_transfer import check_nccl

            check_nccl(cfg.engine.backend, t.learner_resources.num_gpus)
        train_items, self.dev_items = load_questions(cfg)
        train_items = mix_buckets(train_items, t.bucket_weights)
        from world import with_world_index

        cfg = self.cfg = with_world_index(cfg)[0]  # the world's index is built once, here
        from trainer.engine_actor import EngineProxy, create_engine_actors, engine_actor_names
        from trainer.learner_group import LearnerGroup
        from trainer.rollout import start_rollout_workers

        # Remote servers are driven by one client (a pool over all `engine.urls`) inside one actor, so
        # that generation, pause and weight updates pass through the same object: a remote client
        # stamps each call with the version it was sent under, which is exact only for the client
        # that also pauses and updates (serving/remote/client.py).
        if t.weight_transfer == "adapter" and not (t.lora_rank > 0 and cfg.engine.backend == "vllm"):
            raise ValueError("train.weight_transfer=adapter pushes LoRA adapters to vLLM servers: it needs "
                             f"train.lora_rank > 0 and engine.backend=vllm (got {t.lora_rank}, {cfg.engine.backend})")
        if not embedded and not cfg.engine.urls:  # no servers named: start them, as Ray actors
            from trainer.managed_servers import ManagedServers

            self.servers = ManagedServers.start(cfg, str(self.run.path))
            cfg = self.cfg = replace(cfg, engine=replace(cfg.engine, urls=list(self.servers.urls)))
        replicas, placement = ((t.engine_replicas, ray_options(t.engine_resources)) if embedded
                               else (1, {"num_cpus": 0}))
        if self.servers is not None and self.servers.token:  # the client actor talks to servers started above
            from serving.servers.engine_server import TOKEN_ENV

            placement["runtime_env"] = {"env_vars": {TOKEN_ENV: self.servers.token}}
        # every actor loads (imports, model, index) at the same time; one wait for all of them below
        engine_names = engine_actor_names("engine", replicas)
        handles, loading = create_engine_actors(cfg.engine, replicas, placement, role_threads(t.engine_resources),
                                                max_restarts=t.engine_max_restarts, names=engine_names)
        self.engines: list[Any] = [EngineProxy(handles, cfg.engine.model)]
        self.engine_handles = handles
        self.judge_handles, judge_names, judge_loading = self._start_judge(judge_actor)
        self.learners = LearnerGroup(cfg, ray_options(t.learner_resources), role_threads(t.learner_resources),
                                     timeout_s=t.learner_step_timeout_s, wait=False)
        self.workers = start_rollout_workers(cfg, engine_names, ray_options(t.rollout_resources),
                                             role_threads(t.rollout_resources), judge_names)
        ray.get([*loading, *judge_loading, *self.learners.loading, *(w.ready.remote() for w in self.workers)])
        self.staleness = StalenessController(t.max_staleness, t.batch_size, t.group_size, t.max_inflight_trajectories)
        self.buffer = GroupBuffer()
        self.stream = QuestionStream(train_items, seed=cfg.run.seed)
        self.controller = RolloutController(
            stream=self.stream, workers=self.workers, staleness=self.staleness, buffer=self.buffer,
            group_size=t.group_size, filter_groups=t.filter_groups, seed=cfg.run.seed,
            ledger=self.ledger, max_worker_losses=t.worker_max_restarts + 1,
            max_question_attempts=t.max_question_attempts, max_consecutive_failures=t.max_consecutive_failures)
        if t.weight_transfer == "nccl":  # once: learner rank 0 and every server GPU form the weight-update group
            self.learners.start_push(cfg.engine.backend, list(cfg.engine.urls),
                                     max(1, cfg.engine.tensor_parallel_size), t.weight_sync_timeout_s)
        self.sync = WeightSync(self.engines, self.learners, in_memory=embedded,
                               folder=self.run.path / "weights", pause_mode="abort",
                               timeout_s=t.weight_sync_timeout_s, adapter=t.weight_transfer == "adapter",
                               nccl=t.weight_transfer == "nccl")
        from trainer.engine_watch import EngineSupervisor

        self.supervisor = EngineSupervisor(handles, self.sync, interval_s=t.engine_health_interval_s,
                                           timeout_s=t.engine_health_timeout_s, log=self.ledger.record,
                                           fail=self.controller.fail)
        self.metrics = MetricsLogger(self.run.metrics, self.run.tb if t.tensorboard else None,
                                     t.wandb_project if t.wandb else None, self.run.path.name)

    def _start_judge(self, actor: bool) -> tuple[list[Any], list[str] | None, list[Any]]:
        """With `agent.reward_fn=judge`: record the judge in `<run>/judge.json` and, for the embedded backend,
        create its engine actor (never weight-synced), which every rollout worker reaches by name. Returns its
        handles (which the driver must hold: Ray keeps an actor, named or not, only while a handle to it
        exists), its actor names (None without one) and the refs of its loading."""
        judge = self.cfg.agent.judge
        if self.cfg.agent.reward_fn != "judge":
            return [], None, []
        from agent.judge import describe_judge

        self.run.write_json(self.run.path / "judge.json", describe_judge(judge))
        if not actor:
            return [], None, []
        from serving.config import EngineConfig
        from trainer.engine_actor import create_engine_actors, engine_actor_names

        engine_cfg = EngineConfig(model=judge.model, backend="embedded", dtype=self.cfg.engine.dtype,
                                  device=self.cfg.engine.device, request_timeout_s=judge.timeout_s)
        names = engine_actor_names("judge", 1)
        handles, loading = create_engine_actors(
            engine_cfg, 1, ray_options(self.train_cfg.judge_resources), role_threads(self.train_cfg.judge_resources),
            max_restarts=self.train_cfg.engine_max_restarts, synced=False, names=names)
        return handles, names, loading

    async def worker_stats(self) -> dict[str, float]:
        """Tool and judge counters of all rollout workers (`tools/<name>/...`, `judge/...`): sums of the
        counts and costs, means of the latencies."""
        reports = await asyncio.gather(*(w.stats.remote() for w in self.workers), return_exceptions=True)
        parts = [r for r in reports if isinstance(r, dict)]
        out: dict[str, float] = {}
        for part in parts:
            for key, value in part.items():
                out[key] = out.get(key, 0.0) + float(value)
        for key in out:
            if "latency" in key and parts:
                out[key] /= sum(key in p for p in parts)
        return out

    def rollout_figures(self) -> dict[str, float]:
        """Queue depths, the staleness counters and generation speed since the previous call (`rollout/...`)."""
        c, stats = self.staleness.c, self.controller.stats
        gen, (last_gen, last_t) = stats["gen_tokens"], self._last_gen
        self._last_gen = (gen, time.perf_counter())
        return {"rollout/queue_depth": float(len(self.buffer)), "rollout/running": float(c.running),
                "rollout/accepted": float(c.accepted), "rollout/rejected": float(c.rejected),
                "rollout/refused_stale": float(c.refused), "rollout/lost": float(stats["lost"]),
                "rollout/gen_tokens_per_s": (gen - last_gen) / max(time.perf_counter() - last_t, 1e-9)}

    def summary_state(self) -> dict[str, Any]:
        """What results.json records of the rollouts: the controller's counters and the staleness state."""
        return {"rollouts": dict(self.controller.stats), "staleness": self.staleness.state_dict()}

    # -- evaluation --------------------------------------------------------------------------
    async def evaluate(self) -> dict[str, float]:
        """Dev reward/accuracy of the current weights: same questions, same seeds every time."""
        if not self.dev_items:
            return {}
        t0 = time.perf_counter()
        n = len(self.workers)
        shares = [list(range(i, len(self.dev_items), n)) for i in range(n)]
        results = await asyncio.gather(*(self._eval_share(w, idx) for w, idx in enumerate(shares) if idx))
        trajs = [tr for part in results for tr in part]
        return {**self._suite_scores(trajs), **eval_figures(trajs), "time/eval_s": time.perf_counter() - t0}

    def _suite_scores(self, trajs: list[Any]) -> dict[str, float]:
        """`eval/<scorer>` means under `train.eval_suite`'s rule-based scorers (the same code `hexsearch eval` runs)."""
        if not self.train_cfg.eval_suite:
            return {}
        from eval.scorers import score_all
        from eval.suites import get_suite

        names = list(get_suite(self.train_cfg.eval_suite).scorers)
        scores = [score_all(tr.prediction, tr.gold, names) for tr in trajs]
        return {f"eval/{name}": sum(s[name] for s in scores) / len(scores) for name in names}

    async def _eval_share(self, w: int, idx: list[int], attempts: int = 5) -> list[Any]:
        """One worker's dev questions; re-run on the restarted worker if it dies meanwhile.
        Each question's seed depends only on the question's index, so a re-run samples the same way."""
        from trainer.controller import lost_errors

        items = [self.dev_items[k] for k in idx]
        for attempt in range(attempts):
            try:
                return await self.workers[w].run_eval.remote(items, self.train_cfg.eval_seed, self.train_cfg.eval_temperature, idx)
            except lost_errors():
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(1.0 + attempt)
        raise AssertionError("unreachable")

    # -- checkpoints -------------------------------------------------------------------------
    async def save(self) -> Path:
        loop = self.state
        tmp = checkpoint.begin(self.run.checkpoints, loop.step)
        await self.learners.save(str(tmp))
        version, internal, gauss = random.getstate()
        (tmp / "rng.json").write_text(json.dumps({"version": version, "state": list(internal), "gauss": gauss}))
        # one synchronous block: cursor, in-flight keys, counters and buffer form one consistent cut
        state = {"loop": loop.__dict__, "stream": self.stream.state_dict(self.controller.in_flight_keys()),
                 "staleness": self.staleness.state_dict(), "controller": dict(self.controller.stats),
                 "attempts": dict(self.controller.attempts)}
        return checkpoint.commit(tmp, loop.step, json.loads(json.dumps(state)), self.buffer.snapshot(),
                                 self.train_cfg.keep_checkpoints)

    async def restore(self) -> bool:
        """Continue from the newest checkpoint of the run folder; False when there is none."""
        path = checkpoint.latest(self.run.checkpoints)
        if path is None:
            return False
        state, groups = checkpoint.load(path)
        await self.learners.load(str(path))
        if (path / "rng.json").exists():  # never rng.pkl (older checkpoints): nothing is unpickled
            rng = json.loads((path / "rng.json").read_text())
            random.setstate((rng["version"], tuple(rng["state"]), rng["gauss"]))
        self.state = LoopState(**state["loop"])
        self.stream.load_state_dict(state["stream"])
        self.staleness.load_state_dict(state["staleness"])  # accepted restored with the version (#1388)
        self.controller.stats.update(state.get("controller", {}))
        self.controller.attempts.update(state.get("attempts", {}))
        self.buffer.restore(groups)
        truncate_after(self.run.metrics, self.state.step)
        truncate_after(self.run.trajectories / "train.jsonl", self.state.step, lambda r: r["meta"].get("step", 0))
        self.ledger.record("resume", step=self.state.step, version=self.state.version,
                           buffered=len(groups), **self.controller.counts())
        await self.sync.push(self.state.version)  # engines start from the base weights
        return True

    def shutdown(self) -> None:
        import ray

        self.metrics.close()
        if not ray.is_initialized():
            return
        if self.servers is not None:
            self.servers.stop()
        if self.train_cfg.ray_address:  # a shared cluster outlives the run: its actors must not
            for actor in [*self.workers, *self.engine_handles, *self.judge_handles, *self.learners.actors]:
                ray.kill(actor, no_restart=True)
        else:
            ray.shutdown()
