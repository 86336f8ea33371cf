"""scripts/setup_vllm.sh: a disk too full for the vLLM venv is said up front, before pip starts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_vllm_setup_refuses_a_full_disk_before_installing(tmp_path):
    venv = tmp_path / "venv-vllm"
    env = {**os.environ, "VLLM_VENV": str(venv), "HEXSEARCH_VLLM_NEED_MB": str(10**12)}
    env.pop("HEXSEARCH_SKIP_VLLM", None)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "setup_vllm.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert "MB free on" in done.stderr and "HEXSEARCH_SKIP_VLLM=1" in done.stderr
    assert not venv.exists()  # nothing half-built


def test_vllm_setup_is_skipped_when_asked(tmp_path):
    venv = tmp_path / "venv-vllm"
    env = {**os.environ, "VLLM_VENV": str(venv), "HEXSEARCH_SKIP_VLLM": "1", "HEXSEARCH_VLLM_NEED_MB": str(10**12)}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "setup_vllm.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and not venv.exists()
