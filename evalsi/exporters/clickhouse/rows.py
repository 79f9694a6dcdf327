"""Spans to store columns (an Arrow table) and stored rows back to the canonical shape."""

from __future__ import annotations

import base64
import json
import struct
from array import array
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import orjson
import pyarrow as pa

from evalsi import json_codec
from evalsi.exporters.clickhouse.schema import LOGS_SCHEMA, SCORES_SCHEMA, TRACES_SCHEMA
from evalsi.model.log_record import LogRecord
from evalsi.model.score import Score
from evalsi.model.span import Span, held_input, held_output
from evalsi.runtime.pandas_hidden import pandas_hidden
from evalsi.store import RowKind, Rows

_COMPACT = (",", ":")


_SCALAR_STRING = {str: str, int: int.__repr__, float: float.__repr__, bool: lambda b: "true" if b else "false"}


def attribute_string(value: Any) -> str:
    """An attribute value as the OTel ClickHouse exporter stores it (pcommon `AsString`)."""
    scalar = _SCALAR_STRING.get(type(value))
    if scalar is not None:
        return scalar(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if value is None:
        return ""
    return json_codec.dumps(value)


def string_map(attrs: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k, v if isinstance(v, str) else attribute_string(v)) for k, v in attrs.items()]


_json = json_codec.dumps


def _content(messages: list[dict[str, Any]] | bytes | None) -> str:
    """The JSON text of canonical messages: "" for None, as it is for messages held as JSON (`compact_content`)."""
    if messages is None:
        return ""
    return messages.decode() if messages.__class__ is bytes else _json(messages)  # type: ignore[union-attr]


_STATUS = {"UNSET": "STATUS_CODE_UNSET", "OK": "STATUS_CODE_OK", "ERROR": "STATUS_CODE_ERROR"}
_STATUS_BACK = {v: k for k, v in _STATUS.items()}


_INT32 = pa.int32()
_STR = pa.string()


def _int32_column(data: bytes | array[int], n: int) -> pa.Array:
    """An int32 column of `n` values already packed in `data`."""
    return pa.Array.from_buffers(_INT32, n, [None, pa.py_buffer(data)])


def _int32s(values: list[int]) -> pa.Array:
    """An int32 column of ints this module computed (offsets, picks): packed by `struct` in C, ~3x cheaper than
    Arrow's conversion of each Python int."""
    return _int32_column(struct.pack(f"<{len(values)}i", *values), len(values))


def _map_keys(maps: list[dict[str, Any]]) -> pa.Array:
    """Every map's keys, in order, as one string column. Spans of one instrumentation carry the same attribute names
    in the same order: each distinct sequence of names is converted once, and Arrow's `take` repeats it (a tuple and a
    dict look-up a map in Python, rather than a Python string handed to Arrow a key)."""
    firsts: dict[tuple[str, ...], array[int]] = {}
    names: list[str] = []
    picks = array("i")
    extend = picks.extend
    for shape in map(tuple, maps):
        positions = firsts.get(shape)
        if positions is None:
            positions = firsts[shape] = array("i", range(len(names), len(names) + len(shape)))
            names += shape
        extend(positions)
    return pa.array(names, _STR).take(_int32_column(picks, len(picks)))


def _map_array(maps: list[dict[str, Any]]) -> pa.Array:
    """A Map(String, String) column built flat (keys, values, offsets): far cheaper than a list of pair lists.
    The values are one comprehension over every map, numbers and arrays turned into text inline (as
    `attribute_string` does) without a call per value."""
    offsets = list(accumulate(map(len, maps), initial=0))
    values = [
        v
        if (t := type(v)) is str
        else repr(v)
        if t is int or t is float
        else _json(v)
        if t is list
        else attribute_string(v)
        for attrs in maps
        for v in attrs.values()
    ]
    return pa.MapArray.from_arrays(_int32s(offsets), _map_keys(maps), pa.array(values, _STR))


def _shared_map_array(maps: list[dict[str, Any]]) -> pa.Array:
    """`_map_array` of dicts that repeat (every span of one OTLP resource holds the same `resource_attributes`):
    each distinct dict converted once, then picked for every map by Arrow's `take` (one int a map in Python)."""
    ordinal: dict[int, int] = {}
    distinct: list[dict[str, Any]] = []
    picks: list[int] = []
    pick = picks.append
    for attrs in maps:
        i = ordinal.get(id(attrs))
        if i is None:
            i = ordinal[id(attrs)] = len(distinct)
            distinct.append(attrs)
        pick(i)
    return _map_array(distinct).take(_int32s(picks))


