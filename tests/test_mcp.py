"""MCP servers' tools as agent tools, against real SDK servers (tests/fixtures/mcp_server.py).

Covers: schemas, text/structured/non-text results, isError, timeouts, a killed or crashing server
(error observation, then a restart), env passthrough without leaking the secret, the tools filter
and prefix, start failures, streamable HTTP with a bearer token, and whole agent episodes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.loop import run_episode
from serving.engines.scripted import ScriptedEngine
from tools.config import MCPServerConfig
from tools.mcp import MCPError, MCPTool, open_mcp_tools

pytestmark = pytest.mark.timeout(120)

FIXTURE = str(Path(__file__).parent / "fixtures" / "mcp_server.py")
SECRET_VAR, SECRET = "HEXSEARCH_MCP_PASS", "s3cr3t-value-9876"  # a name core.log.redact would not catch


def kw(**over) -> dict:
    """BaseTool kwargs: short timeouts and backoff, no retries unless a test asks."""
    return dict(timeout_s=10.0, max_concurrency=8, retries=0, cache=None, backoff_initial_s=0.05,
                backoff_max_s=0.2, max_retry_after_s=1.0) | over


def stdio(**over) -> MCPServerConfig:
    return MCPServerConfig(**(dict(name="fx", command=sys.executable, args=[FIXTURE]) | over))


async def open_fx(server: MCPServerConfig | None = None, **base):
    conn, tools = await open_mcp_tools(server or stdio(), kw(**base))
    return conn, {t.name: t for t in tools}


async def gone(pid: int, within_s: float = 10.0) -> bool:
    """True once the process no longer exists (not even as a zombie)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}"):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_lists_tools_with_schemas_and_calls_them():
    conn, tools = await open_fx()
    try:
        assert {"echo", "add", "fail", "sleep", "crash", "env_probe", "pid", "media"} <= set(tools)
        echo = tools["echo"]
        assert isinstance(echo, MCPTool) and echo.source == "mcp:fx"
        fn = echo.schema["function"]
        assert fn["name"] == "echo" and fn["description"] == "Echo the given text back."
        assert fn["parameters"]["properties"]["text"]["type"] == "string" and fn["parameters"]["required"] == ["text"]
        assert tools["crash"].parameters["type"] == "object"

        obs = await echo({"text": "hello"})
        assert obs.ok and obs.text == "echo: hello" and obs.data["text"] == "echo: hello"
        obs = await tools["add"]({"a": 2, "b": 40})
        assert obs.ok and obs.data["structured"] == {"total": 42, "terms": [2, 40]} and '"total": 42' in obs.text
        obs = await tools["media"]({})
        assert obs.text.splitlines() == ["a picture:", "[image: image/png, 96 bytes base64]",
                                         "[resource: file:///notes.txt, text/plain]", "embedded notes",
                                         "[resource link: big.csv file:///big.csv, text/csv]"]
        assert not obs.cached and tools["echo"].cache_args({"text": "x"}) is None  # never cached
        missing = await echo({})
        assert missing.error == "missing required argument 'text'"
    finally:
        await conn.aclose()


async def test_is_error_and_protocol_errors_are_error_observations():
    conn, tools = await open_fx()
    try:
        obs = await tools["fail"]({"message": "no such city"})
        assert not obs.ok and "no such city" in obs.error and obs.text.startswith("[fail failed]")
        obs = await tools["add"]({"a": "many", "b": 1})  # the server validates its own schema
        assert not obs.ok and "valid integer" in obs.error
        assert (await tools["echo"]({"text": "still fine"})).text == "echo: still fine"
    finally:
        await conn.aclose()


async def test_slow_tool_times_out_within_bounds_and_the_server_stays_usable():
    conn, tools = await open_fx(timeout_s=1.0)
    try:
        t0 = time.monotonic()
        obs = await tools["sleep"]({"seconds": 30})
        assert time.monotonic() - t0 < 5
        assert obs.error == "timed out after 1s" and "timed out" in obs.text
        assert tools["sleep"].counters["timeouts"] == 1
        assert (await tools["echo"]({"text": "x"})).ok and conn.restarts == 0
    finally:
        await conn.aclose()


