"""What one held span costs in memory: `pipeline.py`'s spans decoded and normalized as a worker holds them (in tail
sampling's buffer, evaluate's queue), measured with tracemalloc, by the line that allocated what stays alive.

    .venv/bin/python benchmarks/span_memory.py [--requests 20] [--top 15] [--parsed]

The messages are held as tail sampling's buffer holds them, as their JSON (`compact_content`); `--parsed` keeps
them parsed, as before it did.

Prints bytes and blocks (Python objects and buffers) a span, in all and by line. Figures in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ingest

from evalsi.model.span import compact_content
from evalsi.processors.normalize import normalize_span
from evalsi.receivers.otlp.decode_protobuf import decode_traces_protobuf


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20, help="requests of 400 spans, as pipeline.py makes them")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--parsed", action="store_true",
                    help="keep the messages parsed (as before tail sampling's buffer held them as JSON)")  # fmt: skip
    args = ap.parse_args(argv)
    template = ingest.build_template(400, 1000, 1)
    payloads = ingest.build_payloads(template, args.requests, 4, 7, 1_700_000_000_000_000_000)
    gc.collect()
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot()
    held = []
    for body in payloads:
        spans = decode_traces_protobuf(body).batch.spans
        for span in spans:
            normalize_span(span)
            if not args.parsed:
                compact_content(span)  # as tail sampling's buffer holds it
        held.extend(spans)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    n = len(held)
    stats = after.compare_to(before, "lineno")
    print(f"{n:,} spans held: {sum(s.size_diff for s in stats) / n:,.0f} B and "
          f"{sum(s.count_diff for s in stats) / n:.1f} blocks a span")  # fmt: skip
    print("   B a span  blocks  allocated at")
    for s in stats[: args.top]:
        frame = s.traceback[0]
        where = "/".join(Path(frame.filename).parts[-2:])
        print(f"{s.size_diff / n:10,.0f}  {s.count_diff / n:6.2f}  {where}:{frame.lineno}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
