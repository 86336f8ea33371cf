"""Under CI=true the browser test fails, never skips, when its browser is missing (a CI image without
Chromium would otherwise pass without the viewer ever being opened in a browser)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TEST = Path(__file__).resolve().parent / "test_viewer_browser.py"


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(tmp_path)  # no chromium, no chromedriver
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", str(TEST), "-q", "-p", "no:cacheprovider", "-rs"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=TEST.parent.parent)


@pytest.mark.parametrize("ci", ["true", "1"])
def test_fails_under_ci_when_chromium_is_missing(tmp_path, ci):
    out = _run(tmp_path, ci)
    assert out.returncode not in (0, 5), out.stdout[-2000:]  # 5: nothing collected
    assert "CI=true and headless Chromium not found" in out.stdout + out.stderr


def test_skips_outside_ci_when_chromium_is_missing(tmp_path):
    out = _run(tmp_path, None)
    assert out.returncode in (0, 5) and "1 skipped" in out.stdout and "headless Chromium not found" in out.stdout
