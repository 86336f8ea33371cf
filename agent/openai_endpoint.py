"""The recording OpenAI-compatible endpoint that agent programs call (one per process, on loopback).

    endpoint = RecordingEndpoint(tokenizer, "policy");  await endpoint.start()
    key = endpoint.open(episode)        # episode: agent.openai_calls.EpisodeCalls (engine, budgets, records)
    ... the program calls endpoint.base_url with api_key=key ...
    endpoint.close(key)                 # the key stops working; calls still running are cancelled

Routes (OpenAI's shapes, request and response bodies as serving/servers/engine_api.py defines them for our engine
server): POST /v1/chat/completions (`tools`, `tool_choice`, Hermes tool-call parsing, `n=1`), POST
/v1/completions (a text or token-id prompt), GET /v1/models. Every generation goes to the episode's engine
through `serving.protocol.generate_continuing`: a call cut by a weight update continues under the new
weights, the program only sees the pause. The sampling settings are the run's (`agent.temperature`, ...):
what the program asks for is not the behaviour policy the learner corrects for, so it is ignored;
`max_tokens` and `stop` are honoured within `agent.max_new_tokens` and the context.

Keys. The API key names the episode: a random secret per episode, compared in constant time, valid from
`open` to `close`. Nothing is ever served across episodes (there is no route that lists or reads calls),
so a program holding one key can neither read nor add to another episode's calls. The server binds
127.0.0.1 only, behind serving/http_guard.LocalGuard (no foreign Host, no cross-origin page, JSON bodies).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from agent.openai_calls import (
    CallRecord,
    ChatRenderer,
    EpisodeCalls,
    normalize_messages,
    parse_tool_calls,
    tool_choice_prefill,
)
from serving.protocol import GenerateRequest, SamplingParams, generate_continuing
from serving.servers.engine_api import (
    BadRequest,
    ChatBody,
    CompletionBody,
    chat_logprobs,
    completion_logprobs,
    envelope,
    output_text,
    usage,
)
from serving.servers.http_guard import BodyLimit, LocalGuard

MAX_BODY_BYTES = 16 << 20
"""Largest request body (a long agent history is well under a megabyte)."""


def _error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


class Unauthorized(Exception):
    """No episode has this key (never issued, or its episode ended)."""


class RecordingEndpoint:
    """See the module docstring."""

    def __init__(self, tokenizer: Any, model_name: str = "policy"):
        self.tokenizer, self.model_name = tokenizer, model_name
        self.renderer = ChatRenderer(tokenizer)
        self.episodes: dict[str, EpisodeCalls] = {}
        self._tasks: dict[str, set[asyncio.Task]] = {}
        self.port = 0
        self._server: Any = None
        self._serve_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats = {"calls": 0, "refused": 0}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        """Serve on a free loopback port in the running event loop (the one the engine calls belong to);
        a new loop (a later `asyncio.run`) gets a new server."""
        loop = asyncio.get_running_loop()
        if self._serve_task is not None and self._loop is loop and not self._serve_task.done():
            return
        import uvicorn

        from serving.servers.retrieval_server import listen_socket

        sock = listen_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off"))
        server.capture_signals = contextlib.nullcontext  # the host process (pytest, Ray, the CLI) owns signals
        self._server, self._loop = server, loop
        self._serve_task = loop.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if self._serve_task.done():
                self._serve_task.result()
                raise RuntimeError("the recording endpoint did not start")
            await asyncio.sleep(0.01)

    def open(self, episode: EpisodeCalls) -> str:
        key = "hx-" + secrets.token_urlsafe(24)
        self.episodes[key] = episode
        return key

    def close(self, key: str) -> None:
        self.episodes.pop(key, None)
        for task in self._tasks.pop(key, set()):
            task.cancel()

    async def aclose(self) -> None:
        for key in list(self.episodes):
            self.close(key)
        if self._server is not None and self._serve_task is not None and not self._serve_task.done():
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._serve_task, 10)
        self._server = self._serve_task = None

    # ---- serving ------------------------------------------------------------------------------
    def episode_of(self, http: Request) -> tuple[str, EpisodeCalls]:
        sent = http.headers.get("authorization", "")
        token = sent[7:].strip() if sent[:7].lower() == "bearer " else ""
        for key, episode in self.episodes.items():
            if hmac.compare_digest(token.encode(), key.encode()):
                return key, episode
        self.stats["refused"] += 1
        raise Unauthorized("invalid API key: every episode has its own key, valid while the episode runs")

    async def generate(self, key: str, episode: EpisodeCalls, prompt: list[int], max_tokens: int | None,
                       stops: list[str], ignore_eos: bool = False) -> Any:
        """One engine call of `episode`, cancelled when the episode is closed."""
        if len(episode.calls) + episode.started >= episode.max_calls:
            episode.budget_spent = True
            raise BadRequest(f"this episode's call budget is spent (agent.max_turns={episode.max_calls})")
        room = episode.max_context_tokens - len(prompt)
        if room < 1:
            raise BadRequest(f"prompt of {len(prompt)} tokens leaves no room in the context "
                             f"(agent.max_context_tokens={episode.max_context_tokens})")
        seed = None if episode.seed is None else (episode.seed * 1_000_003 + len(episode.calls)) % (2**31)
        sampling = SamplingParams(max_new_tokens=min(max_tokens or episode.max_new_tokens, episode.max_new_tokens,
                                                     room), stop=stops, seed=seed, ignore_eos=ignore_eos,
                                  **episode.sampling)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.setdefault(key, set()).add(task)
        episode.started += 1
        t = time.perf_counter()
        try:
            comp = await generate_continuing(episode.engine, GenerateRequest(prompt, sampling, episode.request_id))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            episode.engine_error = f"{type(e).__name__}: {e}"[:500]
            raise
        finally:
            episode.started -= 1
            self._tasks.get(key, set()).discard(task)
        self.stats["calls"] += 1
        return comp, time.perf_counter() - t

    def app(self) -> FastAPI:
        app = FastAPI(title="hexsearch recording endpoint")
        app.add_middleware(LocalGuard, token=None, control_paths=frozenset(), allowed_hosts=frozenset(),
                           error=_error_body)
        app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
        tok = self.tokenizer

        @app.exception_handler(Unauthorized)
        async def _unauthorized(_: Request, exc: Unauthorized) -> JSONResponse:
            return JSONResponse(_error_body(401, str(exc), "AuthenticationError"), status_code=401)

        @app.exception_handler(RequestValidationError)
        async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
            parts = [f"{'.'.join(str(x) for x in e['loc'] if x != 'body')}: {e['msg']}" for e in exc.errors()]
            return JSONResponse(_error_body(400, "invalid request: " + "; ".join(parts), "BadRequestError"), 400)

        @app.exception_handler(ValueError)  # BadRequest included
        async def _bad(_: Request, exc: ValueError) -> JSONResponse:
            return JSONResponse(_error_body(400, str(exc), "BadRequestError"), status_code=400)

        @app.exception_handler(Exception)
        async def _internal(_: Request, exc: Exception) -> JSONResponse:
            return JSONResponse(_error_body(500, f"{type(exc).__name__}: {exc}", "InternalServerError"), 500)

        @app.post("/v1/chat/completions")
        async def chat(body: ChatBody, http: Request) -> dict:
            key, episode = self.episode_of(http)
            body.refuse_unsupported()
            if body.n != 1:
                raise BadRequest("n must be 1: each call is one step of the episode")
            tools = body.tools or None
            choice = (body.model_extra or {}).get("tool_choice")
            if choice == "none":
                tools = None
            prefill = tool_choice_prefill(choice, tools)
            norm = normalize_messages(body.messages)
            if not norm:
                raise BadRequest("messages is empty")
            prompt, how = episode.chat_prompt(self.renderer, norm, tools, prefill)
            comp, latency = await self.generate(key, episode, prompt, body.max_completion_tokens or body.max_tokens,
                                                body.stops(), body.ignore_eos)
            text = output_text(tok, body, comp)
            content, calls = parse_tool_calls(prefill + text) if tools else (text, [])
            ended = bool(comp.output_ids) and comp.output_ids[-1] == tok.eos_token_id
            closed = tok.decode(comp.output_ids[-1:], skip_special_tokens=False) if ended else ""
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            episode.remember_chat(norm, message, prompt + list(comp.output_ids), closed)
            episode.calls.append(CallRecord("chat", prompt, list(comp.output_ids), list(comp.logprobs),
                                            list(comp.versions), comp.finish_reason, how, latency))
            episode.tool_calls += [(len(episode.calls) - 1, c["function"]["name"], c["function"]["arguments"])
                                   for c in calls]
            finish = "tool_calls" if calls else comp.finish_reason
            choice_out = {"index": 0, "message": message, "finish_reason": finish, "token_versions": list(comp.versions),
                          "logprobs": chat_logprobs(tok, comp, body.top_logprobs or 0) if body.logprobs else None}
            return envelope("chat.completion", self.model_name, [choice_out], usage([len(prompt)], [comp]))

        @app.post("/v1/completions")
        async def completions(body: CompletionBody, http: Request) -> dict:
            key, episode = self.episode_of(http)
            body.refuse_unsupported()
            prompts = body.prompts(tok)
            if body.n != 1 or len(prompts) != 1:
                raise BadRequest("one prompt and n=1 per call: each call is one step of the episode")
            comp, latency = await self.generate(key, episode, prompts[0], body.max_tokens, body.stops(), body.ignore_eos)
            episode.calls.append(CallRecord("completions", prompts[0], list(comp.output_ids), list(comp.logprobs),
                                            list(comp.versions), comp.finish_reason, "completion", latency))
            choice_out = {"index": 0, "text": output_text(tok, body, comp), "finish_reason": comp.finish_reason,
                          "token_versions": list(comp.versions),
                          "logprobs": completion_logprobs(tok, comp, body.logprobs) if body.logprobs is not None
                          else None}
            return envelope("text_completion", self.model_name, [choice_out], usage([len(prompts[0])], [comp]))

        @app.get("/v1/models")
        async def models(http: Request) -> dict:
            self.episode_of(http)
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": int(time.time()),
                                                "owned_by": "hexsearch"}]}

        return app