async def test_killed_server_gives_an_error_then_restarts_and_leaves_no_process():
    conn, tools = await open_fx()
    try:
        pid1 = int((await tools["pid"]({})).text)
        os.kill(pid1, signal.SIGKILL)
        obs = await tools["echo"]({"text": "a"})
        assert not obs.ok and "connection lost" in obs.error and obs.meta["error_type"] == "TransientError"
        obs = await tools["echo"]({"text": "b"})  # the connection restarted itself
        assert obs.ok and obs.text == "echo: b" and conn.restarts == 1
        pid2 = int((await tools["pid"]({})).text)
        assert pid2 != pid1 and await gone(pid1)  # the killed one was reaped, no zombie
        # with a retry, a call that hits a dead server succeeds on its second attempt
        retrying = MCPTool(conn, next(t for t in await conn.list_tools() if t.name == "echo"), **kw(retries=1))
        os.kill(pid2, signal.SIGKILL)
        obs = await retrying({"text": "c"})
        assert obs.ok and obs.text == "echo: c" and obs.meta["attempts"] == 2 and conn.restarts == 2
        pid3 = int((await tools["pid"]({})).text)
    finally:
        await conn.aclose()
    assert await gone(pid2) and await gone(pid3)  # aclose ends the server process


async def test_tool_that_exits_the_server_then_later_calls_work():
    conn, tools = await open_fx()
    try:
        pid = int((await tools["pid"]({})).text)
        obs = await tools["crash"]({})
        assert not obs.ok and "connection lost" in obs.error
        assert (await tools["echo"]({"text": "back"})).text == "echo: back"
        assert await gone(pid) and conn.restarts == 1
    finally:
        await conn.aclose()


async def test_concurrent_calls_share_one_session_and_one_restart():
    conn, tools = await open_fx(retries=2)
    try:
        texts = [o.text for o in await asyncio.gather(*(tools["echo"]({"text": str(i)}) for i in range(20)))]
        assert texts == [f"echo: {i}" for i in range(20)]
        os.kill(int((await tools["pid"]({})).text), signal.SIGKILL)
        results = await asyncio.gather(*(tools["echo"]({"text": str(i)}) for i in range(8)))
        assert all(o.ok for o in results) and conn.restarts == 1  # every call retried onto one restarted server
    finally:
        await conn.aclose()


async def test_env_passthrough_reaches_the_server_and_the_secret_never_leaks(monkeypatch, caplog):
    monkeypatch.setenv(SECRET_VAR, SECRET)
    monkeypatch.setenv("HEXSEARCH_MCP_NOT_PASSED", "visible-only-here")
    caplog.set_level(logging.DEBUG, logger="tools")  # tools.mcp and tools.mcp_connection
    conn, tools = await open_fx(stdio(env={"PLAIN_VAR": "hello"}, env_passthrough=[SECRET_VAR]))
    try:
        probe = tools["env_probe"]
        assert (await probe({"name": SECRET_VAR})).text == f"set ({len(SECRET)} chars)"
        assert (await probe({"name": "PLAIN_VAR"})).text == "set (5 chars)"
        assert (await probe({"name": "HEXSEARCH_MCP_NOT_PASSED"})).text == "unset"  # only the safe default env
        leak = await tools["leak"]({"name": SECRET_VAR})  # the server puts the secret in its error text
        assert not leak.ok and "bad credential ***" in leak.error and SECRET not in leak.text + leak.error
        deadline = time.monotonic() + 5  # the server printed the secret to stderr; its log line is scrubbed
        while f"env_probe saw {SECRET_VAR}=***" not in caplog.text and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert f"env_probe saw {SECRET_VAR}=***" in caplog.text
        assert SECRET not in caplog.text
    finally:
        await conn.aclose()
    # a server that dies at start: its stderr tail is in the error, scrubbed
    crashing = stdio(args=["-c", f"import os, sys; print('key is', os.environ['{SECRET_VAR}'], file=sys.stderr); "
                                 "sys.exit(1)"], env_passthrough=[SECRET_VAR])
    with pytest.raises(MCPError) as err:
        await open_mcp_tools(crashing, kw())
    assert "could not start" in str(err.value) and "key is ***" in str(err.value) and SECRET not in str(err.value)
    assert SECRET not in caplog.text


