"""Prepare cached assets once (`python -m hexsearch.assets prepare`, run by `make setup`)."""

from __future__ import annotations

import sys
import time

from serving.models import SMOLLM2, TINY_RANDOM, cache_dir, resolve_model


def prepare() -> None:
    """Convert the packaged SmolLM2 and build the tiny random model, if not cached yet."""
    for spec in (SMOLLM2, TINY_RANDOM):
        t0 = time.time()
        path = resolve_model(spec)
        print(f"[setup] model {spec}: {path} ({time.time() - t0:.1f}s)", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:] != ["prepare"]:
        sys.exit("usage: python -m hexsearch.assets prepare")
    print(f"[setup] cache: {cache_dir()}", file=sys.stderr)
    prepare()
