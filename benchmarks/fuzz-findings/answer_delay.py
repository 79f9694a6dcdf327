"""Fuzz finding: on a kept-alive connection, every answer of the OTLP/HTTP port or the API that has a body waits ~40 ms.

uvicorn writes an answer's head and its body in two writes; the listening sockets (evalsi/runtime/serving.py `bind`)
do not set TCP_NODELAY, so Nagle's algorithm holds the body until the head is acknowledged, and the client acknowledges
it only when its delayed-ACK timer fires (40 ms on Linux). Empty answers (a 200 to an OTLP export without partial
success) are not affected; errors, partial successes and every API answer are: one connection gets ~23 of them a
second. A client that sets TCP_QUICKACK before reading sees ~1 ms.

Run: .venv/bin/python benchmarks/fuzz-findings/answer_delay.py
"""

from __future__ import annotations

import http.client
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from running_collector import serve_config, start_collector  # noqa: E402


def timed(host: str, port: int, method: str, path: str, body: bytes | None, quickack: bool) -> float:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    times = []
    for _ in range(21):
        t0 = time.perf_counter()
        conn.request(method, path, body=body, headers={"Content-Type": "application/x-protobuf"})
        if quickack:
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        conn.getresponse().read()
        times.append(time.perf_counter() - t0)
    conn.close()
    return statistics.median(times[1:]) * 1000  # the first request of a connection is quick-acked by the kernel


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="evalsi-answer-delay-"))
    c = start_collector(tmp, serve_config(tmp / "store"))
    try:
        otlp = c.http.split("://")[1].rsplit(":", 1)
        api = c.api.split("://")[1].rsplit(":", 1)
        cases = [
            ("OTLP/HTTP 400 (a body that is no protobuf)", otlp, "POST", "/v1/traces", b"\xff" * 100),
            ("API GET /healthz", api, "GET", "/healthz", None),
        ]
        slow = False
        for name, (host, port), method, path, body in cases:
            plain = timed(host, int(port), method, path, body, quickack=False)
            quick = timed(host, int(port), method, path, body, quickack=True)
            print(f"{name}: median {plain:.1f} ms a request on a kept-alive connection; {quick:.1f} ms with "
                  f"TCP_QUICKACK on the client")  # fmt: skip
            slow |= plain > 20
        return 1 if slow else 0
    finally:
        c.stop()


if __name__ == "__main__":
    sys.exit(main())
