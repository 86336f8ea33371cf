"""Our OpenAI-compatible server, for real: `hexsearch serve engine` started as a subprocess on loopback.

The protocol suite runs through a minimal HTTP adapter written here (httpx against the vLLM-shaped
endpoints); the remote client of `serving/` runs the same suite against this server too. The server
runs tiny-random in fp32, so returned log-probs can be compared with a local forward pass.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import engine_protocol_suite as suite
import httpx
import pytest
import torch

from core.rundir import RunDir
from serving.launch.servers import start_engine_server
from serving.models import load_model, load_tokenizer, resolve_model
from serving.protocol import Completion, GenerateRequest

pytestmark = pytest.mark.timeout(600)
EXACT = {"temperature": 1.0, "seed": 4321}


class HttpEngine:
    """The InferenceEngine protocol over our server's HTTP API (test adapter; weights from folders only)."""

    def __init__(self, url: str, tokenizer, token: str | None = None):
        self.url, self._tokenizer = url, tokenizer
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def version(self) -> int:
        return int(httpx.get(f"{self.url}/weight_info").json()["weight_version"])

    async def _post(self, path: str, body: dict | None = None, **params) -> dict:
        async with httpx.AsyncClient(timeout=300) as client:
            r = await client.post(f"{self.url}{path}", json=body or {}, params=params, headers=self.headers)
        r.raise_for_status()
        return r.json()

    async def generate(self, request: GenerateRequest) -> Completion:
        p = request.sampling
        body = {"prompt": request.prompt_ids, "max_tokens": p.max_new_tokens, "temperature": p.temperature,
                "top_p": p.top_p, "top_k": p.top_k, "stop": p.stop, "stop_token_ids": p.stop_token_ids,
                "seed": p.seed, "ignore_eos": p.ignore_eos, "logprobs": 0, "return_token_ids": True,
                "request_id": request.request_id}
        c = (await self._post("/v1/completions", body))["choices"][0]
        return Completion(c["token_ids"], c["logprobs"]["token_logprobs"], c["token_versions"], c["finish_reason"],
                          c["stop_reason"])

    async def pause(self, mode: str = "abort") -> None:
        await self._post("/pause", mode=mode)

    async def resume(self) -> None:
        await self._post("/resume")

    async def update_weights(self, source, version: int) -> None:
        await self._post("/update_weights", {"path": str(source), "version": version})

    async def health(self) -> dict:
        async with httpx.AsyncClient(timeout=60) as client:
            return (await client.get(f"{self.url}/health")).json()


def teacher_forced(model, prompt: list[int], output: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + output])).logits[0].float(), -1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(output)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    changed = tmp_path_factory.mktemp("weights") / "changed"
    model = suite.perturbed_tiny(changed, seed=11)
    return {"original": str(resolve_model("tiny-random")), "changed": str(changed), "changed_model": model}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run = RunDir.create(tmp_path_factory.mktemp("runs"), "server-test")
    with start_engine_server("tiny-random", dtype="float32", max_batch_size=16, run_dir=run) as srv:
        srv.run = run
        yield srv
        assert srv.alive(), f"server died:\n{srv.log_tail()}"
    record = json.loads(run.engines.read_text())["engine"]
    assert record["status"] == "stopped" and not srv.alive()


@pytest.fixture
def http(server, tokenizer):
    return HttpEngine(server.url, tokenizer, server.token)


def post(server, path: str, body=None, **kw) -> httpx.Response:
    """POST as the server's own client does: with its control token."""
    headers = {"Authorization": f"Bearer {server.token}", **kw.pop("headers", {})}
    return httpx.post(f"{server.url}{path}", json=body, timeout=120, headers=headers, **kw)


def test_launch_is_recorded_and_healthy(server):
    record = json.loads(server.run.engines.read_text())["engine"]
    assert record["url"] == server.url and record["pid"] == server.pid and record["status"] == "running"
    health = httpx.get(f"{server.url}/health").json()
    assert health["ok"] and health["version"] == int(httpx.get(f"{server.url}/weight_info").json()["weight_version"])
    models = httpx.get(f"{server.url}/v1/models").json()
    assert models["data"][0]["id"] == "tiny-random"


