"""Attacker's inputs for the OTLP receivers and the API, shared by `tests/receivers/test_fuzz.py` (a small budget)
and `benchmarks/fuzz.py` (100,000+ inputs against a real `evalsi serve`).

Three kinds of input, each a `FuzzInput` (what to send, where) drawn by hypothesis or built from a `random.Random`:

- structured (`structured_inputs()`, hypothesis): OTLP trace and log requests built on the wire, field by field,
  with hostile values: ids of every wrong length and all zeros, times at and past the uint64/int64 edges, enum numbers
  out of range (and past int32, as 10-byte varints), NaN/inf/subnormal doubles, AnyValues nested up to 5,000 deep,
  strings up to 1 MB, invalid UTF-8 in string fields (raw bytes, which protobuf's own serializer cannot write),
  fields repeated, wrong wire types and unknown fields, 100,000 attributes on a span, 10,000 spans, empty
  everything; sent as protobuf or OTLP/JSON (its own hostile JSON: numbers out of every range, `NaN` literals, lone
  surrogate escapes, raw invalid UTF-8, nesting 1,000+ deep, duplicate keys, UTF-16) over HTTP, or over gRPC;
- mutation (`mutation_input(rng)`): real requests (tests/fixtures, copies of the project's shared captures, and
  requests made with the OpenTelemetry SDK's encoder) with bits flipped, bytes inserted, cut short, length varints
  set huge or off by one, fields duplicated or spliced from another request; sent as protobuf or JSON, gzip, deflate
  or zstd (corrupted after compressing too), compression bombs, the wrong Content-Type or Content-Encoding, over
  HTTP or gRPC; and malformed HTTP itself on a raw socket;
- api (`api_input(rng)`): every GET route of the API (read off the FastAPI app) with hostile path segments and
  query strings, and JSON bodies, near-valid and random, to `POST /v1/evaluate` (backtracking regexes, recursive
  JSON schemas, 1,000 records), `/v1/feedback`, `/v1/runs` and `/v1/traces/select`.

`send_http` / `send_grpc` / `send_raw` send one and return an `Answer`; `problems(inp, answer)` says what in it breaks
the contract:

- HTTP: never a 5xx (but a 503 with Retry-After on the OTLP port: a refusal to retry); every 4xx on the OTLP port
  carries a `google.rpc.Status` in the request's encoding (JSON when the content type is neither protobuf nor JSON)
  whose code is the status's, with a message, a `BadRequest` on a 400 and `Retry-After` with `RetryInfo` on a 429;
  a 200 carries an export response in the request's encoding;
- gRPC: never INTERNAL or UNKNOWN (nor a hang: DEADLINE_EXCEEDED); INVALID_ARGUMENT carries the Status in
  `grpc-status-details-bin`;
- the API: never a 5xx, and every answer is JSON.
"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import math
import os
import random
import socket
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import zstandard
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = [ROOT / "tests" / "fixtures", ROOT.parent / "shared" / "fixtures"]

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
TRACES_PATH, LOGS_PATH = "/v1/traces", "/v1/logs"
TRACES_RPC = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
LOGS_RPC = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
MAX_BODY = 20 * 1024 * 1024  # the receivers' default max_request_body_size / max_recv_msg_size_mib
U64 = 2**64 - 1
I64_MAX = 2**63 - 1

# the Status code each HTTP error must carry (the receiver's HTTP_TO_CODE, restated: the test must not read it back)
STATUS_CODE = {
    400: code_pb2.INVALID_ARGUMENT,
    401: code_pb2.UNAUTHENTICATED,
    404: code_pb2.UNIMPLEMENTED,
    405: code_pb2.UNIMPLEMENTED,
    413: code_pb2.INVALID_ARGUMENT,
    415: code_pb2.UNIMPLEMENTED,
    429: code_pb2.RESOURCE_EXHAUSTED,
    503: code_pb2.UNAVAILABLE,
}


@dataclass
class FuzzInput:
    """One request to send. `port` is where: "otlp" (OTLP/HTTP), "grpc", "api", or "raw" (bytes written to the
    OTLP/HTTP port's socket as they are: `body` is the whole HTTP request)."""

    kind: str  # structured | mutation | api
    sub: str  # what it is, for the tables: e.g. "traces/json/gzip", "bitflip", "GET /api/v1/traces"
    port: str
    method: str = "POST"
    path: str = TRACES_PATH
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    grpc_compression: bool = False

    @property
    def media(self) -> str:
        """The encoding an OTLP/HTTP answer must come in: the request's, JSON when neither."""
        ct = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        return ct if ct in (PROTOBUF, JSON) else JSON

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sub": self.sub,
            "port": self.port,
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "grpc_compression": self.grpc_compression,
            "body_bytes": len(self.body),
        }


@dataclass
class Answer:
    """What came back: an HTTP status (0: no answer), or a gRPC code name; headers/trailers; the body."""

    status: int = 0
    code: str = ""  # gRPC: "OK", "INVALID_ARGUMENT", ...
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str = ""  # transport error (connection reset, timeout)
    seconds: float = 0.0

    @property
    def label(self) -> str:
        if self.code:
            return self.code
        if self.status == 400 and self.body == PARSER_REFUSAL:
            return "400 (HTTP parser)"
        if self.status:
            return str(self.status)
        return f"no answer ({self.error.split(':', 1)[0]})"


# --- the wire format ------------------------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    n &= U64  # negative numbers as protobuf writes them: ten bytes of two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def f_varint(number: int, n: int) -> bytes:
    return tag(number, 0) + varint(n)


def f_fixed64(number: int, n: int) -> bytes:
    return tag(number, 1) + struct.pack("<Q", n & U64)


def f_fixed32(number: int, n: int) -> bytes:
    return tag(number, 5) + struct.pack("<I", n & 0xFFFFFFFF)


def f_double(number: int, x: float) -> bytes:
    return tag(number, 1) + struct.pack("<d", x)


def f_bytes(number: int, payload: bytes) -> bytes:
    return tag(number, 2) + varint(len(payload)) + payload


# --- hostile values ---------------------------------------------------------------------------------------------------

BAD_UTF8 = (
    b"\xff",
    b"\xc0\xaf",  # overlong '/'
    b"\xe2\x82",  # cut short
    b"\xf4\x90\x80\x80",  # past U+10FFFF
    b"\xed\xa0\x80",  # a UTF-16 surrogate as UTF-8
    b"ok\x80",
    b"\xfe\xfe\xff\xff",
)
ODD_TEXT = (
    "",
    "\x00",
    "nul\x00inside",
    "\u202e rtl",
    "\ufeffbom",
    "\U0010ffff",
    "é" * 3,
    "a" * 300,
    "${jndi:ldap://x}",
    "'; DROP TABLE otel_traces; --",
    "\\N",
    "\t\n\r",
    "%s%n",
    "{{7*7}}",
    "../../etc/passwd",
    "service.name",
    "gen_ai.usage.input_tokens",
    "evalsi.clamped",
)
NOW = time.time_ns()
TIMES = (0, 1, 2**31, 2**32, NOW, I64_MAX - 1, I64_MAX, 2**63, U64 - 1, U64)
ENUMS = (0, 1, 2, 3, 5, 6, 7, 99, 2**31 - 1, -1, -(2**31), 2**32, 2**63, U64)
DOUBLES = (math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1e308, -1e308, 1e25)
ID_LENGTHS = (0, 1, 7, 8, 9, 15, 16, 17, 32, 64)
DEEP = (50, 99, 100, 101, 200, 1_000, 5_000)
HUGE_STRINGS = (1_000, 65_536, 300_000, 1_000_000)
GENAI_KEYS = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.operation.name",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "llm.token_count.prompt",
    "input.value",
    "output.value",
    "mlflow.spanInputs",
    "mlflow.chat.tokenUsage",
    "gen_ai.request.model",
    "gen_ai.conversation.id",
    "session.id",
    "service.name",
    "gen_ai.prompt.0.content",
    "gen_ai.completion.0.content",
    "llm.input_messages.0.message.content",
)

_texts = st.one_of(st.text(max_size=16), st.sampled_from(ODD_TEXT))
_keys = st.one_of(st.sampled_from(GENAI_KEYS), _texts)


