"""What carrying a span's message content twice costs in the store: in `SpanAttributes` (the raw attribute, as the
OTel ClickHouse exporter stores it and Grafana's trace view shows it) and in the canonical `Input`/`Output` columns
(what evalsi's readers and evaluators read without knowing the convention).

The `ingest.py` payloads (GenAI chat spans, ~1 KB of `gen_ai.input.messages` each) are decoded and normalized once;
then, for each layout, the spans are put in Arrow columns (`to_arrow`, CPU time, best of 3) and inserted into a
fresh embedded store (chDB, wall time, best of 3, one INSERT per 5,000 spans as the exporter's batches), and the
table's compressed and uncompressed bytes are read from `system.parts` (the payloads repeat 8 message texts, so
the compressed size is far below real traffic's; the uncompressed size is what the layout adds):

- `both`: today's layout, the content in the attribute and in `Input`;
- `attributes only`: `Input`/`Output` left empty (readers would parse the attribute per convention);
- `columns only`: the content attributes left out of `SpanAttributes` (the raw attributes no longer whole).

Run `python benchmarks/content_twice.py [--spans 20000]`; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from ingest import build_payloads, build_template  # noqa: E402

from evalsi.exporters.clickhouse.backend import ChdbBackend  # noqa: E402
from evalsi.exporters.clickhouse.rows import to_arrow  # noqa: E402
from evalsi.exporters.clickhouse.store import TraceStore  # noqa: E402
from evalsi.model.span import Span  # noqa: E402
from evalsi.processors.normalize import normalize_span  # noqa: E402
from evalsi.receivers.otlp.decode import decode_traces_protobuf  # noqa: E402

CONTENT_ATTRIBUTES = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions")
BATCH = 5_000


def spans_of(n: int) -> list[Span]:
    per_request = 500
    payloads = build_payloads(build_template(per_request, 1024, 1), max(1, n // per_request), 5, 7, time.time_ns())
    spans: list[Span] = []
    for body in payloads:
        batch = decode_traces_protobuf(body).batch.spans  # type: ignore[union-attr]
        for s in batch:
            normalize_span(s)
        spans.extend(batch)
    return spans


def attributes_only(spans: list[Span]) -> list[Span]:
    out = [copy.copy(s) for s in spans]
    for s in out:
        s.input = s.output = None
    return out


def columns_only(spans: list[Span]) -> list[Span]:
    out = [copy.copy(s) for s in spans]
    for s in out:
        s.attributes = {k: v for k, v in s.attributes.items() if k not in CONTENT_ATTRIBUTES}
    return out


def best(fn: Callable[[], Any], clock: Callable[[], float], rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def measure(name: str, spans: list[Span]) -> dict[str, Any]:
    arrow_s = best(lambda: [to_arrow(spans[i : i + BATCH]) for i in range(0, len(spans), BATCH)], time.process_time)
    tables = [to_arrow(spans[i : i + BATCH]) for i in range(0, len(spans), BATCH)]
    insert_times, parts = [], {}
    for _ in range(3):
        tmp = Path(tempfile.mkdtemp(prefix="evalsi-content-"))
        try:
            backend = ChdbBackend(str(tmp / "store"))
            store = TraceStore(backend)
            store.create_schema()
            t0 = time.perf_counter()
            for table in tables:
                store.insert_spans(table)
            insert_times.append(time.perf_counter() - t0)
            backend.query("OPTIMIZE TABLE otel_traces FINAL")
            (parts,) = backend.query(
                "SELECT sum(data_compressed_bytes) AS compressed, sum(data_uncompressed_bytes) AS raw "
                "FROM system.parts WHERE table = 'otel_traces' AND active"
            )
            backend.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    n = len(spans)
    return {
        "layout": name,
        "arrow_us_per_span": arrow_s / n * 1e6,
        "insert_us_per_span": min(insert_times) / n * 1e6,
        "stored_bytes_per_span": int(parts["compressed"]) / n,
        "raw_bytes_per_span": int(parts["raw"]) / n,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spans", type=int, default=20_000)
    args = p.parse_args(argv)
    spans = spans_of(args.spans)
    rows = [
        measure("both", spans),
        measure("attributes only", attributes_only(spans)),
        measure("columns only", columns_only(spans)),
    ]
    base = rows[0]
    print(f"{len(spans):,} spans, ~1 KB of content each")
    print(f"{'layout':<16} {'Arrow µs/span':>14} {'INSERT µs/span':>15} {'stored B/span':>14} {'raw B/span':>11}")
    for r in rows:
        arrow, insert = r["arrow_us_per_span"], r["insert_us_per_span"]
        print(
            f"{r['layout']:<16} {arrow:>9.1f} ({arrow / base['arrow_us_per_span']:.2f}x)"
            f" {insert:>9.1f} ({insert / base['insert_us_per_span']:.2f}x)"
            f" {r['stored_bytes_per_span']:>14.0f} {r['raw_bytes_per_span']:>11.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