@pytest.mark.parametrize("check", ["check_generate_consistent", "check_stop_conditions", "check_concurrent"])
async def test_protocol_suite_over_http(http, check):
    await getattr(suite, check)(http, exact=EXACT)


async def test_suite_pause_abort_over_http(http):
    await suite.check_pause_abort_returns_partial(http)


async def test_suite_weight_update_and_continuation_over_http(http, folders):
    await suite.check_weight_update(http, folders["changed"], folders["original"], exact=EXACT)
    # long enough that the pause lands mid-answer even when a busy machine delays it (150 could finish first)
    await suite.check_continuation_across_update(http, folders["changed"], folders["original"], max_new=1200)


def test_completions_shape_token_ids_and_logprobs(server, tokenizer):
    prompt = [504, 2365, 6354, 16438]
    body = {"prompt": prompt, "n": 2, "max_tokens": 7, "logprobs": 2, "return_token_ids": True, "ignore_eos": True,
            "seed": 3}
    out = post(server, "/v1/completions", body).json()
    version = int(httpx.get(f"{server.url}/weight_info").json()["weight_version"])
    model = load_model("tiny-random", dtype="float32")
    assert out["object"] == "text_completion" and [c["index"] for c in out["choices"]] == [0, 1]
    assert out["usage"] == {"prompt_tokens": 8, "completion_tokens": 14, "total_tokens": 22}
    for c in out["choices"]:
        ids = c["token_ids"]
        assert len(ids) == 7 and c["prompt_token_ids"] == prompt and c["finish_reason"] == "length"
        assert c["token_versions"] == [version] * 7
        lp = c["logprobs"]
        assert lp["tokens"] == [tokenizer.decode([t]) for t in ids] and len(lp["text_offset"]) == 7
        assert max(abs(a - b) for a, b in zip(lp["token_logprobs"], teacher_forced(model, prompt, ids),
                                              strict=True)) < 1e-3
        for tok, top, sampled in zip(lp["tokens"], lp["top_logprobs"], lp["token_logprobs"], strict=True):
            assert 1 <= len(top) <= 3 and top[tok] == pytest.approx(sampled)
        assert c["text"] == tokenizer.decode(ids, skip_special_tokens=True)
    assert out["choices"][0]["token_ids"] != out["choices"][1]["token_ids"], "n samples differ"


def test_text_and_batched_prompts(server):
    one = post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 3, "return_token_ids": True}).json()
    assert one["choices"][0]["prompt_token_ids"] == load_tokenizer("tiny-random").encode("Hello")
    many = post(server, "/v1/completions", {"prompt": [[1, 2, 3], [4, 5]], "n": 2, "max_tokens": 2,
                                            "return_token_ids": True}).json()
    assert [c["prompt_token_ids"] for c in many["choices"]] == [[1, 2, 3], [1, 2, 3], [4, 5], [4, 5]]


def test_chat_completions(server, tokenizer):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 5, "logprobs": True,
                                                "top_logprobs": 2, "return_token_ids": True,
                                                "ignore_eos": True}).json()
    expected = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                                add_special_tokens=False)
    choice = out["choices"][0]
    assert out["object"] == "chat.completion" and out["prompt_token_ids"] == expected
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    content = choice["logprobs"]["content"]
    assert len(content) == len(choice["token_ids"]) == 5
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in content)


