"""CPU µs a span of a pipeline worker's store rows (`ArrowRows.encode`: spans to the store's Arrow columns and the IPC
stream the store link sends), at the store link's batch sizes, this checkout against a baseline checkout.

The spans are `benchmarks/ingest.py`'s payloads decoded (both shards), normalized and redacted (default rules), as a
worker holds them; they are cut into batches of `--batch` spans (the store link sends once it holds 4,000 or after
0.2 s, so batches of 250 to ~9,500 spans in `pipeline.py`). Each checkout runs in a child process of its own
(`PYTHONPATH=<checkout>`), base and new alternated `--pairs` times; each figure is the best of `--rounds` rounds in
CPU time of the child, and the last line gives new / base. With `--callgrind` each child runs once under valgrind
(one and three rounds, no timing) and the figure is instructions a span of one round: the same on every run.

    .venv/bin/python benchmarks/arrow_rows.py --base /tmp/base                  # CPU time, alternated
    .venv/bin/python benchmarks/arrow_rows.py --base /tmp/base --callgrind      # instructions (slow: minutes)
    .venv/bin/python benchmarks/arrow_rows.py --base /tmp/base --scores         # the collector's score rows
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def spans_as_a_worker_holds_them(requests: int) -> list[Any]:
    """`ingest.py`'s spans after decode (both shards), normalize and redact, in the order a worker receives them."""
    import asyncio
    import logging

    import ingest

    from evalsi.collector.builtin import load_builtin_components
    from evalsi.component import REGISTRY, Next, Settings
    from evalsi.receivers.otlp.decode import TRACES, checking_codec, decode_encoded
    from evalsi.runtime.telemetry import SelfMetrics

    class Sink:
        mutates_data = False

        def __init__(self) -> None:
            self.batches: list[Any] = []

        async def consume(self, batch: Any) -> None:
            self.batches.append(batch)

    load_builtin_components()
    metrics, log = SelfMetrics(), logging.getLogger("arrow_rows")
    loop = asyncio.new_event_loop()

    def processor(kind: str) -> tuple[Any, Sink]:
        factory, sink, nxt = REGISTRY[("processor", kind)], Sink(), Next()
        nxt.traces = sink
        return factory.cls(factory.config(), Settings(id=kind, metrics=metrics, logger=log), nxt), sink

    normalize, normalized = processor("normalize")
    redact, redacted = processor("redact")
    template = ingest.build_template(500, 1024, 1)
    payloads = ingest.build_payloads(template, requests, 5, 12345, 1_780_000_000_000_000_000)
    codec = checking_codec(TRACES, 2)
    for body in payloads:
        for shard in (0, 1):
            decoded = decode_encoded(codec.from_protobuf(body).batch, (1 << shard, 2), metrics=metrics, log=log)  # type: ignore[arg-type]
            loop.run_until_complete(normalize.consume(decoded))  # type: ignore[arg-type]
    for batch in normalized.batches:
        loop.run_until_complete(redact.consume(batch))
    return [s for batch in redacted.batches for s in batch.spans]


def scores_as_evaluated(n: int) -> list[Any]:
    """`pipeline.py`'s kind of scores: three deterministic evaluators a trace, some with an explanation or metadata."""
    from evalsi.model.score import Score

    return [
        Score(("answer_length", "has_error", "tool_use")[i % 3], value=(i % 7) / 7, passed=i % 5 != 0,
              explanation=None if i % 4 else "short", trace_id=f"{i // 3:032x}", span_id=f"{i:016x}", policy="bench",
              evaluator=("length", "errors", "tools")[i % 3], evaluator_version="1",
              metadata={"tokens": i} if i % 2 else {}, timestamp_unix_nano=1_780_000_000_000_000_000 + i)
        for i in range(n)
    ]  # fmt: skip


