"""`hexsearch view`'s server and index over real files and a real loopback HTTP server (no browser:
tests/test_viewer_browser.py drives the pages)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys

import pytest
from viewer_runs import BAD_LINE, make_all, make_trajectory

from hexsearch.viewer.index import TrajectoryIndex
from hexsearch.viewer.runs import find_runs, kind_of
from hexsearch.viewer.server import ViewerServer


@pytest.fixture(scope="module")
def site(tmp_path_factory, tokenizer):
    folders = make_all(tmp_path_factory.mktemp("runs"), tokenizer)
    server = ViewerServer(folders).start()
    yield server, folders
    server.close()


def get(server, path: str, host: str | None = None) -> tuple[int, dict | bytes]:
    port = server.httpd.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers={"Host": host or f"127.0.0.1:{port}"})
    res = conn.getresponse()
    body = res.read()
    conn.close()
    is_json = res.getheader("Content-Type", "").startswith("application/json")
    return res.status, json.loads(body) if is_json else body


def test_binds_loopback_and_refuses_other_hosts(site):
    server, _ = site
    assert server.httpd.server_address[0] == "127.0.0.1"
    status, body = get(server, "/api/runs", host="attacker.example:80")  # DNS rebinding
    assert status == 403 and "not a loopback name" in body["error"]
    status, body = get(server, "/")
    assert status == 200 and b"/static/app.js" in body


def test_serves_nothing_outside_the_run_folders(site, tmp_path):
    server, folders = site
    secret = folders[0].parent / "secret.txt"
    secret.write_text("not yours")
    (folders[0] / "artifacts" / "link").symlink_to(secret)
    (folders[0] / "checkpoints" / "learner.pt").write_bytes(b"not yours either")
    for path in ("/api/run/0/file/checkpoints/learner.pt", "/api/run/0/file/../secret.txt", "/api/run/0/file/%2e%2e/secret.txt", "/api/run/0/file/artifacts/link",
                 "/api/run/0/file//etc/passwd", "/static/../server.py", "/static/%2e%2e%2fserver.py", "/api/run/9"):
        status, body = get(server, path)
        assert status == 404, (path, body)
        assert b"not yours" not in json.dumps(body).encode()
    status, body = get(server, "/api/run/0/file/results.json")
    assert status == 200 and body["steps"] == 5


def test_a_malformed_line_is_named_and_the_rest_still_served(site):
    server, folders = site
    status, page = get(server, "/api/run/0/trajectories?limit=100")
    assert status == 200 and page["total"] == 25 and page["error_count"] == 1
    err = page["errors"][0]
    assert err["file"].endswith("train.jsonl") and err["line"] == 4 and "line 1 column" in err["error"]
    assert page["rows"][3]["bad"] and page["rows"][4]["qid"] == "hw-train-000"
    status, body = get(server, "/api/run/0/trajectory?file=train.jsonl&n=3")
    assert status == 400 and "train.jsonl:4:" in body["error"]
    status, body = get(server, "/api/run/0/trajectory?file=train.jsonl&n=abc")
    assert status == 400 and "not an integer" in body["error"]


def test_trajectory_detail_matches_the_file(site):
    server, folders = site
    d = json.loads((folders[0] / "trajectories" / "train.jsonl").read_text().splitlines()[0])
    status, t = get(server, "/api/run/0/trajectory?file=train.jsonl&n=0")
    assert status == 200 and t["tokenizer_problem"] is None
    assert t["tokens"]["trained"] == sum(sum(s["loss_mask"]) for s in d["segments"])
    assert [s["ids"] for s in t["tokens"]["segments"]] == [s["token_ids"] for s in d["segments"]]
    turns = [e for e in t["timeline"] if e["kind"] == "turn"]
    assert turns[0]["text"].startswith("<think>look it up</think><search>") and turns[1]["text"] == "<answer>1642</answer>"
    assert turns[0]["tool_calls"][0]["name"] == "search" and [e["kind"] for e in t["timeline"]].count("segment") == 1
    status, g = get(server, "/api/run/0/group?file=train.jsonl&group=0:1%230")
    assert g["signal"] is False and all(m["advantage"] == 0 for m in g["members"])  # equal rewards: no signal
    status, e = get(server, "/api/run/1/trajectory?file=eval.jsonl&key=q5/0")
    assert status == 200 and e["head"]["question"] == "Who founded town 5?"


def test_run_kinds_and_run_discovery(site, tmp_path):
    server, folders = site
    status, s = get(server, "/api/run/1")
    assert s["files"] == ["report.md"]
    port = server.httpd.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/api/run/1/file/report.md", headers={"Host": f"localhost:{port}"})
    res = conn.getresponse()
    assert res.status == 200 and res.getheader("Content-Type").startswith("text/plain;") and b"<script>" in res.read()
    assert [kind_of(f) for f in folders] == ["train", "eval", "datagen", "ask"]
    assert find_runs([folders[0].parent]) and set(find_runs([folders[0].parent])) == {f.resolve() for f in folders}
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a run folder"):
        find_runs([tmp_path / "empty"])


def test_index_grows_with_the_file_and_waits_for_a_torn_line(tmp_path, tokenizer):
    path = tmp_path / "train.jsonl"
    line = lambda i: make_trajectory(tokenizer, f"Q{i}?", "1642", 1.0, group=f"{i}:0#0", step=i, version=0,  # noqa: E731
                                     qid=f"q{i}").to_json()
    path.write_text(line(0) + "\n" + line(1)[:50])  # a writer is half-way through line 2
    index = TrajectoryIndex(path).refresh()
    assert len(index.rows) == 1 and not index.errors
    with path.open("a") as f:
        f.write(line(1)[50:] + "\n" + BAD_LINE + "\n")
    index.refresh()
    assert [r.get("qid") for r in index.rows] == ["q0", "q1", None] and index.errors[0]["line"] == 3
    assert index.read(1)["question"] == "Q1?"
    path.write_text(line(7) + "\n")  # rewritten (a resumed run): indexed again from the start
    assert [r["qid"] for r in index.refresh().rows] == ["q7"]


def test_view_command_errors_are_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "hexsearch.cli", "view", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip() == f"hexsearch: view: {tmp_path / 'nope'}: no such folder"


@pytest.mark.slow
def test_a_run_of_100k_trajectories_serves_its_first_page_before_the_index_is_done(tmp_path, tokenizer, monkeypatch):
    """The first page of a 100,000-trajectory run is served while the rest is indexed in the background;
    opened again, the cached index has the whole run at once (the times: benchmarks/viewer_open.py)."""
    monkeypatch.setenv("HEXSEARCH_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "big"
    (run / "trajectories").mkdir(parents=True)
    (run / "config.yaml").write_text("engine:\n  model: tiny-random\n")
    with (run / "trajectories" / "train.jsonl").open("w") as f:
        for i in range(100_000):
            f.write(make_trajectory(tokenizer, f"Question {i}?", "1642", float(i % 2), group=f"{i // 4}:0#0", step=i // 32,
                                    version=i // 32, qid=f"q{i}").to_json() + "\n")
    pages = []
    for _ in ("first", "cached"):
        server = ViewerServer([run]).start()
        status, page = get(server, "/api/run/0/trajectories?limit=50")
        assert status == 200 and [r["qid"] for r in page["rows"]] == [f"q{i}" for i in range(50)]
        server.api.runs[0].indexes["train.jsonl"].wait(120)
        pages.append(page)
        server.close()
    assert pages[0]["indexing"] and pages[0]["total"] < 100_000  # answered before the whole file was read
    assert pages[1]["total"] == 100_000 and not pages[1]["indexing"]


def test_a_bad_metrics_line_is_reported_and_the_run_page_still_served(tmp_path, tokenizer):
    from viewer_runs import make_train_run

    run = make_train_run(tmp_path, tokenizer, groups=1, bad_line=False)
    with (run / "metrics.jsonl").open("a") as f:
        f.write("{not json\n" + json.dumps({"step": 6, "train/reward": float("nan")}) + "\n")
    server = ViewerServer([run]).start()
    try:
        status, s = get(server, "/api/run/0")
    finally:
        server.close()
    assert status == 200 and len(s["metrics"]) == 8 and s["metrics"][-1]["train/reward"] is None  # NaN: null
    assert s["errors"] == [{"file": str(run / "metrics.jsonl"), "line": 8, "error": s["errors"][0]["error"]}]


def test_a_finished_index_is_cached_and_dropped_when_the_file_changed(tmp_path, tokenizer, monkeypatch):
    import hexsearch.viewer.index as ix

    monkeypatch.setenv("HEXSEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ix, "CACHE_MIN_ROWS", 2)
    path = tmp_path / "train.jsonl"
    lines = [make_trajectory(tokenizer, f"Q{i}?", "1642", 1.0, group=f"{i}:0#0", step=i, version=0, qid=f"q{i}").to_json()
             for i in range(3)]
    path.write_text("\n".join(lines) + "\n")
    assert len(TrajectoryIndex(path).refresh().rows) == 3 and list((tmp_path / "cache").rglob("*.json"))

    def no_parsing(raw):
        raise AssertionError("a cached index parses nothing")

    monkeypatch.setattr(ix, "summarise", no_parsing)
    assert [r["qid"] for r in TrajectoryIndex(path).refresh().rows] == ["q0", "q1", "q2"]  # from the cache
    monkeypatch.undo()
    monkeypatch.setenv("HEXSEARCH_CACHE", str(tmp_path / "cache"))
    with path.open("r+") as f:  # rewritten in place: same inode, same size, other content
        f.write(lines[0].replace('"Q0?"', '"Z0?"'))
    assert TrajectoryIndex(path).refresh().rows[0]["q"] == "Z0?"


def test_no_file_is_read_from_outside_its_run_folder(tmp_path, tokenizer):
    """Every file the run pages read (config, metrics, results, eval rows, datagen items, trajectories) is resolved
    first: a symlink out of the run folder is reported as an error, never read; `/api/run/-1` is no run."""
    from viewer_runs import make_datagen_run, make_eval_run, make_train_run

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    secret = {"step": 1, "train/reward": 0.5, "question": "SECRET", "index": 0, "engine": {"model": "SECRET"}}
    for name in ("metrics.jsonl", "results.jsonl", "items.jsonl", "stolen.jsonl"):
        (outside / name).write_text(json.dumps(secret) + "\n")
    (outside / "results.json").write_text(json.dumps({"steps": "SECRET"}))
    (outside / "config.yaml").write_text("engine: {model: SECRET}\n")
    train, ev, dg = (make_train_run(tmp_path / "runs", tokenizer, groups=1, bad_line=False),
                     make_eval_run(tmp_path / "runs", tokenizer), make_datagen_run(tmp_path / "runs"))
    links = {train: ("metrics.jsonl", "results.json", "config.yaml"), ev: ("results.jsonl",), dg: ("items.jsonl",)}
    for run, names in links.items():
        for name in names:
            (run / name).unlink(missing_ok=True)
            (run / name).symlink_to(outside / name)
    (train / "trajectories" / "stolen.jsonl").symlink_to(outside / "stolen.jsonl")
    server = ViewerServer([train, ev, dg]).start()
    try:
        for i in range(3):
            status, body = get(server, f"/api/run/{i}")
            assert status == 200 and "SECRET" not in json.dumps(body), (i, body)
            assert any("leads out of the run folder" in e["error"] for e in body["errors"]), body["errors"]
        assert "stolen.jsonl" not in get(server, "/api/run/0")[1]["trajectory_files"]
        for path in ("/api/run/0/trajectories?file=stolen.jsonl", "/api/run/2/item?index=0", "/api/run/-1",
                     "/api/run/-1/stamp", "/api/run/+0"):
            status, body = get(server, path)
            assert status == 404 and "SECRET" not in json.dumps(body), (path, status, body)
    finally:
        server.close()


def test_metric_keys_cannot_pollute_the_page(tmp_path):
    """A metric named `tools/__proto__/calls` (or a staleness bucket `__proto__`) stays a table row: the page's
    objects (Object.prototype) are untouched. Runs pages.js's train section in node, with the page helpers stubbed."""
    import shutil
    from pathlib import Path

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    pages = Path(__file__).resolve().parents[1] / "hexsearch" / "viewer" / "static" / "pages.js"
    metrics = [{"step": 1, "train/reward": 0.5, "tools/__proto__/calls": 7, "tools/constructor/ok": 1,
                "tools/search/calls": 3, "rollout/staleness_hist": {"__proto__": {"polluted": 1}, "0": 2}}]
    script = """
const vm = require("vm"), fs = require("fs");
const ctx = vm.createContext({HX: {pages: {}}, DATA: process.argv[2], h: (...a) => a, cards: x => x,
  table: (cols, rows) => ({rows}), lineChart: () => null, barChart: (t, bars) => ({bars})});
vm.runInContext(fs.readFileSync(process.argv[1], "utf8"), ctx);
const out = vm.runInContext(`(() => { const page = trainSection({metrics: JSON.parse(DATA)});
  const probe = {}; return {calls: probe.calls, ok: probe.ok, polluted: probe.polluted, page}; })()`, ctx);
console.log(JSON.stringify(out));
"""
    run = subprocess.run([node, "-e", script, str(pages), json.dumps(metrics)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert "calls" not in out and "ok" not in out and "polluted" not in out, out  # undefined: not in the JSON
    rows = next(x["rows"] for x in out["page"] if isinstance(x, dict) and "rows" in x)
    assert {r["tool"]: r.get("calls", r.get("ok")) for r in rows} == {"__proto__": 7, "constructor": 1, "search": 3}
