"""The store's Arrow columns for spans (`rows.to_arrow`, built column-wise for speed) hold exactly the rows written
one span at a time from the definitions: attribute values as `attribute_string`, content and details as
`json_codec.dumps`, on the instrumentation fixtures, hostile OTLP values and values only the stdlib's JSON takes."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hostile_otlp import Case, hostile_cases
from hypothesis import HealthCheck, given, settings

from evalsi import json_codec
from evalsi.exporters.clickhouse.rows import (
    ArrowRows,
    attribute_string,
    convert_good,
    from_ipc,
    logs_to_arrow,
    scores_to_arrow,
    to_arrow,
)
from evalsi.exporters.clickhouse.schema import SCORES_SCHEMA, TRACES_SCHEMA
from evalsi.model.score import Score
from evalsi.model.span import Span, SpanEvent, SpanLink, compact_content, held_input, held_output
from evalsi.processors.normalize import normalize_span
from evalsi.receivers.otlp.decode import decode_logs_protobuf, decode_traces_protobuf

FIXTURES = Path(__file__).parent.parent / "fixtures"
_STATUS = {"UNSET": "STATUS_CODE_UNSET", "OK": "STATUS_CODE_OK", "ERROR": "STATUS_CODE_ERROR"}


def _pairs(attrs: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k, attribute_string(v)) for k, v in attrs.items()]


def _count(n: int | None) -> int | None:
    return None if n is None or n < 0 else n


def row_of(s: Span) -> dict[str, Any]:
    """One span's row as the store's columns define it, written field by field."""
    return {
        "Timestamp": s.start_time_unix_nano,
        "TraceId": s.trace_id,
        "SpanId": s.span_id,
        "ParentSpanId": s.parent_span_id,
        "TraceState": s.trace_state,
        "SpanName": s.name,
        "SpanKind": "SPAN_KIND_" + s.kind,
        "ServiceName": s.service_name,
        "ResourceAttributes": _pairs(s.resource_attributes),
        "ScopeName": s.scope_name,
        "ScopeVersion": s.scope_version,
        "SpanAttributes": _pairs(s.attributes),
        "Duration": s.duration_ns,
        "StatusCode": _STATUS.get(s.status_code, "STATUS_CODE_UNSET"),
        "StatusMessage": s.status_message,
        "Events.Timestamp": [e.time_unix_nano for e in s.events],
        "Events.Name": [e.name for e in s.events],
        "Events.Attributes": [_pairs(e.attributes) for e in s.events],
        "Links.TraceId": [ln.trace_id for ln in s.links],
        "Links.SpanId": [ln.span_id for ln in s.links],
        "Links.TraceState": [ln.trace_state for ln in s.links],
        "Links.Attributes": [_pairs(ln.attributes) for ln in s.links],
        "StepType": s.step_type,
        "Model": s.model or "",
        "Provider": s.provider or "",
        "InputTokens": _count(s.input_tokens),
        "OutputTokens": _count(s.output_tokens),
        "ToolName": s.tool_name or "",
        "SessionId": s.session_id or "",
        "AgentName": s.agent_name or "",
        "UserId": s.user_id or "",
        "CostUsd": s.cost_usd,
        "ErrorType": s.error_type or "",
        "Input": "" if s.input is None else json_codec.dumps(s.input),
        "Output": "" if s.output is None else json_codec.dumps(s.output),
        "ContentCaptured": s.content_captured,
        "Convention": s.convention,
        "Unparsed": s.unparsed,
        "Details": json_codec.dumps(s.details) if s.details else "",
    }


def row_wise(spans: list[Span]) -> pa.Table:
    return pa.Table.from_pylist([row_of(s) for s in spans], schema=TRACES_SCHEMA)


def assert_same_rows(spans: list[Span]) -> None:
    """`to_arrow` and the row-wise table agree on every span, and on which spans cannot be stored."""
    table, bad = convert_good(spans, to_arrow)
    expected, expected_bad = convert_good(spans, row_wise)
    assert [id(s) for s, _ in bad] == [id(s) for s, _ in expected_bad]
    if expected is None:
        assert table is None
        return
    assert table is not None
    assert table.schema == TRACES_SCHEMA
    # compared in Arrow: `to_pylist` of nanosecond timestamps needs pandas, which a process that ran `load_arrow`
    # (any component converting rows, earlier in the same test worker) has hidden from pyarrow for good
    assert [name for name in table.column_names if not table[name].equals(expected[name])] == []


def _spans_of(body: bytes) -> list[Span]:
    spans = decode_traces_protobuf(body).batch.spans
    for s in spans:
        normalize_span(s)
    return spans  # type: ignore[return-value]


FIXTURE_FILES = sorted(p for p in FIXTURES.glob("*/*.pb") if ".logs." not in p.name)


def test_there_are_fixtures() -> None:
    assert len(FIXTURE_FILES) >= 20


@pytest.mark.parametrize("folder", sorted({p.parent.name for p in FIXTURE_FILES}))
def test_fixture_spans_store_the_rows_written_span_by_span(folder: str) -> None:
    spans = [s for p in FIXTURE_FILES if p.parent.name == folder for s in _spans_of(p.read_bytes())]
    assert spans
    assert_same_rows(spans)


def test_every_fixture_span_in_one_batch_interleaved_stores_the_rows_written_span_by_span() -> None:
    """A store link's batch mixes the spans of many requests: resources and attribute names alternate from one span
    to the next (each resource's map and each sequence of names is converted once and repeated)."""
    per_file = [_spans_of(p.read_bytes()) for p in FIXTURE_FILES]
    interleaved = [spans[i] for i in range(max(map(len, per_file))) for spans in per_file if i < len(spans)]
    assert len(interleaved) == sum(map(len, per_file))
    assert_same_rows(interleaved)
    assert_same_rows(interleaved[::-1])


def test_maps_that_share_a_resource_or_attribute_names_store_their_own_rows() -> None:
    one, other = {"service.name": "a", "n": 1}, {"service.name": "b", "n": 2.5, "x": [1]}
    spans = [
        _span(0, one, attributes={"a": 1, "b": "x"}),
        _span(1, other, attributes={"b": "y", "a": 2}),  # the same names in another order
        _span(2, one, attributes={"a": 3, "b": "z"}),
        _span(3, dict(one), attributes={"a": True}),  # an equal resource in a dict of its own
        _span(4, other, attributes={}),
        _span(5, one, attributes={"a": 3.0, "b": None, "c": {"k": [1, 2]}}),
    ]
    assert_same_rows(spans)
    table = to_arrow(spans)
    assert table.column("SpanAttributes").to_pylist()[1] == [("b", "y"), ("a", "2")]
    assert table.column("ResourceAttributes").to_pylist()[2] == [("service.name", "a"), ("n", "1")]


def test_a_span_whose_attribute_names_are_not_text_is_left_out_alone() -> None:
    spans = [_span(i, {"r": i}, attributes={"a": i, "b": "x"}) for i in range(6)]
    spans[2].attributes = {1: "x", "b": "y"}  # type: ignore[dict-item]
    spans[4].resource_attributes = {("k",): "tuple key"}  # type: ignore[dict-item]
    assert_same_rows(spans)
    table, bad = convert_good(spans, to_arrow)
    assert table is not None
    assert [s.span_id for s, _ in bad] == [spans[2].span_id, spans[4].span_id]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=hostile_cases())
