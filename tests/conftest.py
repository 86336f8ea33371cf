"""Shared fixtures. Models come from the cache that `make setup` prepares (~/.cache/hexsearch)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def tiny_model_spec() -> str:
    """A 2-layer random Llama with the real SmolLM2 tokenizer (fast; for unit tests)."""
    return "tiny-random"


@pytest.fixture(scope="session")
def tokenizer():
    from serving.models import load_tokenizer

    return load_tokenizer("tiny-random")
