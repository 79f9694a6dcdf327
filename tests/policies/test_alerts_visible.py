"""Alerts you can see: each firing is a metric (`evalsi_alerts_fired_total`, `evalsi_alert_firing`), a row in the
store, and listed by `GET /api/v1/alerts` and `evalsi alerts list`; with pipeline workers it fires once."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from policy_helpers import policy_doc, span, write
from running_collector import Collector, send_chats, serve_config, start_collector, wait_until

from evalsi.model.span import trace_shard
from evalsi.policies import AlertEvent, AlertRecorder, load_policies

# --- the engine: what fired, with which values, and when it resolved ----------------------------------------------


def _scored(i: int, passed: bool) -> list[Any]:
    return [span(f"{i:032x}", attributes={"test.passed": passed})]


def test_an_alert_carries_the_values_that_fired_it_and_resolves_after_a_window_without_it(tmp_path: Path) -> None:
    write(
        tmp_path / "p.yaml",
        policy_doc(
            "answers", cascade=[{"ref": "test/attribute"}], window="1m",
            alerts=[{"name": "failing", "when": "count >= 2 && rate('attribute') < 0.5"}],
        ),
    )  # fmt: skip
    ps = load_policies(["p.yaml"], tmp_path, alert_check_interval=0)
    ps.evaluate_trace(_scored(1, passed=False), now=1.0)
    ps.evaluate_trace(_scored(2, passed=False), now=2.0)
    [fired] = ps.drain_alerts()
    assert (fired.state, fired.alert, fired.fired_at) == ("firing", "failing", 2.0)
    assert fired.values == {"count": 2, "rate('attribute')": 0.0}
    assert fired.body()["values"] == fired.values
    # the window it fired in closes: still firing (it held in that window)
    ps.evaluate_trace(_scored(3, passed=True), now=61.0)
    assert ps.drain_resolved() == [] and ps.drain_alerts() == []
    # the next window closes without it holding: resolved, with what the condition read then
    ps.close_windows(121.0)
    [resolved] = ps.drain_resolved()
    assert (resolved.state, resolved.alert, resolved.window_start, resolved.fired_at) == (
        "resolved",
        "failing",
        60,
        120,
    )
    assert resolved.values == {"count": 1, "rate('attribute')": 1.0}
    assert resolved.notify is None  # never a webhook
    # it fires again in a later window, and resolves once more after a quiet one
    ps.evaluate_trace(_scored(4, passed=False), now=130.0)
    ps.evaluate_trace(_scored(5, passed=False), now=131.0)
    assert [a.window_start for a in ps.drain_alerts()] == [120]
    ps.close_windows(300.0)  # (no traffic since: the window of 180 is skipped, the open one closes)
    assert ps.drain_resolved() == []
    ps.close_windows(400.0)
    assert [a.state for a in ps.drain_resolved()] == ["resolved"]


def test_the_recorder_never_blocks_and_counts_what_the_store_refused() -> None:
    lost: list[tuple[str, int]] = []
    gate = threading.Event()
    written: list[list[AlertEvent]] = []

    def write(events: list[AlertEvent]) -> None:
        gate.wait(10)
        if events[0].alert == "boom":
            raise RuntimeError("store down")
        written.append(events)

    def event(name: str) -> AlertEvent:
        return AlertEvent("p", name, "count > 1", None, 0.0, 60.0, 2, {}, [], {}, 1.0, {"count": 2})

    recorder = AlertRecorder(write, lost=lambda reason, n: lost.append((reason, n)), max_pending=2)
    t0 = time.monotonic()
    recorder.record([event("boom")])  # taken by the writer thread, which waits on the store
    assert wait_until(lambda: not recorder._pending, timeout=5)
    recorder.record([event("a"), event("b"), event("c")])  # one past max_pending waits: dropped, counted
    assert time.monotonic() - t0 < 1  # the caller never waited for the store
    gate.set()
    recorder.close()
    assert ("queue_full", 1) in lost and ("store_error", 1) in lost
    assert [[e.alert for e in batch] for batch in written] == [["a", "b"]]


# --- end to end: a real collector ----------------------------------------------------------------------------------

POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: answers}
spec:
  cascade:
    - ref: builtin/contains
      params: {any: [Paris]}
  alerts:
    - {name: wrong-answers, when: "count >= 3 && rate('contains') < 0.5"}
"""


def _collector(tmp_path: Path, workers: int) -> Collector:
    (tmp_path / "policies.yaml").write_text(POLICY)
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = workers
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {"policies": ["policies.yaml"]}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    return start_collector(tmp_path, cfg)