async def test_tools_filter_and_prefix():
    conn, tools = await open_fx(stdio(tools=["add", "echo"], prefix="fx_"))
    try:
        assert list(tools) == ["fx_add", "fx_echo"]
        assert tools["fx_echo"].schema["function"]["name"] == "fx_echo" and tools["fx_echo"].mcp_name == "echo"
        assert (await tools["fx_echo"]({"text": "p"})).text == "echo: p"
    finally:
        await conn.aclose()
    with pytest.raises(MCPError, match=r"MCP server 'fx': no tool named nope, nada \(it has: add, crash"):
        await open_mcp_tools(stdio(tools=["echo", "nope", "nada"]), kw())


async def test_start_failures_are_one_line_mcp_errors():
    with pytest.raises(MCPError, match=r"^MCP server 'bad' could not start: FileNotFoundError"):
        await open_mcp_tools(stdio(name="bad", command="/nonexistent/mcp-server", args=[]), kw())
    t0 = time.monotonic()
    with pytest.raises(MCPError, match=r"^MCP server 'mute' did not start within 1s$"):
        await open_mcp_tools(stdio(name="mute", args=["-c", "import time; time.sleep(60)"], connect_timeout_s=1), kw())
    assert time.monotonic() - t0 < 8
    with pytest.raises(MCPError, match="exactly one of"):
        await open_mcp_tools(MCPServerConfig(name="none"), kw())
    with pytest.raises(MCPError, match="HEXSEARCH_NO_SUCH_TOKEN .bearer_token_env. is not set"):
        await open_mcp_tools(MCPServerConfig(name="h", url="http://127.0.0.1:9/mcp",
                                             bearer_token_env="HEXSEARCH_NO_SUCH_TOKEN"), kw())
    assert ValueError in MCPError.__mro__


