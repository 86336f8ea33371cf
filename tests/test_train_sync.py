"""Weight sync: pause -> update -> resume with the new version; a held request continues under it."""

from __future__ import annotations

import asyncio

import pytest

from serving.engines.scripted import ScriptedEngine, ScriptedOutput
from serving.protocol import GenerateRequest, SamplingParams, generate_continuing
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


async def test_nccl_sync_sends_while_paused_then_labels_the_version():
    """`train.weight_transfer=nccl`: learner rank 0 sends between pause and resume; the engines only get the label."""
    from serving.protocol import Transferred

    calls: list = []

    class Engine:
        async def pause(self, mode):
            calls.append("pause")

        async def update_weights(self, src, version):
            calls.append(("label", src, version))

        async def resume(self):
            calls.append("resume")

    class Learners:
        async def push_weights(self, version):
            calls.append(("push", version))

    sync = WeightSync([Engine()], Learners(), in_memory=False, nccl=True)
    await sync.push(4)
    assert calls == ["pause", ("push", 4), ("label", Transferred(4), 4), "resume"]
    assert sync.current == (4, Transferred(4))


@pytest.mark.parametrize("lora", [0, 4])
def test_engine_weights_stream_what_their_metadata_declares(tiny_model_spec, lora):
    """The NCCL push sizes the servers' receive buffers from `engine_weight_meta`: iteration must match it
    name by name, and a tied head goes out as the embedding (servers serve untied copies)."""
    learner = Learner(TrainConfig(precision="fp32", lora_rank=lora, lora_modules=["q_proj"]), tiny_model_spec)
    meta = learner.engine_weight_meta(untie=True)
    pairs = list(learner.engine_weights(changed_only=False, untie=True))
    assert [(n, t.dtype, tuple(t.shape)) for n, t in pairs] == meta
    sent = dict(pairs)
    assert not any("lora" in n or "base_layer" in n for n in sent)
    assert learner.tied and "lm_head.weight" in sent
    assert sent["lm_head.weight"].equal(sent["model.embed_tokens.weight"])
    assert set(learner.export_weights(changed_only=False)) == set(sent) - {"lm_head.weight"}


def test_nccl_transfer_is_refused_at_startup_where_it_cannot_work():
    import importlib.util
    import sys

    from serving.remote.weight_transfer import check_nccl

    with pytest.raises(ValueError, match="train.weight_transfer=nccl .* engine.backend=http"):
        check_nccl("http")
    with pytest.raises(RuntimeError, match="train.weight_transfer=nccl .* learners hold no GPU"):
        check_nccl("sglang", learner_gpus=0.0)
    if importlib.util.find_spec("vllm") is None:  # the learner's environment here has no vLLM (only .venv-vllm)
        with pytest.raises(RuntimeError, match=r"train.weight_transfer=nccl .* vllm is not importable in "
                                               + sys.executable.replace(".", r"\.")):
            check_nccl("vllm")


def test_the_vllm_fan_out_gives_every_server_its_own_ranks():
    """vLLM's trainer engine asks for rank_offset 1 (one server); with several, server i's GPUs follow the ones
    before it, and every call reaches every server."""
    from serving.remote.weight_transfer import _FanOut

    class Client:
        def __init__(self):
            self.calls: list = []

        def init_weight_transfer_engine(self, info):
            self.calls.append(("init", info["rank_offset"], info["world_size"]))

        def update_weights(self, info):
            self.calls.append(("update", info["names"]))

    clients = [Client() for _ in range(3)]
    fan = _FanOut(clients, gpus=2)
    fan.init_weight_transfer_engine({"rank_offset": 1, "world_size": 7, "master_port": 1})
    fan.update_weights({"names": ["a"]})
    assert [c.calls for c in clients] == [[("init", 1 + 2 * i, 7), ("update", ["a"])] for i in range(3)]


def test_vllm_server_flags_follow_the_weight_transfer():
    import json

    from serving.launch.vllm_setup import rl_weight_args

    assert rl_weight_args(8, "adapter") == (["--enable-lora", "--max-lora-rank", "8"],
                                            {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    assert rl_weight_args(8, "disk") == ([], {})
    args, env = rl_weight_args(0, "nccl")
    assert args[0] == "--weight-transfer-config" and json.loads(args[1]) == {"backend": "nccl"} and not env
