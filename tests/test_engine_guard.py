"""The engine server refuses what a web page (or a careless client) could make it do, over real loopback HTTP.

A ScriptedEngine stands in for the model (these checks are about HTTP, not generation), served by uvicorn in a
thread; `serving/servers/http_guard.py` and `serving/servers/engine_server.py` are what is under test. Also: the launchers
refuse to expose vLLM/SGLang beyond loopback unprotected (issue 29, items 1 and 2).
"""

from __future__ import annotations

import asyncio
import http.client
import os
from pathlib import Path

import httpx
import pytest
from fixtures.uploads import oversized_upload

from serving.engines.pool import EnginePool
from serving.engines.scripted import ScriptedEngine
from serving.remote.transport import EngineRequestError
from serving.remote.vllm import VLLMEngine
from serving.servers.engine_server import create_app
from serving.servers.retrieval_server import ServerThread

TOKEN = "guard-test-token"


class VersionedScripted(ScriptedEngine):
    """A scripted engine that also takes `/update_weight_version` (as the embedded engine does), so that a
    client's whole weight-update sequence can succeed against it."""

    def set_version(self, version: int) -> None:
        self._state.version = version


def _serve(engine, **kwargs) -> ServerThread:
    return ServerThread(create_app(engine, "tiny-random", **kwargs))


@pytest.fixture
def open_server(tokenizer):
    """The engine server on its default settings: no token, no weights root."""
    engine = VersionedScripted(responder=lambda ids, req: "ok", tokenizer=tokenizer)
    with _serve(engine) as srv:
        yield engine, srv


