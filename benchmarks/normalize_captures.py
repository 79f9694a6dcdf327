"""CPU µs a span of the normalize processor (its `consume`: mapping, pricing, the event join) on each convention's
captures in tests/fixtures, and on `benchmarks/ingest.py`'s payload (OTel GenAI chat spans with ~1 KB of content).

Each capture folder's trace requests are decoded `--copies` times before the clock starts (normalize changes the
spans it maps), then handed to a fresh processor a request at a time; each figure is the best of `--rounds` rounds
in CPU time of this process. `--against DIR` runs every measurement in child processes, alternating this checkout
and DIR (e.g. a base unpacked with `git archive <commit> | tar -x -C DIR`) `--pairs` times, and prints each figure
with its ratio to DIR's best. Without it, it measures the checkout first on `PYTHONPATH` (else this file's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
CHECKOUT = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or HERE)
FIXTURES = HERE / "tests" / "fixtures"


def folders() -> dict[str, list[Path]]:
    """Trace requests (protobuf) by capture folder (`openinference`, `strands/default`, ...)."""
    found: dict[str, list[Path]] = {}
    for path in sorted(FIXTURES.rglob("*.pb")):
        if not path.name.endswith(".logs.pb"):
            found.setdefault(str(path.parent.relative_to(FIXTURES)), []).append(path)
    return found


def measure(copies: int, rounds: int) -> dict[str, float]:
    sys.path.insert(0, str(CHECKOUT))
    sys.path.insert(0, str(CHECKOUT / "benchmarks"))
    import ingest

    from evalsi.component import Settings
    from evalsi.model.span import SpanBatch
    from evalsi.processors.normalize import Normalize, NormalizeConfig
    from evalsi.receivers.otlp.decode import decode_traces_protobuf
    from evalsi.runtime.telemetry import SelfMetrics

    class Sink:
        async def consume(self, batch: SpanBatch) -> None:
            pass

    bodies = {name: [p.read_bytes() for p in paths] for name, paths in folders().items()}
    template = ingest.build_template(500, 1024, 1)
    bodies["ingest payload (otel_genai chat)"] = ingest.build_payloads(template, 4, 5, 12345, time.time_ns())
    loop = asyncio.new_event_loop()
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, requests in bodies.items():
            batches: list[Any] = [decode_traces_protobuf(b).batch for _ in range(copies) for b in requests]
            n = sum(len(b.spans) for b in batches)
            metrics = SelfMetrics()
            normalize = Normalize(NormalizeConfig(), Settings("normalize", metrics, logging.getLogger("bench")), Sink())  # type: ignore[arg-type]
            t0 = time.process_time()
            for batch in batches:
                loop.run_until_complete(normalize.consume(batch))
            best[name] = min(best.get(name, float("inf")), 1e6 * (time.process_time() - t0) / n)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--copies", type=int, default=200, help="decoded copies of each folder's requests a round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--against", help="DIR: a base checkout, measured in alternation with this one")
    p.add_argument("--pairs", type=int, default=2, help="with --against: base/new runs each (default 2)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON (children use it)")
    args = p.parse_args(argv)
    if not args.against:
        figures = measure(args.copies, args.rounds)
        if args.json:
            print(json.dumps(figures))
        else:
            print(f"evalsi from {CHECKOUT}: best of {args.rounds} rounds, CPU µs a span")
            for name, us in figures.items():
                print(f"  {name:36s} {us:8.2f}")
        return 0
    runs: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
    for _ in range(args.pairs):
        for which, checkout in (("base", args.against), ("new", str(CHECKOUT))):
            env = {**os.environ, "PYTHONPATH": checkout}
            cmd = [sys.executable, __file__, "--json", "--copies", str(args.copies), "--rounds", str(args.rounds)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            runs[which].append(json.loads(out.strip().splitlines()[-1]))
    print(f"base {args.against}, new {CHECKOUT}: best of {args.rounds} rounds in each of {args.pairs} alternated "
          "runs, CPU µs a span")  # fmt: skip
    for name in runs["new"][0]:
        base = min(r[name] for r in runs["base"] if name in r)
        new = min(r[name] for r in runs["new"])
        print(f"  {name:36s} {base:8.2f} -> {new:8.2f}   ({new / base:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
