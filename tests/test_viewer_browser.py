"""`hexsearch view` in a real browser: headless Chromium (Debian's `chromium` + `chromium-driver`, which
scripts/setup.sh installs) driven by selenium over run folders this test writes, served by the real
server on 127.0.0.1.

On failure a screenshot of the page is written (the path is in the failure message). With
`VIEWER_SCREENSHOTS=DIR` a screenshot of every page is written there: docs/viewer.md's images come from
`VIEWER_SCREENSHOTS=docs/images/viewer .venv/bin/python -m pytest tests/test_viewer_browser.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from viewer_runs import make_all, make_trajectory

from hexsearch.viewer.server import ViewerServer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    MISSING = None if CHROMIUM and DRIVER else \
        "headless Chromium not found: scripts/setup.sh installs it (apt-get install chromium chromium-driver)"
except ImportError:
    MISSING = "selenium is not installed: run scripts/setup.sh"
if MISSING:
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        # in CI a missing browser is a broken setup, never a reason to pass without testing the viewer
        pytest.fail(f"CI=true and {MISSING}", pytrace=False)
    pytest.skip(MISSING, allow_module_level=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("runs")
    folders = make_all(root, tokenizer)
    server = ViewerServer(folders).start()
    yield server, folders
    server.close()


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@contextlib.contextmanager
def screenshot_on_failure(driver, name: str, tmp_path: Path):
    try:
        yield
    except BaseException as e:
        path = tmp_path / f"viewer-{name}-failure.png"
        driver.save_screenshot(str(path))
        raise AssertionError(f"{e}\n(screenshot of the page: {path})") from e


def visit(driver, server, route: str, shot: str | None = None) -> None:
    """Open a route and wait until the page has rendered it (the app sets body[data-ready])."""
    if not driver.current_url.startswith(server.url):
        driver.get(server.url)
        _wait(driver, "document.body.dataset.ready === '1'")
    driver.execute_script("document.body.dataset.ready = '';"
                          "if (location.hash.replace(/^#/, '') === arguments[0]) render(false);"
                          "else location.hash = arguments[0];", route)
    _wait(driver, "document.body.dataset.ready === '1'")
    assert not driver.find_elements("id", "page-error"), driver.find_element("id", "page-error").text
    if shot:
        shoot(driver, shot)


def shoot(driver, name: str) -> None:
    """A screenshot for the docs, when VIEWER_SCREENSHOTS names a folder."""
    if os.environ.get("VIEWER_SCREENSHOTS"):
        out = Path(os.environ["VIEWER_SCREENSHOTS"])
        out.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out / f"{name}.png"))


def _wait(driver, condition: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not driver.execute_script(f"return {condition};"):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {condition}")
        time.sleep(0.05)


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def count(driver, css: str) -> int:
    return len(driver.find_elements("css selector", css))


def test_every_page_loads_without_console_errors(site, browser, tmp_path):
    server, folders = site
    with screenshot_on_failure(browser, "pages", tmp_path):
        visit(browser, server, "", "runs")
        assert count(browser, "tbody tr") == 4
        visit(browser, server, "run/0", "train-run")
        assert browser.find_element("id", "run-kind").text == "train"
        assert count(browser, "[data-chart] path") >= 6  # reward, accuracy, queue, kept groups, tokens/s, staleness
        assert "train.jsonl:4" in browser.find_element("id", "file-errors").text  # the malformed line, named
        assert count(browser, "tr.badrow") == 1 and count(browser, "tr[data-row=traj]") == 25
        visit(browser, server, "traj/0?file=train.jsonl&n=0", "trajectory")
        assert count(browser, ".ev.turn") == 2 and count(browser, ".ev.segment") == 1  # the rewrite starts segment 1
        assert count(browser, "[data-tool=search]") == 1
        visit(browser, server, "group/0?file=train.jsonl&group=0%3A0%230", "group")
        advantages = [float(e.get_attribute("data-advantage")) for e in browser.find_elements("css selector", "[data-advantage]")]
        assert len(advantages) == 4 and advantages[0] > 0 > advantages[1]
        assert "this group trains" in browser.find_element("id", "group-signal").text
        visit(browser, server, "run/1", "eval-run")
        assert [a.text for a in browser.find_elements("css selector", "a.run-file")] == ["report.md"]
        visit(browser, server, "traj/1?file=eval.jsonl&key=q2%2F0")
        assert "Who founded town 2?" in browser.find_element("tag name", "h1").text
        visit(browser, server, "run/2", "datagen-run")
        visit(browser, server, "item/2?index=1")
        assert "fuzz: difficulty" in browser.find_element("tag name", "main").text
        visit(browser, server, "run/3")
        assert count(browser, "tr[data-row=traj]") == 1
        assert console_errors(browser) == []


def test_filters_narrow_the_tables(site, browser, tmp_path):
    server, _ = site
    with screenshot_on_failure(browser, "filters", tmp_path):
        visit(browser, server, "run/0?stop=max_turns")
        assert browser.find_element("id", "traj-count").text.startswith("1 of 25")
        visit(browser, server, "run/0?tcorrect=no&text=number%202")
        assert count(browser, "tr[data-row=traj]") == 2
        visit(browser, server, "run/1")
        from selenium.webdriver.support.ui import Select

        browser.execute_script("document.body.dataset.ready = ''")
        Select(browser.find_element("id", "f-correct")).select_by_value("no")  # a real change event
        _wait(browser, "document.body.dataset.ready === '1'")
        assert count(browser, "tr[data-row=eval]") == 3 and count(browser, "tr.correct") == 0
        visit(browser, server, "run/1?level=2")
        assert count(browser, "tr[data-row=eval]") == 4
        visit(browser, server, "run/2?status=rejected")
        assert count(browser, "tr[data-row=item]") == 3
        visit(browser, server, "run/2?status=rejected&stage=base")
        assert count(browser, "tr[data-row=item]") == 1
        assert console_errors(browser) == []


def test_token_view_shows_every_trained_token(site, browser, tmp_path):
    server, folders = site
    lines = (folders[0] / "trajectories" / "train.jsonl").read_text().splitlines()
    want = sum(sum(s["loss_mask"]) for s in json.loads(lines[0])["segments"])
    with screenshot_on_failure(browser, "tokens", tmp_path):
        visit(browser, server, "traj/0?file=train.jsonl&n=0")
        assert count(browser, "#token-view .tok.trained") == want > 0
        assert browser.find_element("id", "trained-count").text == str(want)
        assert count(browser, "#token-view .segline") == 2
        for scale in ("logprob", "version"):
            browser.find_element("id", f"scale-{scale}").click()
            assert browser.find_element("id", "token-view").get_attribute("data-scale") == scale
            assert count(browser, "#token-view .tok.trained") == want
        coloured = browser.execute_script(
            "return [...document.querySelectorAll('#token-view .tok')].filter(t => t.style.backgroundColor).length")
        assert coloured == want  # only policy tokens carry a version colour
        browser.execute_script("document.querySelector('h2:last-of-type').scrollIntoView()")
        shoot(browser, "tokens")
        assert console_errors(browser) == []


def test_run_page_updates_while_the_run_writes(site, browser, tmp_path, tokenizer):
    server, folders = site
    with screenshot_on_failure(browser, "live", tmp_path):
        visit(browser, server, "run/0")
        before = browser.find_element("id", "traj-count").text
        t = make_trajectory(tokenizer, "A late question?", "1642", 1.0, group="9:9#0", step=9, version=8, qid="late")
        with (folders[0] / "trajectories" / "train.jsonl").open("a") as f:
            f.write(t.to_json() + "\n")
        _wait(browser, "document.getElementById('traj-count') && "
                       "document.getElementById('traj-count').textContent.includes('of 26')", timeout=10)
        assert before.endswith("of 25 trajectories")
        assert console_errors(browser) == []
