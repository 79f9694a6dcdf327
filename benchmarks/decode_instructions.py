"""Instructions a span of a pipeline worker's decode (`decode_encoded`, both workers' shards of each request), counted
by callgrind: deterministic, so a change of a few percent shows on a machine whose CPU times move by more.

Each checkout (`--base` and this one) runs twice under `valgrind --tool=callgrind`, on the same payloads (written
once by this process): checking the requests only, then that plus `--rounds` decodes of both shards; the difference
over the spans decoded is the figure. Payloads: `ingest.py`'s GenAI spans as `stages.py` uses them, or with
`--captures` every trace capture in tests/fixtures (real instrumentation, a few spans a request). `--gc-as-serve`
sets the garbage collector as `evalsi serve` does (`collector/heap.py`). Needs valgrind; figures in
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]


def child(payloads: Path, decode: bool, rounds: int, gc_as_serve: bool) -> None:
    """Under callgrind: check the payloads (the collector's part) and, with `decode`, decode them `rounds` times."""
    import logging

    import evalsi
    from evalsi.receivers.otlp.decode import TRACES, checking_codec, decode_encoded
    from evalsi.runtime.telemetry import SelfMetrics

    checkout = os.environ["PYTHONPATH"].split(os.pathsep)[0]
    assert evalsi.__file__.startswith(os.path.abspath(checkout)), evalsi.__file__
    if gc_as_serve:
        import gc

        gc.freeze()
        gc.set_threshold(100_000, 50, 100)
    metrics, log = SelfMetrics(), logging.getLogger("decode_instructions")
    logging.disable()
    codec = checking_codec(TRACES, 2)
    checked = [codec.from_protobuf(body).batch for body in pickle.loads(payloads.read_bytes())]
    spans = sum(len(decode_encoded(b, (1 << s, 2), metrics=metrics, log=log)) for b in checked for s in (0, 1))  # type: ignore[arg-type]
    if decode:
        for _ in range(rounds):
            for b in checked:
                for s in (0, 1):
                    decode_encoded(b, (1 << s, 2), metrics=metrics, log=log)  # type: ignore[arg-type]
    print(spans)


def instructions(checkout: Path, payloads: Path, decode: bool, args: argparse.Namespace) -> tuple[int, int]:
    """Instructions of one child run, and the spans a decode of the payloads yields."""
    env = dict(os.environ, PYTHONPATH=str(checkout), PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/callgrind.out", sys.executable, str(HERE)]
        cmd += ["--child", str(payloads), "--rounds", str(args.rounds)]
        cmd += ["--decode"] if decode else []
        cmd += ["--gc-as-serve"] if args.gc_as_serve else []
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    assert found, done.stderr[-2000:]
    return int(found.group(1)), int(done.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", type=Path, help="a checkout to compare with (e.g. `git archive <commit> | tar -x -C DIR`)")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--spans-per-request", type=int, default=500)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--captures", action="store_true", help="decode tests/fixtures' trace captures instead")
    p.add_argument("--gc-as-serve", action="store_true")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--decode", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.decode, args.rounds, args.gc_as_serve)
        return 0
    if args.captures:
        paths = sorted((ROOT / "tests" / "fixtures").rglob("*.pb"))
        bodies = [path.read_bytes() for path in paths if ".logs." not in path.name]
        what = f"{len(bodies)} trace captures of tests/fixtures"
    else:
        sys.path.insert(0, str(HERE.parent))
        import ingest

        template = ingest.build_template(args.spans_per_request, 1024, 1)
        bodies = ingest.build_payloads(template, args.requests, 5, 12345, 1_796_000_000_000_000_000)
        what = f"{args.requests} requests x {args.spans_per_request} spans (ingest.py's)"
    checkouts = ([("base", args.base.resolve())] if args.base else []) + [("this", ROOT)]
    print(f"decode_encoded, both shards, {args.rounds} rounds of {what}; callgrind instructions a span", flush=True)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        payloads = Path(tmp) / "payloads.pickle"
        payloads.write_bytes(pickle.dumps(bodies))
        for name, checkout in checkouts:
            started = time.monotonic()
            setup, spans = instructions(checkout, payloads, False, args)
            total, _ = instructions(checkout, payloads, True, args)
            figures[name] = (total - setup) / (args.rounds * spans)
            took = time.monotonic() - started
            print(f"  {name:5s} {figures[name]:10,.0f}  ({checkout}, {spans} spans a round, {took:.0f} s)")
    if "base" in figures:
        print(f"  this / base: {figures['this'] / figures['base']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
