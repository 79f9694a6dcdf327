"""CPU µs a span of the Arrow IPC stream a pipeline worker writes for the store (`ArrowRows.encode`) and the
collector reads back (`from_ipc`), on `benchmarks/ingest.py`'s payloads decoded, normalized and redacted.

Baseline in the same run: the stream written into a growing `pa.BufferOutputStream` (what `ArrowRows.encode` did
before `ipc_stream`), alternated with the current `ipc_stream` in every round; each figure is the best of `--rounds`
rounds in CPU time of this process. It also checks that both write the same bytes, and whether `from_ipc`'s table
points into the received body (zero-copy) or copies it. Run it with `PYTHONPATH=<checkout>`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

CHECKOUT = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or os.path.dirname(os.path.dirname(__file__))
sys.path.insert(0, os.path.join(CHECKOUT, "benchmarks"))

import ingest  # noqa: E402  (inserts its checkout's root first on sys.path)
import pyarrow as pa  # noqa: E402

from evalsi.collector.builtin import load_builtin_components  # noqa: E402
from evalsi.component import REGISTRY, Next, Settings  # noqa: E402
from evalsi.exporters.clickhouse.rows import from_ipc, ipc_stream, to_arrow  # noqa: E402
from evalsi.model.span import Span, SpanBatch  # noqa: E402
from evalsi.receivers.otlp.decode import TRACES, checking_codec, decode_encoded  # noqa: E402
from evalsi.runtime.telemetry import SelfMetrics  # noqa: E402


class Sink:
    signals = frozenset({"traces"})

    def __init__(self) -> None:
        self.batches: list[SpanBatch] = []

    async def consume(self, batch: SpanBatch) -> None:
        self.batches.append(batch)


def growing_stream(table: pa.Table) -> pa.Buffer:
    """The baseline: the stream written into a `BufferOutputStream` that grows as it fills."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def stored_spans(requests: int, per_request: int) -> list[Span]:
    """The spans a worker hands its store link: decoded (both shards), normalized and redacted (default rules)."""
    metrics, log = SelfMetrics(), logging.getLogger("ipc_write")
    loop = asyncio.new_event_loop()
    spans: list[Span] = []
    stages = []
    sink = Sink()
    for kind in ("redact", "normalize"):  # built last to first: normalize hands on to redact
        factory, nxt = REGISTRY[("processor", kind)], Next()
        nxt.traces = stages[-1] if stages else sink
        stages.append(factory.cls(factory.config(), Settings(id=kind, metrics=metrics, logger=log), nxt))
    template = ingest.build_template(per_request, 1024, 1)
    codec = checking_codec(TRACES, 2)
    for body in ingest.build_payloads(template, requests, 5, 12345, time.time_ns()):
        checked = codec.from_protobuf(body).batch
        for owned in (0b01, 0b10):
            loop.run_until_complete(stages[-1].consume(decode_encoded(checked, (owned, 2), metrics=metrics, log=log)))
    for b in sink.batches:
        spans += b.spans
    return spans


def us_a_span(fn: Callable[[Any], Any], arg: Any, rows: int, reps: int) -> float:
    """CPU µs a row of `fn(arg)`, over `reps` calls."""
    start = time.process_time()
    for _ in range(reps):
        fn(arg)
    return (time.process_time() - start) / reps / rows * 1e6


def zero_copy(body: bytearray) -> bool:
    """Whether every buffer of `from_ipc(body)`'s columns lies inside `body`."""
    start = pa.py_buffer(body).address
    end = start + len(body)
    table = from_ipc(body)
    addresses = [
        b.address for col in table.columns for chunk in col.chunks for b in chunk.buffers() if b is not None and b.size
    ]
    return all(start <= a < end for a in addresses)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000, 4_000, 8_750], help="spans a table")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--reps", type=int, default=20, help="writes of a table a round")
    args = p.parse_args(argv)
    load_builtin_components()
    spans = stored_spans(20, 500)
    print(f"{len(spans):,} spans decoded, normalized and redacted; best of {args.rounds} rounds x {args.reps} writes")
    for rows in args.sizes:
        items = (spans * (rows // len(spans) + 1))[:rows]
        table = to_arrow(items)
        old, new = growing_stream(table), ipc_stream(table)
        same = old.to_pybytes() == new.to_pybytes()
        body = bytearray(new)  # as the collector receives it (pipe.py reads into a bytearray)
        assert from_ipc(body).equals(table)
        runs: dict[str, tuple[Callable[[Any], Any], Any]] = {
            "growing stream (base)": (growing_stream, table),
            "sized buffer (new)": (ipc_stream, table),
            "from_ipc": (from_ipc, body),
            "a copy of the body": (bytearray, body),
        }
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.rounds):  # every run in each round: base and new alternate
            for name, (fn, arg) in runs.items():
                best[name] = min(best[name], us_a_span(fn, arg, rows, args.reps))
        ratio = best["sized buffer (new)"] / best["growing stream (base)"]
        print(
            f"{rows:>6,} spans, {len(body) / rows:,.0f} B a span: "
            + ", ".join(f"{k} {v:.3f}" for k, v in best.items())
            + f" µs a span; new/base {ratio:.2f}; same bytes: {same}; from_ipc zero-copy: {zero_copy(body)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
