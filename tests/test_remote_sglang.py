"""The SGLang client (`serving.remote.sglang.SGLangEngine`) against a loopback SGLang-compatible server.

SGLang cannot run on this machine (it needs a GPU), so this is the one place in hexsearch where a stand-in
server is used: `sglang_compatible_app` implements SGLang's documented native wire format (/generate with
input_ids + return_logprob and meta_info.output_token_logprobs, /pause_generation, /continue_generation,
/abort_request, /update_weights_from_disk, /model_info, /get_load, /metrics, /health) on top of our REAL embedded
engine with `tiny-random` — the tokens, log-probs, pauses and weight reloads are real; only the HTTP
shapes are SGLang's. The shared protocol suite then runs through the client with the same assertions
as for every other engine.
"""

from __future__ import annotations

import asyncio
import threading
import time

import engine_protocol_suite as suite
import pytest
from fastapi import FastAPI, Request  # module level: FastAPI resolves the string annotations here
from fastapi.responses import JSONResponse, PlainTextResponse

from serving.protocol import GenerateRequest, SamplingParams
from serving.remote.sglang import SGLangEngine
from serving.remote.transport import EngineRequestError

pytestmark = pytest.mark.timeout(600)
EXACT = {"temperature": 1.0, "seed": 1234}


def sglang_compatible_app(engine):
    """A FastAPI app speaking SGLang's native API over an InferenceEngine (see the module docstring)."""
    app = FastAPI()

    @app.post("/generate")
    async def generate(http: Request):
        body = await http.json()
        sp = body.get("sampling_params") or {}
        top_k = int(sp.get("top_k", -1))
        params = SamplingParams(temperature=float(sp.get("temperature", 1.0)), top_p=float(sp.get("top_p", 1.0)),
                                top_k=max(top_k, 0), max_new_tokens=int(sp.get("max_new_tokens", 128)),
                                stop=list(sp.get("stop") or []), stop_token_ids=list(sp.get("stop_token_ids") or []),
                                seed=sp.get("sampling_seed"), ignore_eos=bool(sp.get("ignore_eos", False)))
        done = await engine.generate(GenerateRequest(list(body["input_ids"]), params, request_id=body["rid"]))
        if done.finish_reason == "abort":
            finish = {"type": "abort", "message": "Abort before prefill" if not done.output_ids else "Abort in waiting"}
        elif done.finish_reason == "length":
            finish = {"type": "length", "length": len(done.output_ids)}
        else:
            finish = {"type": "stop", "matched": done.stop_reason}
        meta = {"id": body["rid"], "finish_reason": finish, "prompt_tokens": len(body["input_ids"]),
                "completion_tokens": len(done.output_ids), "weight_version": str(engine.version),
                "output_token_logprobs": [[lp, t, None] for t, lp in zip(done.output_ids, done.logprobs, strict=True)]}
        return {"text": engine.tokenizer.decode(done.output_ids), "output_ids": done.output_ids, "meta_info": meta}

    @app.post("/pause_generation")
    async def pause_generation(http: Request):
        mode = (await http.json() or {}).get("mode", "abort")
        await engine.pause("abort" if mode == "abort" else "keep")
        return JSONResponse({"message": "Generation paused"})

    @app.post("/continue_generation")
    async def continue_generation():
        await engine.resume()
        return JSONResponse({"message": "Generation continued"})

    @app.post("/abort_request")
    async def abort_request(http: Request):
        body = await http.json()
        await engine.abort(None if body.get("abort_all") else [body["rid"]])
        return JSONResponse({})

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(http: Request):
        body = await http.json()
        try:
            await engine.update_weights(body["model_path"], int(body.get("weight_version") or engine.version + 1))
        except Exception as e:
            return JSONResponse({"success": False, "message": f"Failed to update weights: {e}"}, status_code=400)
        return {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    @app.get("/model_info")
    async def model_info():
        return {"model_path": "tiny-random", "is_generation": True, "weight_version": str(engine.version)}

    @app.get("/get_load")
    async def get_load():
        h = await engine.health()
        return [{"dp_rank": 0, "num_reqs": h.get("running", 0), "num_waiting_reqs": h.get("waiting", 0)}]

    @app.get("/metrics")  # SGLang's --enable-metrics exposition (only the counter the client reads)
    async def metrics():
        h = await engine.health()
        return PlainTextResponse("# HELP sglang:generation_tokens_total Number of generation tokens processed.\n"
                                 "# TYPE sglang:generation_tokens_total counter\n"
                                 f'sglang:generation_tokens_total{{model_name="tiny-random"}} '
                                 f"{float(h['tokens_generated'])}\n")

    @app.get("/health")
    async def health():
        return JSONResponse({})

    return app


@pytest.fixture(scope="module")
def sglang_url():
    import uvicorn

    from serving.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine("tiny-random", dtype="float32", max_batch_size=8)
    server = uvicorn.Server(uvicorn.Config(sglang_compatible_app(engine), host="127.0.0.1", port=0,
                                           log_level="warning"))
    server.install_signal_handlers = lambda: None  # not the main thread
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the SGLang-compatible server did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)
    engine.close()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from serving.models import resolve_model

    changed = tmp_path_factory.mktemp("ckpt") / "changed"
    suite.perturbed_tiny(changed, seed=5)
    return {"original": str(resolve_model("tiny-random")), "changed": str(changed)}