def _one_in(n: int) -> st.SearchStrategy[bool]:
    """True about once in n draws: hypothesis draws 0 (and the bounds) far more often than 1/n, so not those."""
    return st.integers(0, n - 1).map(lambda i: i == n // 2)


JSON_TEXTS = (
    '[{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]',
    '[{"role": "user", "content": null}]',
    '{"input_tokens": 1e400, "output_tokens": NaN}',
    '{"input_tokens": "9999999999999999999999", "output_tokens": -1}',
    "[" * 5000 + "]" * 5000,
    '{"a": ' * 3000 + "1" + "}" * 3000,
    '[{"role": 1, "parts": {"type": []}}]',
    '"\\ud800"',
    "[1, 2",
    "null",
)


@cache
def _huge_string(size: int, char: str) -> bytes:
    return (char * size).encode("utf-8")[:size]


@st.composite
def _hostile_string(draw: st.DrawFn) -> bytes:
    which = draw(st.integers(0, 999))
    if which < 960:
        return draw(_texts).encode("utf-8")
    if which < 965:
        return draw(st.sampled_from(BAD_UTF8))
    if which < 995:  # JSON texts: the mappers parse some attributes (messages, token usage) as JSON
        return draw(st.sampled_from(JSON_TEXTS)).encode("utf-8")
    size = draw(st.sampled_from(HUGE_STRINGS[:2] * 4 + HUGE_STRINGS[2:]))
    return _huge_string(size, draw(st.sampled_from("xé€😀")))


hostile_string = _hostile_string()
"""The bytes of a string field: usually UTF-8, sometimes huge (up to 1 MB), sometimes not UTF-8 at all."""

_any_scalar = st.one_of(
    hostile_string.map(lambda b: f_bytes(1, b)),
    hostile_string.map(lambda b: f_bytes(1, b)),
    st.booleans().map(lambda b: f_varint(2, int(b))),
    st.sampled_from((2, 3, 255, U64)).map(lambda n: f_varint(2, n)),  # a bool no bool holds
    st.one_of(st.integers(-(2**63), I64_MAX), st.sampled_from((0, -1, I64_MAX, -(2**63), U64))).map(
        lambda n: f_varint(3, n)
    ),
    st.one_of(st.floats(), st.sampled_from(DOUBLES)).map(lambda x: f_double(4, x)),
    st.binary(max_size=24).map(lambda b: f_bytes(7, b)),
    st.just(b""),  # an empty AnyValue
    st.integers(8, 40).map(lambda n: f_varint(n, 1)),  # an unknown field
)


@cache
def deep_any(depth: int, shape: str) -> bytes:
    """`depth` levels of arrays ("a"), kvlists ("k") or both ("m") around a string, built without recursion."""
    v = f_bytes(1, b"leaf")
    for i in range(depth):
        level = shape if shape != "m" else "ak"[i % 2]
        v = f_bytes(5, f_bytes(1, v)) if level == "a" else f_bytes(6, f_bytes(1, key_value(b"k", v)))
    return v


def key_value(key: bytes, value: bytes) -> bytes:
    return f_bytes(1, key) + f_bytes(2, value)


_any_tree = st.recursive(
    _any_scalar,
    lambda children: st.one_of(
        st.lists(children, max_size=4).map(lambda vs: f_bytes(5, b"".join(f_bytes(1, v) for v in vs))),
        st.lists(st.tuples(_keys, children), max_size=4).map(
            lambda kvs: f_bytes(6, b"".join(f_bytes(1, key_value(k.encode(), v)) for k, v in kvs))
        ),
        st.tuples(children, children).map(lambda ab: ab[0] + ab[1]),  # two members of the oneof at once
    ),
    max_leaves=6,
)
_deep_any = st.tuples(st.sampled_from(DEEP), st.sampled_from("akm")).map(lambda a: deep_any(*a))
any_value = _one_in(60).flatmap(lambda deep: _deep_any if deep else _any_tree)
"""The bytes of an AnyValue: a small random tree, or a deep one (up to 5,000 levels)."""


@cache
def many_attributes(number: int, many: int, same_key: bool) -> bytes:
    if same_key:
        return f_bytes(number, key_value(b"k", f_varint(3, 1))) * many
    return b"".join(f_bytes(number, key_value(b"k%d" % i, f_bytes(1, b"v"))) for i in range(many))


@st.composite
def _attributes(draw: st.DrawFn, number: int) -> bytes:
    out = b"".join(
        f_bytes(number, key_value(draw(hostile_string) if draw(_one_in(10)) else draw(_keys).encode(), draw(any_value)))
        for _ in range(draw(st.integers(0, 3)))
    )
    if draw(_one_in(40)):
        out += many_attributes(number, draw(st.sampled_from((1_000, 10_000, 100_000))), draw(st.booleans()))
    return out


ATTRIBUTES = {n: _attributes(n) for n in (1, 3, 4, 6, 9)}
"""Repeated KeyValue field n: a few hostile ones, sometimes 1,000-100,000 more (the same key, or distinct)."""


@st.composite
def _an_id(draw: st.DrawFn, size: int) -> bytes:
    which = draw(st.integers(0, 19))
    if which < 15:
        return draw(st.binary(min_size=size, max_size=size))
    if which < 17:
        return bytes(size)
    return draw(st.binary(min_size=draw(st.sampled_from(ID_LENGTHS)), max_size=64))


TRACE_ID, SPAN_ID = _an_id(16), _an_id(8)
a_time = st.one_of(st.sampled_from(TIMES), st.integers(0, U64), st.integers(NOW - 10**12, NOW + 10**12))
an_enum = st.one_of(st.sampled_from(ENUMS), st.integers(0, 6), st.integers(-(2**63), U64))
a_u32 = st.integers(0, 2**32 - 1)


@st.composite
def _odd_fields(draw: st.DrawFn, strings: tuple[int, ...], fixed64: tuple[int, ...]) -> bytes:
    """Bytes appended to a message (mostly none): a string field again (last wins) with invalid UTF-8, a fixed64 field
    as a varint (the wrong wire type), an unknown field."""
    out = b""
    if not draw(_one_in(8)):
        return out
    which = draw(st.integers(0, 19))
    if which == 0 and strings:
        out += f_bytes(draw(st.sampled_from(strings)), draw(st.sampled_from(BAD_UTF8)))
    elif which == 1 and fixed64:
        out += f_varint(draw(st.sampled_from(fixed64)), draw(a_time))
    elif which < 10:
        out += f_bytes(draw(st.integers(17, 2**29 - 1)), draw(st.binary(max_size=8)))
    elif which < 14:
        out += f_fixed32(draw(st.integers(17, 40)), draw(a_u32))
    elif strings:
        out += f_bytes(draw(st.sampled_from(strings)), draw(hostile_string))  # the same field twice
    return out


@st.composite
def _span(draw: st.DrawFn) -> bytes:
    out = f_bytes(1, draw(TRACE_ID)) + f_bytes(2, draw(SPAN_ID))
    if draw(st.booleans()):
        out += f_bytes(4, draw(SPAN_ID))
    out += f_bytes(5, draw(hostile_string)) + f_varint(6, draw(an_enum))
    out += f_fixed64(7, draw(a_time)) + f_fixed64(8, draw(a_time))
    out += draw(ATTRIBUTES[9])
    if draw(_one_in(4)):
        out += f_bytes(3, draw(hostile_string))  # trace_state
    if draw(_one_in(4)):
        out += f_fixed32(16, draw(a_u32)) + f_varint(10, draw(an_enum))
    for _ in range(draw(st.integers(0, 2)) if draw(_one_in(3)) else 0):  # events
        event = f_fixed64(1, draw(a_time)) + f_bytes(2, draw(hostile_string)) + draw(ATTRIBUTES[3])
        out += f_bytes(11, event + draw(_odd_fields((2,), (1,))))
    for _ in range(draw(st.integers(0, 2)) if draw(_one_in(4)) else 0):  # links
        link = f_bytes(1, draw(TRACE_ID)) + f_bytes(2, draw(SPAN_ID)) + f_bytes(3, draw(hostile_string))
        out += f_bytes(13, link + draw(ATTRIBUTES[4]) + f_fixed32(6, draw(a_u32)))
    if draw(st.booleans()):
        out += f_bytes(15, f_bytes(2, draw(hostile_string)) + f_varint(3, draw(an_enum)))
    return out + draw(_odd_fields((3, 5), (7, 8)))


@st.composite
def _log_record(draw: st.DrawFn) -> bytes:
    out = f_fixed64(1, draw(a_time)) + f_fixed64(11, draw(a_time)) + f_varint(2, draw(an_enum))
    out += f_bytes(3, draw(hostile_string))
    if draw(st.integers(0, 4)):
        out += f_bytes(5, draw(any_value))
    out += draw(ATTRIBUTES[6]) + f_fixed32(8, draw(a_u32))
    if draw(st.booleans()):
        out += f_bytes(9, draw(TRACE_ID)) + f_bytes(10, draw(SPAN_ID))
    if draw(st.booleans()):
        out += f_bytes(12, draw(hostile_string))
    return out + draw(_odd_fields((3, 12), (1, 11)))


span, log_record = _span(), _log_record()


@st.composite
def _resource_and_scope(draw: st.DrawFn) -> tuple[bytes, bytes]:
    resource = draw(ATTRIBUTES[1])
    if draw(st.integers(0, 2)):
        resource += f_bytes(1, key_value(b"service.name", draw(any_value)))
    scope = f_bytes(1, draw(hostile_string)) + f_bytes(2, draw(hostile_string)) + draw(ATTRIBUTES[3])
    return resource, scope


resource_and_scope = _resource_and_scope()


@cache
def many_items(signal: str, many: int, ids: bytes) -> bytes:
    one = f_bytes(1, ids[:16]) + f_bytes(2, ids[16:]) + f_fixed64(7, NOW) if signal == "traces" else f_fixed64(1, NOW)
    return f_bytes(2, one) * many


@st.composite
def _otlp_message(draw: st.DrawFn, signal: str) -> bytes:
    item = span if signal == "traces" else log_record
    out = b""
    for _ in range(draw(st.integers(0, 2))):
        resource, scope = draw(resource_and_scope)
        scopes = b""
        for _ in range(draw(st.integers(0, 2))):
            items = b"".join(f_bytes(2, draw(item)) for _ in range(draw(st.integers(0, 4))))
            if draw(_one_in(60)):  # many small items (the same ids: the store keeps what it keeps)
                items += many_items(signal, draw(st.sampled_from((1_000, 10_000))), draw(st.sampled_from(MANY_IDS)))
            scopes += f_bytes(2, f_bytes(1, scope) + items + f_bytes(3, draw(hostile_string)))
        out += f_bytes(1, (f_bytes(1, resource) if draw(st.integers(0, 4)) else b"") + scopes)
    if draw(_one_in(4)):  # one place protobuf's parser refuses, beside the rest
        bad = draw(st.sampled_from(BAD_UTF8))
        value = draw(
            st.sampled_from((
                f_bytes(1, bad), f_bytes(6, f_bytes(1, key_value(b"k", f_bytes(1, bad)))), deep_any(101, "a"),
                deep_any(1_000, "m"), f_bytes(5, f_bytes(1, f_bytes(5, f_bytes(1, f_bytes(1, bad))))),
            ))
        )  # fmt: skip
        where = draw(st.sampled_from(("name", "key", "value", "resource")))
        one = f_bytes(1, bytes(range(1, 17))) + f_bytes(2, bytes(range(1, 9))) + f_fixed64(7, NOW)
        if signal == "logs":
            one = f_fixed64(1, NOW)
        resource = b""
        if where == "name":
            one += f_bytes(5 if signal == "traces" else 3, bad)
        elif where == "key":
            one += f_bytes(9 if signal == "traces" else 6, key_value(bad, f_bytes(1, b"v")))
        elif where == "value":
            one += f_bytes(9 if signal == "traces" else 6, key_value(b"k", value))
        else:
            resource = f_bytes(1, f_bytes(1, key_value(b"service.name", value)))
        extra = f_bytes(1, resource + f_bytes(2, f_bytes(2, one)))
        out = extra + out if draw(st.booleans()) else out + extra
    return out + draw(_odd_fields((), ()))


MANY_IDS = (bytes(range(1, 25)), b"\x00" * 24, b"\xff" * 24)
OTLP_MESSAGE = {s: _otlp_message(s) for s in ("traces", "logs")}
"""An ExportTraceServiceRequest or ExportLogsServiceRequest on the wire."""


# --- OTLP/JSON --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """JSON text json.dumps cannot write (raw bytes, literals, deep nesting), put in place after serializing."""

    text: bytes


def dumps_with_raw(doc: Any, ensure_ascii: bool) -> bytes:
    raws: list[bytes] = []

    def swap(node: Any) -> Any:
        if isinstance(node, Raw):
            raws.append(node.text)
            return RAW % (len(raws) - 1)
        if isinstance(node, dict):
            return {swap(k) if isinstance(k, Raw) else k: swap(v) for k, v in node.items()}
        if isinstance(node, list):
            return [swap(v) for v in node]
        return node

    text = json.dumps(swap(doc), ensure_ascii=ensure_ascii, allow_nan=True).encode("utf-8", "surrogatepass")
    for i, raw in enumerate(raws):
        text = text.replace(b'"' + (RAW % i).encode() + b'"', raw, 1)
    return text


RAW = "@@RAW%d@@"
RAW_NUMBERS = (
    b"1e999", b"-1e999", b"NaN", b"Infinity", b"-Infinity", b"1" * 400, b"-0", b"0.0000000001e-400",
    b"18446744073709551616", b"-9223372036854775809", b"9223372036854775808", b"1.5", b"0x10", b"01", b"true",
    b"null", b"[]", b"{}", b'"1"', b'" 1"', b'"1e3"', b'""',
)  # fmt: skip
_raw_string = st.one_of(
    st.sampled_from((b"\\ud800", b"\\udfff x", b"\\u0000", b"\\uD83D")),
    st.sampled_from(BAD_UTF8),
).map(lambda b: Raw(b'"' + b + b'"'))
json_scalar = st.one_of(
    _texts,
    _texts,
    st.one_of(st.integers(-(2**70), 2**70), st.sampled_from((0, -1, I64_MAX, 2**63, U64, U64 + 1))),
    st.one_of(st.floats(), st.sampled_from(DOUBLES)),
    st.sampled_from((None, True, False, [], {})),
    st.sampled_from(RAW_NUMBERS).map(Raw),
    _raw_string,
)


@cache
def deep_json_any(depth: int) -> Raw:
    return Raw(b'{"arrayValue": {"values": [' * depth + b'{"stringValue": "x"}' + b"]}}" * depth)


_json_any_scalar = st.one_of(
    st.builds(lambda v: {"stringValue": v}, st.one_of(_texts, _texts, _texts, json_scalar)),
    st.builds(lambda v: {"intValue": v}, st.one_of(st.integers(-(2**63), I64_MAX).map(str), json_scalar)),
    st.builds(
        lambda v: {"doubleValue": v}, st.one_of(st.sampled_from(("NaN", "Infinity", "-Infinity", "1e400")), json_scalar)
    ),
    st.builds(lambda v: {"boolValue": v}, json_scalar),
    st.builds(
        lambda v: {"bytesValue": v}, st.one_of(st.sampled_from(("", "====", "a", "!!", "AA==AA==")), json_scalar)
    ),
    st.just({}),
    st.just({"stringValue": "a", "intValue": "1"}),  # two members of a oneof
    json_scalar,  # not an object at all
    st.sampled_from(DEEP).map(deep_json_any),
)
json_any_value = st.recursive(
    _json_any_scalar,
    lambda children: st.one_of(
        st.builds(lambda vs: {"arrayValue": {"values": vs}}, st.lists(children, max_size=3)),
        st.builds(
            lambda kvs: {"kvlistValue": {"values": [{"key": k, "value": v} for k, v in kvs]}},
            st.lists(st.tuples(st.one_of(_keys, json_scalar), children), max_size=3),
        ),
    ),
    max_leaves=5,
)


@st.composite
def _json_key_value(draw: st.DrawFn) -> Any:
    kv: dict[str, Any] = {"key": draw(st.one_of(_keys, _keys, _keys, json_scalar)), "value": draw(json_any_value)}
    if draw(_one_in(10)):
        kv.pop(draw(st.sampled_from(("key", "value"))))
    return kv


json_key_value = _json_key_value()


@st.composite
def _json_id(draw: st.DrawFn, size: int) -> Any:
    which = draw(st.integers(0, 19))
    if which < 15:
        return draw(st.binary(min_size=size, max_size=size)).hex()
    if which == 15:
        return "0" * (2 * size)
    if which == 16:
        return draw(st.binary(max_size=64)).hex()
    if which == 17:
        return draw(st.sampled_from(("", "zz" * size, "0x" + "1" * (2 * size - 2), " " * (2 * size), "AAAA", "😀")))
    return draw(json_scalar)


JSON_TRACE_ID, JSON_SPAN_ID = _json_id(16), _json_id(8)
json_time = st.one_of(
    a_time.map(str),
    a_time.map(str),
    st.integers(NOW - 10**12, NOW + 10**12).map(str),
    st.sampled_from(("-1", "18446744073709551616", "1e30", "NaN", "", " 1", "1.5", "0x10")),
    st.integers(-(2**70), 2**70),
    json_scalar,
)


@st.composite
def _json_attributes(draw: st.DrawFn) -> Any:
    if draw(_one_in(20)):
        return draw(json_scalar)  # not a list
    out = draw(st.lists(json_key_value, max_size=4))
    if draw(_one_in(40)):
        out += [{"key": f"k{i}", "value": {"intValue": str(i)}} for i in range(draw(st.sampled_from((1_000, 20_000))))]
    return out


json_attributes = _json_attributes()
json_enum = st.one_of(an_enum, an_enum, an_enum, json_scalar)


@st.composite
def _json_item(draw: st.DrawFn, signal: str, snake: bool) -> Any:
    def k(camel: str, snake_: str) -> str:
        return snake_ if snake else camel

    if signal == "traces":
        item = {
            k("traceId", "trace_id"): draw(JSON_TRACE_ID), k("spanId", "span_id"): draw(JSON_SPAN_ID),
            "name": draw(st.one_of(_texts, _texts, json_scalar)), "kind": draw(json_enum),
            k("startTimeUnixNano", "start_time_unix_nano"): draw(json_time),
            k("endTimeUnixNano", "end_time_unix_nano"): draw(json_time),
            "attributes": draw(json_attributes),
        }  # fmt: skip
        if draw(st.booleans()):
            item[k("parentSpanId", "parent_span_id")] = draw(JSON_SPAN_ID)
        if draw(_one_in(3)):
            item["events"] = [
                {k("timeUnixNano", "time_unix_nano"): draw(json_time), "name": draw(_texts),
                 "attributes": draw(json_attributes)}
            ]  # fmt: skip
        if draw(_one_in(4)):
            item["links"] = [
                {k("traceId", "trace_id"): draw(JSON_TRACE_ID), k("spanId", "span_id"): draw(JSON_SPAN_ID)}
            ]
        if draw(st.booleans()):
            item["status"] = {"code": draw(json_enum), "message": draw(_texts)}
    else:
        item = {
            k("timeUnixNano", "time_unix_nano"): draw(json_time),
            k("observedTimeUnixNano", "observed_time_unix_nano"): draw(json_time),
            k("severityNumber", "severity_number"): draw(json_enum),
            "body": draw(json_any_value), "attributes": draw(json_attributes),
            k("traceId", "trace_id"): draw(JSON_TRACE_ID), k("spanId", "span_id"): draw(JSON_SPAN_ID),
        }  # fmt: skip
    if draw(_one_in(10)):
        item[draw(_texts)] = draw(json_scalar)  # an unknown field
    return item


@st.composite
def _json_message(draw: st.DrawFn, signal: str) -> tuple[bytes, str]:
    snake = draw(_one_in(10))  # protobuf's JSON parser takes the proto names too

    def k(camel: str, snake_: str) -> str:
        return snake_ if snake else camel

    resources = []
    for _ in range(draw(st.integers(0, 2))):
        scopes = []
        for _ in range(draw(st.integers(0, 2))):
            items = draw(st.lists(_json_item(signal, snake), max_size=3))
            key = "spans" if signal == "traces" else k("logRecords", "log_records")
            scopes.append({"scope": {"name": draw(_texts), "version": draw(_texts)}, key: items})
        resource = {"attributes": [{"key": "service.name", "value": draw(json_any_value)}]}
        key = k("scopeSpans", "scope_spans") if signal == "traces" else k("scopeLogs", "scope_logs")
        resources.append({"resource": resource, key: scopes})
    top = k("resourceSpans", "resource_spans") if signal == "traces" else k("resourceLogs", "resource_logs")
    doc: Any = {top: resources}
    trick = draw(st.integers(0, 19))
    label = "json"
    if trick == 0:
        doc = draw(st.sampled_from(([], None, 1, "x", [doc])))
        label = "json/not-an-object"
    body = dumps_with_raw(doc, ensure_ascii=draw(st.booleans()))
    if trick == 1:  # deep nesting in place of the whole body, past every recursion limit
        d = draw(st.sampled_from((1_000, 100_000)))
        body = b'{"resourceSpans": ' + b"[" * d + b"]" * d + b"}"
        label = "json/deep-array"
    elif trick == 2 and body.endswith(b"}"):
        body = body[:-1] + b', "resourceSpans": [], "resourceSpans": null}'
        label = "json/duplicate-keys"
    elif trick == 3:
        codec = draw(st.sampled_from(("utf-16", "utf-32", "utf-16-le")))
        body = body.decode("utf-8", "surrogateescape").encode(codec, "surrogatepass")
        label = "json/utf-16-32"
    elif trick == 4:
        body = b"\xef\xbb\xbf" + body
        label = "json/bom"
    elif trick == 5:
        body += draw(st.sampled_from((b" garbage", b"\x00", b"}", b"\n\n", b"//")))
        label = "json/trailing"
    return body, label


JSON_MESSAGE = {s: _json_message(s) for s in ("traces", "logs")}
"""An OTLP/JSON trace or logs request with hostile values, serialized with hostile JSON (and its label)."""


# --- structured inputs --------------------------------------------------------------------------------------------


def _compress(body: bytes, encoding: str) -> bytes:
    if encoding in ("gzip", "x-gzip"):
        return gzip.compress(body, compresslevel=1, mtime=0)
    if encoding == "deflate":
        return zlib.compress(body, 1)
    if encoding == "zstd":
        return zstandard.ZstdCompressor(level=1).compress(body)
    return body


@st.composite
def _structured_inputs(draw: st.DrawFn) -> FuzzInput:
    """A hostile OTLP request, as protobuf over HTTP or gRPC or as OTLP/JSON over HTTP, sometimes compressed."""
    signal = draw(st.sampled_from(("traces", "traces", "traces", "logs")))
    transport = draw(st.sampled_from(("protobuf", "json", "grpc")))
    path = TRACES_PATH if signal == "traces" else LOGS_PATH
    if transport == "json":
        body, label = draw(JSON_MESSAGE[signal])
        media = JSON
    else:
        body, label, media = draw(OTLP_MESSAGE[signal]), "protobuf", PROTOBUF
    if transport == "grpc":
        return FuzzInput(
            "structured",
            f"{signal}/grpc",
            "grpc",
            path=TRACES_RPC if signal == "traces" else LOGS_RPC,
            body=body,
            grpc_compression=draw(st.integers(0, 3)) == 0,
        )
    encoding = draw(st.sampled_from(("",) * 6 + ("gzip", "zstd", "deflate")))
    headers = {"Content-Type": media}
    if encoding:
        headers["Content-Encoding"] = encoding
        body = _compress(body, encoding)
    return FuzzInput(
        "structured",
        f"{signal}/{label}" + (f"/{encoding}" if encoding else ""),
        "otlp",
        path=path,
        headers=headers,
        body=body,
    )


_STRUCTURED = _structured_inputs()


def structured_inputs() -> st.SearchStrategy[FuzzInput]:
    """A hostile OTLP request, as protobuf over HTTP or gRPC or as OTLP/JSON over HTTP, sometimes compressed."""
    return _STRUCTURED


# --- mutation -----------------------------------------------------------------------------------------------------


@dataclass
class Seed:
    signal: str  # traces | logs
    media: str
    body: bytes
    name: str


def _sdk_requests() -> list[Seed]:
    """Requests made with the OpenTelemetry SDK's own encoder (spans with events, links, every attribute type)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    got: list[Any] = []

    class Keep(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            got.extend(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Keep()))
    tracer = provider.get_tracer("fuzz.seed", "1.0")
    with tracer.start_as_current_span(
        "root", kind=SpanKind.SERVER, attributes={"gen_ai.operation.name": "chat"}
    ) as root:
        root.add_event("gen_ai.user.message", {"content": "hello", "n": 3, "f": 0.5, "ok": True})
        with tracer.start_as_current_span(
            "chat gpt-4o", kind=SpanKind.CLIENT, links=[Link(root.get_span_context(), {"why": "x"})]
        ) as child:
            child.set_attributes(
                {
                    "gen_ai.usage.input_tokens": 12,
                    "gen_ai.usage.output_tokens": 7,
                    "gen_ai.request.model": "gpt-4o",
                    "tags": ["a", "b"],
                    "scores": [0.1, 0.2],
                }
            )
            child.set_status(Status(StatusCode.ERROR, "boom"))
    provider.shutdown()
    return [Seed("traces", PROTOBUF, encode_spans(got).SerializeToString(), "sdk")]


@cache
def seeds() -> tuple[Seed, ...]:
    """The valid requests mutation starts from: the fixtures (real captures) and the SDK's."""
    found: list[Seed] = []
    folder = next((f for f in FIXTURES if f.is_dir()), None)
    if folder is not None:
        for p in sorted(folder.glob("*/*")):
            if p.suffix not in (".pb", ".json") or p.name == "meta.json":
                continue
            signal = "logs" if ".logs." in p.name else "traces"
            found.append(
                Seed(signal, PROTOBUF if p.suffix == ".pb" else JSON, p.read_bytes(), f"{p.parent.name}/{p.name}")
            )
    try:
        found += _sdk_requests()
    except ImportError:  # the SDK is a test dependency
        pass
    return tuple(found)


def wire_fields(body: bytes, limit: int = 2000) -> list[tuple[int, int, int, int]]:
    """Length-delimited fields found by walking the wire format, nested ones too (where a payload parses as fields):
    (tag offset, length varint offset, length varint end, payload end)."""
    out: list[tuple[int, int, int, int]] = []
    stack = [(0, len(body))]
    while stack and len(out) < limit:
        pos, end = stack.pop()
        while pos < end and len(out) < limit:
            start = pos
            key, pos = _read_varint(body, pos, end)
            if key is None or key >> 3 == 0:
                break
            wire = key & 7
            if wire == 0:
                _, pos = _read_varint(body, pos, end)
                if _ is None:
                    break
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                n, p2 = _read_varint(body, pos, end)
                if n is None or p2 + n > end:
                    break
                out.append((start, pos, p2, p2 + n))
                stack.append((p2, p2 + n))
                pos = p2 + n
            else:
                break
    return out


def _read_varint(b: bytes, pos: int, end: int) -> tuple[int | None, int]:
    n = shift = 0
    while pos < end and shift < 70:
        c = b[pos]
        pos += 1
        n |= (c & 0x7F) << shift
        if not c & 0x80:
            return n, pos
        shift += 7
    return None, pos


INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x22, 0x7B, 0x22)