def test_hostile_values_store_the_rows_written_span_by_span(case: Case) -> None:
    if not case.pb_parses:
        return  # protobuf's parser refuses the request: no span of it reaches the store
    spans = _spans_of(case.request.SerializeToString())
    assert_same_rows(spans)


def test_spans_holding_their_messages_as_json_store_the_rows_written_span_by_span() -> None:
    """Tail sampling keeps a waiting span's messages as their JSON (`compact_content`); the store writes that JSON
    as it is, and it must be the very text of the parsed messages, every fixture's and the stdlib's fallback's."""
    spans = [s for p in FIXTURE_FILES for s in _spans_of(p.read_bytes())]
    for s in spans:
        compact_content(s)
    held = [v for s in spans for v in (held_input(s), held_output(s)) if v is not None]
    assert held and all(type(v) is bytes for v in held)
    assert_same_rows(spans)  # `to_arrow` reads the JSON held, the row-wise table the messages parsed back
    # messages orjson refuses stay parsed, and a batch of them with held JSON falls back to the stdlib as a whole
    odd = _spans_of(FIXTURE_FILES[0].read_bytes())[:2]
    odd[0].input = [{"role": "user", "parts": [{"type": "text", "content": "big"}], "n": 2**70}]
    odd[1].input = [{"role": "user", "parts": [{"type": "text", "content": "plain"}]}]
    for s in odd:
        compact_content(s)
    assert type(held_input(odd[0])) is list and type(held_input(odd[1])) is bytes
    assert_same_rows(odd)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=hostile_cases())
