"""Body benchmark: CPU of taking in a large body, in glibc's memory against Arrow's pool.

Two ways a body arrives in evalsi: from a pipeline worker's pipe, and from an OTLP/HTTP request's chunks.

Pipe: a thread writes `--size` MB bodies into a socket pair (4 MiB buffers, as `widen_pipe` sets) and this thread reads
each one as the collector's receive loop does (`evalsi.collector.workers.pipe._read`), keeping the last three alive
as the store's queue would. Both ways run with the heap settings of an `evalsi serve` process (`tune_malloc`),
alternated `--rounds` times. Prints CPU ms a body: the reading thread's, and the whole process's (page faults and
unmaps included), and the ratio of the pool's to the bytearray's.

HTTP: the same size in 64 KiB chunks (what uvicorn hands on) put together as `bytes` (`b"".join`) against
`http_transport._joined`, keeping the last three; CPU ms a body of this thread.

    .venv/bin/python benchmarks/pipe_read.py
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evalsi.collector.heap import tune_malloc
from evalsi.collector.workers.pipe import PIPE_BUFFER, _read
from evalsi.receivers.otlp.http_transport import _joined


def _read_bytearray(fd: int, size: int) -> bytearray:
    """What `_read` did before: a zeroed bytearray the kernel then writes into."""
    out = bytearray(size)
    view = memoryview(out)
    got = 0
    while got < size:
        got += os.readv(fd, [view[got:]])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=float, default=10.0, help="MB a body (a worker's table is ~10 MB, a request ~1)")
    p.add_argument("--bodies", type=int, default=40, help="bodies a round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    tune_malloc()
    size = int(args.size * (1 << 20))
    writer, reader = socket.socketpair()
    for s in (writer, reader):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BUFFER)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIPE_BUFFER)
    payload = os.urandom(size)
    ways = {"bytearray": _read_bytearray, "arrow pool": _read}
    total = (1 + args.rounds * len(ways)) * args.bodies
    threading.Thread(target=lambda: [writer.sendall(payload) for _ in range(total)], daemon=True).start()
    fd = reader.fileno()
    for _ in range(args.bodies):  # warm up both allocators
        _read(fd, size)
    best: dict[str, tuple[float, float]] = {}
    print(f"{args.size:g} MB bodies, {args.bodies} a round, CPU ms a body (reading thread / whole process)")
    for r in range(args.rounds):
        for name, read in ways.items():
            kept: list[object] = []
            t0, p0 = time.thread_time(), time.process_time()
            for _ in range(args.bodies):
                body = read(fd, size)
                kept.append(body)
                if len(kept) > 3:
                    kept.pop(0)
            thread_ms = 1e3 * (time.thread_time() - t0) / args.bodies
            process_ms = 1e3 * (time.process_time() - p0) / args.bodies
            assert bytes(body) == payload
            print(f"  round {r + 1}  {name:<10} {thread_ms:6.2f} / {process_ms:6.2f}")
            old = best.get(name, (1e9, 1e9))
            best[name] = (min(old[0], thread_ms), min(old[1], process_ms))
    (bt, bp), (nt, np_) = best["bytearray"], best["arrow pool"]
    print(
        f"best: bytearray {bt:.2f} / {bp:.2f}, arrow pool {nt:.2f} / {np_:.2f}; pool / bytearray {nt / bt:.2f} / "
        f"{np_ / bp:.2f}"
    )

    chunks = [payload[i : i + 65536] for i in range(0, size, 65536)]
    joins = {"bytes": lambda: b"".join(chunks), "arrow pool": lambda: _joined(chunks, size)}
    best_join: dict[str, float] = {}
    print(f"HTTP body of {len(chunks)} chunks, CPU ms a body")
    for r in range(args.rounds):
        for name, join in joins.items():
            kept = []
            t0 = time.thread_time()
            for _ in range(args.bodies):
                kept.append(join())
                if len(kept) > 3:
                    kept.pop(0)
            ms = 1e3 * (time.thread_time() - t0) / args.bodies
            assert bytes(kept[-1]) == payload
            print(f"  round {r + 1}  {name:<10} {ms:6.3f}")
            best_join[name] = min(best_join.get(name, 1e9), ms)
    bj, nj = best_join["bytes"], best_join["arrow pool"]
    print(f"best: bytes {bj:.3f}, arrow pool {nj:.3f}; pool / bytes {nj / bj:.2f}")


if __name__ == "__main__":
    main()