def child(args: argparse.Namespace) -> None:
    """Measure the checkout first on sys.path (PYTHONPATH); print one JSON line."""
    sys.path.insert(0, os.path.join(os.environ["PYTHONPATH"].split(os.pathsep)[0], "benchmarks"))
    from evalsi.exporters.clickhouse.rows import ArrowRows, scores_to_arrow

    rows = ArrowRows()
    rows.prepare()
    if args.scores:  # the collector's store lane of scores
        items = scores_as_evaluated(args.batch)
        batches = [items]

        def encode(batch: list[Any]) -> None:
            scores_to_arrow(batch)
    else:
        items = spans_as_a_worker_holds_them(args.requests)
        size = args.batch
        batches = [items[i : i + size] for i in range(0, len(items), size)]

        def encode(batch: list[Any]) -> None:
            rows.encode("spans", batch)

    best = float("inf")
    for _ in range(args.child_rounds):
        started = time.process_time()
        for batch in batches:
            encode(batch)
        best = min(best, time.process_time() - started)
    print(json.dumps({"spans": len(items), "us_a_span": 1e6 * best / len(items) if args.child_rounds else 0}))


def run_child(checkout: str, args: argparse.Namespace, rounds: int, callgrind: bool) -> tuple[int, float]:
    """(spans, µs a span) timed, or (spans, instructions of the whole child) under callgrind."""
    cmd = [sys.executable, __file__, "--child", "--child-rounds", str(rounds), "--batch", str(args.batch),
           "--requests", str(args.requests), *(["--scores"] if args.scores else [])]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": checkout}
    if not callgrind:
        out = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
        return out["spans"], out["us_a_span"]
    env["PYTHONHASHSEED"] = "0"  # the same dict and set layouts, so the same instructions, on every run
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "callgrind.out"
        done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={result}", *cmd], env=env,
                              capture_output=True, text=True, check=True)  # fmt: skip
        spans = json.loads(done.stdout)["spans"]
        for line in result.read_text().splitlines():
            if line.startswith("totals:") or line.startswith("summary:"):
                return spans, float(line.split()[1])
    raise RuntimeError("no totals in callgrind's output")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", help="the baseline checkout (e.g. `git archive <rev> | tar -x -C /tmp/base`)")
    p.add_argument("--checkout", default=str(HERE), help="the checkout measured against the base")
    p.add_argument("--batch", type=int, default=4_000, help="spans a store link batch")
    p.add_argument("--requests", type=int, default=16, help="requests of 500 spans")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--pairs", type=int, default=2, help="base and new alternated this many times")
    p.add_argument("--callgrind", action="store_true", help="instructions a span under valgrind, not CPU time")
    p.add_argument("--scores", action="store_true", help="`scores_to_arrow` of --batch scores (the collector's)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-rounds", type=int, default=7, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    checkouts = {"base": args.base, "new": args.checkout} if args.base else {"new": args.checkout}
    figures: dict[str, list[float]] = {name: [] for name in checkouts}
    unit = "instructions a span (callgrind, one round)" if args.callgrind else f"CPU µs a span, best of {args.rounds}"
    what = "scores_to_arrow, batches of {:,} scores" if args.scores else "ArrowRows.encode, batches of {:,} spans"
    print(f"{what.format(args.batch)}: {unit.replace('span', 'score') if args.scores else unit}")
    for _ in range(1 if args.callgrind else args.pairs):
        for name, checkout in checkouts.items():
            if args.callgrind:  # one round less three rounds, halved: set-up and first-round costs cancel out
                spans, one = run_child(checkout, args, 1, True)
                spans, three = run_child(checkout, args, 3, True)
                figure = (three - one) / 2 / spans
            else:
                spans, figure = run_child(checkout, args, args.rounds, False)
            figures[name].append(figure)
            print(f"  {name:4s} {checkout}: {figure:,.2f}", flush=True)
    if args.base:
        base, new = min(figures["base"]), min(figures["new"])
        print(f"best: base {base:,.2f}, new {new:,.2f}, new / base {new / base:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