def test_bad_requests_get_400_with_a_message(server, tmp_path):
    cases = [("/v1/completions", {"max_tokens": 3}, "prompt"),
             ("/v1/completions", {"prompt": [1, 2], "max_tokens": -1}, "max_tokens"),
             ("/v1/completions", {"prompt": [1, 2], "temperature": -1}, "temperature"),
             ("/v1/completions", {"prompt": [10**8]}, "vocabulary"),
             ("/v1/completions", {"prompt": [1] * 5000}, "max_model_len"),
             ("/v1/completions", {"prompt": [1, 2], "stream": True}, "stream"),
             ("/v1/completions", {"prompt": [1, 2], "repetition_penalty": 1.3}, "repetition_penalty"),
             ("/v1/completions", {"prompt": []}, "empty"),
             ("/v1/chat/completions", {"messages": []}, "messages"),
             ("/update_weights", {"version": 3}, "path"),
             ("/update_weights", {"path": str(tmp_path / "nope"), "version": 3}, "does not exist"),
             ("/collective_rpc", {"method": "sleep"}, "reload_weights"),
             ("/update_weight_version", {"new_version": "step-x"}, "integer")]
    for path, body, words in cases:
        r = post(server, path, body)
        assert r.status_code == 400, (path, body, r.text)
        assert words in r.json()["error"]["message"], (words, r.text)
    r = httpx.post(f"{server.url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert post(server, "/pause", params={"mode": "sleep"}).status_code == 400
    assert httpx.get(f"{server.url}/health").json()["ok"], "the server survives bad requests"


async def test_pause_resume_is_paused_and_abort_requests(server):
    auth = {"Authorization": f"Bearer {server.token}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=120, headers=auth) as client:
        assert (await client.post("/pause", params={"mode": "keep"})).json() == {"status": "paused"}
        assert (await client.get("/is_paused")).json() == {"is_paused": True}
        assert (await client.post("/resume")).json() == {"status": "resumed"}
        assert (await client.get("/is_paused")).json() == {"is_paused": False}
        body = {"prompt": [1, 2, 3], "max_tokens": 4000, "ignore_eos": True, "request_id": "long-one"}
        long = asyncio.create_task(client.post("/v1/completions", json=body))
        http = HttpEngine(server.url, None, server.token)
        await suite.wait_for_progress(http, min_tokens=5)
        aborted = (await client.post("/abort_requests", json={"request_ids": ["long-one"]})).json()
        assert aborted == {"status": "aborted", "aborted": 1}
        choice = (await long).json()["choices"][0]
        assert choice["finish_reason"] == "abort" and 0 < len(choice["token_versions"]) < 4000


def test_weight_endpoints_vllm_style(server, folders):
    start = int(httpx.get(f"{server.url}/weight_info").json()["weight_version"])
    assert post(server, "/pause", params={"mode": "abort"}).status_code == 200
    r = post(server, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": folders["changed"]}})
    assert r.json() == {"results": [None]}
    assert int(httpx.get(f"{server.url}/weight_info").json()["weight_version"]) == start, "reload keeps the version"
    assert post(server, "/update_weight_version", {"new_version": str(start + 5)}).json()["success"]
    assert post(server, "/resume").status_code == 200
    prompt = [504, 2365, 6354, 16438, 314]
    c = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "logprobs": 0, "return_token_ids": True,
                                         "ignore_eos": True}).json()["choices"][0]
    assert c["token_versions"] == [start + 5] * 6
    reference = teacher_forced(folders["changed_model"], prompt, c["token_ids"])
    assert max(abs(a - b) for a, b in zip(c["logprobs"]["token_logprobs"], reference, strict=True)) < 1e-3
    r = post(server, "/update_weights", {"update_info": {"weights_path": folders["original"],
                                                         "weight_version": start + 6}})
    assert r.json() == {"status": "ok", "version": start + 6}


def test_sticky_request_id_header_reuses_kv(server, tokenizer):
    prompt = tokenizer.encode("A long enough prompt for a multi-turn agent episode", add_special_tokens=False)
    headers = {"X-Request-Id": "episode-42"}
    first = httpx.post(f"{server.url}/v1/completions", headers=headers, timeout=60,
                       json={"prompt": prompt, "max_tokens": 5, "return_token_ids": True}).json()["choices"][0]
    hits = httpx.get(f"{server.url}/health").json()["prefix_cache"]["hits"]
    turn2 = prompt + first["token_ids"] + [1, 2, 3]
    httpx.post(f"{server.url}/v1/completions", headers=headers, timeout=60, json={"prompt": turn2, "max_tokens": 5})
    assert httpx.get(f"{server.url}/health").json()["prefix_cache"]["hits"] == hits + 1
    assert post(server, "/reset_prefix_cache").json() == {"success": True}
    assert httpx.get(f"{server.url}/health").json()["prefix_cache"]["entries"] == 0
    assert httpx.get(f"{server.url}/load").json() == {"server_load": 0}


def test_cli_refuses_unknown_model_in_one_line():
    out = subprocess.run([sys.executable, "-m", "hexsearch.cli", "serve", "engine", "--model", "/no/such/model",
                          "--port", "0"], capture_output=True, text=True, timeout=120)
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "not found" in lines[0], out.stderr


async def test_protocol_suite_through_the_remote_client(server, folders):
    """The same checks through `serving.remote.vllm.VLLMEngine(backend="http")`, the client that also
    drives vLLM: our server is shaped so that one client serves both."""
    from serving.remote.vllm import VLLMEngine

    engine = VLLMEngine(server.url, "tiny-random", backend="http", token=server.token)
    try:
        await suite.check_generate_consistent(engine, exact=EXACT)
        await suite.check_stop_conditions(engine, exact=EXACT)
        await suite.check_pause_abort_returns_partial(engine)
        await suite.check_weight_update(engine, folders["changed"], folders["original"], exact=EXACT)
    finally:
        await engine.aclose()


def test_tokenize_round_trip_and_bad_token_ids_are_400(server, tokenizer):
    ids = post(server, "/tokenize", {"prompt": "Hello world", "add_special_tokens": False}).json()["tokens"]
    assert ids == tokenizer.encode("Hello world", add_special_tokens=False)
    assert post(server, "/detokenize", {"tokens": ids}).json()["prompt"] == "Hello world"
    for bad in ([len(tokenizer) + 5], [-1], [True], "12"):
        got = post(server, "/detokenize", {"tokens": bad})
        assert got.status_code == 400, (bad, got.text)
    assert "out of range" in post(server, "/detokenize", {"tokens": [10**9]}).text


def test_control_routes_need_the_token_and_weights_stay_under_the_root(tmp_path, monkeypatch):
    """With HEXSEARCH_ENGINE_TOKEN set, pause/resume/update_weights answer 401 without the bearer token (generation
    stays open); `--weights-root` refuses folders outside it; the remote engine client sends the token."""
    from serving.config import EngineConfig
    from serving.factory import build_engine

    root = tmp_path / "weights"
    root.mkdir()
    env = {"HEXSEARCH_ENGINE_TOKEN": "s3cret-token"}
    srv = start_engine_server("tiny-random", dtype="float32", max_batch_size=4, env=env,
                              extra_args=["--weights-root", str(root)], run_dir=tmp_path)
    try:
        assert httpx.post(f"{srv.url}/pause").status_code == 401
        assert httpx.post(f"{srv.url}/update_weights", json={"path": str(root)}).status_code == 401
        ok = httpx.post(f"{srv.url}/v1/completions", json={"prompt": [504, 2365], "max_tokens": 2}, timeout=120)
        assert ok.status_code == 200
        auth = {"Authorization": "Bearer s3cret-token"}
        assert httpx.post(f"{srv.url}/pause", headers=auth).status_code == 200
        assert httpx.post(f"{srv.url}/resume", headers=auth).status_code == 200
        outside = httpx.post(f"{srv.url}/update_weights", json={"path": str(tmp_path)}, headers=auth)
        assert outside.status_code == 403 and "outside the server's weights root" in outside.text
        monkeypatch.setenv("HEXSEARCH_ENGINE_TOKEN", "s3cret-token")
        client = build_engine(EngineConfig(backend="http", urls=[srv.url], model="tiny-random"))

        async def control() -> None:
            await client.pause("abort")
            await client.resume()
            await client.aclose()

        asyncio.run(control())
    finally:
        srv.stop()


def test_a_launched_server_gets_a_fresh_token_that_never_reaches_the_run_folder(server):
    """`start_engine_server` gives every server a fresh random control token (its clients get `.token`), so the
    control routes of a server hexsearch starts are never open, and the token is not written to engines.json."""
    assert server.token and len(server.token) >= 32
    assert httpx.post(f"{server.url}/pause").status_code == 401
    assert httpx.post(f"{server.url}/update_weights", json={"path": "/tmp"}).status_code == 401
    assert server.token not in server.run.engines.read_text()


def test_serving_beyond_loopback_needs_a_token():
    proc = subprocess.run([sys.executable, "-m", "hexsearch.cli", "serve", "engine", "--model", "tiny-random",
                           "--host", "0.0.0.0", "--port", "0"], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "HEXSEARCH_ENGINE_TOKEN"})
    assert proc.returncode == 2 and "needs a control token" in proc.stderr and "Traceback" not in proc.stderr
