"""The viewer's HTTP server (stdlib `ThreadingHTTPServer`): the page, its static files, and a JSON API.

    GET /                                   the single page (static/index.html)
    GET /static/<name>                      app.js, style.css, ... (only files of the package's static/)
    GET /api/runs                           the run folders: name, kind, path
    GET /api/run/<i>                        run page data (metrics, eval rows, datagen items, results, errors)
    GET /api/run/<i>/stamp                  changes when the run's files change (pages poll it: live updates)
    GET /api/run/<i>/trajectories?file=&offset=&limit=&stop=&text=&group=&correct=&min_reward=&max_reward=
    GET /api/run/<i>/trajectory?file=&n=    (or &key=<question id>/<sample>) timeline + token view
    GET /api/run/<i>/group?file=&group=     a group's trajectories, rewards and advantages
    GET /api/run/<i>/item?index=            one datagen item (edits and checks)
    GET /api/run/<i>/file/<path>            a report, plot, log or JSON file of the run folder; never outside it

It binds 127.0.0.1 by default, answers only requests whose Host is a loopback name (no DNS
rebinding), serves nothing but the static files and files under the given run folders (paths are
resolved, symlinks included, before the check), sends a Content-Security-Policy that forbids any
other origin (the page works offline), and never writes into a run folder.
"""

from __future__ import annotations

import json
import logging
import math
import mimetypes
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from hexsearch.viewer.detail import detail, group_view
from hexsearch.viewer.runs import Run

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
RUN_FILE_SUFFIXES = (".png", ".md", ".txt", ".json", ".yaml")
RUN_FILE_MAX_BYTES = 64 << 20
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class NotFound(Exception):
    pass


class BadRequest(Exception):
    pass


class Api:
    """The JSON answers, separate from HTTP so that they can be called directly."""

    def __init__(self, folders: list[Path]):
        self.runs = [Run(Path(p)) for p in folders]
        self._lock = threading.Lock()

    def run(self, i: str) -> Run:
        """Run number `i` (0, 1, ...): a negative number is no run, not one counted from the end."""
        if not i.isdigit():
            raise NotFound(f"no run {i!r}")
        try:
            return self.runs[int(i)]
        except IndexError:
            raise NotFound(f"no run {i!r}") from None

    def list_runs(self) -> dict[str, Any]:
        return {"runs": [{"id": i, "name": r.path.name, "kind": r.kind, "path": str(r.path)}
                         for i, r in enumerate(self.runs)]}

    def get(self, parts: list[str], q: dict[str, str]) -> Any:
        if parts == ["runs"]:
            return self.list_runs()
        if len(parts) < 2 or parts[0] != "run":
            raise NotFound("/api/" + "/".join(parts))
        run, what = self.run(parts[1]), parts[2] if len(parts) > 2 else ""
        if what == "":
            return {"id": int(parts[1]), **run.summary()}
        if what == "stamp":
            return {"stamp": run.stamp()}
        if what == "item":
            return run.datagen_item(_int(q, "index", 0))
        index = self._index(run, q)
        if what == "trajectories":
            return index.page(offset=_int(q, "offset", 0), limit=_int(q, "limit", 50), stop=q.get("stop", ""),
                              text=q.get("text", ""), group=q.get("group", ""), correct=q.get("correct", ""),
                              min_reward=_float(q, "min_reward"), max_reward=_float(q, "max_reward"),
                              bad=q.get("bad") == "1")
        index.wait()  # a trajectory or group page needs the whole index (a cached or small one is there already)
        model = str((run.config().get("engine") or {}).get("model", ""))
        if what == "trajectory":
            n = _int(q, "n", -1)
            if "key" in q:
                n = index.keys.get(q["key"], -1)
                if n < 0:
                    raise NotFound(f"{index.path.name}: no trajectory with key {q['key']!r}")
            d = index.read(n)
            return {"file": index.path.name, "n": n, "line": n + 1, **detail(d, model)}
        if what == "group":
            members = index.groups.get(q.get("group", ""), [])
            if not members:
                raise NotFound(f"{index.path.name}: no group {q.get('group', '')!r}")
            estimator = (run.config().get("train") or {}).get("advantage", "grpo")
            return {"file": index.path.name, "group": q["group"],
                    **group_view([(n, index.read(n)) for n in members[:16]], estimator, model)}
        raise NotFound("/api/" + "/".join(parts))

    def _index(self, run: Run, q: dict[str, str]):
        files = run.trajectory_files()
        name = q.get("file") or (files[0] if files else "")
        try:
            return run.index(name)
        except KeyError as e:
            raise NotFound(str(e.args[0])) from None

    def run_file(self, i: str, rel: str) -> Path:
        """A report, plot, log or JSON file under run `i`'s folder (after resolving symlinks and `..`), else
        NotFound: never checkpoints, caches or anything outside the folder."""
        root = self.run(i).path.resolve()
        target = (root / unquote(rel)).resolve()
        if (not target.is_relative_to(root) or not target.is_file() or target.suffix not in RUN_FILE_SUFFIXES
                or target.stat().st_size > RUN_FILE_MAX_BYTES):
            raise NotFound(f"no file {rel!r} in run {i}")
        return target


