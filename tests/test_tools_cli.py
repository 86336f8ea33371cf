"""`hexsearch tools access`: refuses metadata, loopback and private targets (also via redirect) in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fixtures.corpus import url_of, write_corpus
from fixtures.web import FixtureWeb


@pytest.fixture(scope="module")
def web():
    with FixtureWeb() as server:
        yield server


def access(*args: str, env_cache: str) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, HEXSEARCH_CACHE=env_cache)
    return subprocess.run([sys.executable, "-m", "hexsearch.cli", "-q", "tools", "access", *args, "--retries", "0"],
                          capture_output=True, text=True, env=env, timeout=120)


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("url,needle", [
    ("http://169.254.169.254/latest/meta-data/iam/security-credentials/", "cloud metadata address 169.254.169.254"),
    ("http://metadata.google.internal/computeMetadata/v1/", "private host name 'metadata.google.internal'"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "cloud metadata address fd00:ec2::254"),
    ("http://127.0.0.1:8265/api/jobs/", "loopback address 127.0.0.1"),
    ("http://localhost:8000/retrieve", "private host name 'localhost'"),
    ("http://0x7f.1/", "loopback address 127.0.0.1"),
    ("http://192.168.0.10/admin", "private address 192.168.0.10"),
    ("http://[::ffff:10.1.1.1]/", "private address 10.1.1.1"),
    ("file:///etc/passwd", "scheme 'file'"),
])
def test_refused_targets_exit_nonzero_with_one_line(url, needle, tmp_path):
    proc = access(url, env_cache=str(tmp_path))
    assert proc.returncode == 1 and proc.stdout == ""
    line = one_line(proc)
    assert line.startswith("hexsearch: access failed: refused") and needle in line


def test_redirect_to_private_is_refused_even_from_an_allowed_host(web, tmp_path):
    for target, needle in [("http://169.254.169.254/latest/", "metadata"), ("http://10.0.0.1/", "private"),
                           ("http://[::1]:22/", "loopback")]:
        proc = access(web.url(f"/redirect/to?url={target}"), "--allow-host", "127.0.0.1", env_cache=str(tmp_path))
        assert proc.returncode == 1
        line = one_line(proc)
        assert "redirect to" in line and needle in line


def test_allowed_fixture_page_and_local_world_page(web, tmp_path):
    ok = access(web.url("/article"), "--allow-host", "127.0.0.1", "--json", env_cache=str(tmp_path))
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert data["title"] == "Veyra Lighthouse" and "Odile Marchetti" in data["chunks"][0]
    failed = access(web.url("/status/500"), "--allow-host", "127.0.0.1", env_cache=str(tmp_path))
    assert failed.returncode == 1 and one_line(failed) == "hexsearch: access failed: HTTP 500"
    write_corpus(tmp_path / "world")
    local = access(url_of("Port Sable"), "--pages", str(tmp_path / "world" / "pages.jsonl"), env_cache=str(tmp_path))
    assert local.returncode == 0 and "Title: Port Sable" in local.stdout and "salt trade" in local.stdout


# -- `hexsearch tools list|call` on a config's tools (here: an MCP server's) ----------------------------
MCP_FIXTURE = str(__import__("pathlib").Path(__file__).parent / "fixtures" / "mcp_server.py")


def hexsearch(*args: str, cache: str) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, HEXSEARCH_CACHE=cache)
    return subprocess.run([sys.executable, "-m", "hexsearch.cli", "-q", "tools", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def mcp_config(tmp_path, **server) -> str:
    """A config with no built-ins and one MCP server (JSON is YAML)."""
    entry = dict(name="fx", command=sys.executable, args=[MCP_FIXTURE], tools=["echo", "fail", "add"],
                 prefix="fx_") | server
    path = tmp_path / "mcp.yaml"
    path.write_text(json.dumps({"tools": {"builtin": [], "retries": 0, "timeout_s": 20, "mcp_servers": [entry]}}))
    return str(path)


def test_tools_list_shows_mcp_tools_with_schemas(tmp_path):
    cfg = mcp_config(tmp_path)
    proc = hexsearch("list", cfg, cache=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "fx_echo  [mcp fx]\n  Echo the given text back.\n  parameters: {" in proc.stdout
    assert '"required": ["a", "b"]' in proc.stdout
    proc = hexsearch("list", cfg, "--json", cache=str(tmp_path))
    schemas = json.loads(proc.stdout)
    assert [s["function"]["name"] for s in schemas] == ["fx_echo", "fx_fail", "fx_add"]
    assert schemas[0]["function"]["parameters"]["properties"]["text"]["type"] == "string"


def test_tools_call_prints_the_observation_and_exits_by_outcome(tmp_path):
    cfg = mcp_config(tmp_path)
    ok = hexsearch("call", "fx_echo", '{"text": "hello"}', cfg, cache=str(tmp_path))
    assert ok.returncode == 0 and ok.stdout == "echo: hello\n", ok.stderr
    data = hexsearch("call", "fx_add", '{"a": 2, "b": 3}', cfg, "--json", cache=str(tmp_path))
    assert data.returncode == 0 and json.loads(data.stdout)["structured"] == {"total": 5, "terms": [2, 3]}
    failed = hexsearch("call", "fx_fail", '{"message": "no such page"}', cfg, cache=str(tmp_path))
    assert failed.returncode == 1 and failed.stdout == ""
    assert one_line(failed).startswith("hexsearch: fx_fail failed:") and "no such page" in failed.stderr
    unknown = hexsearch("call", "echo", "{}", cfg, cache=str(tmp_path))
    assert unknown.returncode == 2
    assert one_line(unknown) == "hexsearch: unknown tool 'echo' (configured tools: fx_add, fx_echo, fx_fail)"
    bad_json = hexsearch("call", "fx_echo", "{text: hi}", cfg, cache=str(tmp_path))
    assert bad_json.returncode == 2 and "JSON_ARGS is not valid JSON" in one_line(bad_json)


def test_tools_list_reports_a_server_that_cannot_start(tmp_path):
    proc = hexsearch("list", mcp_config(tmp_path, name="broken", command="/nonexistent/server", args=[]),
                     cache=str(tmp_path))
    assert proc.returncode == 2
    assert one_line(proc).startswith("hexsearch: MCP server 'broken' could not start: FileNotFoundError")