def mutate_bytes(rng: random.Random, body: bytes, other: bytes) -> tuple[bytes, str]:
    """1-4 stacked mutations of a protobuf body; `other` is another seed to splice from."""
    b = bytearray(body)
    names = []
    for _ in range(rng.choice((1, 1, 2, 3, 4))):
        op = rng.choice(
            (
                "bitflip",
                "byte",
                "truncate",
                "insert",
                "delete",
                "duplicate",
                "length",
                "length",
                "dup-field",
                "splice",
                "wire-type",
                "unknown-field",
            )
        )
        names.append(op)
        n = len(b)
        if op == "bitflip" and n:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == "byte" and n:
            b[rng.randrange(n)] = rng.choice(INTERESTING) if rng.random() < 0.5 else rng.randrange(256)
        elif op == "truncate" and n:
            del b[rng.randrange(n) :]
        elif op == "insert":
            at = rng.randint(0, n)
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == "delete" and n:
            at = rng.randrange(n)
            del b[at : at + rng.randint(1, 32)]
        elif op == "duplicate" and n:
            at, size = rng.randrange(n), rng.randint(1, 256)
            chunk = b[at : at + size]
            where = rng.randint(0, len(b))
            b[where:where] = chunk
        elif op == "length":
            fields = wire_fields(bytes(b))
            if fields:
                _, lpos, lend, pend = rng.choice(fields)
                length = pend - lend
                new = rng.choice(
                    (
                        2**31 - 1,
                        2**31,
                        2**32 - 1,
                        2**32,
                        2**63,
                        U64,
                        length + 1,
                        length + 2,
                        max(0, length - 1),
                        0,
                        length * 2 + 1000,
                    )
                )
                b[lpos:lend] = varint(new)
        elif op == "dup-field":
            fields = wire_fields(bytes(b))
            if fields:
                start, _, _, pend = rng.choice(fields)
                chunk = b[start:pend]
                times = rng.choice((1, 1, 2, 10, 100))
                b[pend:pend] = chunk * times
        elif op == "splice" and other:
            at = rng.randrange(len(other))
            chunk = other[at : at + rng.randint(1, 512)]
            where = rng.randint(0, len(b))
            b[where:where] = chunk
        elif op == "wire-type":
            fields = wire_fields(bytes(b))
            if fields:
                start = rng.choice(fields)[0]
                b[start] = (b[start] & ~7) | rng.choice((0, 1, 3, 4, 5, 6, 7))
        elif op == "unknown-field":
            extra = rng.choice(
                (
                    f_bytes(rng.randint(1, 2**29 - 1), rng.randbytes(rng.randint(0, 8))),
                    f_varint(rng.randint(1, 20), rng.getrandbits(64)),
                    tag(rng.randint(1, 20), 3),
                    tag(rng.randint(1, 20), 4),
                    f_fixed64(rng.randint(1, 20), rng.getrandbits(64)),
                )
            )
            where = rng.choice((0, len(b)))
            b[where:where] = extra
    return bytes(b), "+".join(dict.fromkeys(names))