# -- streamable HTTP ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http_server():
    """The fixture served over streamable HTTP on a free loopback port, requiring a bearer token."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "fixture-bearer-token-123"
    proc = subprocess.Popen([sys.executable, FIXTURE, "--http", str(port), "--token", token],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("the HTTP MCP fixture did not start")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", token
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_streamable_http_with_bearer_token(http_server, monkeypatch):
    url, token = http_server
    monkeypatch.setenv("FIXTURE_MCP_BEARER", token)
    conn, tools = await open_fx(MCPServerConfig(name="web", url=url, bearer_token_env="FIXTURE_MCP_BEARER",
                                                tools=["echo", "add", "fail"], connect_timeout_s=10))
    try:
        assert (await tools["echo"]({"text": "over http"})).text == "echo: over http"
        assert (await tools["add"]({"a": 1, "b": 2})).data["structured"]["total"] == 3
        assert "boom" in (await tools["fail"]({"message": "boom"})).error
    finally:
        await conn.aclose()
    monkeypatch.setenv("FIXTURE_MCP_BEARER", "wrong-token-456")
    with pytest.raises(MCPError) as err:
        await open_mcp_tools(MCPServerConfig(name="web", url=url, bearer_token_env="FIXTURE_MCP_BEARER",
                                             connect_timeout_s=10), kw())
    assert "could not start" in str(err.value) and "wrong-token-456" not in str(err.value)


@pytest.mark.parametrize("url", ["http://example.org/mcp", "http://10.0.0.7:8000/mcp", "HTTP://[2001:db8::1]/mcp",
                                 "http://127.0.0.1.example.org/mcp"])
async def test_the_bearer_token_never_goes_over_plain_http_beyond_loopback(url, monkeypatch):
    monkeypatch.setenv("FIXTURE_MCP_BEARER", "secret-token-789")
    with pytest.raises(MCPError, match=r"refusing to send the bearer token .FIXTURE_MCP_BEARER. over plain HTTP") as err:
        await open_mcp_tools(MCPServerConfig(name="far", url=url, bearer_token_env="FIXTURE_MCP_BEARER"), kw())
    assert "secret-token-789" not in str(err.value)


@pytest.mark.parametrize("url", ["https://example.org/mcp", "http://localhost:9/mcp", "http://127.0.0.2:9/mcp",
                                 "http://[::1]:9/mcp"])
def test_https_or_loopback_may_carry_the_token_and_no_token_needs_no_tls(url):
    from tools.mcp_connection import MCPConnection

    MCPConnection(MCPServerConfig(name="ok", url=url, bearer_token_env="FIXTURE_MCP_BEARER"))  # no error
    MCPConnection(MCPServerConfig(name="open", url=url.replace("https:", "http:").replace("localhost", "example.org")))


# -- whole episodes -------------------------------------------------------------------------------
def tool_call(name: str, args: dict) -> str:
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


async def test_episode_calls_an_mcp_tool(tokenizer):
    conn, tools = await open_fx(stdio(tools=["echo", "add"], prefix="fx_"))
    try:
        engine = ScriptedEngine([tool_call("fx_echo", {"text": "lighthouse of Veyra"}) + tokenizer.eos_token,
                                 "<answer>Veyra</answer>" + tokenizer.eos_token], tokenizer=tokenizer)
        traj = await run_episode("Where is the lighthouse?", engine, tools,
                                 AgentConfig(action_format="hermes", read_search_results=False))
    finally:
        await conn.aclose()
    assert traj.stop_reason == "answered"
    [call] = traj.tool_calls
    assert call.name == "fx_echo" and call.args == {"text": "lighthouse of Veyra"} and call.error is None
    assert "echo: lighthouse of Veyra" in call.summary
    decoded = "".join(tokenizer.decode(seg.token_ids) for seg in traj.segments)
    assert "<tool_response>\necho: lighthouse of Veyra\n</tool_response>" in decoded
    assert '"name": "fx_add"' in decoded  # the MCP tools' schemas are in the system prompt


async def test_episode_survives_the_server_dying_mid_episode(tokenizer):
    conn, tools = await open_fx()
    try:
        engine = ScriptedEngine([tool_call("crash", {}) + tokenizer.eos_token,
                                 tool_call("echo", {"text": "again"}) + tokenizer.eos_token,
                                 "<answer>done</answer>" + tokenizer.eos_token], tokenizer=tokenizer)
        traj = await run_episode("Crash it.", engine, tools, AgentConfig(action_format="hermes",
                                                                          read_search_results=False))
    finally:
        await conn.aclose()
    assert traj.stop_reason == "answered"
    assert [c.name for c in traj.tool_calls] == ["crash", "echo"]
    assert "connection lost" in traj.tool_calls[0].error and traj.tool_calls[1].error is None
    decoded = "".join(tokenizer.decode(seg.token_ids) for seg in traj.segments)
    assert "connection lost" in decoded and "echo: again" in decoded


def test_mcp_tool_names_become_valid_agent_tool_names():
    from tools.mcp import agent_tool_name
    from tools.protocol import check_tool_name

    for raw, want in (("files.read", "files_read"), ("git/log", "git_log"), ("2fa", "_2fa"), ("ok-name", "ok-name")):
        assert agent_tool_name(raw) == want
        check_tool_name(want)
    assert len(agent_tool_name("x" * 100)) == 64
