"""Weight sync: pause -> update -> resume with the new version; a held request continues under it."""

from __future__ import annotations

import asyncio

import pytest

from serving.protocol import GenerateRequest, SamplingParams, generate_continuing
from serving.scripted import ScriptedEngine, ScriptedOutput
from trainer.config import TrainConfig
from trainer.learner import Learner
from trainer.weight_sync import WeightSync


class _Learners:
    """The two LearnerGroup calls WeightSync uses, over one in-process Learner."""

    def __init__(self, learner: Learner):
        self.learner = learner

    def export_ref(self):
        return self.learner.export_weights()

    async def save_for_engine(self, path: str) -> str:
        return self.learner.save_for_engine(path)


class _Controller:
    def __init__(self):
        self.events: list = []

    def pause(self):
        self.events.append("pause")

    def resume(self):
        self.events.append("resume")

    def set_version(self, v):
        self.events.append(("version", v))


async def test_interrupted_request_continues_under_the_new_version(tiny_model_spec):
    engine = ScriptedEngine([ScriptedOutput(text="alpha beta gamma delta", hold_after=2)])
    sync = WeightSync([engine], _Learners(Learner(TrainConfig(), tiny_model_spec)), in_memory=True)
    call = asyncio.create_task(generate_continuing(engine, GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=32))))
    await engine.wait_held()
    ctrl = _Controller()
    await sync.push(1, ctrl)
    done = await call
    assert ctrl.events == ["pause", ("version", 1), "resume"]
    assert engine.version == 1 and engine.weight_updates[-1][1] == 1
    assert isinstance(engine.weight_updates[-1][0], dict) and engine.weight_updates[-1][0]
    assert done.versions[:2] == [0, 0] and set(done.versions[2:]) == {1}   # each token keeps its version
    assert done.finish_reason != "abort"


async def test_remote_engines_get_an_untied_folder(tmp_path, tiny_model_spec):
    from safetensors.torch import load_file

    engine = ScriptedEngine([])
    learner = Learner(TrainConfig(lora_rank=4, lora_modules=["q_proj"]), tiny_model_spec)
    sync = WeightSync([engine], _Learners(learner), in_memory=False, folder=tmp_path, keep_folders=1)
    await sync.push(1)
    await sync.push(2)
    path, version = engine.weight_updates[-1]
    assert version == 2 and str(path).endswith("v2") and not (tmp_path / "v1").exists()   # old folders pruned
    state = load_file(f"{path}/model.safetensors")
    assert "lm_head.weight" in state and any(k.endswith("q_proj.weight") for k in state)
    assert not any("lora" in k for k in state)


def test_a_hung_engine_is_named_and_every_engine_still_resumes():
    """A weight update that never returns stops the sync with a TimeoutError naming the engine, after
    `resume` reached every engine; it is never waited on silently."""
    calls: list[tuple[int, str]] = []

    class Engine:
        def __init__(self, i: int, hang: bool):
            self.i, self.hang = i, hang

        async def pause(self, mode):
            calls.append((self.i, "pause"))

        async def update_weights(self, src, version):
            calls.append((self.i, "update"))
            if self.hang:
                await asyncio.sleep(3600)

        async def resume(self):
            calls.append((self.i, "resume"))

    class Learners:
        def export_ref(self):
            return "weights"

    sync = WeightSync([Engine(0, False), Engine(1, True)], Learners(), in_memory=True, timeout_s=0.3)
    with pytest.raises(TimeoutError, match=r"update_weights to v3 did not finish on engine\(s\) \[1\]"):
        asyncio.run(sync.push(3))
    assert {(0, "resume"), (1, "resume")} <= set(calls)
