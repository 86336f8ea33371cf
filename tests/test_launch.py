"""`serving.launch.servers`: a started server counts as stopped only once its whole process group is gone."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from serving.launch.servers import free_port, start_server

# The leader answers /health and spawns a child that, like vLLM's engine core, takes a while to exit on
# SIGTERM: a stop() that waited only for the leader would return while the child still runs.
_SERVER = textwrap.dedent("""
    import http.server, signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, sys, time\\n"
        "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.5), sys.exit(0)))\\n"
        "time.sleep(600)"])
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
""")


def test_stop_waits_for_the_whole_group_and_records_it(tmp_path):
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    server = start_server([sys.executable, "-c", _SERVER, str(port)], url=url, health_url=f"{url}/health",
                          name="slowchild", run_dir=tmp_path, startup_timeout_s=60)
    assert json.loads((tmp_path / "engines.json").read_text())["slowchild"]["status"] == "running"
    server.stop(grace_s=10.0)
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)
    assert json.loads((tmp_path / "engines.json").read_text())["slowchild"]["status"] == "stopped"
    server.stop()  # idempotent
