"""Native decode attention for the embedded engine on CPU (serving/engines/csrc/decode_attention.c).

A decoding step has one query token per row; with grouped-query attention that is a handful of query
heads per KV head against each row's whole KV slot row. PyTorch's CPU SDPA spends most of that call in
per-block GEMM overhead (it is ~40% of a 64-row decoding step of SmolLM2-135M at 430 tokens); the C
kernel streams each row's keys and values once for all of its query heads.

    install(model)   # once, on the engine's own model: decoding steps that pass
                     # `hex_decode_lengths` use the kernel, every other call is plain SDPA

The kernel is compiled on first use with the system C compiler (`-O3 -march=native`, OpenMP from
torch's own libgomp so there is one thread pool) into $HEXSEARCH_CACHE/kernels/, keyed by the source,
the flags and the CPU; the build is atomic (a temporary file renamed into place). Without a compiler,
or with HEXSEARCH_NATIVE_ATTENTION=0, `status()` says why and every call stays on SDPA. Outputs equal
SDPA's within bf16 rounding (tests/test_cpu_attention.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

NAME = "hexsearch_decode"
"""The attention implementation name registered with transformers."""
SOURCES = (Path(__file__).parent / "csrc" / "decode_attention.c", Path(__file__).parent / "csrc" / "llama_ops.c")
"""Compiled together into one library: the decode attention and the fused layer steps (serving/engines/cpu_llama.py)."""
MAX_GROUPS, MAX_HEAD_DIM = 16, 256
"""The kernel's limits (MAX_G, MAX_D in the C source): other shapes stay on SDPA."""
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-shared"]

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_status = "not built"


def _cpu_key() -> str:
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return hashlib.sha256(flags.encode()).hexdigest()[:12]


def _torch_gomp() -> Path | None:
    """torch's bundled OpenMP runtime: linking against it keeps one thread pool in the process."""
    lib = Path(torch.__file__).parent / "lib"
    found = sorted(lib.glob("libgomp*.so*"))
    return found[0] if found else None


def _build(out: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    gomp = _torch_gomp()
    link = [str(gomp), f"-Wl,-rpath,{gomp.parent}"] if gomp else []
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        target = Path(tmp) / out.name
        cmd = [cc, *FLAGS, *map(str, SOURCES), "-o", str(target), *link, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
        os.replace(target, out)


def load() -> ctypes.CDLL | None:
    """The compiled kernel (built on first use), or None with the reason in `status()`."""
    global _lib, _status
    with _lock:
        if _lib is not None or _status != "not built":
            return _lib
        if os.environ.get("HEXSEARCH_NATIVE_ATTENTION", "1") == "0":
            _status = "off (HEXSEARCH_NATIVE_ATTENTION=0)"
            return None
        from serving.models import cache_dir

        key = hashlib.sha256(b"".join(src.read_bytes() for src in SOURCES) + " ".join(FLAGS).encode() + str(_torch_gomp()).encode())
        path = cache_dir() / "kernels" / f"decode_attention-{key.hexdigest()[:12]}-{_cpu_key()}.so"
        try:
            if not path.exists():
                _build(path)
            lib = ctypes.CDLL(str(path))
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            _status = f"sdpa (native kernel unavailable: {e})"
            return None
        fn = lib.hex_decode_attention
        i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        fn.argtypes = [ptr, i64, i64, ptr, i64, i64, i64, ptr, i64, i64, i64, ptr, i64, ptr,
                       i32, i32, i32, i32, ctypes.c_float, i32, i32]
        fn.restype = i32
        lib.hex_add_rmsnorm.argtypes = [ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float, i32, i32, i32]
        lib.hex_rope_store.argtypes = [ptr, i64, ptr, ptr, ptr, ptr, i64, i64, i64, ptr, ptr, i64, i32, i32, i32,
                                       i32, i32]
        for name in ("hex_add_rmsnorm", "hex_rope_store"):
            getattr(lib, name).restype = i32
        _lib, _status = lib, f"native ({path.name})"
        return _lib


def status() -> str:
    """What decoding steps use: 'native (...)', or 'sdpa (why not)'."""
    return _status


def supported(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    return (query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float32)
            and key.dtype == value.dtype == query.dtype and query.shape[2] == 1
            and query.stride(-1) == key.stride(-1) == value.stride(-1) == 1
            and query.shape[1] % key.shape[1] == 0 and query.shape[1] // key.shape[1] <= MAX_GROUPS
            and query.shape[-1] <= MAX_HEAD_DIM)


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lengths: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """query [B, Hq, 1, D]; key/value [B, Hkv, >=max(lengths), D] (any strides, D contiguous);
    row b attends slots [0, lengths[b]). Returns [B, Hq, 1, D] in the query's dtype."""
    lib = load()
    assert lib is not None, status()
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    lens = lengths.to(torch.int64).contiguous()
    max_len = int(lens.max())
    assert max_len <= key.shape[2] and int(lens.min()) >= 1, "lengths must be within the KV view"
    out = torch.empty((batch, heads, 1, dim), dtype=query.dtype)
    rc = lib.hex_decode_attention(
        query.data_ptr(), query.stride(0), query.stride(1),
        key.data_ptr(), key.stride(0), key.stride(1), key.stride(2),
        value.data_ptr(), value.stride(0), value.stride(1), value.stride(2),
        lens.data_ptr(), max_len, out.data_ptr(), batch, kv_heads, heads // kv_heads, dim, float(scale),
        int(query.dtype == torch.bfloat16), torch.get_num_threads())
    if rc:
        raise RuntimeError(f"native decode attention failed (code {rc})")
    return out


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      hex_decode_lengths: torch.Tensor | None = None, **kwargs):
    """A transformers attention function: the kernel for decoding steps that pass their rows' lengths,
    SDPA (unchanged) for everything else."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if hex_decode_lengths is not None and _lib is not None and supported(query, key, value):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = decode_attention(query, key, value, hex_decode_lengths, scale)
        return out.transpose(1, 2), None  # [B, 1, Hq, D], as sdpa_attention_forward returns
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                  **kwargs)


def install(model) -> bool:
    """Route `model`'s attention through `attention_forward` when the kernel loads; True if it did.
    The model's numerics are unchanged for every call that does not pass `hex_decode_lengths`."""
    if next(model.parameters()).device.type != "cpu" or load() is None:
        return False
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, attention_forward)
    model.config._attn_implementation = NAME
    return True