@pytest.fixture
def engine(sglang_url):
    return SGLangEngine(sglang_url, "tiny-random", request_timeout_s=120)


def test_payload_is_sglang_native():
    req = GenerateRequest([4, 5], SamplingParams(max_new_tokens=3, top_k=0, seed=9, stop_token_ids=[2]), request_id="t")
    path, body = SGLangEngine("http://127.0.0.1:1", "tiny-random")._generate_payload(req, 3, "t-abc")
    assert path == "/generate" and body["input_ids"] == [4, 5] and body["rid"] == "t-abc" and body["return_logprob"]
    sp = body["sampling_params"]
    assert sp["max_new_tokens"] == 3 and sp["top_k"] == -1 and sp["sampling_seed"] == 9 and sp["stop_token_ids"] == [2]


async def test_protocol_suite(engine, checkpoints):
    assert "tokens_generated" in await engine.health()  # read from /metrics: the suite waits on it
    await suite.check_generate_consistent(engine, exact=EXACT, vocab=len(engine.tokenizer))
    await suite.check_stop_conditions(engine, exact=EXACT)
    await suite.check_pause_abort_returns_partial(engine)
    await suite.check_weight_update(engine, checkpoints["changed"], checkpoints["original"], exact=EXACT)
    await suite.check_continuation_across_update(engine, checkpoints["changed"], checkpoints["original"], max_new=200)
    await suite.check_concurrent(engine, n=8, exact=EXACT)


async def test_version_read_from_model_info_and_failed_update_raises(engine, sglang_url, tmp_path):
    target = engine.version + 3
    with pytest.raises(EngineRequestError) as failed:  # an empty folder: SGLang answers success=false
        await engine.update_weights(str(tmp_path), target)
    assert not failed.value.retryable and not engine.paused and engine.version != target
    fresh = SGLangEngine(sglang_url, "tiny-random")
    assert fresh.version == engine.version
    health = await fresh.health()
    assert health["ok"] and health["server_version"] == engine.version and "server_load" in health


async def test_abort_before_prefill_returns_no_tokens(engine):
    await engine._request("POST", "/pause_generation", json={"mode": "abort"})  # the server pauses "under" us
    try:
        call = asyncio.create_task(engine.generate(GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=8))))
        await asyncio.sleep(1.0)
        assert not call.done() and engine.in_flight == 1
        await asyncio.wait_for(engine.pause("abort"), 30)  # the drain aborts the queued call by rid
        done = await asyncio.wait_for(call, 10)
        assert done.finish_reason == "abort" and done.output_ids == [] and done.versions == []
    finally:
        await asyncio.wait_for(engine.resume(), 30)