def test_a_web_page_cannot_drive_the_engine(open_server, tmp_path):
    """A cross-site `text/plain` POST, a foreign Host (DNS rebinding) and a cross-origin Origin are refused, on
    the default settings; plain clients on loopback still work."""
    engine, srv = open_server
    body = f'{{"path": "{tmp_path}", "version": 7}}'
    simple = httpx.post(f"{srv.url}/update_weights", content=body, headers={"content-type": "text/plain"})
    assert simple.status_code == 415 and "application/json" in simple.text
    form = httpx.post(f"{srv.url}/pause", content=b"a=1", headers={"content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415
    rebound = httpx.get(f"{srv.url}/v1/models", headers={"Host": "evil.example"})
    assert rebound.status_code == 403 and "evil.example" in rebound.text
    assert httpx.post(f"{srv.url}/update_weights", json={"path": str(tmp_path)},
                      headers={"Host": "evil.example:80"}).status_code == 403
    crossed = httpx.post(f"{srv.url}/pause", json={}, headers={"Origin": "http://evil.example"})
    assert crossed.status_code == 403 and "cross-origin" in crossed.text
    assert httpx.post(f"{srv.url}/pause", json={}, headers={"Origin": "null"}).status_code == 403
    assert engine.weight_updates == [] and not engine._state.paused
    assert httpx.get(f"{srv.url}/v1/models").status_code == 200
    same = httpx.get(f"{srv.url}/v1/models", headers={"Origin": srv.url})
    assert same.status_code == 200
    assert httpx.post(f"{srv.url}/pause").status_code == 200  # no body: nothing to declare


def test_the_token_is_checked_on_the_routed_path(tokenizer):
    """A Host header that would make a URL rebuilt from headers lose its path (`Host: 127.0.0.1:<port>/x#`) gets
    nowhere near the control routes (403: not this server's name), and the token is checked on the ASGI path the
    router matches, duplicate slashes included. (Starlette 1.x already rebuilds `request.url.path` from
    `scope["path"]`; the check no longer depends on that.)"""
    engine = VersionedScripted(tokenizer=tokenizer)
    with _serve(engine, control_token=TOKEN) as srv:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.putrequest("POST", "/pause", skip_host=True)
        conn.putheader("Host", f"127.0.0.1:{srv.port}/x#")
        conn.putheader("Content-Length", "0")
        conn.endheaders()
        status = conn.getresponse().status
        conn.close()
        assert status == 403 and not engine._state.paused
        for path in ("/pause", "//pause"):
            assert httpx.post(f"{srv.url}{path}").status_code in (401, 404)
        assert not engine._state.paused
        assert httpx.post(f"{srv.url}/pause", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_a_refused_weight_update_fails_loudly_in_every_client(tokenizer, tmp_path):
    """A path outside the weights root is a 403 on /collective_rpc as on /update_weights; RemoteVLLM and the pool
    raise it and keep their version (no old weights under a new version); what loads is the resolved path."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "real").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside, target_is_directory=True)
    (root / "alias").symlink_to(root / "real", target_is_directory=True)
    engine = VersionedScripted(tokenizer=tokenizer)
    with _serve(engine, weights_root=str(root)) as srv:
        for path in (outside, root / "escape"):
            rpc = httpx.post(f"{srv.url}/collective_rpc",
                             json={"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
            assert rpc.status_code == 403 and "outside the server's weights root" in rpc.text
        assert httpx.post(f"{srv.url}/update_weights", json={"path": str(outside), "version": 3}).status_code == 403

        async def updates() -> tuple[int, int]:
            client = VLLMEngine(srv.url, None, backend="http", tokenizer=tokenizer)
            with pytest.raises(EngineRequestError, match="403"):
                await client.update_weights(str(outside), 5)
            single = client.version
            pool = EnginePool([VLLMEngine(srv.url, None, backend="http", tokenizer=tokenizer)], health_interval_s=60)
            with pytest.raises(RuntimeError, match="outside the server's weights root"):
                await pool.update_weights(str(outside), 6)
            versions = single, pool.version
            await client.update_weights(str(root / "alias"), 8)  # inside: loads, as its resolved path
            await client.aclose()
            await pool.aclose()
            return versions

        assert asyncio.run(updates()) == (0, 0)
        assert httpx.get(f"{srv.url}/weight_info").json()["version"] == 8
        assert engine.weight_updates == [(str((root / "real").resolve()), 0)]


def test_malformed_rpc_arguments_are_400_not_500(open_server):
    _, srv = open_server
    for body in ({"method": "reload_weights", "kwargs": "x"}, {"method": "reload_weights", "args": 5},
                 {"method": "reload_weights", "kwargs": [1]}, {"method": "reload_weights", "args": [7]}):
        r = httpx.post(f"{srv.url}/collective_rpc", json=body)
        assert r.status_code == 400, (body, r.status_code, r.text)


def test_an_oversized_body_gets_a_413_the_client_can_read(tokenizer):
    engine = VersionedScripted(tokenizer=tokenizer)
    with _serve(engine, max_body_bytes=1 << 20) as srv:
        seen = []
        reply = oversized_upload(srv.port, "/detokenize", 20 << 20,
                                  lambda: seen.append(httpx.get(f"{srv.url}/v1/models", timeout=30).status_code))
        assert reply.startswith(b"HTTP/1.1 413") and b"request body over" in reply, reply[:300]
        assert seen == [200]
        assert httpx.post(f"{srv.url}/detokenize", json={"tokens": [1, 2]}).status_code == 200


def test_vllm_and_sglang_are_not_exposed_unprotected(monkeypatch):
    """Beyond loopback: vLLM needs the authenticating-proxy statement (its --api-key leaves the development routes
    open), SGLang a token or that statement; refused before any setup or conversion."""
    from serving.launch import servers as launch
    from serving.launch import vllm_setup
    from serving.launch.servers import AUTH_PROXY_ENV, ServerStartError, check_exposure

    monkeypatch.delenv(AUTH_PROXY_ENV, raising=False)
    monkeypatch.delenv("HEXSEARCH_ENGINE_TOKEN", raising=False)

    def no_setup(*a, **k):
        raise AssertionError("set up vLLM before refusing the bind")

    monkeypatch.setattr(vllm_setup, "untied_dir", no_setup)
    monkeypatch.setattr(vllm_setup, "ensure_venv", no_setup)
    with pytest.raises(ServerStartError, match="not loopback"):
        launch.start_vllm_server("tiny-random", host="0.0.0.0")
    with pytest.raises(ServerStartError, match="not loopback"):
        launch.start_sglang_server("tiny-random", host="10.1.2.3")
    with pytest.raises(ServerStartError, match="api-key does not guard"):
        check_exposure("vllm", "10.1.2.3", token="t")
    check_exposure("vllm", "127.0.0.1")
    check_exposure("sglang", "10.1.2.3", token="t")
    monkeypatch.setenv(AUTH_PROXY_ENV, "1")
    check_exposure("vllm", "0.0.0.0")


def test_serve_vllm_refuses_a_public_host_at_once(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("HEXSEARCH_AUTH_PROXY", "HEXSEARCH_ENGINE_TOKEN")}
    out = subprocess.run([sys.executable, "-m", "hexsearch.cli", "serve", "vllm", "--host", "0.0.0.0",
                          "--run-root", str(tmp_path)], capture_output=True, text=True, timeout=120, env=env,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 2 and "not loopback" in out.stderr and "Traceback" not in out.stderr, out.stderr
