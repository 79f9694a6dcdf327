"""One span with an out-of-range value among valid ones, through a real `evalsi serve` in-process and with 2 pipeline
workers: every valid span is stored within two flush intervals, and the poison span is rejected (partial success) or
stored clamped, marked and counted, as docs/receivers/otlp.md says. Why: the store refuses an insert holding such a
value as a whole, so one span stored as sent would hold the store up through its retries (300 s) and then drop every
span batched with it, whoever sent them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from running_collector import Collector, serve_config, start_collector

PROTOBUF = {"Content-Type": "application/x-protobuf"}
T0 = time.time_ns() - 60_000_000_000
MAX_NS = (1 << 63) - 1
FLUSH = 0.1  # the test config's flush_interval (s)


@pytest.fixture(scope="module", params=[1, 2], ids=["in-process", "2-workers"])
def collector(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp(f"poison-{request.param}")
    cfg = serve_config(tmp / "store")
    cfg["service"]["workers"] = request.param
    c = start_collector(tmp, cfg)
    yield c
    assert c.stop() == 0, c.log_path.read_text()[-3000:]


_serial = iter(range(1, 1_000_000))


def _span(trace_id: bytes, **fields: Any) -> Span:
    n = next(_serial)
    span = Span(
        trace_id=trace_id,
        span_id=n.to_bytes(8, "big"),
        name=f"chat {n}",
        kind=Span.SPAN_KIND_CLIENT,
        start_time_unix_nano=T0 + n,
        end_time_unix_nano=T0 + n + 5_000,
    )
    span.attributes.append(KeyValue(key="gen_ai.operation.name", value=AnyValue(string_value="chat")))
    span.attributes.append(KeyValue(key="gen_ai.request.model", value=AnyValue(string_value="gpt-4o")))
    for key, value in fields.items():
        setattr(span, key, value)
    return span


def _request(spans: list[Span]) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="poison-test")))
    rs.scope_spans.add().spans.extend(spans)
    return req.SerializeToString()


def _tokens(value: AnyValue) -> Callable[[Span], None]:
    def poison(span: Span) -> None:
        span.attributes.append(KeyValue(key="gen_ai.usage.input_tokens", value=value))

    return poison


def _event_time(span: Span) -> None:
    span.events.add(time_unix_nano=MAX_NS + 1, name="gen_ai.choice")


def _end_before_start(span: Span) -> None:
    span.end_time_unix_nano = span.start_time_unix_nano - 1


def _kind(span: Span) -> None:
    span.kind = 99  # type: ignore[assignment]


# (what, how the span is poisoned, whether it is rejected, the clamped fields or the unparsed canonical field)
CASES: list[tuple[str, Callable[[Span], None], bool, str]] = [
    ("start 2^64-1", lambda s: setattr(s, "start_time_unix_nano", (1 << 64) - 1), True, ""),
    ("start 2^63", lambda s: setattr(s, "start_time_unix_nano", 1 << 63), True, ""),
    ("event time 2^63", _event_time, False, "clamped:events.time_unix_nano"),
    ("end before start", _end_before_start, False, "clamped:end_time_unix_nano"),
    ("span kind 99", _kind, False, "clamped:kind"),
    ("tokens '1e30'", _tokens(AnyValue(string_value="1e30")), False, "unparsed:input_tokens"),
    ("tokens 1e25", _tokens(AnyValue(double_value=1e25)), False, "unparsed:input_tokens"),
    ("tokens 23 digits", _tokens(AnyValue(string_value="9" * 23)), False, "unparsed:input_tokens"),
    ("tokens -5", _tokens(AnyValue(int_value=-5)), False, "unparsed:input_tokens"),
]


@pytest.mark.parametrize("what,poison,rejected,marked", CASES, ids=[c[0] for c in CASES])
def test_three_requests_with_one_poison_span_store_every_valid_span(
    collector: Collector, what: str, poison: Callable[[Span], None], rejected: bool, marked: str
) -> None:
    c = collector
    trace_id = next(_serial).to_bytes(16, "big")
    batches = [[_span(trace_id) for _ in range(10)] for _ in range(3)]
    bad = batches[1][4]
    poison(bad)
    answers = []
    sent = time.monotonic()
    for spans in batches:
        r = httpx.post(c.http + "/v1/traces", content=_request(spans), headers=PROTOBUF)
        assert r.status_code == 200, r.text
        answers.append(ExportTraceServiceResponse.FromString(r.content))
    assert not answers[0].HasField("partial_success") and not answers[2].HasField("partial_success")
    middle = answers[1].partial_success
    expected = 29 if rejected else 30
    deadline = sent + 2 * FLUSH + 3.0  # two flush intervals, plus slack for two busy cores and the worker link
    stored: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        got = httpx.get(f"{c.api}/api/v1/traces/{trace_id.hex()}")
        stored = got.json()["spans"] if got.status_code == 200 else []
        if len(stored) >= expected:
            break
        time.sleep(0.05)
    assert len(stored) == expected, f"{what}: {len(stored)} of {expected} spans stored"
    bad_id = bad.span_id.hex()
    by_id = {s["span_id"]: s for s in stored}
    if rejected:
        assert middle.rejected_spans == 1
        assert "start_time_unix_nano" in middle.error_message and "2262" in middle.error_message
        assert bad_id not in by_id
        return
    assert not answers[1].HasField("partial_success"), "a span kept (clamped or not) is no partial success"
    kept = by_id[bad_id]
    kind, field = marked.split(":")
    if kind == "clamped":
        assert field in kept["attributes"]["evalsi.clamped"]  # stored as the OTel exporter stores arrays: JSON
        assert kept["duration_ns"] >= 0
    else:
        assert kept["input_tokens"] is None and field in kept["unparsed"]


def test_the_clamped_and_rejected_items_are_counted(collector: Collector) -> None:
    def total(name: str, where: str = "") -> float:
        text = httpx.get(collector.metrics).text
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name) and where in ln)

    deadline = time.monotonic() + 5  # workers report their counts every second
    while total("evalsi_receiver_clamped_items_total", 'signal="traces"') < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert total("otelcol_receiver_refused_spans") >= 2  # the two start times rejected
    assert total("evalsi_receiver_clamped_items_total", 'signal="traces"') >= 3  # the three clamped cases above
    assert "clamped traces: 1 span(s) kept with out-of-range fields clamped" in collector.log_path.read_text()


def test_a_log_record_past_2262_is_stored_with_its_time_clamped(collector: Collector) -> None:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceRequest,
        ExportLogsServiceResponse,
    )

    req = ExportLogsServiceRequest()
    records = req.resource_logs.add().scope_logs.add().log_records
    records.add(time_unix_nano=(1 << 64) - 1, observed_time_unix_nano=T0, body=AnyValue(string_value="late"))
    records.add(time_unix_nano=T0, body=AnyValue(string_value="fine"))
    r = httpx.post(collector.http + "/v1/logs", content=req.SerializeToString(), headers=PROTOBUF)
    assert r.status_code == 200
    assert not ExportLogsServiceResponse.FromString(r.content).HasField("partial_success")
    # a valid request afterwards is stored: the store was not held up by the clamped record
    trace_id = next(_serial).to_bytes(16, "big")
    r = httpx.post(collector.http + "/v1/traces", content=_request([_span(trace_id)]), headers=PROTOBUF)
    assert r.status_code == 200
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if httpx.get(f"{collector.api}/api/v1/traces/{trace_id.hex()}").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError("a valid span sent after the clamped log record was not stored")


def test_poison_spans_do_not_log_tracebacks(collector: Collector) -> None:
    text = Path(collector.log_path).read_text()
    assert "Traceback" not in text and "OverflowError" not in text, text[-3000:]
