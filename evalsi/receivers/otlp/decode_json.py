"""OTLP/JSON bodies parsed into the OTLP request messages (hex ids, lone surrogates, the failing field's
path), then decoded as protobuf ones."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from google.protobuf import json_format, message_factory
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from evalsi.receivers.otlp.config import Limits
from evalsi.receivers.otlp.decode_protobuf import logs_from_request, spans_from_request
from evalsi.receivers.otlp.decoded import LIMITS, Decoded, DecodeFailed


def _hex_to_b64(value: Any) -> Any:
    """OTLP/JSON carries ids as hex; protobuf JSON expects base64. A bad id becomes bytes of a length no id
    has, which validation then rejects (so one bad id never fails the whole request)."""
    if not isinstance(value, str):
        return value
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b"\xff"
    return base64.b64encode(raw).decode()


_ID_KEYS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def _fix_ids(obj: dict[str, Any]) -> None:
    for key in _ID_KEYS:
        if key in obj:
            obj[key] = _hex_to_b64(obj[key])


def _items(obj: dict[str, Any], camel: str, snake: str) -> list[Any]:
    return obj.get(camel, obj.get(snake)) or []


# Where in an OTLP/JSON body the parser failed is searched for, by parsing parts of it again, in bodies up to this
# size (a few parses of the body: tenths of a second) and this many messages deep; the message names the problem in
# any case.
_LOCATE_BYTES = 256 * 1024
_LOCATE_LEVELS = 12


def _failed_field(doc: dict[str, Any], message: Message, size: int) -> str:
    """The path (`resourceSpans[0].scopeSpans[0].spans[3].startTimeUnixNano`) of the field protobuf's JSON parser
    fails on, found by parsing each field, then each element of the failing list, again on the way down (a lone one
    is the failing one); it stops where no single part fails alone, so it never names a wrong field. "" when not
    searched or not found."""
    if size > _LOCATE_BYTES:
        return ""
    path, node, cls = "", doc, type(message)
    for _ in range(_LOCATE_LEVELS):
        keys = list(node)
        key = keys[0] if len(keys) == 1 else next((k for k in keys if not _parses({k: node[k]}, cls)), None)
        field = None if key is None else _field_named(cls, key)
        if key is None or field is None:
            break
        path = f"{path}.{key}" if path else key
        value = node[key]
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            break  # a scalar (or a map, which OTLP has none of): the field itself
        cls = message_factory.GetMessageClass(field.message_type)
        if field.is_repeated:
            if not isinstance(value, list) or not value:
                break
            index = 0 if len(value) == 1 else next((i for i, v in enumerate(value) if not _parses(v, cls)), None)
            if index is None:
                break
            path, value = f"{path}[{index}]", value[index]
        if not isinstance(value, dict):
            break
        node = value
    return path


def _field_named(cls: Any, key: str) -> Any:
    return cls.DESCRIPTOR.fields_by_camelcase_name.get(key) or cls.DESCRIPTOR.fields_by_name.get(key)


def _parses(item: Any, cls: Any) -> bool:
    try:
        json_format.ParseDict(item, cls(), ignore_unknown_fields=True)
        return True
    except Exception:
        return False


def parse_json(body: bytes, message: Message, what: str, fix_ids: Any) -> None:
    """Parse OTLP/JSON into `message`; anything wrong with the body, whatever part of the parser finds it, is a
    `DecodeFailed` naming the problem."""

    def lone_surrogate(doc: Any) -> tuple[str, str]:
        """What and where (its path) the first string (object key or value) holding a lone UTF-16 surrogate is, or
        ("", ""). JSON escapes (`"\\ud800"`), or surrogates encoded as UTF-8 bytes, decode to such strings, which no
        UTF-8 text can hold: protobuf refuses them in values and fails inside its C code on them in keys."""
        # cheap screens first: such a string needs a `\ud`/`\uD` escape or an 0xED byte in UTF-8 (a UTF-16/32
        # body, which `json.loads` also takes, is checked in full), and then fails to encode as a whole
        if json.detect_encoding(body).startswith("utf-8") and not (
            b"\\ud" in body or b"\\uD" in body or b"\xed" in body
        ):
            return "", ""
        try:
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
            return "", ""
        except UnicodeEncodeError:
            pass

        def shown(s: str) -> str:  # lone surrogates as `\udXXXX` text
            return s.encode("utf-8", "backslashreplace").decode("utf-8")

        stack: list[tuple[Any, str]] = [(doc, "")]
        while stack:
            node, path = stack.pop()
            for k, v in node.items() if isinstance(node, dict) else enumerate(node):
                if isinstance(k, str):
                    name = shown(k)
                    if name != k:
                        return f"the object key '{name[:60]}' in {path or 'the top-level object'}", path
                    at = f"{path}.{name}" if path else name
                else:
                    at = f"{path}[{k}]"
                if isinstance(v, str):
                    text = shown(v)
                    if text != v:
                        return f"the string '{text[:60]}' at {at}", at
                elif isinstance(v, dict | list):
                    stack.append((v, at))
        return "a string", ""  # not reached: encoding the whole document failed on one

    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DecodeFailed(f"body is not valid JSON: {e}", "INVALID_JSON") from None
    if not isinstance(doc, dict):
        raise DecodeFailed(f"body must be a JSON object (an OTLP {what})", "INVALID_JSON")
    invalid = f"body is not a valid OTLP/JSON {what}"
    try:
        where, field = lone_surrogate(doc)
    except (RecursionError, MemoryError) as e:
        raise DecodeFailed(f"{invalid}: {type(e).__name__}: {e}", "INVALID_OTLP_JSON") from None
    if where:
        raise DecodeFailed(f"{invalid}: invalid Unicode escape (lone surrogate) in {where}", "INVALID_OTLP_JSON", field)
    try:
        fix_ids(doc)
        json_format.ParseDict(doc, message, ignore_unknown_fields=True)
    except json_format.ParseError as e:
        try:
            field = _failed_field(doc, message, len(body))
        except (RecursionError, MemoryError):
            field = ""
        raise DecodeFailed(f"{invalid}: {e}", "INVALID_OTLP_JSON", field) from None
    except (AttributeError, TypeError, ValueError, RecursionError, binascii.Error) as e:
        raise DecodeFailed(f"{invalid}: {e}", "INVALID_OTLP_JSON") from None
    except Exception as e:  # protobuf's parser fails in other ways on some input (e.g. a SystemError from upb)
        raise DecodeFailed(f"{invalid}: {type(e).__name__}: {e}", "INVALID_OTLP_JSON") from None


def fix_span_ids(doc: dict[str, Any]) -> None:
    for rs in _items(doc, "resourceSpans", "resource_spans"):
        for ss in _items(rs, "scopeSpans", "scope_spans"):
            for s in ss.get("spans") or []:
                _fix_ids(s)
                for link in s.get("links") or []:
                    _fix_ids(link)


def fix_log_ids(doc: dict[str, Any]) -> None:
    for rl in _items(doc, "resourceLogs", "resource_logs"):
        for sl in _items(rl, "scopeLogs", "scope_logs"):
            for r in _items(sl, "logRecords", "log_records"):
                _fix_ids(r)


def decode_traces_json(body: bytes, limits: Limits = LIMITS, key: str = "limits") -> Decoded:
    # an OTLP/JSON body is at least as long as any string or bytes value in it (escapes and base64 only lengthen
    # them): its length bounds them as a protobuf body's does
    req = ExportTraceServiceRequest()
    parse_json(body, req, "ExportTraceServiceRequest", fix_span_ids)
    return spans_from_request(req, None, limits, len(body), key)


def decode_logs_json(body: bytes, limits: Limits = LIMITS, key: str = "limits") -> Decoded:
    req = ExportLogsServiceRequest()
    parse_json(body, req, "ExportLogsServiceRequest", fix_log_ids)
    return logs_from_request(req, None, limits, len(body), key)
