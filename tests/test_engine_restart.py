"""A dead engine actor is restarted by Ray and, before it serves again, given the run's current weights
and version by the engine supervisor; a hung one (SIGSTOPped) is reported, replaced and restored the same
way (tiny model, real Ray actors, a real learner step)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from hexsearch.config import load_config
from serving.protocol import GenerateRequest, SamplingParams
from trainer.engine_actor import EngineProxy, engine_actor_names, lookup_engine_actors, start_engine_actors
from trainer.engine_watch import EngineSupervisor
from trainer.learner_group import LearnerGroup
from trainer.placement import init_ray
from trainer.weight_sync import WeightSync


def _request(rid: str) -> GenerateRequest:
    return GenerateRequest(prompt_ids=[1, 42, 7, 99, 3], request_id=rid,
                           sampling=SamplingParams(temperature=0.0, max_new_tokens=6))


async def _scenario(cfg, events, hung: bool):
    import ray
    from test_learner import _samples

    names = engine_actor_names("engine", 1)
    handles = start_engine_actors(cfg.engine, 1, {"num_cpus": 0}, 1, max_restarts=2, names=names)
    proxy = EngineProxy(handles, cfg.engine.model)
    learners = LearnerGroup(cfg, {"num_cpus": 0}, threads=1)
    sync = WeightSync([proxy], learners, in_memory=True, timeout_s=120)
    await learners.train_step(_samples(), version=0)
    await sync.push(1)
    before = await proxy.generate(_request("a"))
    assert set(before.versions) == {1}

    pid = (await handles[0].status.remote())["pid"]
    os.kill(pid, signal.SIGKILL)
    supervisor = EngineSupervisor(handles, sync, interval_s=0.2, timeout_s=60,
                                  log=lambda event, **kw: events.append((event, kw)), fail=pytest.fail)
    # a request sent while the actor restarts waits for the restore, then runs on the current weights
    pending = asyncio.ensure_future(_generate_after_restart(proxy))
    deadline = time.time() + 120
    while not supervisor.stats["restored"] and time.time() < deadline:
        await supervisor.check()
        await asyncio.sleep(0.2)
    after = await asyncio.wait_for(pending, 60)
    status = await handles[0].status.remote()
    # the restarted actor keeps its name: a restarted rollout worker finds it by name (trainer/rollout.py)
    assert (await lookup_engine_actors(names)[0].status.remote())["pid"] == status["pid"]
    if not hung:
        ray.kill(handles[0], no_restart=True)
        return before, after, status, pid

    # hung: the process stops answering; the supervisor kills it, Ray starts another, which is restored
    failures: list = []
    watch = EngineSupervisor(handles, sync, interval_s=0.2, timeout_s=3, fail=failures.append,
                             log=lambda event, **kw: events.append((event, kw)))
    await watch.check()  # as in a run, the supervisor has seen the actor alive (its pid and node) before it hangs
    os.kill(status["pid"], signal.SIGSTOP)
    deadline = time.time() + 120
    while not watch.stats["restored"] and time.time() < deadline:
        await watch.check()
        await asyncio.sleep(0.2)
    replaced = await asyncio.wait_for(_generate_after_restart(proxy), 60)
    third = await handles[0].status.remote()
    ray.kill(handles[0], no_restart=True)
    assert not failures, failures
    assert watch.stats["hung"] >= 1 and third["pid"] not in (pid, status["pid"]) and third["version"] == 1
    assert replaced.output_ids == before.output_ids and set(replaced.versions) == {1}
    return before, after, status, pid


async def _generate_after_restart(proxy):
    from trainer.controller import lost_errors

    for _ in range(200):  # the call in flight at the kill fails; the next ones reach the new process
        try:
            return await proxy.generate(_request("b"))
        except lost_errors():
            await asyncio.sleep(0.1)
    raise AssertionError("the engine actor never came back")


def _run(tiny_model_spec, hung: bool):
    import ray

    cfg = load_config(None, [f"engine.model={tiny_model_spec}", "engine.backend=embedded", "engine.dtype=float32",
                             "train.lr=5e-2", "agent.temperature=1.0"])
    started = not ray.is_initialized()
    init_ray(cfg.train)
    events: list = []
    try:
        before, after, status, old_pid = asyncio.run(_scenario(cfg, events, hung))
    finally:
        if started:
            ray.shutdown()
    assert status["restarted"] and status["pid"] != old_pid and not status["needs_weights"]
    assert status["version"] == 1
    restored = [kw for e, kw in events if e == "engine_restored"]
    assert restored and restored[0]["version"] == 1
    # same greedy tokens and log-probs as before the kill: the trained weights, not the base ones
    assert after.output_ids == before.output_ids and set(after.versions) == {1}
    assert after.logprobs == pytest.approx(before.logprobs, abs=1e-5)


def test_killed_engine_actor_serves_again_only_with_the_current_weights(tiny_model_spec):
    _run(tiny_model_spec, hung=False)


@pytest.mark.slow
def test_hung_engine_actor_is_replaced_and_restored(tiny_model_spec):
    _run(tiny_model_spec, hung=True)


def test_engine_actor_names_are_unique_per_call_and_must_match_the_replicas():
    from trainer.engine_actor import create_engine_actors

    first, second = engine_actor_names("engine", 2), engine_actor_names("engine", 2)
    assert len(set(first + second)) == 4 and all(n.startswith("hexsearch-engine-") for n in first)
    with pytest.raises(ValueError, match="1 names for 2 engine actors"):
        create_engine_actors(load_config(None).engine, 2, {}, 1, names=first[:1])
