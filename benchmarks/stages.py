"""CPU µs a span of each stage of the pipeline-worker path, in one process, on `benchmarks/ingest.py`'s payloads.

Stages: the receiver's check in the collector process (parse, ids, shards), a worker's decode of its shard (both
workers' summed, so each request is parsed twice as with `workers: 2`), normalize, redact (default rules),
`to_arrow`, tail_sampling's holding of messages as JSON (`compact_content`) and `to_arrow` of spans so held; and,
apart, a fan-out of a batch to two exporters (read-only consumers) and a protobuf wire-format scan
of the ids without messages (the cheap scan the receiver's check could shard from; it validates nothing). Each figure
is the best of `--rounds` rounds, in CPU time of this process, so other load on the machine skews it less. Run it
with `PYTHONPATH=<checkout>` for each checkout to compare (it imports `evalsi` from there). Figures in
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

CHECKOUT = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or os.path.dirname(os.path.dirname(__file__))
sys.path.insert(0, os.path.join(CHECKOUT, "benchmarks"))

import ingest  # noqa: E402  (inserts its checkout's root first on sys.path)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from evalsi.collector.builtin import load_builtin_components  # noqa: E402
from evalsi.collector.fanout import FanOut  # noqa: E402
from evalsi.component import REGISTRY, Next, Settings  # noqa: E402
from evalsi.exporters.clickhouse.rows import to_arrow  # noqa: E402
from evalsi.model.encoded import EncodedBatch  # noqa: E402
from evalsi.model.span import SpanBatch  # noqa: E402
from evalsi.receivers.otlp.decode import TRACES, checking_codec, decode_encoded  # noqa: E402
from evalsi.receivers.otlp.request_check import check_spans  # noqa: E402
from evalsi.runtime.telemetry import SelfMetrics  # noqa: E402

try:
    from evalsi.model.span import compact_content
except ImportError:  # a checkout from before tail sampling held messages as JSON
    compact_content = None  # type: ignore[assignment]


class Sink:
    mutates_data = False  # an exporter: `MutatesData`

    def __init__(self) -> None:
        self.batches: list[SpanBatch] = []

    async def consume(self, batch: SpanBatch) -> None:
        self.batches.append(batch)


def _varint(b: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        c = b[i]
        i += 1
        result |= (c & 0x7F) << shift
        if c < 0x80:
            return result, i
        shift += 7


def _fields(b: bytes, i: int, end: int) -> Iterator[tuple[int, int, int]]:
    while i < end:
        tag, i = _varint(b, i)
        wire = tag & 7
        if wire == 2:
            n, i = _varint(b, i)
            yield tag >> 3, i, i + n
            i += n
        elif wire == 0:
            _, i = _varint(b, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError("unknown wire type")


def wire_scan(body: bytes, shards: int) -> tuple[int, int, set[int]]:
    """Valid and rejected spans and the owning shards, from the wire format: request > resource_spans (1) >
    scope_spans (2) > spans (2) > trace_id (1), span_id (2). Attributes are skipped, not validated."""
    valid = rejected = 0
    owners: set[int] = set()
    for f1, s1, e1 in _fields(body, 0, len(body)):
        if f1 != 1:
            continue
        for f2, s2, e2 in _fields(body, s1, e1):
            if f2 != 2:
                continue
            for f3, s3, e3 in _fields(body, s2, e2):
                if f3 != 2:
                    continue
                trace_id = span_id = b""
                for f4, s4, e4 in _fields(body, s3, e3):
                    if f4 == 1:
                        trace_id = body[s4:e4]
                    elif f4 == 2:
                        span_id = body[s4:e4]
                if len(trace_id) == 16 and len(span_id) == 8:
                    valid += 1
                    owners.add(int.from_bytes(trace_id[8:], "big") % shards)
                else:
                    rejected += 1
    return valid, rejected, owners


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--spans-per-request", type=int, default=500)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--only", help="run only the stages whose name contains this (e.g. 'decode')")
    args = p.parse_args(argv)
    load_builtin_components()
    metrics, log = SelfMetrics(), logging.getLogger("stages")
    loop = asyncio.new_event_loop()

    def processor(kind: str) -> tuple[Any, Sink]:
        factory, sink, nxt = REGISTRY[("processor", kind)], Sink(), Next()
        nxt.traces = sink
        return factory.cls(factory.config(), Settings(id=kind, metrics=metrics, logger=log), nxt), sink

    normalize, normalized = processor("normalize")
    redact, redacted = processor("redact")
    template = ingest.build_template(args.spans_per_request, 1024, 1)
    payloads = ingest.build_payloads(template, args.requests, 5, 12345, time.time_ns())
    n = args.requests * args.spans_per_request
    codec = checking_codec(TRACES, 2)
    checked = [codec.from_protobuf(body).batch for body in payloads]
    assert all(isinstance(b, EncodedBatch) for b in checked)
    shards = [
        decode_encoded(b, (1 << shard, 2), metrics=metrics, log=log)
        for b in checked
        for shard in (0, 1)  # type: ignore[arg-type]
    ]
    for b in shards:
        loop.run_until_complete(normalize.consume(b))  # type: ignore[arg-type]
    for b in normalized.batches:
        loop.run_until_complete(redact.consume(b))
    stored = redacted.batches
    normalized.batches, redacted.batches = [], []
    fresh: list[Any] = []

    def fresh_shards() -> None:  # normalize and redact change the spans: each round takes freshly decoded ones
        fresh[:] = [decode_encoded(b, (1 << s, 2), metrics=metrics, log=log) for b in checked for s in (0, 1)]  # type: ignore[arg-type]

    def run_normalize() -> None:
        for b in fresh:
            loop.run_until_complete(normalize.consume(b))

    def normalized_shards() -> None:  # redact takes normalized spans: made here when normalize did not just run
        if not normalized.batches:
            fresh_shards()
            run_normalize()

    def run_redact() -> None:
        for b in normalized.batches:
            loop.run_until_complete(redact.consume(b))
        normalized.batches.clear()
        redacted.batches.clear()

    to_compact: list[Any] = []

    def normalized_spans() -> None:  # compaction changes the spans it is given: each round takes fresh copies
        # (sharing their messages with the stored spans, so what is timed leaves out freeing the parsed messages,
        # which a span's end would cost anyway)
        to_compact[:] = [copy.copy(span) for b in stored for span in b.spans]

    def compact() -> None:
        for span in to_compact:
            compact_content(span)  # type: ignore[misc]

    held_json: list[list[Any]] = []
    if compact_content is not None:  # what tail sampling hands on: the stored spans with their messages as JSON
        held_json = [[copy.copy(span) for span in b.spans] for b in stored]
        for spans in held_json:
            for span in spans:
                compact_content(span)

    readers = FanOut([Sink(), Sink()])

    def fan_out() -> None:
        for b in stored:
            loop.run_until_complete(readers.consume(b))

    def check() -> None:
        for body in payloads:
            codec.from_protobuf(body)

    def decode() -> None:
        for b in checked:
            for s in (0, 1):
                decode_encoded(b, (1 << s, 2), metrics=metrics, log=log)  # type: ignore[arg-type]

    def parse_and_check() -> None:
        for body in payloads:
            check_spans(ExportTraceServiceRequest.FromString(body), 2)

    def scan() -> None:
        for body in payloads:
            wire_scan(body, 2)

    stages: list[tuple[str, Callable[[], Any], Callable[[], Any] | None]] = [
        ("receiver check (collector)", check, None),
        ("worker decode (both shards)", decode, None),
        ("normalize", run_normalize, fresh_shards),
        ("redact", run_redact, normalized_shards),
        ("to_arrow", lambda: [to_arrow(b.spans) for b in stored], None),
        ("compact messages (tail_sampling)", compact, normalized_spans),
        ("to_arrow, messages as JSON", lambda: [to_arrow(spans) for spans in held_json], None),
        ("fan-out to 2 exporters", fan_out, None),
        ("parse + check_spans", parse_and_check, None),
        ("wire-format scan of ids", scan, None),
    ]
    if compact_content is None:  # a checkout from before tail sampling held messages as JSON
        stages = [stage for stage in stages if "JSON" not in stage[0] and "compact" not in stage[0]]
    if args.only:
        stages = [stage for stage in stages if args.only in stage[0]]
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, fn, prepare in stages:
            if prepare is not None:
                prepare()
            t0 = time.process_time()
            fn()
            best[name] = min(best.get(name, float("inf")), time.process_time() - t0)
    print(f"evalsi from {CHECKOUT}: {n:,} spans, best of {args.rounds} rounds, CPU µs a span")
    for name, seconds in best.items():
        print(f"  {name:30s} {1e6 * seconds / n:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