def test_hostile_values_with_messages_held_as_json_store_the_rows_written_span_by_span(case: Case) -> None:
    if not case.pb_parses:
        return
    spans = _spans_of(case.request.SerializeToString())
    for s in spans:
        compact_content(s)
    assert_same_rows(spans)


def _growing_stream(table: pa.Table) -> bytes:
    """The Arrow IPC stream of `table` as pyarrow writes it into a buffer that grows as it fills."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_rows_a_worker_sends_are_the_table_the_store_would_write() -> None:
    """What a pipeline worker sends the collector (`ArrowRows.encode`, written into a buffer sized beforehand) is
    byte for byte the stream pyarrow writes into a growing buffer, and reads back as the table of every fixture's
    spans and log records, the hostile-looking ones included."""
    spans = [s for p in FIXTURE_FILES for s in _spans_of(p.read_bytes())]
    records = [
        r for p in sorted(FIXTURES.glob("*/*.logs.pb")) for r in decode_logs_protobuf(p.read_bytes()).batch.records
    ]
    assert spans and records
    encoder = ArrowRows()
    encoder.prepare()
    for kind, items, convert in (("spans", spans, to_arrow), ("logs", records, logs_to_arrow)):
        for part in (items[:1], items):
            body, bad = encoder.encode(kind, part)  # type: ignore[arg-type]
            assert body is not None and bad == []
            table = convert(part)
            assert bytes(body) == _growing_stream(table)
            received = bytearray(body)  # as the collector reads it off the pipe
            assert from_ipc(received).equals(table)


def _span(i: int, resource: dict[str, Any], **fields: Any) -> Span:
    span = Span(
        trace_id=f"{i + 1:032x}",
        span_id=f"{i + 1:016x}",
        parent_span_id="",
        name=f"span {i}",
        kind="INTERNAL",
        start_time_unix_nano=1_700_000_000_000_000_000 + i,
        end_time_unix_nano=1_700_000_000_000_000_000 + 2 * i,
    )
    span.resource_attributes = resource
    for name, value in fields.items():
        setattr(span, name, value)
    return span


def test_values_orjson_refuses_are_stored_as_the_stdlib_writes_them() -> None:
    shared = {"service.name": "svc", "n": 7, "ratio": 0.5, "flag": True}
    spans = [
        _span(0, shared, attributes={"big": 2**70, "neg": -(2**64), "f": math.nan, "inf": -math.inf, "b": False}),
        _span(1, shared, attributes={"bytes": b"\x00\xff", "none": None, "list": [1, "a", [2**65]], "map": {"k": 1}}),
        _span(2, shared, details={"big": 2**80, 3: "int key"}, input=[], output=[{"role": "assistant"}]),
        _span(3, {"other": 1.0}, input=[{"content": 2**64}], details={}, attributes={"s": "", "e": []}),
        _span(
            4,
            shared,
            events=[SpanEvent(5, "ev", {"k": 1, "x": [1.5]}), SpanEvent(6, "e2", {})],
            links=[SpanLink(f"{9:032x}", f"{9:016x}", "st", {"l": 2**66})],
        ),
        _span(5, shared, input_tokens=-1, output_tokens=2**63, cost_usd=0.25, unparsed=["input_tokens"]),
    ]
    assert_same_rows(spans)
    assert_same_rows(spans[:2])  # columns orjson takes whole
    table = to_arrow(spans[2:3])
    assert table.column("Input").to_pylist() == ["[]"]
    assert table.column("Details").to_pylist() == ['{"big":1208925819614629174706176,"3":"int key"}']


def test_a_span_with_text_utf8_cannot_hold_is_left_out_alone() -> None:
    spans = [
        _span(0, {}, input=[{"content": "fine"}]),
        _span(1, {}, input=[{"content": "lone \ud800 surrogate"}]),
        _span(2, {}, attributes={"k": "also \udfff"}),
        _span(3, {}, details={"why": "fine"}),
    ]
    assert_same_rows(spans)
    table, bad = convert_good(spans, to_arrow)
    assert table is not None
    assert table.column("SpanId").to_pylist() == [spans[0].span_id, spans[3].span_id]
    assert [s.span_id for s, _ in bad] == [spans[1].span_id, spans[2].span_id]


def test_text_the_same_in_every_span_is_stored_and_refused_as_each_span_alone() -> None:
    """A column holding one text in every row is repeated by Arrow rather than converted a row: stored the same, and
    text UTF-8 cannot hold still leaves out every span holding it, each alone."""
    spans = [_span(i, {}, status_message="same", model="m", kind="SERVER") for i in range(5)]
    spans.append(_span(5, {}, status_message="same", model="m", kind="MADE_UP"))
    assert_same_rows(spans)
    for s in spans:
        s.status_message = "lone \udc80"
    assert_same_rows(spans)
    table, bad = convert_good(spans, to_arrow)
    assert table is None and len(bad) == len(spans)


def score_row(s: Score) -> dict[str, Any]:
    """One score's row as the store's columns define it, written field by field."""
    return {
        "Timestamp": s.timestamp_unix_nano,
        "Project": s.project,
        "TraceId": s.trace_id,
        "SpanId": s.span_id,
        "SessionId": s.session_id,
        "Policy": s.policy,
        "Evaluator": s.evaluator,
        "EvaluatorVersion": s.evaluator_version,
        "Name": s.name,
        "Value": s.value,
        "Passed": s.passed,
        "Label": s.label or "",
        "Explanation": s.explanation or "",
        "Outcome": s.outcome,
        "Reason": s.reason or "",
        "Source": s.source,
        "JudgeCostUsd": s.judge_cost_usd,
        "RunId": s.run_id,
        "Trial": s.trial,
        "TaskId": s.task_id,
        "Metadata": json_codec.dumps(s.metadata) if s.metadata else "",
    }


def test_scores_store_the_rows_written_score_by_score() -> None:
    """Score columns the same in every score, varied ones, metadata orjson refuses, and values no column holds (a
    lone surrogate, a trial past 32 bits): each of those scores left out alone, the others stored as written."""
    base = {"trace_id": "t", "span_id": "s", "policy": "p", "evaluator": "e", "timestamp_unix_nano": 1}
    scores = [Score(f"n{i % 2}", value=i / 3, passed=i % 3 == 0 or None, metadata={"i": i} if i % 2 else {}, **base)
              for i in range(8)]  # fmt: skip
    scores += [
        Score.skipped("n0", "no content"),
        Score.error("n1", "judge_error", "boom"),
        Score("big", metadata={"n": 2**70, 3: "int key"}, judge_cost_usd=0.5, **base),
        Score("bad text", explanation="lone \ud800", **base),
        Score("bad trial", trial=2**32, **base),
    ]
    for batch in (scores[:8], scores):
        table, bad = convert_good(batch, scores_to_arrow)
        expected, expected_bad = convert_good(
            batch, lambda part: pa.Table.from_pylist([score_row(s) for s in part], schema=SCORES_SCHEMA)
        )
        assert [s.name for s, _ in bad] == [s.name for s, _ in expected_bad]
        assert table is not None and expected is not None and table.schema == SCORES_SCHEMA
        assert [name for name in table.column_names if not table[name].equals(expected[name])] == []
    assert [s.name for s, _ in bad] == ["bad text", "bad trial"]
    assert table.column("Metadata").to_pylist()[-1] == '{"n":1180591620717411303424,"3":"int key"}'


def test_converting_rows_leaves_pandas_unloaded_yet_importable() -> None:
    """pyarrow would import pandas on its first conversion (~45 MB in every process); `load_arrow` keeps it out, and
    a pandas conversion asked for later still works. In a fresh interpreter: this one may hold pandas already."""
    script = """
import sys
from evalsi.exporters.clickhouse.rows import ArrowRows, to_arrow
ArrowRows().prepare()
to_arrow([])
loaded_after_start = "pandas" in sys.modules
import pyarrow as pa
frame = pa.table({"a": [1, 2]}).to_pandas()
print(loaded_after_start, type(frame).__name__, list(frame["a"]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "DataFrame", "[1,", "2]"]
