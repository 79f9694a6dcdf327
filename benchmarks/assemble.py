"""Trace assembly: the memory 100k buffered GenAI spans take, and how fast the tail sampler takes spans and decides.

In one process, with the collector's GC settings: decodes and normalizes OTLP payloads of GenAI chat spans (the
ingest benchmark's: 13 attributes, ~1 KB of messages, 5 spans per trace), feeds them to a `tail_sampling`
processor whose traces cannot complete during the feed (no tick runs), then prints

- the RSS growth of the process and tracemalloc's count of the bytes held once all spans are buffered (only the
  buffer holds them), beside the processor's own estimate (what `max_buffered_bytes` is compared with);
- consume: spans/s and µs per span of `TailSampling.consume` alone (decode and normalize are done beforehand);
- decisions/s: complete traces decided and handed on per second by one tick, for a few policy sets.

Run `python benchmarks/assemble.py` (`--spans`, default 100,000).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

from ingest import build_payloads, build_template  # noqa: E402

from evalsi.component import Next, Settings  # noqa: E402
from evalsi.model.span import BatchKind, Span, SpanBatch  # noqa: E402
from evalsi.processors.normalize import normalize_span  # noqa: E402
from evalsi.processors.tail_sampling import TailSampling, TailSamplingConfig  # noqa: E402
from evalsi.receivers.otlp.decode import decode_traces_protobuf  # noqa: E402
from evalsi.runtime.telemetry import SelfMetrics  # noqa: E402

SPANS_PER_REQUEST = 500
POLICY_SETS: dict[str, list[dict[str, Any]]] = {
    "none (assembly only)": [],
    "status_code + string_attribute regex + probabilistic 10%": [
        {"name": "errors", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}},
        {
            "name": "big-models",
            "type": "string_attribute",
            "string_attribute": {"key": "model", "values": ["^o1", "^o3"], "enabled_regex_matching": True},
        },
        {"name": "some", "type": "probabilistic", "probabilistic": {"sampling_percentage": 10}},
    ],
    "cel (error_count, exists over spans)": [
        {
            "name": "slow-llm",
            "type": "cel",
            "cel": {
                "condition": 'trace.error_count > 0 || trace.spans.exists(s, s.step_type == "llm" '
                "&& s.output_tokens > 780)"
            },
        }
    ],
}


class Sink:
    def __init__(self) -> None:
        self.spans = 0

    async def consume(self, batch: SpanBatch) -> None:
        if batch.kind is BatchKind.TRACE:
            self.spans += len(batch.spans)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def make(policies: list[dict[str, Any]], clock: list[float]) -> tuple[TailSampling, Sink]:
    sink = Sink()
    nxt = Next()
    nxt.traces = sink
    config = TailSamplingConfig.model_validate(
        {"decision_wait": "5s", "num_traces": 1_000_000, "max_buffered_bytes": 1 << 40, "policies": policies}
    )
    settings = Settings("tail_sampling", SelfMetrics(), logging.getLogger("bench"))
    return TailSampling(config, settings, nxt, clock=lambda: clock[0]), sink


def decoded_batches(n_spans: int, run_tag: int) -> list[list[Span]]:
    template = build_template(SPANS_PER_REQUEST, 1000, seed=run_tag)
    payloads = build_payloads(template, n_spans // SPANS_PER_REQUEST, 5, run_tag, time.time_ns())
    batches = []
    for body in payloads:
        spans = decode_traces_protobuf(body).batch.spans
        for s in spans:
            normalize_span(s)
        batches.append(spans)
    return batches


async def feed(proc: TailSampling, batches: list[list[Span]]) -> float:
    """Seconds spent in consume."""
    spent = 0.0
    for spans in batches:
        t = time.perf_counter()
        await proc.consume(SpanBatch(spans))
        spent += time.perf_counter() - t
    return spent


def buffered(n_spans: int, run_tag: int) -> TailSampling:
    """A processor holding `n_spans` spans, which nothing else references."""
    proc, _ = make([], [0.0])
    batches = decoded_batches(n_spans, run_tag)
    asyncio.run(feed(proc, batches))
    del batches
    gc.collect()
    return proc


def memory(n_spans: int) -> None:
    # RSS first, without tracemalloc (whose own bookkeeping would count), then tracemalloc on a second buffer
    gc.collect()
    before = rss_bytes()
    proc = buffered(n_spans, 1)
    grown = rss_bytes() - before
    n = sum(len(t.spans) for t in proc._buffer.traces.values())
    estimate = proc._buffer.bytes
    traces = len(proc._buffer)
    del proc
    gc.collect()
    tracemalloc.start()
    again = buffered(n_spans, 2)
    held, _ = tracemalloc.get_traced_memory()
    assert len(again._buffer) == traces
    tracemalloc.stop()
    print(f"memory: {n:,} spans in {traces:,} buffered traces")
    print(f"  RSS growth              {grown / 2**20:8.1f} MiB  ({grown / n:,.0f} B/span)")
    print(f"  tracemalloc (held)      {held / 2**20:8.1f} MiB  ({held / n:,.0f} B/span)")
    print(f"  estimate (max_buffered) {estimate / 2**20:8.1f} MiB  ({estimate / n:,.0f} B/span)")


def speed(n_spans: int) -> None:
    print(f"speed: {n_spans:,} spans, {n_spans // 5:,} traces of 5")
    print(f"  {'policies':<58}{'consume spans/s':>16}{'µs/span':>9}{'decisions/s':>13}{'sampled':>9}")
    for i, (label, policies) in enumerate(POLICY_SETS.items()):
        clock = [0.0]
        proc, sink = make(policies, clock)
        batches = decoded_batches(n_spans, 10 + i)
        n = sum(len(b) for b in batches)
        spent = asyncio.run(feed(proc, batches))
        clock[0] += 10  # every trace is complete now
        traces = len(proc._buffer)
        t = time.perf_counter()
        asyncio.run(proc.tick())
        decide = time.perf_counter() - t
        assert sink.spans == n and len(proc._buffer) == 0
        kept = sum(1 for b in batches for s in b if s.sampled) / n
        print(f"  {label:<58}{n / spent:>16,.0f}{spent / n * 1e6:>9.1f}{traces / decide:>13,.0f}{kept:>9.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=100_000, help="spans buffered (a multiple of 500)")
    args = parser.parse_args()
    gc.set_threshold(100_000, 50, 100)  # as `evalsi serve` runs (evalsi/collector/service.py)
    memory(args.spans)
    speed(args.spans)


if __name__ == "__main__":
    main()
