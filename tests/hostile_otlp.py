"""Hostile OTLP trace requests, for `tests/receivers/test_hostile_values.py` and `benchmarks/hostile_values.py`.

`hostile_cases()` is a hypothesis strategy of `Case`s: an `ExportTraceServiceRequest` mixing valid spans (fresh random
ids, remembered with what the collector must store for them) and hostile ones: extreme ints in the uint64 time
fields, odd enum numbers, NaN/inf/huge doubles, numeric strings no count can hold, empty and ~100 KB strings, AnyValue
nesting up to depth 60, links with odd ids, GenAI token attributes of four conventions with hostile values, invalid
spans (bad ids, a start time past 2**63-1), and whole-request corruption (invalid UTF-8 patched into the protobuf
bytes, a lone surrogate escape or an out-of-range integer in OTLP/JSON).

`Harness` runs one `evalsi serve` and sends a case through OTLP/HTTP protobuf, OTLP/HTTP JSON or gRPC, checks the
answer against the contract, checks that the valid spans are stored (clamped fields marked with `evalsi.clamped`,
token counts parsed or listed as unparsed) and that a valid request sent afterwards is stored promptly.

The contract, as tested here:

- valid span: trace_id 16 bytes not all zero, span_id 8 bytes not all zero, parent_span_id empty or 8 bytes,
  start_time_unix_nano <= 2**63-1. Invalid spans are rejected one by one (partial_success.rejected_spans counts them,
  error_message names the first), the answer stays 200 / OK.
- kept and clamped, `evalsi.clamped` listing the fields: end_time_unix_nano > 2**63-1 or < start (duration 0),
  an event's time_unix_nano > 2**63-1, a span kind or status code no enum value has (UNSPECIFIED / UNSET).
- token attributes whose value cannot be a token count: the canonical count is None, the field in `unparsed`.
- a request that does not decode (protobuf parser errors, invalid UTF-8, lone surrogates, JSON ints out of range):
  400 + google.rpc.Status with a message / INVALID_ARGUMENT, nothing of it stored.
- never a 5xx except 503/429 with Retry-After (retried here), never a stall.
"""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from running_collector import Collector, serve_config, start_collector

MAX_NS = 2**63 - 1  # the largest start/end/event time the contract keeps as is
NOW = time.time_ns()
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
TRANSPORTS = ("http-protobuf", "http-json", "grpc")
FLUSH_INTERVAL = 0.1  # serve_config's flush_interval
SPAN_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
STATUS_CODES = ("UNSET", "OK", "ERROR")

# --- hostile values ---------------------------------------------------------------------------------------------

U64_TIMES = (0, 1, 2**32, NOW, MAX_NS, 2**63, 2**64 - 1)
I64_EXTREMES = (0, -1, 1, 2**31 - 1, 2**53 + 1, MAX_NS, -(2**63))
DOUBLES = (math.nan, math.inf, -math.inf, 1e308, -1e308, -0.0, 1e25, 5e-324, 0.1)
NUMERIC_STRINGS = ("1e30", "9" * 23, "-1", "NaN", "Infinity", "0x1F", "١٢٣", " 12 ", "1_000", "1e-400", "")
ODD_KINDS = (6, 7, 99, 2**31 - 1, -1, -(2**31))
ODD_STATUS = (3, 7, 99, 2**31 - 1, -1)
BIG_SIZES = (1_000, 100_000)
DEPTHS = (1, 5, 20, 40, 45, 60)

# the string slot that corruption patches: ASCII in every encoding, replaced by bytes of the same length
PLACEHOLDER = "@@HOSTILE-UTF8@@"
_PH = PLACEHOLDER.encode()
BAD_UTF8 = {  # name -> bytes that are not UTF-8, padded to the placeholder's length
    "0xff": b"\xff",
    "overlong": b"\xc0\xaf",
    "truncated": b"\xe2\x82",
    "above-U+10FFFF": b"\xf4\x90\x80\x80",
    "surrogate-as-utf8": b"\xed\xa0\x80",
}
JSON_INT_OVERFLOWS = (  # (where, value) in OTLP/JSON: protobuf's JSON parser refuses each
    ("startTimeUnixNano", "18446744073709551616"),
    ("endTimeUnixNano", "-1"),
    ("intValue", "9223372036854775808"),
    ("intValue", "-9223372036854775809"),
    ("intValue", 1e19),
    ("kind", 2**31),
    ("droppedAttributesCount", 2**32),
)

