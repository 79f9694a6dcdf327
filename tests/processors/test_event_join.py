"""GenAI content sent as OTLP log records reaches its spans, whichever arrives first, through a real collector."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from running_collector import FIXTURES, Collector, serve_config, start_collector

from evalsi.exporters.clickhouse.backend import open_backend
from evalsi.model.log_record import LogRecord
from evalsi.model.span import Span
from evalsi.processors.normalize.events import EventJoin

FOLDER = FIXTURES / "otel-openai-v2"
META = json.loads((FOLDER / "meta.json").read_text())


def _post(c: Collector, path: str, file: Path) -> None:
    r = httpx.post(c.http + path, content=file.read_bytes(), headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 200, r.text
    assert r.content == b"", "no partial success expected"


def _chat_spans(c: Collector, trace_id: str) -> list[dict[str, Any]]:
    """The trace's model-call spans as stored, none while the trace is not stored yet."""
    shown = c.cli("traces", "show", trace_id, "--json", check=False)
    if shown.returncode != 0 and "not found" in shown.stderr:
        return []
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    return [s for s in doc["spans"] if s["step_type"] == "llm"]


def _trace_id(file: Path) -> str:
    doc = json.loads(file.with_suffix(".json").read_text())
    return doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]


def _wait_for(check: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


@pytest.fixture(scope="module", params=[1, 2], ids=["in-process", "2-workers"])
def collector(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Any:
    """Spans and their log records arrive in separate requests: with workers, both reach the trace's worker."""
    tmp = tmp_path_factory.mktemp("join")
    cfg = serve_config(tmp / "store")
    cfg["service"]["workers"] = request.param
    cfg["processors"]["normalize"] = {"event_wait": "1s"}
    c = start_collector(tmp, cfg)
    yield c
    c.stop()


def test_events_after_their_spans_revise_the_stored_content(collector: Collector) -> None:
    spans = FOLDER / "chat_tools.pb"
    trace_id = _trace_id(spans)
    _post(collector, "/v1/traces", spans)
    assert collector.wait_stored(4) >= 4
    before = _chat_spans(collector, trace_id)
    assert len(before) == 2 and not any(s["content_captured"] for s in before)

    _post(collector, "/v1/logs", FOLDER / "chat_tools.logs.pb")

    def revised() -> list[dict[str, Any]]:
        chats = _chat_spans(collector, trace_id)
        return chats if len(chats) == 2 and all(s["content_captured"] for s in chats) else []

    chats = _wait_for(revised)
    assert chats, "the late events never reached the stored spans"
    markers = META["scenarios"]["chat_tools"]["markers"]
    first, second = sorted(chats, key=lambda s: s["start_time_unix_nano"])
    assert markers["prompt"] in json.dumps(first["input"])
    assert [p["name"] for p in first["output"][0]["parts"] if p["type"] == "tool_call"] == ["get_weather"]
    # the second call carries the tool result back and answers
    assert any(p["type"] == "tool_call_response" for m in second["input"] for p in m["parts"])
    assert markers["completion"] in json.dumps(second["output"])
    # the revision replaced the rows: still exactly the trace's 4 spans
    doc = json.loads(collector.cli("traces", "show", trace_id, "--json").stdout)
    assert len(doc["spans"]) == 4


def test_events_before_their_spans_are_joined_on_arrival(collector: Collector) -> None:
    logs = FOLDER / "chat_pii.logs.pb"
    trace_id = _trace_id(FOLDER / "chat_pii.pb")
    _post(collector, "/v1/logs", logs)
    _post(collector, "/v1/traces", FOLDER / "chat_pii.pb")
    chats = _wait_for(lambda: _chat_spans(collector, trace_id))
    assert len(chats) == 1
    chat = chats[0]
    assert chat["content_captured"] is True
    markers = META["scenarios"]["chat_pii"]["markers"]
    assert markers["prompt"] in json.dumps(chat["input"])
    assert markers["completion"] in json.dumps(chat["output"])
    assert [m["role"] for m in chat["input"]] == ["system", "user"]


def test_log_records_are_stored_in_otel_logs(tmp_path: Path) -> None:
    c = start_collector(tmp_path, serve_config(tmp_path / "store"))
    try:
        _post(c, "/v1/logs", FOLDER / "chat_simple.logs.pb")
        metrics = lambda: httpx.get(c.metrics).text  # noqa: E731
        assert _wait_for(lambda: 'otelcol_exporter_sent_log_records_total{exporter="clickhouse"} 3.0' in metrics())
    finally:
        assert c.stop() == 0
    store = open_backend(f"chdb://{tmp_path / 'store'}", create=False)
    try:
        rows = store.query("SELECT EventName, TraceId, SpanId, Body FROM otel_logs ORDER BY Timestamp")
    finally:
        store.close()
    doc = json.loads((FOLDER / "chat_simple.logs.json").read_text())
    records = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    assert [r["EventName"] for r in rows] == [r["eventName"] for r in records]
    assert {r["SpanId"] for r in rows} == {r["spanId"] for r in records}
    assert json.loads(rows[0]["Body"]) == {"content": "You are a concise assistant."}


def _span(step: str = "llm", service: str = "app") -> Span:
    return Span("a" * 32, "b" * 16, "", "chat", "CLIENT", 1, 2, service_name=service, step_type=step)


def _record(name: str, body: Any, service: str = "app", t: int = 1) -> LogRecord:
    return LogRecord(t, t, "a" * 32, "b" * 16, body=body, event_name=name, service_name=service)


def test_a_span_waits_only_for_services_known_to_log_events() -> None:
    join = EventJoin(wait=1.0, event_ttl=10.0)
    assert join.on_span(_span(), now=0) is True  # nothing logged events yet: no reason to wait
    join.on_records([_record("gen_ai.user.message", {"content": "hi"}, service="app")], now=0)
    held = _span()
    held.span_id = "c" * 16
    assert join.on_span(held, now=1) is False
    assert join.due(now=1.5) == []
    assert join.due(now=2.5) == [held]
    assert join.on_span(_span(step="other"), now=3) is True


def test_orphan_events_expire_and_memory_stays_bounded() -> None:
    join = EventJoin(wait=1.0, event_ttl=5.0, max_events=3)
    for i in range(10):
        r = _record("gen_ai.user.message", {"content": str(i)})
        r.span_id = f"{i:016x}"
        join.on_records([r], now=0)
    assert join._n_events == 3
    join.due(now=6)
    assert join._n_events == 0
