"""Shared fixtures. Models come from the cache that `make setup` prepares (~/.cache/hexsearch)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


# The files that take longest on 2 cores, longest first (measured under `make test`'s two xdist workers).
# `make test` hands out whole files in collection order (--dist loadfile --no-loadscope-reorder), so these
# start first and overlap each other instead of one of them running alone at the end.
LONGEST_FILES = ("test_vllm_cpu.py", "test_demo_long.py", "test_fault_tolerance.py", "test_docs_extending.py",
                 "test_eval_run.py", "test_retrieval_service.py", "test_train_cli.py", "test_plugins_train.py",
                 "test_datagen_cli.py", "test_learner_strategies.py", "test_pool.py", "test_tools_cli.py",
                 "test_managed_servers.py", "test_engine_restart.py", "test_engine_server.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session")
def tiny_model_spec() -> str:
    """A 2-layer random Llama with the real SmolLM2 tokenizer (fast; for unit tests)."""
    return "tiny-random"


@pytest.fixture(scope="session")
def tokenizer():
    from serving.models import load_tokenizer

    return load_tokenizer("tiny-random")
