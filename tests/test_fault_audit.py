"""The fault-tolerance benchmark's audit (benchmarks/fault_tolerance.py) must report the faults it exists to
find: fed records with a planted duplicate, a lost question or a trained failed episode, it counts each.
And its fault proxy's outages fail requests back to back, beyond a client's retry budget."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fault_tolerance as ft  # noqa: E402
from _fault_proxy import FaultProxy  # noqa: E402


def _run_records():
    """A clean two-step run of batch 2 over 6 questions: keys 0:0..0:3 consumed, 0:4 buffered, 0:5 to re-run."""
    trajs = [{"meta": {"key": f"0:{i}", "step": 1 + i // 2}, "stop_reason": "answered",
              "tool_calls": [{"name": "search", "error": None}]} for i in range(4) for _ in range(2)]
    events = [{"event": "admit", "key": f"0:{i}"} for i in range(6)]
    stream = {"epoch": 0, "position": 6, "retry": ["0:5"]}
    return events, trajs, stream, ["0:4"]


def test_a_clean_run_audits_clean():
    events, trajs, stream, buffered = _run_records()
    report = ft.audit_records(events, trajs, stream, buffered, 2, 2, 6)
    assert (report["lost"], report["duplicated"], report["trained_on_failures"]) == (0, 0, 0)
    assert report["steps_complete"] and report["episodes_with_tool_errors"] == 0


def test_the_audit_reports_each_planted_fault():
    events, trajs, stream, buffered = _run_records()
    again = [{**t, "meta": {**t["meta"], "step": 3}} for t in trajs if t["meta"]["key"] == "0:1"]
    assert ft.audit_records(events, trajs + again, stream, buffered, 2, 2, 6)["duplicated"] == 1
    gone = [t for t in trajs if t["meta"]["key"] != "0:2"]
    assert ft.audit_records(events, gone, stream, buffered, 2, 2, 6)["lost"] == 1
    assert ft.audit_records(events, trajs, stream, [], 2, 2, 6)["lost"] == 1  # the buffered group vanished
    failed = [{**trajs[0], "stop_reason": "engine_error"}, *trajs[1:]]
    assert ft.audit_records(events, failed, stream, buffered, 2, 2, 6)["trained_on_failures"] == 1
    errored = [{**trajs[0], "tool_calls": [{"name": "search", "error": "HTTP 503"}]}, *trajs[1:]]
    assert ft.audit_records(events, errored, stream, buffered, 2, 2, 6)["episodes_with_tool_errors"] == 1


def test_the_negative_controls_catch_every_planted_fault():
    assert ft.negative_controls(*_run_records(), 2, 2, 6) == {"duplicate": True, "lost": True, "trained_failure": True}
    blind = ft.audit_records  # an audit that saw nothing would fail its controls

    def audit_that_sees_nothing(*args):
        return {**blind(*args), "lost": 0, "duplicated": 0, "trained_on_failures": 0}

    ft.audit_records = audit_that_sees_nothing
    try:
        assert ft.negative_controls(*_run_records(), 2, 2, 6) == {"duplicate": False, "lost": False,
                                                                  "trained_failure": False}
    finally:
        ft.audit_records = blind


def test_an_outage_fails_requests_back_to_back_beyond_the_retry_budget():
    """An outage starts at the first request (outage_every=1) and answers every request for 30 s with 503:
    six in a row, more than the fault_tolerance config's 1 + 3 retries of one search."""
    proxy = FaultProxy("http://127.0.0.1:9", rate=0.0, outage_every=1, outage_s=30.0)
    url = proxy.start()
    try:
        with httpx.Client(timeout=10, trust_env=False) as client:
            codes = [client.post(url + "/retrieve", json={}).status_code for _ in range(6)]
    finally:
        proxy.stop()
    assert codes == [503] * 6
    assert proxy.stats["outages"] == 1 and proxy.stats["outage"] == 6 and proxy.stats["forwarded"] == 0
    assert ft.OUTAGE_S > 1 + 3 * 1.0  # the benchmark's outage outlasts its tools' retries (backoff <= 1 s each)


def test_outages_wait_until_every_kind_of_fault_was_injected():
    """A client retrying through an outage makes most of a run's requests; outages therefore start only once
    each spread-out fault (500, 503, 429, timeout, drop) has occurred, so a short run meets every kind."""
    proxy = FaultProxy("http://127.0.0.1:9", rate=1.0, hang_s=0.1, outage_every=1, outage_s=30.0)
    url = proxy.start()
    outcomes = []
    try:
        with httpx.Client(timeout=5, trust_env=False) as client:
            for _ in range(7):
                try:
                    outcomes.append(client.post(url + "/retrieve", json={}).status_code)
                except httpx.TransportError:
                    outcomes.append("closed")
    finally:
        proxy.stop()
    assert outcomes == [500, 503, 429, "closed", "closed", 503, 503]
    assert all(proxy.stats[k] == 1 for k in ("500", "503", "429", "timeout", "drop"))
    assert proxy.stats["outages"] == 1 and proxy.stats["outage"] == 2
