"""Hand memory the C allocator keeps after Python and torch freed it back to the OS.

glibc's malloc keeps freed blocks in per-thread arenas for reuse; a process whose tensors change
shape every step (packed micro-batches, weight updates, growing contexts) leaves many partly used
arenas behind, and its resident memory creeps up although nothing is alive in it (benchmarks/soak.py
measured it). `malloc_trim(0)` returns those free pages; long-lived actors call it once per step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return lib if lib is not None and hasattr(lib, "malloc_trim") else None


def release_free_memory() -> bool:
    """`malloc_trim(0)` where the C library has it (glibc); True when memory was returned to the OS."""
    lib = _libc()
    return bool(lib.malloc_trim(0)) if lib is not None else False