# GenAI conventions whose mapper reads a token count: (mapper name, marker attributes, input key, output key);
# mlflow's counts are inside the JSON string `mlflow.chat.tokenUsage`
CONVENTIONS: dict[str, tuple[dict[str, str], str, str]] = {
    "otel_genai": (
        {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai"},
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
    ),
    "openinference": ({"openinference.span.kind": "LLM"}, "llm.token_count.prompt", "llm.token_count.completion"),
    "openllmetry": ({"llm.request.type": "chat"}, "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"),
    "mlflow": ({"mlflow.spanType": '"CHAT_MODEL"'}, "input_tokens", "output_tokens"),
}


def _token_value() -> st.SearchStrategy[tuple[Any, int | None]]:
    """(value as sent, the count the contract expects or None when it cannot be a token count)."""
    valid = st.one_of(
        st.sampled_from((0, 1, 4096, 2**31, 2**53 + 1, MAX_NS)).map(lambda n: (n, n)),
        st.integers(0, MAX_NS).map(lambda n: (n, n)),
        st.sampled_from((0.0, 12.0, 4096.0)).map(lambda f: (f, int(f))),
        st.integers(0, MAX_NS).map(lambda n: (str(n), n)),
    )
    invalid = st.one_of(
        st.sampled_from((-1, -(2**63), -4096)).map(lambda n: (n, None)),
        st.integers(-(2**63), -1).map(lambda n: (n, None)),
        st.sampled_from((math.nan, math.inf, -math.inf, 1e25, 1e308, -1.0, 12.5)).map(lambda f: (f, None)),
        st.sampled_from(("1e30", "9" * 23, "-5", "abc", "", "NaN", "inf", "12.5")).map(lambda s: (s, None)),
    )
    return st.one_of(valid, invalid)


def _json_number(v: Any) -> str:
    """A token value in the JSON of `mlflow.chat.tokenUsage` as Python's json.dumps (MLflow's) writes it: NaN and
    the infinities bare, which strict JSON parsers refuse (the other count must still be read)."""
    return json.dumps(v)


def _set_scalar(av: AnyValue, v: Any) -> None:
    if isinstance(v, bool):
        av.bool_value = v
    elif isinstance(v, int):
        av.int_value = v
    elif isinstance(v, float):
        av.double_value = v
    else:
        av.string_value = v


# an AnyValue tree: ("string_value"|"int_value"|"double_value"|"bool_value"|"bytes_value", v), ("empty", None),
# ("array", [tree]), ("kvlist", [(key, tree)])
_keys = st.one_of(st.text(max_size=12), st.sampled_from(("", "service.name", "x" * 300, "\x00", "a.b.c")))
_texts = st.one_of(st.text(max_size=24), st.sampled_from(NUMERIC_STRINGS))
_scalars = st.one_of(
    st.tuples(st.just("string_value"), _texts),
    st.tuples(st.just("int_value"), st.one_of(st.sampled_from(I64_EXTREMES), st.integers(-(2**63), MAX_NS))),
    st.tuples(st.just("double_value"), st.one_of(st.sampled_from(DOUBLES), st.floats())),
    st.tuples(st.just("bool_value"), st.booleans()),
    st.tuples(st.just("bytes_value"), st.binary(max_size=16)),
    st.just(("empty", None)),
)
_trees = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.tuples(st.just("array"), st.lists(children, max_size=3)),
        st.tuples(st.just("kvlist"), st.lists(st.tuples(_keys, children), max_size=3)),
    ),
    max_leaves=6,
)


def fill_any(av: AnyValue, tree: tuple[str, Any]) -> None:
    kind, v = tree
    if kind == "empty":
        av.Clear()
    elif kind == "array":
        av.array_value.SetInParent()
        for child in v:
            fill_any(av.array_value.values.add(), child)
    elif kind == "kvlist":
        av.kvlist_value.SetInParent()
        for key, child in v:
            kv = av.kvlist_value.values.add()
            kv.key = key
            fill_any(kv.value, child)
    else:
        setattr(av, kind, v)


def deep_value(av: AnyValue, depth: int, kind: str) -> None:
    """`depth` levels of arrays or kvlists (alternating for "mixed") around a string."""
    for i in range(depth):
        level = kind if kind != "mixed" else ("array", "kvlist")[i % 2]
        if level == "array":
            av = av.array_value.values.add()
        else:
            kv = av.kvlist_value.values.add()
            kv.key = f"k{i}"
            av = kv.value
    av.string_value = "leaf"


# --- cases ------------------------------------------------------------------------------------------------------


@dataclass
class ExpectedSpan:
    """A valid span of a case and what the store must show for it."""

    trace_id: str
    span_id: str
    start: int
    duration: int
    kind: str
    status: str
    clamped: set[str]  # of "end_time", "kind", "status", "event_time"
    events: int
    convention: str | None = None
    tokens: dict[str, tuple[Any, int | None]] = field(default_factory=dict)  # input/output_tokens -> (sent, want)
    features: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"{self.trace_id}/{self.span_id} [{', '.join(self.features) or 'plain'}]"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis prints falsifying examples with this
        p.text(self.describe())


