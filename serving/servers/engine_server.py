"""OpenAI-compatible HTTP server over an InferenceEngine, with vLLM's RL endpoints (same names and shapes).

    hexsearch serve engine --model smollm2-135m-instruct --port 8000

Generation     POST /v1/completions        token-id or text prompts; `logprobs`, `return_token_ids` give
                                           per choice `token_ids`, `prompt_token_ids`, `logprobs`; every choice
                                           also carries `token_versions` (the weight version of each token)
               POST /v1/chat/completions   chat template applied; logprobs in the OpenAI chat shape
               GET  /v1/models, GET /health, POST /tokenize, POST /detokenize
RL control     POST /pause?mode=abort|wait|keep, POST /resume, GET /is_paused, POST /abort_requests
               POST /update_weights        {"path": dir, "version": n} (also "weights_path"/"weight_version",
                                           optionally nested in "update_info")
               POST /collective_rpc        {"method": "reload_weights", "kwargs": {"weights_path": dir}}
               POST /update_weight_version {"new_version": n};  GET /weight_info
               POST /reset_prefix_cache (drops KV kept for sticky request ids);  GET /load

Security (serving/servers/http_guard.py): with HEXSEARCH_ENGINE_TOKEN set, the RL control routes need `Authorization:
Bearer <token>` (the remote engine client sends it from the same variable); binding a non-loopback address
requires it, and a server hexsearch starts (serving/launch/servers.py) always gets a fresh one. Whatever the bind, a
web page the user opens cannot drive the server: a foreign `Host` (DNS rebinding) or any cross-origin `Origin`
gets 403, a POST body that is not `application/json` 415, a body over MAX_BODY_BYTES 413.
`--weights-root` limits the folders a weight update may load: a refused path is a 403 on `/update_weights` and
`/collective_rpc` alike, and what is loaded is the path as resolved when it was checked.

Sticky routing: a `request_id` body field or an `X-Request-Id` header names the trajectory, so the engine
reuses that trajectory's KV cache on its next turn. Bad requests get HTTP 400 with a message, never a crash.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from serving.protocol import GenerateRequest, SamplingParams
from serving.servers.engine_api import (
    BadRequest,
    ChatBody,
    CompletionBody,
    chat_logprobs,
    completion_logprobs,
    envelope,
    new_id,
    output_text,
    usage,
)
from serving.servers.http_guard import BodyLimit, LocalGuard, is_loopback

MAX_BODY_BYTES = 32 << 20
"""Largest request body (a batch of long token-id prompts is a few MB); larger ones get 413."""


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse(_error_body(status, message, kind), status_code=status)


def _version_arg(value: Any, field: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"'{field}' must be an integer weight version, got {value!r}") from None


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except Exception:
        raise BadRequest("request body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


CONTROL_PATHS = frozenset({"/pause", "/resume", "/abort_requests", "/update_weights", "/collective_rpc",
                           "/update_weight_version", "/reset_prefix_cache"})
"""Routes that change what the engine serves: behind the control token when one is set."""
TOKEN_ENV = "HEXSEARCH_ENGINE_TOKEN"
"""Environment variable holding the control token (the server requires it, the remote client sends it)."""


class Refused(Exception):
    """A request the server refuses with HTTP 403 and this message (a weights path outside the root)."""


def _error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def allowed_hosts(bind_host: str) -> frozenset[str] | None:
    """Names accepted in `Host`: the loopback ones and the bound address; any for a wildcard bind."""
    if bind_host in ("", "0.0.0.0", "::"):
        return None
    return frozenset({bind_host.strip("[]").lower()})


def create_app(engine: Any, model_name: str | None = None, *, control_token: str | None = None,
               weights_root: str | None = None, bind_host: str = "127.0.0.1",
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app serving `engine` (any InferenceEngine; the embedded engine adds top log-probs).

    `control_token`: the RL control routes (CONTROL_PATHS) answer 401 without `Authorization: Bearer
    <token>`. `weights_root`: weight updates may only load folders inside it (403 otherwise). `bind_host`:
    the address served, the one name besides loopback's accepted in `Host` (see serving/servers/http_guard.py)."""
    app = FastAPI(title="hexsearch engine server")
    root = Path(weights_root).resolve() if weights_root else None
    app.add_middleware(LocalGuard, token=control_token, control_paths=CONTROL_PATHS,
                       allowed_hosts=allowed_hosts(bind_host), error=_error_body)
    app.add_middleware(BodyLimit, limit=max_body_bytes)  # outermost: an oversized body is drained and refused first
    name = model_name or getattr(engine, "name", None) or "model"
    tok = engine.tokenizer
    max_len = getattr(engine, "max_model_len", None)
    active: dict[str, list[str]] = {}  # client request id -> engine request ids in flight
    top_ok = "top_logprobs" in inspect.signature(engine.generate).parameters

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(x) for x in e['loc'] if x != 'body')}: {e['msg']}" for e in exc.errors()]
        return _error(400, "invalid request: " + "; ".join(parts))

    @app.exception_handler(BadRequest)
    async def _bad(_: Request, exc: BadRequest) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(Refused)
    async def _refused(_: Request, exc: Refused) -> JSONResponse:
        return _error(403, str(exc), "PermissionError")

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"{type(exc).__name__}: {exc}", "InternalServerError")

    def sampling(body, max_new: int) -> SamplingParams:
        return SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=max(body.top_k, 0),
                              max_new_tokens=max_new, stop=body.stops(), stop_token_ids=body.stop_token_ids or [],
                              seed=body.seed, ignore_eos=body.ignore_eos)

    async def run(body, http: Request, prompts: list[list[int]], max_tokens: int | None, top: int) -> list:
        """Generate n choices per prompt concurrently; choice i*n + j is prompt i, sample j."""
        body.refuse_unsupported()
        rid = body.request_id or http.headers.get("x-request-id") or new_id("req")
        jobs = []
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise BadRequest(f"prompt {i} is empty")
            limit = (max_len or len(prompt) + 16) - len(prompt)
            max_new = max_tokens if max_tokens is not None else limit
            for j in range(body.n):
                eid = rid if len(prompts) * body.n == 1 else f"{rid}-{i * body.n + j}"
                params = sampling(body, max_new)
                if body.seed is not None and j:
                    params.seed = body.seed + j  # distinct but reproducible samples for n > 1
                jobs.append(GenerateRequest(list(prompt), params, request_id=eid))
        active[rid] = [j.request_id for j in jobs]
        kwargs = {"top_logprobs": top} if top and top_ok else {}
        try:
            return await asyncio.gather(*(engine.generate(j, **kwargs) for j in jobs))
        finally:
            active.pop(rid, None)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, http: Request) -> dict:
        prompts = body.prompts(tok)
        outs = await run(body, http, prompts, body.max_tokens, body.logprobs or 0)
        choices = []
        for k, c in enumerate(outs):
            prompt = prompts[k // body.n]
            choice = {"index": k, "text": output_text(tok, body, c), "finish_reason": c.finish_reason,
                      "stop_reason": c.stop_reason, "token_versions": list(c.versions),
                      "logprobs": completion_logprobs(tok, c, body.logprobs) if body.logprobs is not None else None}
            if body.return_token_ids:
                choice.update(token_ids=list(c.output_ids), prompt_token_ids=list(prompt))
            choices.append(choice)
        return envelope("text_completion", name, choices, usage([len(prompts[k // body.n]) for k in range(len(outs))],
                                                                outs))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, http: Request) -> dict:
        prompt = body.prompt_ids(tok)
        top = (body.top_logprobs or 0) if body.logprobs else 0
        outs = await run(body, http, [prompt], body.max_completion_tokens or body.max_tokens, top)
        choices = []
        for k, c in enumerate(outs):
            choice = {"index": k, "message": {"role": "assistant", "content": output_text(tok, body, c)},
                      "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                      "token_versions": list(c.versions),
                      "logprobs": chat_logprobs(tok, c, top) if body.logprobs else None}
            if body.return_token_ids:
                choice["token_ids"] = list(c.output_ids)
            choices.append(choice)
        extra = {"prompt_token_ids": prompt} if body.return_token_ids else {}
        return envelope("chat.completion", name, choices, usage([len(prompt)] * len(outs), outs), **extra)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                            "owned_by": "hexsearch", "root": name, "max_model_len": max_len}]}

    @app.get("/health")
    async def health() -> JSONResponse:
        h = await engine.health()
        return JSONResponse(h, status_code=200 if h.get("ok", True) else 503)

    @app.post("/tokenize")
    async def tokenize(http: Request) -> dict:
        body = await _json(http)
        if "messages" in body:
            ids = ChatBody(messages=body["messages"]).prompt_ids(tok)
        elif isinstance(body.get("prompt"), str):
            ids = tok.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))
        else:
            raise BadRequest("tokenize needs 'prompt' (a string) or 'messages'")
        return {"tokens": ids, "count": len(ids), "max_model_len": max_len}

    @app.post("/detokenize")
    async def detokenize(http: Request) -> dict:
        ids = (await _json(http)).get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise BadRequest("detokenize needs 'tokens', a list of token ids")
        bad = next((t for t in ids if not 0 <= t < len(tok)), None)
        if bad is not None:  # the tokenizer would raise (a 500) or return garbage
            raise BadRequest(f"token id {bad} is out of range: the vocabulary has {len(tok)} ids")
        return {"prompt": tok.decode(ids)}

    @app.post("/pause")
    async def pause(mode: str = "abort") -> dict:
        if mode not in ("abort", "wait", "keep"):
            raise BadRequest(f"unknown pause mode '{mode}'; valid: abort, wait, keep")
        await engine.pause(mode)
        return {"status": "paused"}

    @app.post("/resume")
    async def resume() -> dict:
        await engine.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict:
        return {"is_paused": bool((await engine.health()).get("paused"))}

    @app.post("/abort_requests")
    async def abort_requests(http: Request) -> dict:
        ids = (await _json(http)).get("request_ids") or []
        if not isinstance(ids, list):
            raise BadRequest("'request_ids' must be a list of request ids (empty: all)")
        if not hasattr(engine, "abort"):
            raise BadRequest("this engine cannot abort single requests; use /pause?mode=abort")
        targets = [e for rid in ids for e in active.get(str(rid), [str(rid)])]
        n = await engine.abort(targets or None)
        return {"status": "aborted", "aborted": n}

    async def load(path: Any, version: int) -> dict:
        """Load the folder `path` as `version`; Refused (403) outside the weights root. The path is resolved
        once and that resolved path is what loads: a symlink swapped after the check changes nothing."""
        if not isinstance(path, str) or not path:
            raise BadRequest("a weights folder path is required ('path' or 'weights_path')")
        resolved = Path(path).resolve()
        if root is not None and not resolved.is_relative_to(root):
            raise Refused(f"weights path {path} is outside the server's weights root {root}")
        await engine.update_weights(str(resolved), version)
        return {"status": "ok", "version": engine.version}

    @app.post("/update_weights")
    async def update_weights(http: Request) -> dict:
        body = await _json(http)
        info = body.get("update_info") if isinstance(body.get("update_info"), dict) else body
        path = info.get("path", info.get("weights_path"))
        raw = info.get("version", info.get("weight_version", info.get("new_version")))
        version = engine.version + 1 if raw is None else _version_arg(raw, "version")
        return await load(path, version)

    @app.post("/collective_rpc")
    async def collective_rpc(http: Request) -> dict:
        body = await _json(http)
        if body.get("method") != "reload_weights":
            raise BadRequest(f"unsupported collective_rpc method {body.get('method')!r}; supported: reload_weights")
        kwargs, args = body.get("kwargs") or {}, body.get("args") or []
        if not isinstance(kwargs, dict) or not isinstance(args, list):
            raise BadRequest("collective_rpc needs 'kwargs' as an object and 'args' as a list, got "
                             f"{type(kwargs).__name__} and {type(args).__name__}")
        path = kwargs.get("weights_path") or (args[0] if args else None)
        await load(path, engine.version)
        return {"results": [None]}

    @app.post("/update_weight_version")
    async def update_weight_version(http: Request) -> dict:
        body = await _json(http)
        version = _version_arg(body.get("new_version", body.get("version")), "new_version")
        if not hasattr(engine, "set_version"):
            raise BadRequest("this engine sets versions only through /update_weights")
        engine.set_version(version)
        return {"success": True, "new_version": str(version)}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict:
        reset = getattr(engine, "reset_prefix_cache", None)
        if reset is not None:
            await reset()
        return {"success": True}

    @app.get("/load")
    async def load_figure() -> dict:
        h = await engine.health()
        return {"server_load": int(h.get("running", 0)) + int(h.get("waiting", 0))}

    @app.get("/weight_info")
    async def weight_info() -> dict:
        return {"weight_version": str(engine.version), "version": engine.version}

    return app


def serve(engine: Any, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          log_level: str = "warning", control_token: str | None = None, weights_root: str | None = None) -> None:
    """Run the server in this process until interrupted; prints the bound address (port 0 picks a free one).
    A non-loopback `host` needs a `control_token` (ValueError otherwise)."""
    import uvicorn

    if not is_loopback(host) and not control_token:
        raise ValueError(f"binding {host} (not loopback) needs a control token: set {TOKEN_ENV} (the RL control "
                         "routes would otherwise let anyone on the network pause the engine or swap its weights)")
    app = create_app(engine, model_name, control_token=control_token, weights_root=weights_root, bind_host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False)
    server = uvicorn.Server(config)

    async def main() -> None:
        await server.serve()

    original_startup = server.startup

    async def startup(sockets=None) -> None:
        await original_startup(sockets)
        for s in server.servers:
            for sock in s.sockets:
                h, p = sock.getsockname()[:2]
                print(f"hexsearch engine server listening on http://{h}:{p}", flush=True)

    server.startup = startup  # type: ignore[method-assign]
    try:
        asyncio.run(main())
    finally:
        close = getattr(engine, "close", None)
        if close:
            close()