def _int(q: dict[str, str], key: str, default: int) -> int:
    try:
        return int(q.get(key, default))
    except ValueError:
        raise BadRequest(f"{key}: not an integer: {q[key]!r}") from None


def _float(q: dict[str, str], key: str) -> float | None:
    if q.get(key, "") == "":
        return None
    try:
        return float(q[key])
    except ValueError:
        raise BadRequest(f"{key}: not a number: {q[key]!r}") from None


class Handler(BaseHTTPRequestHandler):
    server_version = "hexsearch-view"
    api: Api

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the page polls every few seconds
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
        if host not in LOOPBACK_NAMES:
            return self._send(HTTPStatus.FORBIDDEN, {"error": f"Host {host!r} is not a loopback name"})
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            if not parts:
                return self._file(STATIC / "index.html")
            if parts[0] == "static" and len(parts) == 2 and (STATIC / parts[1]).is_file() and "/" not in parts[1]:
                return self._file(STATIC / parts[1])
            if parts[0] == "api" and len(parts) >= 4 and parts[1] == "run" and parts[3] == "file":
                return self._file(self.api.run_file(parts[2], "/".join(parts[4:])))
            if parts[0] == "api":
                return self._send(HTTPStatus.OK, self.api.get(parts[1:], q))
            raise NotFound(url.path)
        except (NotFound, KeyError, IndexError) as e:
            self._send(HTTPStatus.NOT_FOUND, {"error": str(e.args[0]) if e.args else "not found"})
        except (BadRequest, ValueError) as e:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(e)})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # the page shows the message; the server keeps serving
            log.exception("viewer: %s failed", url.path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(e).__name__}: {e}"})

    def _headers(self, status: int, ctype: str, length: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()

    def _send(self, status: int, obj: Any) -> None:
        body = json.dumps(_finite(obj), default=str, allow_nan=False).encode()
        self._headers(status, "application/json", len(body))
        self.wfile.write(body)

    def _file(self, path: Path) -> None:
        body = path.read_bytes()
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if path.suffix in (".md", ".txt", ".log", ".jsonl", ".yaml"):
            ctype = "text/plain"  # shown, never run
        if ctype.startswith("text/") or ctype == "application/javascript":
            ctype += "; charset=utf-8"
        self._headers(HTTPStatus.OK, ctype, len(body))
        self.wfile.write(body)


def _finite(obj: Any) -> Any:
    """`obj` with NaN and infinities as null (the browser's JSON.parse rejects them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


class ViewerServer:
    """The server over some run folders; `start()` serves in a thread (tests), `serve_forever()` blocks."""

    def __init__(self, folders: list[Path], host: str = "127.0.0.1", port: int = 0):
        handler = type("BoundHandler", (Handler,), {"api": Api(folders)})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.api = handler.api
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{port}/"

    def warm_up(self) -> None:
        """Load the tokenizers of the runs' models in the background (the first trajectory page then opens at once)."""
        from hexsearch.viewer.detail import tokenizer_for

        models = {str((r.config().get("engine") or {}).get("model", "")) for r in self.api.runs} - {""}
        threading.Thread(target=lambda: [tokenizer_for(m) for m in sorted(models)], name="viewer-warm-up",
                         daemon=True).start()

    def start(self) -> ViewerServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="viewer", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
