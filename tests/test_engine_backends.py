"""Engine backends are one registry (serving/backends.py): the config asks it, build_engine and the managed
servers take everything from the backend's record, and a user's backend plugs in by import path."""

from __future__ import annotations

import pytest

from serving.backends import ENGINE_BACKENDS, EngineBackend, engine_backend
from serving.config import EngineConfig
from serving.engines.pool import EnginePool, build_remote
from serving.engines.scripted import ScriptedEngine
from serving.factory import build_engine

MADE: list[tuple[str, str]] = []


class _Client(ScriptedEngine):
    def __init__(self, url: str, model: str, **kw):
        super().__init__(["<answer>x</answer>"])
        self.url = url
        MADE.append((url, model))


IN_PROCESS = EngineBackend(engine=lambda cfg: ScriptedEngine([f"<answer>{cfg.model}</answer>"]))
REMOTE = EngineBackend(client=_Client)
BOTH = EngineBackend(engine=lambda cfg: None, client=_Client)


def test_the_built_ins_are_registered_records():
    assert {"embedded", "http", "vllm", "sglang"} <= set(ENGINE_BACKENDS.names())
    assert engine_backend("vllm").gpu_server and engine_backend("vllm").remote and engine_backend("vllm").launch
    assert not engine_backend("http").gpu_server and engine_backend("http").launch is not None
    assert not engine_backend("embedded").remote


def test_a_backend_of_ones_own_by_import_path():
    engine = build_engine(EngineConfig(model="m1", backend="test_engine_backends:IN_PROCESS"))
    assert isinstance(engine, ScriptedEngine) and list(engine._script) == ["<answer>m1</answer>"]
    MADE.clear()
    one = build_engine(EngineConfig(model="m2", backend="test_engine_backends:REMOTE", urls=["http://a"]))
    assert isinstance(one, _Client) and MADE == [("http://a", "m2")]
    pool = build_remote("test_engine_backends:REMOTE", ["http://a", "http://b"], "m3")
    assert isinstance(pool, EnginePool) and MADE[-2:] == [("http://a", "m3"), ("http://b", "m3")]


def test_bad_backends_are_clear_errors():
    with pytest.raises(ValueError, match=r"engine.backend: unknown engine backend 'vlm'. Valid: embedded, http, vllm, sglang"):
        build_engine(EngineConfig(backend="vlm"))
    with pytest.raises(ValueError, match="exactly one of engine/client"):
        engine_backend("test_engine_backends:BOTH")
    with pytest.raises(ValueError, match="runs in-process, not as a client of servers; the remote backends: http, vllm, sglang"):
        build_remote("embedded", ["http://a"], "m")


def test_the_config_asks_the_registry(tmp_path):
    from hexsearch.config import load_config

    with pytest.raises(ValueError, match=r"engine.backend: unknown engine backend 'vlm'"):
        load_config(None, ["engine.backend=vlm"])
    with pytest.raises(ValueError, match=r"agent.judge.backend: unknown engine backend 'opnai'. Valid: openai, embedded"):
        load_config(None, ["agent.judge.backend=opnai"])
    cfg = load_config(None, ["engine.backend=test_engine_backends:REMOTE", "agent.judge.backend=openai",
                             "datagen.solver.backend=vllm"])
    assert cfg.engine.backend == "test_engine_backends:REMOTE"
