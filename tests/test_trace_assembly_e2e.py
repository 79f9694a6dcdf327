"""Trace assembly end to end: a real `evalsi serve` with normalize → tail_sampling → clickhouse, spans sent out of
order over several requests with the root last, then a late span after the decision."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from running_collector import Collector, serve_config, start_collector

from evalsi.exporters.clickhouse.backend import open_backend

SAMPLED = "5a" * 16  # has an ERROR span: kept by the status_code policy
DROPPED = "d1" * 16  # all OK: probabilistic 0 keeps nothing (with 2 workers, the other worker's trace)
T0 = time.time_ns() - 60_000_000_000


def _span(trace_id: str, n: int, parent: int | None, error: bool = False) -> Span:
    s = Span(
        trace_id=bytes.fromhex(trace_id),
        span_id=(n + 1).to_bytes(8, "big"),
        parent_span_id=b"" if parent is None else (parent + 1).to_bytes(8, "big"),
        name="invoke_agent support" if parent is None else f"step {n}",
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=T0 + n * 10_000_000,
        end_time_unix_nano=T0 + n * 10_000_000 + 5_000_000,
    )
    s.attributes.append(KeyValue(key="step", value={"int_value": n}))
    if error:
        s.status.code = Status.STATUS_CODE_ERROR
    return s


def _post(c: Collector, *spans: Span) -> None:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value={"string_value": "assembly-e2e"}))
    rs.scope_spans.add().spans.extend(spans)
    r = httpx.post(
        c.http + "/v1/traces",
        content=req.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
    assert r.status_code == 200, r.text


def _metric(c: Collector, name: str, **labels: str) -> float:
    text = httpx.get(c.metrics).text
    total = 0.0
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _wait(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("workers", [1, 2], ids=["in-process", "2-workers"])
@pytest.mark.parametrize("reevaluation", [False, True], ids=["late-span-alone", "late-span-reevaluation"])
def test_a_trace_sent_out_of_order_with_its_root_last_is_decided_once_complete_and_late_spans_follow(
    tmp_path: Path, reevaluation: bool, workers: int
) -> None:
    """With late_span_reevaluation the late span travels inside a revision of its whole trace: still stored once.
    With 2 workers the two traces are assembled in different processes and the metrics are their sums."""
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = workers
    cfg["processors"]["tail_sampling"] = {
        "decision_wait": "1s",
        "late_span_reevaluation": reevaluation,
        "policies": [
            {"name": "errors", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}},
            {"name": "none-else", "type": "probabilistic", "probabilistic": {"sampling_percentage": 0}},
        ],
    }
    cfg["service"]["pipelines"]["traces"]["processors"] = ["normalize", "tail_sampling"]
    c = start_collector(tmp_path, cfg)
    try:
        # children first, across three requests, each trace's root last
        _post(c, _span(SAMPLED, 3, 0), _span(DROPPED, 2, 0))
        _post(c, _span(SAMPLED, 1, 0, error=True), _span(SAMPLED, 2, 1), _span(DROPPED, 1, 0))
        _post(c, _span(DROPPED, 0, None), _span(SAMPLED, 0, None))
        decided = lambda: _metric(c, "evalsi_tail_sampling_traces_completed_total") >= 2  # noqa: E731
        _wait(decided, "both traces to be decided")
        assert _metric(c, "evalsi_tail_sampling_traces_total", decision="sampled") == 1
        assert _metric(c, "evalsi_tail_sampling_traces_total", decision="not_sampled") == 1
        # each trace was decided once, with every one of its spans
        assert _metric(c, "evalsi_tail_sampling_spans_total", decision="sampled") == 4
        assert _metric(c, "evalsi_tail_sampling_spans_total", decision="not_sampled") == 3
        assert _metric(c, "evalsi_tail_sampling_traces_completed_total", reason="quiet") == 2

        # late spans: the error cannot flip the decision made for the trace sampled out
        _post(c, _span(SAMPLED, 4, 0), _span(DROPPED, 3, 0, error=True))
        late = lambda: _metric(c, "evalsi_tail_sampling_late_spans_total") >= 2  # noqa: E731
        _wait(late, "the late spans")
        assert _metric(c, "evalsi_tail_sampling_late_spans_total", decision="sampled") == 1
        assert _metric(c, "evalsi_tail_sampling_late_spans_total", decision="not_sampled") == 1
        assert _metric(c, "evalsi_tail_sampling_traces_reemitted_total") == (2 if reevaluation else 0)
        stored = lambda: _metric(c, "otelcol_exporter_sent_spans_total") >= 5  # noqa: E731
        _wait(stored, "the sampled spans to be stored")
        time.sleep(1.5)  # nothing else may arrive
        # a revision writes its whole trace again, replacing the rows by span id
        assert _metric(c, "otelcol_exporter_sent_spans_total") == (4 + 5 if reevaluation else 5)
        assert _metric(c, "evalsi_tail_sampling_traces_completed_total") == 2, "a late span started a new trace"
    finally:
        assert c.stop() == 0

    store = open_backend(f"chdb://{tmp_path / 'store'}", create=False)
    try:
        rows = store.query("SELECT TraceId, SpanId, count() AS n FROM otel_traces GROUP BY TraceId, SpanId")
    finally:
        store.close()
    stored_spans = {(r["TraceId"], r["SpanId"]): r["n"] for r in rows}
    assert stored_spans == {(SAMPLED, f"{n + 1:016x}"): 1 for n in range(5)}, "every sampled span once, none else"