JSON_TOKENS = (
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b",",
    b":",
    b"\\",
    b"\\u",
    b"\\ud800",
    b"null",
    b"-",
    b"1e999",
    b"\x00",
    b"\xff",
    b"\xed\xa0\x80",
    b"NaN",
    b'"": ',
    b"9" * 40,
)


def mutate_json(rng: random.Random, body: bytes) -> tuple[bytes, str]:
    b = bytearray(body)
    names = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.choice(("token", "token", "delete", "number", "deep", "string-bytes", "truncate", "encoding"))
        names.append(op)
        n = len(b)
        if op == "token" and n:
            at = rng.randrange(n)
            b[at:at] = rng.choice(JSON_TOKENS)
        elif op == "delete" and n:
            at = rng.randrange(n)
            del b[at : at + rng.randint(1, 8)]
        elif op == "number":  # a number or numeric string replaced with one out of every range
            digits = [i for i in range(min(n, 200_000)) if 0x30 <= b[i] <= 0x39]
            if digits:
                at = rng.choice(digits)
                end = at
                while end < n and (0x30 <= b[end] <= 0x39 or b[end] in b".eE+-"):
                    end += 1
                b[at:end] = rng.choice(RAW_NUMBERS[:13])
        elif op == "deep":
            d = rng.choice((*DEEP, 100_000))
            at = rng.randint(0, n)
            b[at:at] = (b"[" * d + b"]" * d) if rng.random() < 0.5 else (b'{"a":' * d + b"1" + b"}" * d)
        elif op == "string-bytes":
            quotes = [i for i in range(min(n, 200_000)) if b[i] == 0x22]
            if quotes:
                at = rng.choice(quotes) + 1
                b[at:at] = rng.choice((*BAD_UTF8, b"\\ud800", b"\\udc00\\ud800", b"\\u00"))
        elif op == "truncate" and n:
            del b[rng.randrange(n) :]
        elif op == "encoding":
            try:
                b = bytearray(bytes(b).decode("utf-8").encode(rng.choice(("utf-16", "utf-32", "utf-16-be", "latin-1"))))
            except (UnicodeDecodeError, UnicodeEncodeError):
                b[0:0] = b"\xef\xbb\xbf"
    return bytes(b), "json:" + "+".join(dict.fromkeys(names))