_orjson_dumps = orjson.dumps


def _json_column(values: list[Any], *, empty_too: bool = False) -> pa.Array:
    """A string column of the JSON text of each value, "" for None (and for any empty value with `empty_too`), as
    `_content` and `_json` write it. orjson's bytes are appended to one buffer as they are made and the column is
    built on it with the offsets (orjson writes only UTF-8), so no `str` is made a value and none is kept alive
    until Arrow copies it. When orjson refuses a value (an integer past 64 bits, a key that is not a string, a lone
    surrogate) the whole column is written by `_json`, which takes those to the stdlib (and Arrow refuses text that
    is not Unicode, for `convert_good` to leave that item out)."""
    dumps = _orjson_dumps
    data = bytearray()
    ends = [0]
    end = ends.append
    try:
        if empty_too:
            for v in values:
                if v:
                    data += dumps(v, default=str)
                end(len(data))
        else:
            for v in values:
                if v is not None:
                    data += v if v.__class__ is bytes else dumps(v, default=str)  # bytes: JSON (`compact_content`)
                end(len(data))
        offsets = struct.pack(f"<{len(ends)}i", *ends)  # `pa.string()`'s 32-bit offsets: 2 GiB or more goes below
    except (TypeError, struct.error):
        texts = [_json(v) if v else "" for v in values] if empty_too else [_content(v) for v in values]
        return pa.array(texts, _STR)
    return pa.Array.from_buffers(_STR, len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _texts(values: list[Any]) -> pa.Array | list[Any]:
    """A string column the same text in every row (a batch's spans mostly share their service, scope, kind, status
    and empty fields) as Arrow's repeat of one value, ~10x cheaper than a Python string handed to Arrow a row; any
    other column as it is, for `to_arrow` to convert."""
    if values and type(first := values[0]) is str and values.count(first) == len(values):
        return pa.repeat(pa.scalar(first, _STR), len(values))
    return values


class _SpanKinds(dict[str, str]):
    """`SPAN_KIND_` and the kind: the same string for each known kind, made anew only for another."""

    def __missing__(self, kind: str) -> str:
        return "SPAN_KIND_" + kind


_SPAN_KIND = _SpanKinds(
    {k: "SPAN_KIND_" + k for k in ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")}
)


def _empty_lists(n: int, item: pa.DataType) -> pa.Array:
    return pa.ListArray.from_arrays(_int32_column(bytes(4 * (n + 1)), n + 1), pa.array([], item))  # every offset 0


def to_arrow(spans: list[Span]) -> pa.Table:
    """Column-wise build: one comprehension per column, converted by Arrow in C. Spans seldom carry events or
    links: when none in the batch does, those columns are built empty without a pass over the spans."""
    status, kind = _STATUS, _SPAN_KIND
    n = len(spans)
    columns: list[Any] = [
        [s.start_time_unix_nano for s in spans],
        [s.trace_id for s in spans],
        [s.span_id for s in spans],
        [s.parent_span_id for s in spans],
        _texts([s.trace_state for s in spans]),
        _texts([s.name for s in spans]),
        _texts([kind[s.kind] for s in spans]),
        _texts([s.service_name for s in spans]),
        _shared_map_array([s.resource_attributes for s in spans]),
        _texts([s.scope_name for s in spans]),
        _texts([s.scope_version for s in spans]),
        _map_array([s.attributes for s in spans]),
        [s.duration_ns for s in spans],
        _texts([status.get(s.status_code, "STATUS_CODE_UNSET") for s in spans]),
        _texts([s.status_message for s in spans]),
    ]
    if any(s.events for s in spans):
        columns += [
            [[e.time_unix_nano for e in s.events] for s in spans],
            [[e.name for e in s.events] for s in spans],
            [[string_map(e.attributes) for e in s.events] for s in spans],
        ]
    else:
        columns += [None] * 3
    if any(s.links for s in spans):
        columns += [
            [[ln.trace_id for ln in s.links] for s in spans],
            [[ln.span_id for ln in s.links] for s in spans],
            [[ln.trace_state for ln in s.links] for s in spans],
            [[string_map(ln.attributes) for ln in s.links] for s in spans],
        ]
    else:
        columns += [None] * 4
    columns += [
        _texts([s.step_type for s in spans]),
        _texts([s.model or "" for s in spans]),
        _texts([s.provider or "" for s in spans]),
        [t if (t := s.input_tokens) is None or t >= 0 else None for s in spans],
        [t if (t := s.output_tokens) is None or t >= 0 else None for s in spans],
        _texts([s.tool_name or "" for s in spans]),
        _texts([s.session_id or "" for s in spans]),
        _texts([s.agent_name or "" for s in spans]),
        _texts([s.user_id or "" for s in spans]),
        [s.cost_usd for s in spans],
        _texts([s.error_type or "" for s in spans]),
        _json_column([held_input(s) for s in spans]),  # compacted messages (bytes) are written as they are
        _json_column([held_output(s) for s in spans]),
        [s.content_captured for s in spans],
        _texts([s.convention for s in spans]),
        [s.unparsed for s in spans],
        _json_column([s.details for s in spans], empty_too=True),
    ]
    arrays = [
        _empty_lists(n, f.type.value_type) if c is None else c if isinstance(c, pa.Array) else pa.array(c, type=f.type)
        for c, f in zip(columns, TRACES_SCHEMA, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=TRACES_SCHEMA)


def convert_good(
    items: list[Any], convert: Callable[[list[Any]], pa.Table]
) -> tuple[pa.Table | None, list[tuple[Any, BaseException]]]:
    """Put `items` in columns with `convert`; when a value cannot be converted (an int past 64 bits, text that is
    not Unicode), halve until each such item is alone, so only those are left out: the table of the others (None
    when there is none), and each item left out with its error. Costs O(bad * log n) conversions when any fail."""
    try:
        return (convert(items) if items else None), []
    except Exception as e:  # whatever a row makes the conversion raise, that row cannot be stored
        if len(items) == 1:
            return None, [(items[0], e)]
    half = len(items) // 2
    left, bad_left = convert_good(items[:half], convert)
    right, bad_right = convert_good(items[half:], convert)
    tables = [t for t in (left, right) if t is not None]
    table = None if not tables else tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    return table, bad_left + bad_right


def load_arrow() -> None:
    """Convert an empty batch once, as a component that converts rows starts, so the first requests do not pay for
    pyarrow's set-up. pyarrow looks for pandas on its first array built from Python objects and imports it if it can
    (~0.5 s of CPU, ~45 MB of RSS); with pandas hidden here it records pandas as absent and does not look again (a
    pandas conversion asked for later still imports it)."""
    with pandas_hidden():
        to_arrow([])


def _table(columns: list[Any], schema: pa.Schema) -> pa.Table:
    """The table of `columns`: each an Arrow array already, or a list Arrow converts to its field's type."""
    arrays = [c if isinstance(c, pa.Array) else pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)]
    return pa.Table.from_arrays(arrays, schema=schema)


def logs_to_arrow(records: list[LogRecord]) -> pa.Table:
    resource_cache: dict[int, list[tuple[str, str]]] = {}

    def resource(r: LogRecord) -> list[tuple[str, str]]:
        key = id(r.resource_attributes)
        if key not in resource_cache:
            resource_cache[key] = string_map(r.resource_attributes)
        return resource_cache[key]

    columns = [
        [r.timestamp for r in records],
        [r.trace_id for r in records],
        [r.span_id for r in records],
        [r.flags for r in records],
        [r.severity_text for r in records],
        [r.severity_number for r in records],
        [r.service_name for r in records],
        [attribute_string(r.body) for r in records],
        [resource(r) for r in records],
        [r.scope_name for r in records],
        [r.scope_version for r in records],
        [string_map(r.attributes) for r in records],
        [r.event_name for r in records],
    ]
    return _table(columns, LOGS_SCHEMA)


def scores_to_arrow(scores: list[Score]) -> pa.Table:
    """The scores' columns, built as `to_arrow` builds spans': text the same in every score (project, policy,
    evaluator, outcome, source, empty fields) repeated by Arrow, the metadata's JSON on one buffer."""
    columns = [
        [s.timestamp_unix_nano for s in scores],
        _texts([s.project for s in scores]),
        [s.trace_id for s in scores],
        [s.span_id for s in scores],
        _texts([s.session_id for s in scores]),
        _texts([s.policy for s in scores]),
        _texts([s.evaluator for s in scores]),
        _texts([s.evaluator_version for s in scores]),
        _texts([s.name for s in scores]),
        [s.value for s in scores],
        [s.passed for s in scores],
        _texts([s.label or "" for s in scores]),
        _texts([s.explanation or "" for s in scores]),
        _texts([s.outcome for s in scores]),
        _texts([s.reason or "" for s in scores]),
        _texts([s.source for s in scores]),
        [s.judge_cost_usd for s in scores],
        _texts([s.run_id for s in scores]),
        [s.trial for s in scores],
        _texts([s.task_id for s in scores]),
        _json_column([s.metadata for s in scores], empty_too=True),
    ]
    return _table(columns, SCORES_SCHEMA)


def _pairs(value: Any) -> dict[str, str]:
    # a Map comes back as a dict (JSON) or as a list of pairs (Arrow)
    if isinstance(value, dict):
        return value
    return dict(value or [])


def _json_or_none(text: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def canonical_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row of `trace_spans_sql` in the canonical shape (attribute values come back as strings)."""
    events = [
        {"time_unix_nano": int(t), "name": n, "attributes": _pairs(a)}
        for t, n, a in zip(row["EventTimes"], row["EventNames"], row["EventAttributes"], strict=False)
    ]
    links = [
        {"trace_id": t, "span_id": s, "trace_state": st, "attributes": _pairs(a)}
        for t, s, st, a in zip(
            row["LinkTraceIds"],
            row["LinkSpanIds"],
            row["LinkTraceStates"],
            row["LinkAttributes"],
            strict=False,
        )
    ]
    return {
        "trace_id": row["TraceId"],
        "span_id": row["SpanId"],
        "parent_span_id": row["ParentSpanId"],
        "name": row["SpanName"],
        "kind": row["SpanKind"].removeprefix("SPAN_KIND_"),
        "service_name": row["ServiceName"],
        "start_time_unix_nano": int(row["StartNs"]),
        "duration_ns": int(row["Duration"]),
        "status_code": _STATUS_BACK.get(row["StatusCode"], "UNSET"),
        "status_message": row["StatusMessage"],
        "step_type": row["StepType"],
        "model": row["Model"] or None,
        "provider": row["Provider"] or None,
        "input_tokens": None if row["InputTokens"] is None else int(row["InputTokens"]),
        "output_tokens": None if row["OutputTokens"] is None else int(row["OutputTokens"]),
        "tool_name": row["ToolName"] or None,
        "session_id": row["SessionId"] or None,
        "agent_name": row["AgentName"] or None,
        "user_id": row["UserId"] or None,
        "cost_usd": row["CostUsd"],
        "error_type": row["ErrorType"] or None,
        "input": _json_or_none(row["Input"]),
        "output": _json_or_none(row["Output"]),
        "content_captured": bool(row["ContentCaptured"]),
        "convention": row["Convention"],
        "unparsed": list(row["Unparsed"]),
        "details": _json_or_none(row["Details"]) or {},
        "attributes": _pairs(row["SpanAttributes"]),
        "resource_attributes": _pairs(row["ResourceAttributes"]),
        "trace_state": row["TraceState"],
        "scope_name": row["ScopeName"],
        "scope_version": row["ScopeVersion"],
        "events": events,
        "links": links,
    }


class ArrowRows:
    """The store's `RowEncoder` for pipeline workers: spans and log records in the store's Arrow columns, as an
    Arrow IPC stream the collector process's exporter queues as is (`ClickHouseExporter.write_rows`)."""

    def prepare(self) -> None:
        load_arrow()

    def encode(self, kind: RowKind, items: list[Any]) -> tuple[Rows | None, list[tuple[Any, BaseException]]]:
        table, bad = convert_good(items, logs_to_arrow if kind == "logs" else to_arrow)
        if table is None:
            return None, bad
        return memoryview(ipc_stream(table)), bad


def ipc_stream(table: pa.Table) -> pa.Buffer:
    """`table` as an Arrow IPC stream in a buffer of its exact size, measured first by a dry run: a growing
    `BufferOutputStream` reallocates and copies as it fills, which made the write twice as slow."""
    size = pa.MockOutputStream()
    with pa.ipc.new_stream(size, table.schema) as writer:
        writer.write_table(table)
    out = pa.allocate_buffer(size.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(out), table.schema) as writer:
        writer.write_table(table)
    return out


def from_ipc(body: Rows) -> pa.Table:
    """The table an `ArrowRows.encode` made."""
    return pa.ipc.open_stream(pa.py_buffer(body)).read_all()
