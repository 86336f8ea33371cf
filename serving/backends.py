"""Engine backends (`engine.backend`): one record each, in one registry (core/registry.py).

    backend = ENGINE_BACKENDS.resolve(cfg.backend)   # an EngineBackend
    engine  = build_engine(cfg)                      # serving/factory.py: backend.engine(cfg), or a client
                                                     # (a pool over several) of the servers at engine.urls

A backend is either in-process (`engine`: EngineConfig -> InferenceEngine) or a client of servers (`client`:
one RemoteEngine per URL; several URLs make an EnginePool). A client backend may say how to start one of its
servers (`launch`), which `hexsearch train` does on a Ray actor when `engine.urls` is empty
(trainer/managed_servers.py), and whether such a server needs GPUs (`gpu_server`: the placement and the dry
run count them). The built-ins below are registered exactly as a user's backend would be; a backend of your
own is this record registered under a name (imported before the config is read) or named by import path,
`engine.backend=my_pkg.engines:BACKEND`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.registry import Registry
from serving.config import EngineConfig


@dataclass(frozen=True)
class LaunchSpec:
    """Where and as what a managed server starts (filled by trainer/managed_servers.py on its actor)."""

    host: str
    """The address the server binds: loopback on one machine, the node's own address on a cluster."""
    port: int | None
    """The port it had before a restart (None: a free one)."""
    run_path: str
    """The run folder (engines.json and the server's log go there)."""
    name: str
    """The server's name in engines.json and its log file."""
    token: str | None = None
    """The control token of our own servers (None for others)."""
    lora_rank: int = 0
    """train.lora_rank: vLLM then serves LoRA adapters."""
    transfer: str = "disk"
    """train.weight_transfer: vLLM then opens its weight-transfer engine for `nccl`."""
    gpu_share: float = 1.0
    """The part of one GPU the actor holds (a GPU shared with a learner: the server takes that part)."""


@dataclass(frozen=True)
class EngineBackend:
    """How to build one engine backend (see the module docstring)."""

    engine: Callable[[EngineConfig], Any] | None = None
    """In-process: the InferenceEngine for an `engine:` section."""
    client: Callable[..., Any] | None = None
    """A client of a server: `client(url, model, request_timeout_s=..., token=...)` -> RemoteEngine."""
    launch: Callable[[EngineConfig, LaunchSpec], Any] | None = None
    """Start one server (serving/launch/servers.py's ManagedServer) for `hexsearch train`; None: the user
    starts servers and names them in engine.urls."""
    gpu_server: bool = False
    """Its servers need GPUs (engine.tensor_parallel_size of them each, or a share of one)."""

    @property
    def remote(self) -> bool:
        return self.client is not None


ENGINE_BACKENDS = Registry("engine backend", "engine.backend")


def engine_backend(name: str) -> EngineBackend:
    """The record `engine.backend` names (a registered name or an import path); ComponentError otherwise."""
    backend = ENGINE_BACKENDS.resolve(name)
    if not isinstance(backend, EngineBackend) or (backend.engine is None) == (backend.client is None):
        raise ValueError(f"engine.backend={name}: not an EngineBackend with exactly one of engine/client "
                         f"(serving/backends.py)")
    return backend


# --- built-ins ------------------------------------------------------------------------------------------
def _embedded(cfg: EngineConfig) -> Any:
    from serving.engines.embedded import EmbeddedEngine

    return EmbeddedEngine(
        cfg.model, dtype=cfg.dtype, device=cfg.device, max_batch_size=cfg.max_batch_size,
        max_model_len=cfg.max_model_len, prefill_chunk_tokens=cfg.prefill_chunk_tokens,
        kv_cache_gb=cfg.kv_cache_gb, prefix_cache_gb=cfg.prefix_cache_gb, threads=cfg.threads, seed=cfg.seed)


def _openai_client(backend: str) -> Callable[..., Any]:
    def client(url: str, model: str, **kw: Any) -> Any:
        from serving.remote.vllm import VLLMEngine

        return VLLMEngine(url, model, backend=backend, **kw)

    return client


def _sglang_client(url: str, model: str, **kw: Any) -> Any:
    from serving.remote.sglang import SGLangEngine

    return SGLangEngine(url, model, **kw)


def _launch_http(cfg: EngineConfig, at: LaunchSpec) -> Any:
    from serving.launch.servers import start_engine_server

    return start_engine_server(cfg.model, host=at.host, port=at.port, dtype=cfg.dtype, max_batch_size=cfg.max_batch_size,
                               max_model_len=cfg.max_model_len, run_dir=at.run_path, name=at.name, token=at.token)


def _launch_vllm(cfg: EngineConfig, at: LaunchSpec) -> Any:
    from serving.launch.servers import start_vllm_server
    from serving.launch.vllm_setup import rl_weight_args

    tp = max(1, cfg.tensor_parallel_size)
    extra = ["--tensor-parallel-size", str(tp)] if tp > 1 else []
    if 0 < at.gpu_share < 1:  # a GPU shared with a learner: vLLM takes its part of the memory only
        extra += ["--gpu-memory-utilization", f"{0.85 * at.gpu_share:.2f}"]
    args, env = rl_weight_args(at.lora_rank, at.transfer)  # adapters or NCCL (serving/remote/weight_transfer.py)
    return start_vllm_server(cfg.model, run=at.run_path, host=at.host, port=at.port, max_model_len=cfg.max_model_len,
                             kv_cache_gb=cfg.kv_cache_gb, dtype=cfg.dtype, extra_args=extra + args, name=at.name, env=env)


def _launch_sglang(cfg: EngineConfig, at: LaunchSpec) -> Any:
    from serving.launch.servers import start_sglang_server

    return start_sglang_server(cfg.model, run=at.run_path, host=at.host, port=at.port,
                               tp=max(1, cfg.tensor_parallel_size), max_model_len=cfg.max_model_len, name=at.name)


ENGINE_BACKENDS.add("embedded", EngineBackend(engine=_embedded))
ENGINE_BACKENDS.add("http", EngineBackend(client=_openai_client("http"), launch=_launch_http))
ENGINE_BACKENDS.add("vllm", EngineBackend(client=_openai_client("vllm"), launch=_launch_vllm, gpu_server=True))
ENGINE_BACKENDS.add("sglang", EngineBackend(client=_sglang_client, launch=_launch_sglang, gpu_server=True))