@cache
def bombs() -> dict[str, bytes]:
    """Small bodies that inflate far past the body limit (256 MiB of zeros; zstd 1 GiB), nested ones, many members."""
    zeros = bytes(16 * 1024 * 1024)
    gz = zlib.compressobj(9, zlib.DEFLATED, 31)
    gzip_bomb = gz.compress(b"") + b"".join(gz.compress(zeros) for _ in range(16)) + gz.flush()
    df = zlib.compressobj(9, zlib.DEFLATED, 15)
    deflate_bomb = df.compress(b"") + b"".join(df.compress(zeros) for _ in range(16)) + df.flush()
    z = zstandard.ZstdCompressor(level=3).compressobj()
    zstd_bomb = b"".join(z.compress(zeros) for _ in range(64)) + z.flush()
    return {
        "gzip": gzip_bomb,
        "deflate": deflate_bomb,
        "zstd": zstd_bomb,
        "gzip-in-gzip": gzip.compress(gzip_bomb, mtime=0),
        "gzip-members": gzip.compress(b"", mtime=0) * 200_000,
        "zstd-frames": zstandard.ZstdCompressor().compress(b"") * 200_000,
        "gzip-just-under": gzip.compress(bytes(MAX_BODY), compresslevel=9, mtime=0),
        "gzip-just-over": gzip.compress(bytes(MAX_BODY + 1), compresslevel=9, mtime=0),
    }


CONTENT_TYPES = (
    PROTOBUF,
    JSON,
    "application/x-protobuf; charset=utf-8",
    "APPLICATION/JSON",
    "application/protobuf",
    "text/plain",
    "",
    "application/json; charset=latin-1",
    "application/x-protobuf, application/json",
    "multipart/form-data; boundary=x",
    "application/grpc",
    "*/*",
    "application/x-protobuf;;;=",
)
ENCODINGS = (
    "gzip",
    "x-gzip",
    "deflate",
    "zstd",
    "br",
    "identity",
    "gzip, gzip",
    "GZIP",
    " gzip ",
    "compress",
    "gzip;q=1",
    "\u00e9",
)


