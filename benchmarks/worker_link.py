"""Worker link benchmark: the CPU cost of moving a request body or a store table between the collector process and
a pipeline worker, as `evalsi.collector.workers` sends them (header pickled, body raw) against the baseline of
pickling the whole message, measured in the same run over the same kind of pipe.

    .venv/bin/python benchmarks/worker_link.py                 # a 1 MB request body and a 10 MB table
    .venv/bin/python benchmarks/worker_link.py --sizes 4000000 --rounds 3

Prints, per body size and way of sending: CPU ms per message on the sending and on the receiving side, and the
ratio of pickled to raw. The receiving side is the one that matters most for tables: it is the collector process,
whose one Python thread also serves the receivers.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evalsi.collector.workers.pipe import receive_message, send_message, widen_pipe


def _sender(conn: Any, how: str, size: int, count: int) -> None:
    body = os.urandom(size)
    started = time.process_time()
    for _ in range(count):
        if how == "pickled":
            conn.send(("table", "spans", body))
        else:
            send_message(conn, ("table", "spans", body))
    conn.send(("done", time.process_time() - started))


def measure(how: str, size: int, count: int) -> tuple[float, float]:
    """CPU ms per message: (sending, receiving)."""
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe(duplex=True)
    for end in (here, there):
        widen_pipe(end)
    proc = ctx.Process(target=_sender, args=(there, how, size, count))
    proc.start()
    there.close()
    received = 0.0
    while True:
        started = time.process_time()
        msg = here.recv() if how == "pickled" else receive_message(here)
        if msg[0] == "done":
            sent = msg[1]
            break
        received += time.process_time() - started
        assert len(msg[2]) == size
    proc.join()
    return 1e3 * sent / count, 1e3 * received / count


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000], help="body sizes in bytes")
    p.add_argument("--messages", type=int, default=60, help="messages per measurement")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per way (the median is printed)")
    args = p.parse_args(argv)
    print(f"{'body':>10}  {'way':<8}  {'send ms':>8}  {'receive ms':>10}")
    for size in args.sizes:
        figures: dict[str, list[tuple[float, float]]] = {"pickled": [], "raw": []}
        for _ in range(args.rounds):
            for how in figures:  # alternate, so a change in machine speed hits both ways alike
                figures[how].append(measure(how, size, args.messages))
        medians = {
            how: (statistics.median(f[0] for f in runs), statistics.median(f[1] for f in runs))
            for how, runs in figures.items()
        }
        for how, (send, receive) in medians.items():
            print(f"{size:>10,}  {how:<8}  {send:8.2f}  {receive:10.2f}")
        (ps, pr), (rs, rr) = medians["pickled"], medians["raw"]
        print(f"{size:>10,}  {'ratio':<8}  {ps / rs:7.1f}x  {pr / rr:9.1f}x  (pickled / raw)")


if __name__ == "__main__":
    main()
