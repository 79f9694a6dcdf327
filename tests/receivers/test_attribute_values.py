"""Every kind of OTLP attribute value decodes to its value, the empty and zero ones too: the decoder reads a
non-empty string without asking which value the oneof holds, so an empty string, a zero, false and a value of no
kind must still come out as themselves, in a small request and in one larger than the value length limit (where
each value's length is looked at)."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from evalsi.receivers.otlp.config import Limits
from evalsi.receivers.otlp.decode import decode_traces_protobuf

VALUES = {
    "text": (AnyValue(string_value="hello"), "hello"),
    "empty text": (AnyValue(string_value=""), ""),
    "int": (AnyValue(int_value=7), 7),
    "zero": (AnyValue(int_value=0), 0),
    "double": (AnyValue(double_value=0.5), 0.5),
    "zero double": (AnyValue(double_value=0.0), 0.0),
    "true": (AnyValue(bool_value=True), True),
    "false": (AnyValue(bool_value=False), False),
    "bytes": (AnyValue(bytes_value=b"\x00\x01"), b"\x00\x01"),
    "no value": (AnyValue(), None),
    "array": (
        AnyValue(
            array_value=ArrayValue(
                values=[AnyValue(string_value=""), AnyValue(int_value=0), AnyValue(string_value="x")]
            )
        ),
        ["", 0, "x"],
    ),
    "map": (
        AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="k", value=AnyValue(string_value=""))])),
        {"k": ""},
    ),
}


def request(padding: int) -> bytes:
    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes(range(1, 17)), bytes(range(1, 9)), "s"
    span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
    span.attributes.extend(KeyValue(key=k, value=v) for k, (v, _) in VALUES.items())
    span.attributes.add(key="padding", value=AnyValue(string_value="p" * padding))
    return req.SerializeToString()


@pytest.mark.parametrize("larger_than_the_limit", [False, True])
def test_each_kind_of_value_decodes_to_itself(larger_than_the_limit: bool) -> None:
    limits = Limits(max_attribute_value_length=1000)
    body = request(2000 if larger_than_the_limit else 10)
    assert (len(body) > 1000) is larger_than_the_limit
    [span] = decode_traces_protobuf(body, limits).batch.spans
    expected = {k: want for k, (_, want) in VALUES.items()}
    got = {k: v for k, v in span.attributes.items() if k in expected}
    assert got == expected
    assert [type(got[k]) for k in expected] == [type(v) for v in expected.values()]


def request_of(attributes: dict[str, str], span_id: int = 1) -> bytes:
    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes(range(1, 17)), span_id.to_bytes(8, "big"), "s"
    span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
    span.attributes.extend(KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attributes.items())
    return req.SerializeToString()


@pytest.mark.parametrize("larger_than_the_limit", [False, True])
def test_spans_of_separate_requests_hold_one_copy_of_each_name_and_short_value(larger_than_the_limit: bool) -> None:
    """What a held span costs: its attribute names, and short values such as a model, decoded once for all the spans
    that carry them (benchmarks/span_memory.py), not once a span; a long value (content) is the span's own."""
    from evalsi.receivers.otlp import attributes as decoding

    decoding._shared.clear()  # from empty: a table one string short of its bound would start again between the two
    limits = Limits(max_attribute_value_length=1000)
    content = "a prompt " * (100 if larger_than_the_limit else 10)
    attrs = {"gen_ai.request.model": "gpt-4o-mini", "gen_ai.operation.name": "chat", "gen_ai.prompt": content}
    bodies = [request_of(attrs, i) for i in (1, 2)]
    assert (len(bodies[0]) > 1000) is larger_than_the_limit
    [one], [two] = (decode_traces_protobuf(body, limits).batch.spans for body in bodies)
    assert one.attributes == two.attributes == attrs
    assert all(a is b for a, b in zip(one.attributes, two.attributes, strict=True))
    assert one.attributes["gen_ai.request.model"] is two.attributes["gen_ai.request.model"]
    assert one.attributes["gen_ai.operation.name"] is two.attributes["gen_ai.operation.name"]
    assert one.attributes["gen_ai.prompt"] is not two.attributes["gen_ai.prompt"]


def test_names_and_values_a_sender_never_repeats_are_not_kept() -> None:
    """A sender of ever new names or values (ids, or an attacker) does not grow what the decoder keeps past
    `SHARED_MAX` strings, and each span still decodes to its own values."""
    from evalsi.receivers.otlp import attributes as decoding

    for i in range(decoding.SHARED_MAX + 500):
        [span] = decode_traces_protobuf(request_of({f"k{i}": f"v{i}", "x" * 100: "y" * 100})).batch.spans
        assert span.attributes == {f"k{i}": f"v{i}", "x" * 100: "y" * 100}
        assert len(decoding._shared) <= decoding.SHARED_MAX
    assert all(len(s) <= decoding.SHARED_LENGTH for s in decoding._shared)