def _raw_http(rng: random.Random, body: bytes) -> tuple[bytes, str]:
    """A malformed or unusual HTTP/1.1 request for the OTLP port, as bytes."""
    which = rng.choice(
        (
            "chunked",
            "bad-chunk",
            "length-lies",
            "two-lengths",
            "huge-header",
            "many-headers",
            "bad-version",
            "nul-in-path",
            "absolute-uri",
            "expect-continue",
            "garbage",
            "pipelined",
            "negative-length",
            "obs-fold",
        )
    )
    head = "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
    ok = head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body
    if which == "chunked":
        req = head.encode() + b"Transfer-Encoding: chunked\r\n\r\n"
        for i in range(0, len(body), 97):
            chunk = body[i : i + 97]
            req += b"%x\r\n" % len(chunk) + chunk + b"\r\n"
        req += b"0\r\n\r\n"
    elif which == "bad-chunk":
        req = (
            head.encode()
            + b"Transfer-Encoding: chunked\r\n\r\n"
            + rng.choice(
                (b"zz\r\nab\r\n0\r\n\r\n", b"ffffffffffffffffff\r\nab\r\n", b"-1\r\n\r\n", b"5\r\nab\r\n0\r\n\r\n")
            )
        )
    elif which == "length-lies":
        req = head.encode() + b"Content-Length: %d\r\n\r\n" % (len(body) + rng.choice((-5, 5))) + body
    elif which == "two-lengths":
        req = head.encode() + b"Content-Length: 3\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    elif which == "huge-header":
        req = (
            head.encode()
            + b"X-Big: "
            + b"a" * rng.choice((8_000, 70_000, 1_000_000))
            + b"\r\nContent-Length: 0\r\n\r\n"
        )
    elif which == "many-headers":
        req = (
            head.encode()
            + b"".join(b"X-H%d: v\r\n" % i for i in range(rng.choice((200, 5_000))))
            + b"Content-Length: 0\r\n\r\n"
        )
    elif which == "bad-version":
        req = ok.replace(b"HTTP/1.1", rng.choice((b"HTTP/9.9", b"HTTP/1.1x", b"HTTP/0.9", b"FOO")), 1)
    elif which == "nul-in-path":
        req = ok.replace(
            b"/v1/traces", rng.choice((b"/v1/tr\x00aces", b"/v1/traces%00", b"/v1/%ff%fe", b"/v1/traces?%ff=%00")), 1
        )
    elif which == "absolute-uri":
        req = ok.replace(b"/v1/traces", b"http://evil.example/v1/traces", 1)
    elif which == "expect-continue":
        req = head.encode() + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    elif which == "garbage":
        req = rng.randbytes(rng.randint(1, 200))
    elif which == "pipelined":
        req = ok * rng.randint(2, 20)
    elif which == "negative-length":
        req = head.encode() + b"Content-Length: -1\r\n\r\n" + body
    else:
        req = head.encode() + b"X-Folded: a\r\n b\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    return req, which