def _metric(c: Collector, name: str) -> float | None:
    """The value of the series `name{labels}` (labels as Prometheus writes them, sorted), None if absent."""
    for line in httpx.get(c.metrics).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


FIRED = 'evalsi_alerts_fired_total{alert="wrong-answers",policy="answers",processor="evaluate"}'
FIRING = 'evalsi_alert_firing{alert="wrong-answers",policy="answers",processor="evaluate"}'


def _alerts(c: Collector, **params: Any) -> list[dict[str, Any]]:
    resp = httpx.get(c.api + "/api/v1/alerts", params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()["alerts"]


def test_a_fired_alert_is_a_metric_a_stored_row_and_listed(tmp_path: Path) -> None:
    c = _collector(tmp_path, workers=1)
    try:
        assert "no alerts" in c.cli("alerts", "list").stdout  # nothing yet, and it says where it looked
        answers = ["Paris.", "I am not sure.", "No idea.", "Maybe Rome?"]
        send_chats(c.http, [0xA1 << 64 | n for n in range(1, 5)], answers)
        assert wait_until(lambda: _alerts(c)), c.log_path.read_text()[-3000:]
        [row] = _alerts(c, policy="answers", since="1h")
        assert (row["policy"], row["alert"], row["state"]) == ("answers", "wrong-answers", "firing")
        assert row["condition"] == "count >= 3 && rate('contains') < 0.5"
        assert row["project"] == "default"
        assert row["values"]["count"] >= 3 and row["values"]["rate('contains')"] < 0.5
        assert row["window_end_unix_ms"] - row["window_start_unix_ms"] == 300_000
        assert row["window_start_unix_ms"] * 10**6 <= row["timestamp_unix_nano"] <= row["window_end_unix_ms"] * 10**6
        assert row["aggregates"]["contains"]["method"] == "wilson"
        assert _alerts(c, policy="nobody") == []
        assert httpx.get(c.api + "/api/v1/alerts", params={"since": "soon"}).status_code == 400

        assert _metric(c, FIRED) == 1
        assert _metric(c, FIRING) == 1

        listed = c.cli("alerts", "list", "--since", "1h").stdout
        assert "wrong-answers" in listed and "firing" in listed and "rate('contains')" in listed
        [doc] = json.loads(c.cli("alerts", "list", "--policy", "answers", "--json").stdout)
        assert doc == row
        nobody = c.cli("alerts", "list", "--policy", "nobody").stdout
        assert "no alerts of policy nobody in the collector at" in nobody
        # the stored scores' stats name their interval's method (the API field, the CLI column)
        stats = httpx.get(c.api + "/api/v1/policies/stats", params={"window": "10m"}).json()["stats"]
        assert [(s["name"], s["method"]) for s in stats] == [("contains", "wilson")]
        table = c.cli("policies", "stats", "--window", "10m").stdout
        assert "METHOD" in table and "wilson" in table
    finally:
        assert c.stop() == 0
    # the row is in the store: read with no collector running
    [stored] = json.loads(c.cli("alerts", "list", "--json", api=False).stdout)
    assert (stored["alert"], stored["state"], stored["values"]) == ("wrong-answers", "firing", row["values"])


def test_with_two_workers_an_alert_fires_once(tmp_path: Path) -> None:
    c = _collector(tmp_path, workers=2)
    try:
        ids = [0xA1B2 << 64 | n for n in range(1, 7)]
        assert {trace_shard(format(t, "032x"), 2) for t in ids} == {0, 1}  # both workers own some
        send_chats(c.http, ids, ["Paris."] + ["I am not sure."] * 5)
        assert wait_until(lambda: _alerts(c)), c.log_path.read_text()[-3000:]
        time.sleep(2.5)  # more alert checks, here and in the workers: it must not fire again
        [row] = _alerts(c)
        assert (row["alert"], row["state"]) == ("wrong-answers", "firing")
        assert row["values"]["count"] >= 3
        assert _metric(c, FIRED) == 1
        assert _metric(c, FIRING) == 1
        assert len([e for e in c.logs() if e.get("msg") == "alert fired"]) == 1
    finally:
        assert c.stop() == 0


def test_the_alerts_api_checks_its_parameters_before_the_store() -> None:
    from fastapi.testclient import TestClient

    from evalsi.collector.api import build_api

    client = TestClient(build_api(None, dict))
    assert client.get("/api/v1/alerts", params={"since": "never"}).status_code == 400
    assert client.get("/api/v1/alerts", params={"limit": 0}).status_code == 400
    assert client.get("/api/v1/alerts", params={"since": "1h"}).status_code == 404  # no store in this collector
