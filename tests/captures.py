"""Reading the fixture captures in tests: OTLP/JSON values as plain Python, and a capture decoded and normalized."""

from __future__ import annotations

from typing import Any

from running_collector import FIXTURES

from evalsi.model.span import Span
from evalsi.processors.normalize import normalize_span
from evalsi.receivers.otlp.decode import decode_traces_json, decode_traces_protobuf


def any_value(value: dict[str, Any]) -> Any:
    """An OTLP/JSON AnyValue as plain Python (what the file says, independent of evalsi's decoder)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return value["boolValue"]
    if "arrayValue" in value:
        return [any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return {kv["key"]: any_value(kv["value"]) for kv in value["kvlistValue"].get("values", [])}
    return None


def normalized_capture(folder: str, scenario: str, suffix: str = ".json") -> list[Span]:
    """The capture `folder/scenario{suffix}` (OTLP/JSON or protobuf), decoded with no rejects and normalized."""
    body = (FIXTURES / folder / f"{scenario}{suffix}").read_bytes()
    decoded = decode_traces_json(body) if suffix == ".json" else decode_traces_protobuf(body)
    assert decoded.rejected == 0, decoded.message
    for span in decoded.batch:
        normalize_span(span)
    return decoded.batch.spans


def parts(messages: list[dict[str, Any]] | None, kind: str) -> list[dict[str, Any]]:
    """The parts of one type (text, tool_call, ...) across canonical messages."""
    return [p for m in messages or () for p in m["parts"] if p["type"] == kind]


def texts(messages: list[dict[str, Any]] | None) -> list[str]:
    return [p["content"] for p in parts(messages, "text")]
