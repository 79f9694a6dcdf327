"""Spans to store columns (an Arrow table) and stored rows back to the canonical shape."""

from __future__ import annotations

import base64
import json
from typing import Any

import pyarrow as pa

from evalsi import json_codec
from evalsi.exporters.clickhouse.schema import LOGS_SCHEMA, SCORES_SCHEMA, TRACES_SCHEMA
from evalsi.log_record import LogRecord
from evalsi.score import Score
from evalsi.span import Span

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


def _content(messages: list[dict[str, Any]] | None) -> str:
    return "" if messages is None else _json(messages)


_STATUS = {"UNSET": "STATUS_CODE_UNSET", "OK": "STATUS_CODE_OK", "ERROR": "STATUS_CODE_ERROR"}
_STATUS_BACK = {v: k for k, v in _STATUS.items()}


class _MapColumn:
    """A Map(String, String) column built flat (keys, values, offsets): far cheaper than a list of pair lists."""

    def __init__(self) -> None:
        self.offsets = [0]
        self.keys: list[str] = []
        self.values: list[str] = []

    def add(self, keys: Any, values: list[str]) -> None:
        self.keys.extend(keys)
        self.values.extend(values)
        self.offsets.append(len(self.keys))

    def array(self) -> pa.Array:
        return pa.MapArray.from_arrays(
            pa.array(self.offsets, pa.int32()), pa.array(self.keys, pa.string()), pa.array(self.values, pa.string())
        )


def _strings(attrs: dict[str, Any]) -> list[str]:
    return [v if type(v) is str else attribute_string(v) for v in attrs.values()]


def to_arrow(spans: list[Span]) -> pa.Table:
    """Column-wise build: one Python list per column, converted by Arrow in C."""
    cols: list[Any] = [[] for _ in TRACES_SCHEMA]
    rattrs, sattrs = _MapColumn(), _MapColumn()
    cols[TRACES_SCHEMA.get_field_index("ResourceAttributes")] = rattrs
    cols[TRACES_SCHEMA.get_field_index("SpanAttributes")] = sattrs
    (ts, tid, sid, psid, tstate, name, kind, service, rattrs, scope, scope_v, sattrs, dur, status, status_msg,
     ev_ts, ev_name, ev_attrs, ln_tid, ln_sid, ln_state, ln_attrs, step, model, provider, in_tok, out_tok,
     tool, session, agent, user, cost, error, inp, out, captured, convention, unparsed, details) = cols  # fmt: skip
    resource_cache: dict[int, tuple[list[str], list[str]]] = {}
    for s in spans:
        ts.append(s.start_time_unix_nano)
        tid.append(s.trace_id)
        sid.append(s.span_id)
        psid.append(s.parent_span_id)
        tstate.append(s.trace_state)
        name.append(s.name)
        kind.append("SPAN_KIND_" + s.kind)
        service.append(s.service_name)
        # spans of one OTLP resource share its dict: convert it once
        key = id(s.resource_attributes)
        r = resource_cache.get(key)
        if r is None:
            r = resource_cache[key] = (list(s.resource_attributes), _strings(s.resource_attributes))
        rattrs.add(*r)
        scope.append(s.scope_name)
        scope_v.append(s.scope_version)
        sattrs.add(s.attributes.keys(), _strings(s.attributes))
        dur.append(s.duration_ns)
        status.append(_STATUS.get(s.status_code, "STATUS_CODE_UNSET"))
        status_msg.append(s.status_message)
        if s.events:
            ev_ts.append([e.time_unix_nano for e in s.events])
            ev_name.append([e.name for e in s.events])
            ev_attrs.append([string_map(e.attributes) for e in s.events])
        else:
            ev_ts.append([])
            ev_name.append([])
            ev_attrs.append([])
        if s.links:
            ln_tid.append([ln.trace_id for ln in s.links])
            ln_sid.append([ln.span_id for ln in s.links])
            ln_state.append([ln.trace_state for ln in s.links])
            ln_attrs.append([string_map(ln.attributes) for ln in s.links])
        else:
            ln_tid.append([])
            ln_sid.append([])
            ln_state.append([])
            ln_attrs.append([])
        step.append(s.step_type)
        model.append(s.model or "")
        provider.append(s.provider or "")
        in_tok.append(s.input_tokens if s.input_tokens is None or s.input_tokens >= 0 else None)
        out_tok.append(s.output_tokens if s.output_tokens is None or s.output_tokens >= 0 else None)
        tool.append(s.tool_name or "")
        session.append(s.session_id or "")
        agent.append(s.agent_name or "")
        user.append(s.user_id or "")
        cost.append(s.cost_usd)
        error.append(s.error_type or "")
        inp.append(_content(s.input))
        out.append(_content(s.output))
        captured.append(s.content_captured)
        convention.append(s.convention)
        unparsed.append(s.unparsed)
        details.append(_json(s.details) if s.details else "")
    arrays = [
        c.array() if isinstance(c, _MapColumn) else pa.array(c, type=f.type)
        for c, f in zip(cols, TRACES_SCHEMA, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=TRACES_SCHEMA)


def _table(columns: list[list[Any]], schema: pa.Schema) -> pa.Table:
    arrays = [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)]
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
    columns = [
        [s.timestamp_unix_nano for s in scores],
        [s.project for s in scores],
        [s.trace_id for s in scores],
        [s.span_id for s in scores],
        [s.session_id for s in scores],
        [s.policy for s in scores],
        [s.evaluator for s in scores],
        [s.evaluator_version for s in scores],
        [s.name for s in scores],
        [s.value for s in scores],
        [s.passed for s in scores],
        [s.label or "" for s in scores],
        [s.explanation or "" for s in scores],
        [s.outcome for s in scores],
        [s.reason or "" for s in scores],
        [s.source for s in scores],
        [s.judge_cost_usd for s in scores],
        [s.run_id for s in scores],
        [s.trial for s in scores],
        [s.task_id for s in scores],
        [_json(s.metadata) if s.metadata else "" for s in scores],
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
