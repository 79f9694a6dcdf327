"""The receivers' checking codec (service.workers > 1) answers a request as full decoding would, and names the
workers owning its valid spans."""

from __future__ import annotations

import os

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from evalsi.model.encoded import EncodedBatch
from evalsi.receivers.otlp.decode import TRACES, checking_codec, shard_of, spans_from_request

GOOD_TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")


def request(*spans: tuple[bytes, bytes, bytes]) -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i, (trace_id, span_id, parent) in enumerate(spans):
        s = ss.spans.add()
        s.trace_id, s.span_id, s.parent_span_id, s.name = trace_id, span_id, parent, f"span-{i}"
    return req.SerializeToString()


BAD = {
    "short trace id": (os.urandom(15), os.urandom(8), b""),
    "zero trace id": (bytes(16), os.urandom(8), b""),
    "short span id": (GOOD_TRACE, os.urandom(4), b""),
    "zero span id": (GOOD_TRACE, bytes(8), b""),
    "long parent id": (GOOD_TRACE, os.urandom(8), os.urandom(9)),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("shards", [2, 3, 4])
def test_rejects_what_full_decoding_rejects_with_the_same_message(case: str, shards: int) -> None:
    good = [(os.urandom(16), os.urandom(8), os.urandom(8)) for _ in range(12)]
    body = request(good[0], BAD[case], *good[1:], BAD[case])

    full = TRACES.from_protobuf(body)
    checked = checking_codec(TRACES, shards).from_protobuf(body)

    assert checked.rejected == full.rejected == 2
    assert checked.message == full.message
    assert "span 'span-1'" in checked.message
    assert isinstance(checked.batch, EncodedBatch)
    assert checked.batch.count == len(good)
    assert checked.batch.shards == {shard_of(t, shards) for t, _, _ in good}
    # each worker then decodes its own traces' valid spans: every valid span once, no rejected one
    req = ExportTraceServiceRequest.FromString(body)
    decoded = [s.span_id for i in range(shards) for s in spans_from_request(req, (1 << i, shards)).batch]
    assert sorted(decoded) == sorted(span_id.hex() for _, span_id, _ in good)
    # and each one in the worker `shard_of` names, the one the collector sends it to (decoding computes the shard
    # inline, by a mask for a power of two workers)
    for i in range(shards):
        mine = {s.span_id for s in spans_from_request(req, (1 << i, shards)).batch}
        assert mine == {span_id.hex() for t, span_id, _ in good if shard_of(t, shards) == i}


def test_a_request_of_one_trace_goes_to_its_worker_only() -> None:
    spans = [(GOOD_TRACE, os.urandom(8), b"") for _ in range(4)]

    checked = checking_codec(TRACES, 4).from_protobuf(request(*spans))

    assert checked.rejected == 0 and checked.message == ""
    assert isinstance(checked.batch, EncodedBatch)
    assert checked.batch.shards == {shard_of(GOOD_TRACE, 4)}


@pytest.mark.parametrize("slots", [3, 4, 5])
def test_a_worker_owning_several_slots_decodes_the_traces_of_each_and_no_other(slots: int) -> None:
    """With the collector's own shard (`service.collector_shard`) a worker process owns two slots and the collector's
    shard one: each decodes the spans of its slots' traces (with or without the power-of-two mask), none twice."""
    good = [(os.urandom(16), os.urandom(8), os.urandom(8)) for _ in range(60)]
    req = ExportTraceServiceRequest.FromString(request(*good))
    owned = {"collector": 0b1, "worker": (1 << slots) - 2}  # slot 0, and every other slot
    decoded = {who: {s.span_id for s in spans_from_request(req, (mask, slots)).batch} for who, mask in owned.items()}
    assert decoded["collector"] == {span_id.hex() for t, span_id, _ in good if shard_of(t, slots) == 0}
    assert decoded["worker"] == {span_id.hex() for t, span_id, _ in good if shard_of(t, slots) != 0}
    assert decoded["collector"] and decoded["worker"]
