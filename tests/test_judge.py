"""The LLM judge over both transports, for real: token ids through an InferenceEngine, and text through
OpenAIChatClient against real HTTP servers on loopback (a small OpenAI-shaped server written here, and our
own engine server). The judge *model* is a ScriptedEngine wherever a test has to decide the verdict.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.config import JudgeConfig
from agent.judge import JUDGE_PROMPT, LLMJudge, VerdictCache, build_judge, describe_judge, parse_verdict
from serving.engines.scripted import ScriptedEngine, ScriptedOutput
from serving.servers.openai_chat import MissingAPIKey, OpenAIChatClient, OpenAIChatError, api_base

pytestmark = pytest.mark.timeout(120)
KEY_ENV = "HEXSEARCH_TEST_JUDGE_CRED"  # a name core.log.redact does not know: the client must scrub it itself
KEY = "sk-test-9f8e7d6c5b4a-do-not-leak"
Q, GOLD, PRED = "When was Varnholt founded?", ["1642"], "in 1642"


def test_parse_verdict_edge_cases():
    assert parse_verdict("verdict: correct") is True
    assert parse_verdict("**VERDICT:** INCORRECT  ") is False
    assert parse_verdict("The answer is incorrect.\nVERDICT: CORRECT") is True  # only verdict lines count
    assert parse_verdict("VERDICT: CORRECTLY") is None
    assert parse_verdict('{"judgement": "incorrect"} then {"judgment": "Correct"}') is True  # last object wins
    assert parse_verdict('{"verdict": "maybe"}') is None
    assert parse_verdict("{not json} VERDICT") is None


async def test_engine_judge_caches_and_keys_by_model(tmp_path, tokenizer):
    engine = ScriptedEngine(["Same year.\nVERDICT: CORRECT"], tokenizer=tokenizer)
    judge = LLMJudge(engine, "judge-a", cache=tmp_path / "j.sqlite")
    v = await judge.judge(Q, GOLD, PRED)
    assert v.correct is True and not v.cached and engine.num_calls == 1
    again = await judge.judge(Q, GOLD, PRED)
    assert again.correct is True and again.cached and engine.num_calls == 1
    assert judge.stats()["judge/calls"] == 1 and judge.stats()["judge/cache_hits"] == 1
    # another judge model over the same file misses and asks its own engine
    other_engine = ScriptedEngine(["VERDICT: INCORRECT"], tokenizer=tokenizer)
    other = LLMJudge(other_engine, "judge-b", cache=tmp_path / "j.sqlite")
    assert (await other.judge(Q, GOLD, PRED)).correct is False and other_engine.num_calls == 1
    # the prompt version is part of the key
    assert VerdictCache.key("judge-a", Q, GOLD, PRED) != VerdictCache.key("judge-a", Q, GOLD, PRED, "v0")
    await judge.aclose()
    await other.aclose()


async def test_unparseable_is_retried_then_none_and_not_cached(tmp_path, tokenizer):
    engine = ScriptedEngine(["hmm", "VERDICT: CORRECT or VERDICT: INCORRECT", "no idea"], tokenizer=tokenizer)
    judge = LLMJudge(engine, "j", cache=tmp_path / "j.sqlite", retries=2, temperature=0.0)
    v = await judge.judge(Q, GOLD, "maybe 1642")
    assert v.correct is None and v.attempts == 3 and v.raw == "no idea" and not v.cached
    assert [c.sampling.temperature for c in engine.calls] == [0.0, 0.7, 0.7]
    assert [c.sampling.seed for c in engine.calls] == [1, 2, 3]
    assert judge.cache.get(VerdictCache.key("j", Q, GOLD, "maybe 1642")) is None
    assert judge.stats()["judge/unparsed"] == 1 and judge.calls == 3


async def test_identical_judgements_in_flight_share_one_call(tokenizer):
    engine = ScriptedEngine(["VERDICT: CORRECT"], tokenizer=tokenizer, token_delay_s=0.01)
    judge = LLMJudge(engine, "j", cache=None)
    verdicts = await judge.judge_many([(Q, GOLD, PRED)] * 4)
    assert [v.correct for v in verdicts] == [True] * 4 and engine.num_calls == 1
    assert sum(v.cached for v in verdicts) == 3 and judge.stats()["judge/shared"] == 3


async def test_slow_judge_call_times_out_and_raises(tmp_path, tokenizer):
    engine = ScriptedEngine([ScriptedOutput("VERDICT: CORRECT", hold_after=1)], tokenizer=tokenizer)
    judge = LLMJudge(engine, "j", cache=tmp_path / "j.sqlite", timeout_s=0.3)
    with pytest.raises(TimeoutError, match=r"timed out after 0.3s"):
        await judge.judge(Q, GOLD, PRED)
    assert judge.stats()["judge/errors"] == 1 and judge.cache.get(VerdictCache.key("j", Q, GOLD, PRED)) is None


def test_build_judge_errors_and_shared_engine(tmp_path, tokenizer):
    with pytest.raises(ValueError, match=r"needs agent.judge.urls"):
        build_judge(JudgeConfig(backend="openai", model="gpt-x", urls=[]))
    with pytest.raises(ValueError, match=r"agent.judge.backend: unknown engine backend 'bogus'. Valid: openai, embedded, http, vllm, sglang"):
        build_judge(JudgeConfig(backend="bogus"))
    engine = ScriptedEngine([], tokenizer=tokenizer)
    judge = build_judge(JudgeConfig(model="judge-m", cache=str(tmp_path / "c.sqlite"), timeout_s=7), engine=engine)
    assert judge.engine is engine and not judge.owns_transport and judge.timeout_s == 7
    d = judge.describe()
    assert d["model"] == "judge-m" and d["prompt_template"] == JUDGE_PROMPT and d["prompt_version"] == "v1"
    assert d["cache"] == str(tmp_path / "c.sqlite") and json.dumps(d)
    assert build_judge(JudgeConfig(cache="none"), engine=engine).cache is None
    assert describe_judge(JudgeConfig(backend="vllm", urls=["http://u:p@h:8000/?token=x"]))["urls"] == ["http://h:8000/"]


def test_api_base_forms():
    assert api_base("https://api.openai.com/v1/") == "https://api.openai.com/v1"
    assert api_base("127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert api_base("http://h:1/v1/chat/completions") == "http://h:1/v1"
    assert api_base("https://x.test/v1beta/openai") == "https://x.test/v1beta/openai"


# ---- a small OpenAI-compatible server --------------------------------------------------------------------


class FakeOpenAI:
    """Chat completions on loopback: checks the bearer token, replies from a script of (status, headers, body)."""

    def __init__(self, replies: list[tuple[int, dict, dict]]):
        self.replies, self.requests = list(replies), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization", "")
                outer.requests.append({"path": self.path, "auth": auth, "body": body, "t": time.monotonic()})
                if auth != f"Bearer {KEY}":  # echoes what it got, as some providers do
                    status, headers, reply = 401, {}, {"error": {"message": f"Incorrect API key provided: {auth}"}}
                elif self.path != "/v1/chat/completions":
                    status, headers, reply = 404, {}, {"detail": "Not Found"}
                else:
                    status, headers, reply = outer.replies.pop(0)
                    if callable(reply):
                        reply = reply(body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def chat_reply(text: str) -> dict:
    return {"id": "c1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


@pytest.fixture
def fake():
    servers = []

    def start(replies):
        servers.append(FakeOpenAI(replies))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


async def test_openai_judge_retries_429_and_never_leaks_the_key(fake, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(KEY_ENV, KEY)
    server = fake([(429, {"Retry-After": "1"}, {"error": {"message": "Rate limit reached"}}),
                   (200, {}, chat_reply("Both say 1642.\nVERDICT: CORRECT"))])
    cfg = JudgeConfig(backend="openai", model="gpt-judge", urls=[server.url + "/v1"], api_key_env=KEY_ENV,
                      cache=str(tmp_path / "j.sqlite"), timeout_s=30)
    judge = build_judge(cfg)
    caplog.set_level(logging.DEBUG)
    t0 = time.monotonic()
    v = await judge.judge(Q, GOLD, PRED)
    assert v.correct is True and not v.cached and time.monotonic() - t0 >= 0.95  # Retry-After honoured
    assert len(server.requests) == 2 and all(r["auth"] == f"Bearer {KEY}" for r in server.requests)
    body = server.requests[-1]["body"]
    assert body["model"] == "gpt-judge" and body["messages"][0]["role"] == "system" and body["seed"] == 1
    assert "Varnholt" in body["messages"][1]["content"] and body["max_tokens"] == cfg.max_new_tokens
    assert "HTTP 429: Rate limit reached" in caplog.text and "retry 1/3" in caplog.text
    assert (await judge.judge(Q, GOLD, PRED)).cached and len(server.requests) == 2
    d = judge.describe()
    assert d["backend"] == "openai" and d["urls"] == [server.url + "/v1"] and d["api_key_env"] == KEY_ENV
    assert describe_judge(cfg) == d  # what the driver records without building the judge
    assert judge.stats()["judge/latency_s"] >= 0.95
    assert KEY not in caplog.text + json.dumps(d) + repr(judge.engine)
    await judge.aclose()


async def test_openai_errors_are_one_clear_redacted_line(fake, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    server = fake([(400, {}, {"error": {"message": "messages must not be empty"}}),
                   (503, {}, {"error": {"message": "overloaded"}}), (503, {}, {"error": {"message": "overloaded"}})])
    client = OpenAIChatClient(server.url, "m", api_key_env=KEY_ENV, max_retries=1, backoff_s=0.01)
    msgs = [{"role": "user", "content": "hi"}]
    # missing key: names the variable, sends nothing
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(MissingAPIKey, match=KEY_ENV):
        await client.chat(msgs, temperature=0, max_tokens=8)
    assert server.requests == []
    # a wrong key echoed by the server is scrubbed
    monkeypatch.setenv(KEY_ENV, "sk-wrong-0123456789")
    with pytest.raises(OpenAIChatError) as e:
        await client.chat(msgs, temperature=0, max_tokens=8)
    assert e.value.status == 401 and "HTTP 401: Incorrect API key provided: Bearer ***" in str(e.value)
    assert "sk-wrong" not in str(e.value) and len(server.requests) == 1 and not e.value.retryable
    monkeypatch.setenv(KEY_ENV, KEY)
    # 400: at once, with the server's message
    with pytest.raises(OpenAIChatError, match=r"/v1/chat/completions: HTTP 400: messages must not be empty$"):
        await client.chat(msgs, temperature=0, max_tokens=8)
    assert len(server.requests) == 2
    # 503 twice with max_retries=1: gives up after 2 attempts
    with pytest.raises(OpenAIChatError, match=r"HTTP 503: overloaded \(gave up after 2 attempts\)") as e:
        await client.chat(msgs, temperature=0, max_tokens=8)
    assert e.value.retryable and len(server.requests) == 4
    # nothing listening: a retryable connection error
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = OpenAIChatClient(f"http://127.0.0.1:{port}", "m", api_key_env=KEY_ENV, max_retries=0)
    with pytest.raises(OpenAIChatError, match=r"ConnectError") as e:
        await dead.chat(msgs, temperature=0, max_tokens=8)
    assert e.value.retryable and e.value.__cause__ is None and e.value.__context__ is None  # httpx error not chained
    assert KEY not in caplog.text and "sk-wrong" not in caplog.text
    await client.aclose()


async def test_openai_switches_to_max_completion_tokens(fake, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)

    def reply(body):
        assert "max_tokens" not in body and body["max_completion_tokens"] == 16
        return chat_reply("VERDICT: INCORRECT")

    server = fake([(400, {}, {"error": {"message": "Unsupported parameter: 'max_tokens'. Use "
                                                   "'max_completion_tokens' instead."}}), (200, {}, reply)])
    client = OpenAIChatClient(server.url + "/v1/", "o-model", api_key_env=KEY_ENV, max_retries=0)
    assert await client.chat([{"role": "user", "content": "x"}], temperature=1, max_tokens=16) == "VERDICT: INCORRECT"
    assert client.token_param == "max_completion_tokens" and len(server.requests) == 2


# ---- our own engine server ------------------------------------------------------------------------------


@pytest.fixture
def engine_server(tokenizer):
    """serving.servers.engine_server over a ScriptedEngine (the judge model) on loopback, in a uvicorn thread."""
    import uvicorn

    from serving.servers.engine_server import create_app

    engine = ScriptedEngine(responder=lambda ids, req: "Same.\nVERDICT: CORRECT", tokenizer=tokenizer)
    server = uvicorn.Server(uvicorn.Config(create_app(engine, "tiny-random"), host="127.0.0.1", port=0,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    port = server.servers[0].sockets[0].getsockname()[1]
    yield engine, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


async def test_judge_over_our_engine_server_both_transports(engine_server, tmp_path):
    engine, url = engine_server
    # chat completions (text), no API key
    judge = build_judge(JudgeConfig(backend="openai", model="tiny-random", urls=[url], api_key_env="",
                                    cache="none", timeout_s=30))
    v = await judge.judge(Q, GOLD, PRED)
    assert v.correct is True and engine.num_calls == 1
    prompt = engine.tokenizer.decode(engine.calls[0].prompt_ids)
    assert "<|im_start|>system" in prompt and "Varnholt" in prompt  # the server applied the chat template
    await judge.aclose()
    # the http engine backend (token ids through /v1/completions)
    judge = build_judge(JudgeConfig(backend="http", model="tiny-random", urls=[url], cache="none", timeout_s=30))
    v = await judge.judge(Q, GOLD, "1642")
    assert v.correct is True and engine.num_calls == 2 and judge.describe()["urls"] == [url]
    assert engine.calls[1].prompt_ids == judge.prompt_ids(Q, GOLD, "1642")
    await judge.aclose()


def test_judge_client_survives_a_new_event_loop(engine_server):
    _, url = engine_server
    judge = build_judge(JudgeConfig(backend="openai", model="tiny-random", urls=[url], api_key_env="", cache="none"))
    for _ in range(2):  # each asyncio.run is a new loop: the HTTP client is rebuilt, not reused across loops
        assert asyncio.run(judge.judge(Q, GOLD, PRED)).correct is True