@dataclass
class Case:
    request: ExportTraceServiceRequest
    valid: list[ExpectedSpan]
    invalid_names: list[str]  # the invalid spans' names in request order
    corruption: str = ""  # "", "bad-utf8", "lone-surrogate", "json-int"
    bad_bytes: bytes = b""
    json_int: tuple[str, Any] | None = None
    pb_parses: bool = True  # whether protobuf's parser takes the request (deep nesting may exceed its depth limit)
    features: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        spans = "; ".join(s.describe() for s in self.valid[:12])
        more = f" (+{len(self.valid) - 12} more)" if len(self.valid) > 12 else ""
        return (
            f"Case(request={', '.join(self.features) or 'plain'}; {len(self.valid)} valid span(s): {spans}{more}; "
            f"invalid: {self.invalid_names})"
        )

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis prints falsifying examples with this
        p.text(repr(self))

    def expect(self, transport: str) -> str:
        """The answer due: "ok" (200 / OK, partial success counting the invalid spans), "bad" (400 /
        INVALID_ARGUMENT), or "either" for an OTLP/JSON request protobuf's own parser would refuse for its depth (400
        with nothing stored, or 200 with everything)."""
        if transport == "http-json":
            if self.corruption:
                return "bad"
            return "ok" if self.pb_parses else "either"
        if self.corruption in ("bad-utf8", "lone-surrogate"):
            return "bad"
        return "ok" if self.pb_parses else "bad"

    def body(self, transport: str) -> bytes:
        if transport != "http-json":
            raw = self.request.SerializeToString()
            if self.corruption in ("bad-utf8", "lone-surrogate"):
                assert raw.count(_PH) == 1
                raw = raw.replace(_PH, self.bad_bytes.ljust(len(_PH), b"x"))
            return raw
        doc = otlp_json(self.request)
        if self.corruption == "json-int":
            _apply_json_int(doc, *self.json_int)  # type: ignore[misc]
        text = json.dumps(doc, ensure_ascii=False).encode()
        if self.corruption == "bad-utf8":
            text = text.replace(_PH, self.bad_bytes.ljust(len(_PH), b"x"))
        elif self.corruption == "lone-surrogate":
            text = text.replace(_PH, b"\\ud800 lone")
        return text


def _b64_to_hex(obj: dict[str, Any], *keys: str) -> None:
    for key in keys:
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()


