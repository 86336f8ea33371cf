"""Facts about this machine that pick defaults (precision, threads)."""

from __future__ import annotations

from pathlib import Path


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (AVX512_BF16 or AMX). Without them bf16 is emulated
    and far slower than fp32, so every `auto` precision on CPU asks this first."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