def mutation_input(rng: random.Random) -> FuzzInput:
    """A valid request made invalid in 1-4 ways, with the headers a sender may get wrong, over HTTP or gRPC."""
    pool = seeds()
    seed = rng.choice(pool)
    other = rng.choice(pool).body
    roll = rng.random()
    if roll < 0.03:
        body, _ = mutate_bytes(rng, seed.body, other) if seed.media == PROTOBUF else (seed.body, "")
        req, which = _raw_http(rng, body)
        return FuzzInput("mutation", f"raw-http/{which}", "raw", body=req)
    if seed.media == JSON:
        body, ops = mutate_json(rng, seed.body)
    else:
        body, ops = mutate_bytes(rng, seed.body, other)
    if roll < 0.28 and seed.media == PROTOBUF:
        rpc = TRACES_RPC if seed.signal == "traces" else LOGS_RPC
        if rng.random() < 0.1:  # the other signal's method, or one no service has
            rpc = rng.choice(
                (
                    LOGS_RPC if rpc == TRACES_RPC else TRACES_RPC,
                    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
                    "/x/y",
                    TRACES_RPC.replace("Export", "export"),
                )
            )
        return FuzzInput("mutation", f"grpc/{ops}", "grpc", path=rpc, body=body, grpc_compression=rng.random() < 0.2)
    path = TRACES_PATH if seed.signal == "traces" else LOGS_PATH
    media = seed.media
    headers: dict[str, str] = {}
    sub = ops
    r = rng.random()
    if r < 0.08:
        media = rng.choice(CONTENT_TYPES)
        sub += "/content-type"
    elif r < 0.11:
        path = rng.choice(
            (
                LOGS_PATH if path == TRACES_PATH else TRACES_PATH,
                "/v1/metrics",
                "/v1/traces/",
                "//v1/traces",
                "/V1/TRACES",
                "/v1/traces%2f",
                "/" + "a" * 5000,
            )
        )
        sub += "/path"
    if media:
        headers["Content-Type"] = media
    r = rng.random()
    if r < 0.12:
        enc = rng.choice(("gzip", "zstd", "deflate"))
        body = _compress(body, enc)
        headers["Content-Encoding"] = enc
        sub += f"/{enc}"
        if rng.random() < 0.3:  # corrupted after compressing
            body, more = mutate_bytes(rng, body, b"")
            sub += f"/corrupt-{more}"
    elif r < 0.125:  # each costs the server inflating 20 MiB: a few go a long way
        name = rng.choice(sorted(bombs()))
        body = bombs()[name]
        headers["Content-Encoding"] = name.split("-")[0] if not name.startswith("gzip") else "gzip"
        sub = f"bomb/{name}"
    elif r < 0.20:
        headers["Content-Encoding"] = rng.choice(ENCODINGS)
        if rng.random() < 0.5:
            body = _compress(body, rng.choice(("gzip", "zstd", "deflate")))
        sub += "/wrong-encoding"
    method = "POST" if rng.random() < 0.98 else rng.choice(("GET", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"))
    return FuzzInput("mutation", sub, "otlp", method=method, path=path, headers=headers, body=body)


# --- the API ------------------------------------------------------------------------------------------------------


@cache
def api_routes() -> tuple[tuple[str, str], ...]:
    """(method, path template) of every route the API serves, read off the app itself (the store left out)."""
    try:
        from evalsi.collector.api import build_api

        app = build_api(None, dict)
        found = [(m, r.path) for r in app.routes for m in sorted(getattr(r, "methods", None) or ()) if m != "HEAD"]
    except Exception:  # the API could not be built here: the routes known when this was written
        found = []
    return tuple(sorted(set(found))) or (
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/api/v1/status"),
        ("GET", "/api/v1/traces"),
        ("GET", "/api/v1/scores"),
        ("GET", "/api/v1/traces/{trace_id}"),
        ("GET", "/api/v1/runs"),
        ("GET", "/api/v1/runs/{run_id}"),
        ("GET", "/api/v1/runs/{run_id}/scores"),
        ("GET", "/api/v1/policies/stats"),
        ("POST", "/v1/evaluate"),
        ("POST", "/v1/feedback"),
        ("POST", "/v1/runs"),
        ("POST", "/v1/traces/select"),
    )


@cache
def evaluator_refs() -> tuple[str, ...]:
    try:
        from evalsi.evaluators import load_evaluators

        return tuple(sorted(load_evaluators()))
    except Exception:
        return ("builtin/regex", "builtin/contains", "builtin/json-schema", "builtin/length", "builtin/exact-match")


QUERY_NAMES = ("limit", "service", "trace_id", "policy", "window", "run_id", "since", "offset", "q")
HOSTILE_VALUES = (
    "",
    "0",
    "-1",
    "1",
    "10000",
    "10001",
    "100000",
    "100001",
    "1e3",
    "NaN",
    "inf",
    "1" * 400,
    "9223372036854775808",
    "0x10",
    "00000000000000000000000000000000",
    "f" * 32,
    "F" * 32,
    "g" * 32,
    "f" * 31,
    "f" * 33,
    "f" * 32 + "\n",
    "5m",
    "0s",
    "-5m",
    "1y",
    "87600h",
    "87601h",
    "1e9h",
    "9" * 30 + "s",
    "1.5h",
    "P1D",
    "ms",
    "' OR 1=1 --",
    "\\",
    "%",
    "_",
    "\x00",
    "\u202e",
    "é",
    "😀",
    "a" * 1001,
    "a" * 100_000,
    "..",
    "../..",
    "a/b",
    "a b",
    "null",
    "[]",
    "{}",
    "true",
)


def _hostile_text(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return rng.choice(HOSTILE_VALUES)
    return "".join(rng.choice("af09-_.~%/\\ \x00é😀'\"<>{}[]") for _ in range(rng.randint(0, 40)))


def _encoded(rng: random.Random, text: str) -> str:
    """Text percent-encoded for a URL, or raw percent escapes no UTF-8 decodes."""
    r = rng.random()
    if r < 0.1:
        return rng.choice(("%ff", "%c0%af", "%ed%a0%80", "%", "%zz", "%00", "%2e%2e", "%2f"))
    return quote(text, safe="" if r < 0.8 else "/%")


def _json_doc(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 3 or r < 0.5:
        return rng.choice(
            (
                None,
                True,
                False,
                0,
                -1,
                2**63,
                10**400,
                1.5,
                1e308,
                -0.0,
                "",
                "x",
                "a" * 10_000,
                "\x00",
                "\ud800",
                [],
                {},
                math.nan,
                math.inf,
            )
        )
    if r < 0.75:
        return [_json_doc(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {_hostile_text(rng): _json_doc(rng, depth + 1) for _ in range(rng.randint(0, 4))}


# patterns that backtrack exponentially on a run of "a"s with no match at its end ("aaaa!"): Python's re holds the GIL
# all the while; the records sent with them are kept short (at most 22 "a"s: about a second a record), or one
# request would hang the collector for hours
REDOS = ("(a+)+$", "(a|aa)+$", "(a*)*b", "^(a+)+$", "(a|a?)+$")
SCHEMAS: tuple[Any, ...] = (
    {"type": "object"},
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "string", "pattern": "(a+)+$"},
    {"type": "number", "multipleOf": 1e-308},
    {"type": "integer", "maximum": 1e400},
    {"allOf": [{"type": "string"}] * 1000},
    {"type": "array", "items": {"type": "array", "items": {"type": "array"}}, "uniqueItems": True},
    {"format": "regex"},
    {"type": "nope"},
    {"$ref": "http://127.0.0.1:1/schema.json"},
    {"$ref": "file:///etc/passwd"},
)


def _evaluate_body(rng: random.Random, light: bool = False) -> Any:
    refs = evaluator_refs()
    evaluators = []
    backtracks = False
    for _ in range(rng.choice((0, 1, 1, 2, 5, 50, 51))):
        ref = rng.choice(refs) if rng.random() < 0.9 else _hostile_text(rng)
        params: Any = {}
        if ref.endswith("/regex"):
            pattern = rng.choice((*REDOS, "(", "a", "", "[", "(?P<x>a)(?P=y)", "a{1000000}"))
            backtracks |= pattern in REDOS
            params = {"pattern": pattern, "full": rng.random() < 0.5}
        elif ref.endswith("/json-schema"):
            schema = rng.choice(SCHEMAS)
            backtracks |= "pattern" in schema
            params = {"schema": schema}
        elif ref.endswith("/contains"):
            params = {"any": [rng.choice(("a", "", "\x00"))] * rng.randint(0, 3)}
        elif ref.endswith("/length"):
            params = {"min": rng.choice((0, -1, 10**400, 5)), "max": rng.choice((None, 1, 2**64))}
        if rng.random() < 0.2:
            params = _json_doc(rng)
        evaluators.append({"ref": ref, "params": params})
    if backtracks:  # a few short records, a few evaluators: seconds of backtracking, not hours
        evaluators = evaluators[:3]
        n = rng.randint(12, 16 if light else 22)
        texts: tuple[Any, ...] = ("a" * n + "!", '"' + "a" * n + '!"', "hello")
        sizes: tuple[int, ...] = (1, 1, 2)
    else:
        texts = ("hello", "", "a" * 30 + "b", "[" * 5000, '{"a": 1}', "x" * 100_000, "\x00\ud800", None, '"x"')
        sizes = (0, 1, 1, 2, 3, 10, 100) if light else (0, 1, 1, 2, 3, 10, 1000, 1001)
    records = []
    for _ in range(rng.choice(sizes)):
        rec: dict[str, Any] = {"input": rng.choice(("hi", None, "", "a" * 1000)), "output": rng.choice(texts)}
        if rng.random() < 0.3:
            rec["reference"] = rng.choice(("hello", {"expected_output": "x", "expected_tools": [1, None]}, 5))
        if rng.random() < 0.2:
            rec["context"] = [rng.choice(("c", "", "a" * 1000))] * rng.randint(0, 50)
        if rng.random() < 0.1:
            rec["metadata"] = _json_doc(rng)
        records.append(rec)
    body: Any = {"records": records, "evaluators": evaluators}
    if rng.random() < 0.1:
        body[_hostile_text(rng)] = _json_doc(rng)
    return body


def _feedback_body(rng: random.Random, light: bool = False) -> Any:
    body: dict[str, Any] = {
        "trace_id": rng.choice((rng.randbytes(16).hex(), rng.randbytes(16).hex().upper(), _hostile_text(rng), 5, None)),
        "name": rng.choice(("helpful", "", " ", "a" * 10_000, "\x00", 7)),
        "value": rng.choice(
            (
                True,
                False,
                1,
                0.5,
                -1,
                10**400,
                -(10**400),
                2**64,
                1e308,
                math.nan,
                math.inf,
                "good",
                "",
                None,
                [],
                {},
                "a" * 100_000,
            )
        ),
    }
    if rng.random() < 0.5:
        body["comment"] = rng.choice(("ok", None, "\ud800", "a" * 100_000, 5))
    if rng.random() < 0.5:
        body["span_id"] = rng.choice((rng.randbytes(8).hex(), _hostile_text(rng), None))
    if rng.random() < 0.1:
        body.pop(rng.choice(list(body)))
    return body


def _runs_body(rng: random.Random, light: bool = False) -> Any:
    return {
        "run_id": rng.choice(("r1", _hostile_text(rng), "a" * 201)),
        "name": _hostile_text(rng),
        "status": rng.choice(("running", "finished", "interrupted", "failed", _hostile_text(rng))),
        "manifest": _json_doc(rng),
        "summary": _json_doc(rng),
    }


def _select_body(rng: random.Random, light: bool = False) -> Any:
    where = rng.choice(
        (
            "true",
            "trace.service_name == 'x'",
            "1/0 == 1",
            "size(trace.spans) > 0",
            "(",
            "",
            "x" * 10_000,
            "trace.spans.all(s, s.name.matches('(a+)+$'))",
            "[1,2,3].map(x, [x,x,x,x]).size() > 0",
        )
    )
    body = {"where": where, "limit": rng.choice((1, 10, 0, -1, 10**9, "x"))}
    if light or rng.random() < 0.5:  # without it, 10,000 traces are scanned
        body["scan"] = rng.choice((1, 100, 0) if light else (1, 100, 100_000, 100_001, 0))
    return body


BODY_MAKERS: dict[str, Callable[[random.Random, bool], Any]] = {
    "/v1/evaluate": _evaluate_body,
    "/v1/feedback": _feedback_body,
    "/v1/runs": _runs_body,
    "/v1/traces/select": _select_body,
}


def api_input(rng: random.Random, light: bool = False) -> FuzzInput:
    """A request to the API: a GET route with hostile path segments and query, or a JSON body to a POST route.
    `light`: no request that costs seconds by design of a known finding (backtracking past 16 "a"s, a select
    scanning more than 100 traces, 1,000 records to evaluate), for a test that times every probe."""
    routes = [r for r in api_routes() if not r[1].startswith(("/docs", "/openapi", "/redoc"))]
    posts = [r for r in routes if r[0] == "POST" and r[1] in BODY_MAKERS and "{" not in r[1]]
    gets = [r for r in routes if r[0] == "GET"]
    if posts and rng.random() < 0.35:
        # select scans stored traces (seconds each): a small share; the others as often as each other
        weights = [0.05 if p == "/v1/traces/select" else 1.0 for _, p in posts]
        _, path = rng.choices(posts, weights)[0]
        r = rng.random()
        if r < 0.6:
            doc, what = BODY_MAKERS[path](rng, light), "near-valid"
        elif r < 0.85:
            doc, what = _json_doc(rng), "random"
        else:
            doc, what = None, "malformed"
        if doc is None:
            body = rng.choice(
                (
                    b"",
                    b"{",
                    b"\xff\xfe",
                    b"[" * 100_000,
                    b'{"records": [' * 5000,
                    b"nul\x00",
                    b'{"a": 1e999999}',
                    b'{"trace_id": "\\ud800"}',
                )
            )
        else:
            body = json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
        headers = {"Content-Type": rng.choice((JSON,) * 8 + ("text/plain", "application/x-protobuf", ""))}
        return FuzzInput("api", f"POST {path} ({what})", "api", path=path, headers=headers, body=body)
    if rng.random() < 0.05:  # a path no route has, or a method a route does not take
        method = rng.choice(("GET", "POST", "PUT", "DELETE", "PATCH"))
        path = "/" + "/".join(_encoded(rng, _hostile_text(rng)) for _ in range(rng.randint(1, 4)))
        return FuzzInput("api", f"{method} (unknown path)", "api", method=method, path=path)
    _, template = rng.choice(gets)
    path = template
    while "{" in path:
        a = path.index("{")
        b = path.index("}", a)
        value = rng.choice((rng.randbytes(16).hex(), "r1", _hostile_text(rng), _hostile_text(rng)))
        path = path[:a] + _encoded(rng, value) + path[b + 1 :]
    params = []
    for _ in range(rng.choice((0, 1, 1, 2, 3, 20))):
        name = rng.choice(QUERY_NAMES) if rng.random() < 0.85 else _hostile_text(rng)
        params.append(f"{_encoded(rng, name)}={_encoded(rng, _hostile_text(rng))}")
    if params:
        path += "?" + "&".join(params)
    return FuzzInput("api", f"GET {template}", "api", method="GET", path=path)


# --- sending --------------------------------------------------------------------------------------------------------


class Connection(http.client.HTTPConnection):
    """http.client with TCP_NODELAY (it writes a body over 2,920 bytes apart from the headers), and TCP_QUICKACK set
    again before each answer is read: the server writes an answer's head and body in two segments without
    TCP_NODELAY, so on a kept-alive connection the body waits for this side's delayed ACK, 40 ms an answer (a
    finding of its own, see benchmarks/README.md); the fuzzing would spend most of its time waiting on it."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def getresponse(self) -> http.client.HTTPResponse:
        if self.sock is not None and hasattr(socket, "TCP_QUICKACK"):
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        return super().getresponse()


def send_http(conn: Any, inp: FuzzInput) -> Answer:
    """One request on an http.client connection. A kept-alive connection the server closed meanwhile (uvicorn closes
    it after refusing malformed HTTP) is opened again once; any other error closes it and is the answer."""
    t0 = time.monotonic()
    for attempt in (1, 2):
        reused = conn.sock is not None
        try:
            conn.request(
                inp.method,
                inp.path,
                body=inp.body if inp.method not in ("GET", "HEAD") or inp.body else None,
                headers=inp.headers,
            )
            resp = conn.getresponse()
            body = resp.read()
            break
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
            conn.close()
            if attempt == 2 or not reused:
                return Answer(error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
        except Exception as e:  # a timeout, a bad status line
            conn.close()
            return Answer(error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
    headers = {k.lower(): v for k, v in resp.getheaders()}
    if headers.get("connection", "").lower() == "close":
        conn.close()
    return Answer(status=resp.status, headers=headers, body=body, seconds=time.monotonic() - t0)


def send_raw(address: tuple[str, int], inp: FuzzInput, timeout: float = 3.0) -> Answer:
    """Bytes written to a fresh connection; the first response's status line and body, if any comes."""
    t0 = time.monotonic()
    chunks = []
    try:
        with socket.create_connection(address, timeout=timeout) as s:
            try:
                s.sendall(inp.body)
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server may close before it has read everything: its answer is still there
            while sum(map(len, chunks)) < 1_000_000:
                got = s.recv(65536)
                if not got:
                    break
                chunks.append(got)
    except TimeoutError:
        pass
    except OSError as e:
        if not chunks:
            return Answer(error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
    data = b"".join(chunks)
    if not data.startswith(b"HTTP/"):
        return Answer(error="no response", body=data[:200], seconds=time.monotonic() - t0)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return Answer(error=f"bad status line {lines[0][:80]!r}", seconds=time.monotonic() - t0)
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.decode("latin-1").strip().lower()] = v.decode("latin-1").strip()
    if "content-length" in headers and headers["content-length"].isdigit():
        body = body[: int(headers["content-length"])]
    return Answer(status=status, headers=headers, body=body, seconds=time.monotonic() - t0)


def send_grpc(channel: grpc.Channel, inp: FuzzInput, timeout: float = 30.0) -> Answer:
    t0 = time.monotonic()
    call = channel.unary_unary(inp.path, request_serializer=None, response_deserializer=None)
    compression = grpc.Compression.Gzip if inp.grpc_compression else None
    try:
        body = call(inp.body, timeout=timeout, compression=compression)
        return Answer(code="OK", body=body, seconds=time.monotonic() - t0)
    except grpc.RpcError as e:
        trailers = {k: v for k, v in (e.trailing_metadata() or ())}  # type: ignore[attr-defined]
        details = trailers.get("grpc-status-details-bin", b"")
        headers = {"details": (e.details() or "")[:2000]}  # type: ignore[attr-defined]
        return Answer(
            code=e.code().name,
            headers=headers,
            body=details if isinstance(details, bytes) else b"",  # type: ignore[attr-defined]
            seconds=time.monotonic() - t0,
        )


# --- the contract ---------------------------------------------------------------------------------------------------


def _status_of(body: bytes, media: str) -> status_pb2.Status | str:
    status = status_pb2.Status()
    try:
        if media == JSON:
            from google.protobuf import json_format

            json_format.Parse(body.decode("utf-8"), status, ignore_unknown_fields=False)
        else:
            status.ParseFromString(body)
    except Exception as e:
        return f"not a google.rpc.Status in {media}: {type(e).__name__}: {str(e)[:120]}"
    return status


def _has_detail(status: status_pb2.Status, message: Any) -> bool:
    return any(d.Is(message.DESCRIPTOR) for d in status.details)


PARSER_REFUSAL = b"Invalid HTTP request received."


def problems(inp: FuzzInput, a: Answer) -> list[str]:
    """What in the answer breaks the contract (see the module's docstring); [] when nothing does. A request that got
    no answer at all is not judged here (the caller tells a dead collector from a connection the server closed)."""
    out: list[str] = []
    if inp.port == "grpc":
        if a.code in ("INTERNAL", "UNKNOWN", "DEADLINE_EXCEEDED", "DATA_LOSS"):
            out.append(f"gRPC {a.code}: {a.headers.get('details', '')[:300]}")
        elif a.code == "INVALID_ARGUMENT":
            if not a.body:
                out.append("gRPC INVALID_ARGUMENT without grpc-status-details-bin")
            else:
                status = _status_of(a.body, PROTOBUF)
                if isinstance(status, str):
                    out.append(f"gRPC INVALID_ARGUMENT: grpc-status-details-bin is {status}")
                elif status.code != code_pb2.INVALID_ARGUMENT or not status.message:
                    out.append(f"gRPC INVALID_ARGUMENT: its Status has code {status.code}, message {status.message!r}")
        elif a.code == "OK":
            try:
                (ExportTraceServiceResponse if inp.path == TRACES_RPC else ExportLogsServiceResponse).FromString(a.body)
            except DecodeError as e:
                out.append(f"gRPC OK with a body that is no export response: {e}")
        return out
    if not a.status:
        return out
    if a.status == 400 and a.body == PARSER_REFUSAL:
        return out  # HTTP uvicorn's parser refuses before any app sees it (a URL or header too long, bad bytes)
    if a.status >= 500 and not (a.status == 503 and inp.port in ("otlp", "raw") and "retry-after" in a.headers):
        out.append(f"HTTP {a.status}: {a.body[:300]!r}")
    if inp.port == "api":
        if a.status != 204 and inp.method != "HEAD":
            try:
                json.loads(a.body or b"null")
            except ValueError:
                if not inp.path.startswith(("/docs", "/redoc")):
                    out.append(f"API answer {a.status} is not JSON: {a.body[:200]!r}")
        return out
    if (
        inp.port == "raw"
        and 400 <= a.status < 500
        and not a.headers.get("content-type", "").startswith((PROTOBUF, JSON))
    ):
        return out  # HTTP the server's parser refuses before the OTLP app sees it (uvicorn's plain-text 400)
    got = a.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    media = inp.media if inp.port == "otlp" else got if got in (PROTOBUF, JSON) else JSON
    if inp.method == "HEAD":
        return out  # an answer to HEAD has no body
    if 400 <= a.status < 600:
        if got != media and inp.port == "otlp":
            out.append(f"HTTP {a.status} answered in {got!r}, not the request's {media!r}: {a.body[:200]!r}")
            media = got if got in (PROTOBUF, JSON) else media
        status = _status_of(a.body, media)
        if isinstance(status, str):
            out.append(f"HTTP {a.status} without a google.rpc.Status body ({status}): {a.body[:200]!r}")
            return out
        want = STATUS_CODE.get(a.status)
        if want is not None and status.code != want:
            out.append(f"HTTP {a.status} with a Status code {status.code}, not {want}")
        if not status.message:
            out.append(f"HTTP {a.status} with a Status without a message")
        if a.status == 400 and not _has_detail(status, error_details_pb2.BadRequest):
            out.append(f"HTTP 400 without a BadRequest detail: {status.message[:200]!r}")
        if a.status in (429, 503) and (
            "retry-after" not in a.headers or not _has_detail(status, error_details_pb2.RetryInfo)
        ):
            out.append(f"HTTP {a.status} without Retry-After and RetryInfo")
    elif a.status == 200 and inp.port == "otlp":
        response = ExportTraceServiceResponse() if inp.path.startswith(TRACES_PATH) else ExportLogsServiceResponse()
        try:
            if got == JSON:
                from google.protobuf import json_format

                json_format.Parse(a.body.decode("utf-8") or "{}", response)
            else:
                response.ParseFromString(a.body)
        except Exception as e:
            out.append(f"HTTP 200 whose body is no export response in {got!r}: {type(e).__name__}: {e}")
    return out


# --- valid requests, for probes -------------------------------------------------------------------------------------


def probe_request(service: str, n: int = 1) -> tuple[bytes, list[str]]:
    """A valid ExportTraceServiceRequest of `n` spans of one new trace for `service`; its trace id."""
    trace = os.urandom(16)
    now = time.time_ns()
    spans = b"".join(
        f_bytes(
            2,
            f_bytes(1, trace)
            + f_bytes(2, os.urandom(7) + b"\x01")
            + f_bytes(5, b"probe %d" % i)
            + f_varint(6, 1)
            + f_fixed64(7, now)
            + f_fixed64(8, now + 1_000_000),
        )
        for i in range(n)
    )
    resource = f_bytes(1, key_value(b"service.name", f_bytes(1, service.encode())))
    return f_bytes(1, f_bytes(1, resource) + f_bytes(2, f_bytes(1, f_bytes(1, b"fuzz.probe")) + spans)), [trace.hex()]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