def otlp_json(req: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON: protobuf's JSON mapping with trace and span ids as hex strings."""
    doc = json_format.MessageToDict(req)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                _b64_to_hex(s, "traceId", "spanId", "parentSpanId")
                for link in s.get("links", []):
                    _b64_to_hex(link, "traceId", "spanId")
    return doc


def _apply_json_int(doc: dict[str, Any], where: str, value: Any) -> None:
    spans = [s for rs in doc.get("resourceSpans", []) for ss in rs.get("scopeSpans", []) for s in ss.get("spans", [])]
    if where == "intValue" or not spans:
        if where != "intValue":  # no span to put it on: an attribute of the resource then
            value = str(2**63)
        target = spans[0] if spans else doc.setdefault("resourceSpans", [{}])[0].setdefault("resource", {})
        target.setdefault("attributes", []).append({"key": "x.overflow", "value": {"intValue": value}})
    else:
        spans[0][where] = value


def _fresh(n: int) -> bytes:
    while True:
        b = os.urandom(n)
        if any(b):
            return b


INVALID_REASONS = (
    "no-trace-id",
    "short-trace-id",
    "long-trace-id",
    "zero-trace-id",
    "no-span-id",
    "short-span-id",
    "long-span-id",
    "zero-span-id",
    "bad-parent-id",
    "start-after-max",
)


@st.composite
def hostile_cases(draw: st.DrawFn, max_spans: int = 8) -> Case:
    corruption = draw(st.sampled_from(("",) * 12 + ("bad-utf8", "lone-surrogate", "json-int") * 2))
    req = ExportTraceServiceRequest()
    valid: list[ExpectedSpan] = []
    invalid_names: list[str] = []
    features: list[str] = []
    string_slots: list[Callable[[str], None]] = []  # places a hostile string (big, or the corruption placeholder) goes
    attribute_lists: list[Any] = []  # repeated KeyValue fields a deep value may go into
    traces = [_fresh(16) for _ in range(draw(st.integers(1, 2)))]
    n_spans = 0

    for _ in range(draw(st.integers(1, 2))):
        rs = req.resource_spans.add()
        if draw(st.booleans()):
            kv = rs.resource.attributes.add()
            kv.key = "service.name"
            fill_any(kv.value, draw(st.one_of(st.tuples(st.just("string_value"), _texts), _trees)))
        attribute_lists.append(rs.resource.attributes)
        for _ in range(draw(st.integers(1, 2))):
            ss = rs.scope_spans.add()
            ss.scope.name = draw(_texts)
            ss.scope.version = draw(_texts)
            string_slots.append(lambda s, ss=ss: setattr(ss.scope, "name", s))
            for _ in range(draw(st.integers(0, min(4, max_spans - n_spans)))):
                n_spans += 1
                span = ss.spans.add()
                reason = draw(st.sampled_from(("",) * 20 + INVALID_REASONS))
                attribute_lists.append(span.attributes)
                string_slots.append(lambda s, span=span: setattr(span.status, "message", s))
                string_slots.append(lambda s, span=span: setattr(span, "trace_state", s))
                exp = _draw_span(draw, span, traces, attribute_lists, string_slots)
                if reason:  # its name stays plain, so the error message can be checked for it
                    name = f"invalid#{len(invalid_names)}:{reason}"
                    _break(span, reason)
                    span.name = name
                    invalid_names.append(name)
                else:
                    string_slots.append(lambda s, span=span: setattr(span, "name", s))
                    valid.append(exp)

    scatter = draw(st.sampled_from((0,) * 19 + (120,)))
    if scatter:  # many valid spans with start times spread over the whole range: a day each
        features.append(f"{scatter} spans on scattered days")
        ss = req.resource_spans[0].scope_spans.add()
        trace = _fresh(16)
        for i in range(scatter):
            span = ss.spans.add()
            span.trace_id, span.span_id, span.name = trace, _fresh(8), f"scatter-{i}"
            start = draw(st.integers(0, MAX_NS - 10**12))
            span.start_time_unix_nano, span.end_time_unix_nano = start, start + 1000
            valid.append(ExpectedSpan(trace.hex(), span.span_id.hex(), start, 1000, "UNSPECIFIED", "UNSET", set(), 0))

    big = draw(st.sampled_from((0, 0, 0, *BIG_SIZES)))
    if big and string_slots:
        chunk = draw(st.text(min_size=1, max_size=8))
        s = (chunk * (big // max(1, len(chunk.encode())) + 1))[:big]
        draw(st.sampled_from(string_slots))(s)
        features.append(f"a {len(s.encode())}-byte string")

    depth = draw(st.sampled_from((0,) * 12 + DEPTHS))
    if depth:
        target = draw(st.sampled_from(attribute_lists))
        shape = draw(st.sampled_from(("array", "kvlist", "mixed")))
        kv = target.add()
        kv.key = "x.deep"
        deep_value(kv.value, depth, shape)
        features.append(f"{shape} nested {depth} deep")

    case = Case(req, valid, invalid_names, features=features)
    if corruption in ("bad-utf8", "lone-surrogate") and string_slots:
        draw(st.sampled_from(string_slots))(PLACEHOLDER)
        case.corruption = corruption
        which = "surrogate-as-utf8" if corruption == "lone-surrogate" else draw(st.sampled_from(list(BAD_UTF8)[:-1]))
        case.bad_bytes = BAD_UTF8[which]
        features.append(f"{corruption} ({which} in protobuf)")
    elif corruption == "json-int":
        case.corruption = corruption
        case.json_int = draw(st.sampled_from(JSON_INT_OVERFLOWS))
        features.append(f"json-int {case.json_int[0]}={case.json_int[1]!r} (JSON only)")
    try:
        ExportTraceServiceRequest.FromString(req.SerializeToString())
    except DecodeError:
        case.pb_parses = False
        features.append("beyond protobuf's depth limit")
    return case


# strategies built once (building them per draw costs more than the draws)
_PARENTS = st.sampled_from((b"", b"\x00" * 8, b"p" * 8))
_KINDS = st.one_of(st.integers(0, 5), st.sampled_from(ODD_KINDS))
_CODES = st.one_of(st.integers(0, 2), st.sampled_from(ODD_STATUS))
_TRACE_STATES = st.one_of(st.just(""), _texts)
_FLAGS = st.sampled_from((0, 1, 0x101, 2**32 - 1))
_U32_EXTREMES = st.sampled_from((0, 2**32 - 1))
_STARTS = st.one_of(st.sampled_from((0, 1, NOW, MAX_NS)), st.integers(0, MAX_NS))
_END_MODES = st.sampled_from((0, "start", "start+1000", MAX_NS, 2**63, 2**64 - 1, "random", "start-1"))
_U64 = st.integers(0, 2**64 - 1)
_EVENT_TIMES = st.one_of(st.sampled_from(U64_TIMES), _U64)
_N_ATTRIBUTES = st.integers(0, 3)
_N_EVENTS_LINKS = st.integers(0, 2)
_LINK_TRACE_IDS = st.sampled_from((0, 1, "zero16", 15, 16, 17))
_LINK_SPAN_IDS = st.sampled_from((0, "zero8", 7, 8, 9))
_CONVENTION_NAMES = st.sampled_from((None, *CONVENTIONS))
TOKEN_VALUES = _token_value()


def _odd_id(shape: int | str) -> bytes:
    if isinstance(shape, str):
        return bytes(int(shape.removeprefix("zero")))
    return _fresh(shape) if shape else b""


def _draw_span(
    draw: st.DrawFn,
    span: Any,
    traces: list[bytes],
    attribute_lists: list[Any],
    string_slots: list[Callable[[str], None]],
) -> ExpectedSpan:
    """Fill `span` as a valid span with hostile content; return what the store must show."""
    feats: list[str] = []
    clamped: set[str] = set()
    span.trace_id = traces[draw(st.integers(0, len(traces) - 1))]
    span.span_id = _fresh(8)
    span.parent_span_id = draw(_PARENTS)
    span.name = draw(_texts)
    kind = draw(_KINDS)
    span.kind = kind
    if not 0 <= kind <= 5:
        clamped.add("kind")
        feats.append(f"kind={kind}")
    code = draw(_CODES)
    span.status.code = code
    if not 0 <= code <= 2:
        clamped.add("status")
        feats.append(f"status.code={code}")
    span.status.message = draw(_texts)
    span.trace_state = draw(_TRACE_STATES)
    span.flags = draw(_FLAGS)
    span.dropped_attributes_count = draw(_U32_EXTREMES)
    start = draw(_STARTS)
    end_mode = draw(_END_MODES)
    end = {"start": start, "start+1000": start + 1000, "start-1": max(0, start - 1)}.get(end_mode, end_mode)
    if end == "random":
        end = draw(_U64)
    span.start_time_unix_nano, span.end_time_unix_nano = start, end
    if start != NOW:
        feats.append(f"start={start}")
    if end > MAX_NS or end < start:
        clamped.add("end_time")
        feats.append(f"end={end}")
    duration = end - start if start <= end <= MAX_NS else 0

    for _ in range(draw(_N_ATTRIBUTES)):
        kv = span.attributes.add()
        kv.key = "x." + draw(_keys)
        fill_any(kv.value, draw(_trees))
    n_events = draw(_N_EVENTS_LINKS)
    for _ in range(n_events):
        e = span.events.add()
        e.time_unix_nano = draw(_EVENT_TIMES)
        e.name = draw(_texts)
        string_slots.append(lambda s, e=e: setattr(e, "name", s))
        if draw(st.booleans()):
            kv = e.attributes.add()
            kv.key = draw(_keys)
            fill_any(kv.value, draw(_trees))
        attribute_lists.append(e.attributes)
        if e.time_unix_nano > MAX_NS:
            clamped.add("event_time")
            feats.append(f"event time={e.time_unix_nano}")
    for _ in range(draw(_N_EVENTS_LINKS)):
        ln = span.links.add()
        ln.trace_id = _odd_id(draw(_LINK_TRACE_IDS))
        ln.span_id = _odd_id(draw(_LINK_SPAN_IDS))
        ln.trace_state = draw(_texts)
        ln.flags = draw(_U32_EXTREMES)
        attribute_lists.append(ln.attributes)
        feats.append(f"link ids of {len(ln.trace_id)}/{len(ln.span_id)} bytes")

    exp = ExpectedSpan(
        span.trace_id.hex(),
        span.span_id.hex(),
        start,
        duration,
        SPAN_KINDS[kind] if 0 <= kind <= 5 else "UNSPECIFIED",
        STATUS_CODES[code] if 0 <= code <= 2 else "UNSET",
        clamped,
        n_events,
        features=feats,
    )
    convention = draw(_CONVENTION_NAMES)
    if convention:
        markers, input_key, output_key = CONVENTIONS[convention]
        exp.convention = convention
        for key, value in markers.items():
            kv = span.attributes.add()
            kv.key, kv.value.string_value = key, value
        usage: dict[str, Any] = {}
        for field_name, key in (("input_tokens", input_key), ("output_tokens", output_key)):
            if not draw(st.booleans()):
                continue
            sent, want = draw(TOKEN_VALUES)
            exp.tokens[field_name] = (sent, want)
            feats.append(f"{convention} {field_name}={sent!r}" if len(repr(sent)) < 40 else f"{field_name}=...")
            if convention == "mlflow":
                usage[field_name] = sent
            else:
                kv = span.attributes.add()
                kv.key = key
                _set_scalar(kv.value, sent)
        if usage:
            kv = span.attributes.add()
            kv.key = "mlflow.chat.tokenUsage"
            kv.value.string_value = "{" + ", ".join(f'"{k}": {_json_number(v)}' for k, v in usage.items()) + "}"
    return exp


def _break(span: Any, reason: str) -> None:
    """Make a span invalid for `reason` (its other hostile content stays)."""
    if reason == "no-trace-id":
        span.trace_id = b""
    elif reason == "short-trace-id":
        span.trace_id = _fresh(15)
    elif reason == "long-trace-id":
        span.trace_id = _fresh(17)
    elif reason == "zero-trace-id":
        span.trace_id = bytes(16)
    elif reason == "no-span-id":
        span.span_id = b""
    elif reason == "short-span-id":
        span.span_id = _fresh(4)
    elif reason == "long-span-id":
        span.span_id = _fresh(9)
    elif reason == "zero-span-id":
        span.span_id = bytes(8)
    elif reason == "bad-parent-id":
        span.parent_span_id = _fresh(7)
    elif reason == "start-after-max":
        span.start_time_unix_nano = 2**63 if span.start_time_unix_nano % 2 else 2**64 - 1
    else:
        raise ValueError(reason)


def valid_request(name: str = "probe") -> tuple[ExportTraceServiceRequest, str, str]:
    """A plain valid one-span request (the no-stall probe); returns it with its trace and span ids."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "hostile-probe"
    span = rs.scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name, span.kind = _fresh(16), _fresh(8), name, 1
    now = time.time_ns()
    span.start_time_unix_nano, span.end_time_unix_nano = now, now + 1_000_000
    return req, span.trace_id.hex(), span.span_id.hex()


# --- the collector --------------------------------------------------------------------------------------------


@dataclass
class Answer:
    transport: str
    klass: str  # "ok", "bad", "retry-exhausted", "5xx", "other", "transport-error"
    status: str  # HTTP status or gRPC code name
    rejected: int = 0
    message: str = ""
    retries: int = 0
    elapsed: float = 0.0

    def short(self) -> str:
        msg = self.message if len(self.message) < 300 else self.message[:300] + "..."
        return f"{self.transport} -> {self.status} rejected={self.rejected} message={msg!r}"


def _clamped_marker(attributes: dict[str, Any]) -> list[str] | None:
    raw = attributes.get("evalsi.clamped")
    if raw is None:
        return None
    if isinstance(raw, list):
        return [str(x) for x in raw]
    try:
        parsed = json.loads(raw)
    except ValueError:
        return [raw]
    return [str(x) for x in parsed] if isinstance(parsed, list) else [str(parsed)]


_MARKER_WORDS = {"end_time": "end", "kind": "kind", "status": "status", "event_time": "event"}


def span_problems(exp: ExpectedSpan, got: dict[str, Any]) -> list[str]:
    """How a stored span (canonical shape from the API) differs from what the contract expects."""
    out = []
    where = f"span {exp.describe()}"
    if int(got["start_time_unix_nano"]) != exp.start:
        out.append(f"{where}: start_time_unix_nano {got['start_time_unix_nano']} != sent {exp.start}")
    if int(got["duration_ns"]) != exp.duration:
        out.append(f"{where}: duration_ns {got['duration_ns']}, expected {exp.duration}")
    if got["kind"] != exp.kind:
        out.append(f"{where}: kind {got['kind']!r}, expected {exp.kind!r}")
    if got["status_code"] != exp.status:
        out.append(f"{where}: status_code {got['status_code']!r}, expected {exp.status!r}")
    marker = _clamped_marker(got.get("attributes") or {})
    if exp.clamped:
        if marker is None:
            out.append(f"{where}: no evalsi.clamped attribute, expected one naming {sorted(exp.clamped)}")
        else:
            for what in sorted(exp.clamped):
                if not any(_MARKER_WORDS[what] in m.lower() for m in marker):
                    out.append(f"{where}: evalsi.clamped {marker} does not name the {what} field")
    elif marker is not None:
        out.append(f"{where}: evalsi.clamped {marker} on a span with nothing to clamp")
    events = got.get("events") or []
    if len(events) != exp.events:
        out.append(f"{where}: {len(events)} events stored, {exp.events} sent")
    for e in events:
        if not 0 <= int(e["time_unix_nano"]) <= MAX_NS:
            out.append(f"{where}: event time {e['time_unix_nano']} stored unclamped")
    unparsed = got.get("unparsed") or []
    for name in ("input_tokens", "output_tokens"):
        if name not in exp.tokens:
            if got.get(name) is not None and exp.convention:
                out.append(f"{where}: {name} {got.get(name)!r} though none was sent")
            continue
        sent, want = exp.tokens[name]
        conv = f"[{exp.convention}, stored convention {got.get('convention')!r}]"
        if got.get("convention") != exp.convention:
            # another mapper took the span (another convention's markers were drawn too, e.g. agentgateway's
            # scope): it does not read this convention's token attributes, so no count is expected from them
            continue
        if want is None:
            if got.get(name) is not None:
                out.append(f"{where}: {name}={sent!r} {conv} stored as {got.get(name)!r}, expected None")
            if name not in unparsed:
                out.append(f"{where}: {name}={sent!r} {conv} not listed in unparsed {unparsed}")
        else:
            if got.get(name) != want:
                out.append(f"{where}: {name}={sent!r} {conv} stored as {got.get(name)!r}, expected {want}")
            if name in unparsed:
                out.append(f"{where}: {name}={sent!r} {conv} listed in unparsed {unparsed}")
    return out


class Harness:
    """One `evalsi serve` (restarted if it wedges), the three transports, and what was stored."""

    def __init__(self, tmp: Path, workers: int, *, stall_slack: float = 3.0) -> None:
        self.tmp = tmp
        self.workers = workers
        self.stall_limit = 2 * FLUSH_INTERVAL + stall_slack
        self.exit_codes: list[int | None] = []  # of the collectors stopped so far (restarts included)
        self.stored_expected: list[ExpectedSpan] = []  # every valid span of every accepted request
        self.must_be_absent: list[tuple[str, str, str]] = []  # (trace, span, why) of refused requests
        self.max_probe = 0.0
        self.stalls: list[str] = []
        self.restarts = 0
        self.collector: Collector | None = None
        self._log_offset = 0
        self._start()

    # lifecycle

    def _start(self) -> None:
        run = self.tmp / f"run{self.restarts}"
        run.mkdir(parents=True, exist_ok=True)
        cfg = serve_config(self.tmp / "store")
        cfg["service"]["workers"] = self.workers
        self.collector = start_collector(run, cfg)
        self._log_offset = 0
        self.http = httpx.Client(base_url=self.collector.http, timeout=30)
        self.api = httpx.Client(base_url=self.collector.api, timeout=30)
        self.channel = grpc.insecure_channel(self.collector.grpc)
        self.grpc_export = self.channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)

    def stop(self, timeout: float = 60) -> int | None:
        c = self.collector
        assert c is not None
        self.http.close()
        self.api.close()
        self.channel.close()
        try:
            code: int | None = c.stop(signal.SIGTERM, timeout)
        except Exception:  # hung on SIGTERM
            c.proc.kill()
            c.proc.wait(10)
            code = None
        self.exit_codes.append(code)
        return code

    def restart(self) -> None:
        self.stop(timeout=30)
        self.restarts += 1
        self._start()

    def new_log_lines(self, levels: tuple[str, ...] = ("WARNING", "ERROR", "CRITICAL")) -> list[str]:
        """Warning and error lines the collector logged since the last call (tracebacks included)."""
        assert self.collector is not None
        with self.collector.log_path.open("rb") as f:
            f.seek(self._log_offset)
            data = f.read()
        self._log_offset += len(data)
        out = []
        for line in data.decode(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                if line.strip():
                    out.append(line[:500])
                continue
            level = str(entry.get("level", entry.get("levelname", ""))).upper()
            if level in levels:
                out.append(json.dumps(entry)[:1500])
        return out

    # sending

    def send(self, body: bytes, transport: str, max_retries: int = 5) -> Answer:
        t0 = time.monotonic()
        retries = 0
        while True:
            a = self._send_once(body, transport)
            if a.klass != "retry" or retries >= max_retries:
                if a.klass == "retry":
                    a.klass = "retry-exhausted"
                a.retries, a.elapsed = retries, time.monotonic() - t0
                return a
            retries += 1
            time.sleep(min(2.0, max(0.1, float(a.message or 1))))

    def _send_once(self, body: bytes, transport: str) -> Answer:
        if transport == "grpc":
            return self._send_grpc(body)
        media = JSON if transport == "http-json" else PROTOBUF
        try:
            r = self.http.post("/v1/traces", content=body, headers={"content-type": media})
        except httpx.HTTPError as e:
            return Answer(transport, "transport-error", type(e).__name__, message=str(e))
        status = str(r.status_code)
        got_media = r.headers.get("content-type", "").split(";")[0].strip()
        if r.status_code in (200, 400) and got_media != media:  # OTLP: the answer comes in the request's encoding
            return Answer(transport, "other", status, message=f"answer in {got_media!r} to a {media} request")
        if r.status_code == 200:
            out = ExportTraceServiceResponse()
            try:
                if got_media == JSON:
                    json_format.Parse(r.text, out, ignore_unknown_fields=True)
                else:
                    out.ParseFromString(r.content)
            except Exception as e:
                return Answer(transport, "other", status, message=f"undecodable 200 answer ({got_media}): {e}")
            ps = out.partial_success
            return Answer(transport, "ok", status, ps.rejected_spans, ps.error_message)
        if r.status_code in (429, 503) and r.headers.get("retry-after"):
            return Answer(transport, "retry", status, message=r.headers["retry-after"])
        klass = "bad" if r.status_code == 400 else ("5xx" if r.status_code >= 500 else "other")
        st_msg = status_pb2.Status()
        try:
            if got_media == JSON:
                json_format.Parse(r.text, st_msg, ignore_unknown_fields=True)
            else:
                st_msg.ParseFromString(r.content)
        except Exception:
            return Answer(
                transport, "other" if klass == "bad" else klass, status, message=f"not a Status: {r.text!r}"[:500]
            )
        if klass == "bad" and (st_msg.code != code_pb2.INVALID_ARGUMENT or not st_msg.message):
            return Answer(transport, "other", status, message=f"400 with Status code={st_msg.code} {st_msg.message!r}")
        return Answer(transport, klass, status, message=st_msg.message)

    def _send_grpc(self, body: bytes) -> Answer:
        try:
            raw = self.grpc_export(body, timeout=30)
        except grpc.RpcError as e:
            err: Any = e
            code = err.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
                return Answer("grpc", "retry", code.name, message="1")
            if code == grpc.StatusCode.INVALID_ARGUMENT and err.details():
                return Answer("grpc", "bad", code.name, message=err.details())
            klass = "5xx" if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) else "other"
            return Answer("grpc", klass, code.name, message=str(err.details()))
        out = ExportTraceServiceResponse.FromString(raw)
        return Answer("grpc", "ok", "OK", out.partial_success.rejected_spans, out.partial_success.error_message)

    # checking

    def answer_problems(self, case: Case, transport: str, a: Answer) -> list[str]:
        want = case.expect(transport)
        if a.klass not in ("ok", "bad"):
            return [f"answer {a.short()} (expected {want})"]
        if want != "either" and a.klass != want:
            return [f"answer {a.short()}, expected {'200/OK' if want == 'ok' else '400/INVALID_ARGUMENT'}"]
        out = []
        if a.klass == "ok":
            if a.rejected != len(case.invalid_names):
                out.append(f"rejected_spans {a.rejected}, expected {len(case.invalid_names)} ({a.short()})")
            if case.invalid_names and case.invalid_names[0] not in a.message:
                out.append(f"error_message {a.message[:300]!r} does not name the first invalid span "
                           f"{case.invalid_names[0]!r}")  # fmt: skip
        return out

    def remember(self, case: Case, a: Answer, transport: str) -> None:
        if a.klass == "ok":
            self.stored_expected.extend(case.valid)
        elif a.klass == "bad":
            why = f"{transport} request answered 400 ({', '.join(case.features)})"
            self.must_be_absent.extend((s.trace_id, s.span_id, why) for s in case.valid)

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        r = self.api.get(f"/api/v1/traces/{trace_id}")
        if r.status_code == 404:
            return []
        r.raise_for_status()
        return r.json()["spans"]

    def probe(self, wedge_wait: float = 10.0) -> tuple[float | None, float | None]:
        """Send a plain valid span: (seconds until the API shows it, None past the stall limit), and when past the
        limit, the seconds it took after all (None: not within `wedge_wait` more seconds either: wedged)."""
        req, trace_id, span_id = valid_request()
        t0 = time.monotonic()
        a = self.send(req.SerializeToString(), "http-protobuf")
        if a.klass != "ok" or a.rejected:
            return None, None
        while True:
            elapsed = time.monotonic() - t0
            try:
                found = any(s["span_id"] == span_id for s in self.trace(trace_id))
            except httpx.HTTPError:
                found = False
            if found:
                self.max_probe = max(self.max_probe, elapsed)
                return (elapsed, None) if elapsed <= self.stall_limit else (None, elapsed)
            if elapsed > self.stall_limit + wedge_wait:
                return None, None
            time.sleep(0.02)

    def stored_problems(
        self, expected: list[ExpectedSpan], timeout: float = 3.0, *, markers_only: bool = False
    ) -> tuple[list[str], int]:
        """Problems of the stored versions of `expected` (waiting up to `timeout` for missing ones), and how many
        are missing. `markers_only`: only whether each is stored and its `evalsi.clamped` marker."""
        by_trace: dict[str, list[ExpectedSpan]] = {}
        for e in expected:
            by_trace.setdefault(e.trace_id, []).append(e)
        out: list[str] = []
        missing = 0
        deadline = time.monotonic() + timeout
        for trace_id, exps in by_trace.items():
            while True:
                spans = {s["span_id"]: s for s in self.trace(trace_id)}
                if all(e.span_id in spans for e in exps) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            for e in exps:
                got = spans.get(e.span_id)
                if got is None:
                    missing += 1
                    out.append(f"span {e.describe()} not stored")
                else:
                    found = span_problems(e, got)
                    out.extend(p for p in found if not markers_only or "evalsi.clamped" in p)
        return out, missing

    def absent_problems(self, items: list[tuple[str, str, str]]) -> list[str]:
        out = []
        by_trace: dict[str, list[tuple[str, str]]] = {}
        for trace_id, span_id, why in items:
            by_trace.setdefault(trace_id, []).append((span_id, why))
        for trace_id, spans in by_trace.items():
            stored = {s["span_id"] for s in self.trace(trace_id)}
            out.extend(f"span {trace_id}/{s} stored though its {why}" for s, why in spans if s in stored)
        return out

    def run_case(self, case: Case, transport: str) -> list[str]:
        """Send `case`, check the answer, that a valid request right after is stored promptly, and that the case's
        valid spans are stored as the contract says (or none of them, when refused). Returns the problems."""
        self.new_log_lines()
        a = self.send(case.body(transport), transport)
        problems = self.answer_problems(case, transport, a)
        self.remember(case, a, transport)
        waited, late = self.probe()
        if waited is None:
            assert self.collector is not None
            if self.collector.proc.poll() is not None:
                state = f"the collector exited {self.collector.proc.returncode}: restarted"
            elif late is not None:
                state = f"stored after {late:.1f}s"
            else:
                state = "wedged: restarted"
            problems.append(f"stall: a valid request sent after it was not stored within {self.stall_limit:.1f}s "
                            f"({state})")  # fmt: skip
            self.stalls.append(problems[-1])
            if late is None:
                problems += [f"log: {line}" for line in self.new_log_lines()][:20]
                self.restart()
                return problems
        if a.klass == "ok":
            found, _ = self.stored_problems(case.valid)
            problems += found
        elif a.klass == "bad":
            problems += self.absent_problems([(s.trace_id, s.span_id, "request was refused") for s in case.valid])
        if problems:
            problems += [f"log: {line}" for line in self.new_log_lines()][:20]
        return problems
