"""Fuzz finding: reading one big trace through the API takes memory without bound, and an OOM kill of the collector.

Any sender can put any number of spans in one trace (100,000 a request, as many requests as it likes: a trace id is
the sender's to choose). `GET /api/v1/traces/{trace_id}` (and `evalsi traces show`) then builds every span of it in
the collector's memory, and its JSON, with no limit. In the fuzzing (benchmarks/fuzz.py, `--workers 2 --seed 2`),
requests reusing three trace ids had put 352,000 and 499,000 spans in two traces, the API fuzzing asked for
`/api/v1/traces/ffffffffffffffffffffffffffffffff`, and the kernel's OOM killer ended the collector at 23 GB anonymous
RSS (it had stopped answering anything 230 s before).

This script stores `--spans` spans in one trace (in requests of 100,000), then reads it once through the API while
it samples the collector's RSS every 0.1 s; the collector is killed past `--rss-cap-mb` (the machine is shared).

Run: .venv/bin/python benchmarks/fuzz-findings/big_trace_read.py --spans 100000
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import fuzz_inputs as F  # noqa: E402
from running_collector import serve_config, start_collector  # noqa: E402


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spans", type=int, default=100_000, help="spans in the one trace")
    p.add_argument("--rss-cap-mb", type=float, default=8000)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="evalsi-big-trace-"))
    c = start_collector(tmp, serve_config(tmp / "store"))
    trace = bytes.fromhex("ff" * 16)
    try:
        otlp, api = c.http, c.api
        now = F.NOW
        with httpx.Client(timeout=600) as client:
            for start in range(0, args.spans, 100_000):
                n = min(100_000, args.spans - start)
                spans = b"".join(
                    F.f_bytes(
                        2,
                        F.f_bytes(1, trace)
                        + F.f_bytes(2, (start + i + 1).to_bytes(8, "big"))
                        + F.f_bytes(5, b"span")
                        + F.f_fixed64(7, now)
                        + F.f_fixed64(8, now + 1000),
                    )
                    for i in range(n)
                )
                body = F.f_bytes(1, F.f_bytes(2, spans))
                r = client.post(otlp + "/v1/traces", content=body, headers={"Content-Type": F.PROTOBUF})
                print(f"sent {start + n:,} spans: {r.status_code}")
            for _ in range(120):  # until stored
                got = client.get(api + "/api/v1/traces", params={"limit": 10}).json()["traces"]
                if sum(t["span_count"] for t in got if t["trace_id"] == trace.hex()) >= args.spans:
                    break
                time.sleep(1)
            before = rss_mb(c.proc.pid)
            peak = [before]
            done = threading.Event()

            def watch() -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], rss_mb(c.proc.pid))
                    if peak[0] > args.rss_cap_mb:
                        print(f"RSS past {args.rss_cap_mb:,.0f} MB: killing the collector")
                        c.proc.kill()
                        return
                    time.sleep(0.1)

            t = threading.Thread(target=watch, daemon=True)
            t.start()
            t0 = time.monotonic()
            try:
                r = client.get(f"{api}/api/v1/traces/{trace.hex()}")
                answer = f"{r.status_code}, {len(r.content):,} bytes"
            except httpx.HTTPError as e:
                answer = f"no answer ({type(e).__name__})"
            done.set()
            t.join(5)
            took = time.monotonic() - t0
            print(
                f"GET /api/v1/traces/{trace.hex()} ({args.spans:,} spans): {answer} in {took:.1f} s; collector RSS "
                f"{before:,.0f} MB before, {peak[0]:,.0f} MB at the peak "
                f"(+{(peak[0] - before) * 1024 / args.spans:.1f} KB a span)"
            )
        return 0
    finally:
        if c.proc.poll() is None:
            c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
