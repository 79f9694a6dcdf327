"""Store-evaluated windows benchmark (`windows.scope: store`): what reading every policy's window from the store costs
per replica, at 1, 2 and 3 replicas polling one ClickHouse.

The store is filled with one window of scores per policy (`--scores` per policy, three score names each, as a policy
with a three-stage cascade writes them), in the current window. Then 1, 2 and 3 "replicas" (processes, each with the
`StoreWindows` an `evalsi serve` runs, and its own clickhouse-connect client) poll every `--interval` for
`--seconds`, as `evaluate` does. Printed per replica count: polls and queries a second over all replicas, a query's
latency p50/p95 as the replicas saw it, and the ClickHouse process's CPU per query (the stand-in's, when it is the
stand-in); and the ratios against one replica in the same run.

The ClickHouse is `tests/clickhouse_http.py` (chDB behind ClickHouse's HTTP interface, one query at a time) unless
`--url` names a real server. Run `python benchmarks/store_windows.py --help`; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from evalsi.exporters.clickhouse.backend import open_backend  # noqa: E402
from evalsi.exporters.clickhouse.store import TraceStore  # noqa: E402
from evalsi.model.score import Score  # noqa: E402
from evalsi.policies.conditions import compile_alert  # noqa: E402
from evalsi.policies.store_window import StoreWindows  # noqa: E402

WINDOW = 3600.0


def fill(url: str, database: str, policies: int, per_policy: int) -> None:
    store = TraceStore(open_backend(url, database=database))
    store.create_schema()
    rng = random.Random(0)
    start = (time.time() // WINDOW) * WINDOW
    for p in range(policies):
        batch: list[Score] = []
        for i in range(per_policy // 3):
            trace = f"{p:04x}{i:028x}"
            stamp = int((start + rng.uniform(0, min(WINDOW, time.time() - start))) * 1e9)
            common: dict[str, Any] = dict(trace_id=trace, policy=f"policy-{p}", timestamp_unix_nano=stamp)
            value = rng.random()
            batch += [
                Score(name="relevance", evaluator="judge/relevance", value=value, passed=value > 0.2, **common),
                Score(name="latency", evaluator="builtin/latency", value=rng.lognormvariate(6, 1), **common),
                Score(name="pii-leak", evaluator="builtin/pii-leak", passed=rng.random() > 0.01, **common),
            ]
            if len(batch) >= 30_000:
                store.write_scores(batch)
                batch = []
        store.write_scores(batch)
    store.close()


def replica(url: str, database: str, policies: int, interval: float, seconds: float, out: Any) -> None:
    store = TraceStore(open_backend(url, database=database, create=False))
    windows = StoreWindows(settle=0)
    rule = compile_alert("count >= 100 && rate('pii-leak') < 0.99", name="pii")
    windows.use({f"policy-{p}": (WINDOW, [rule], {}) for p in range(policies)})
    latencies: list[float] = []

    def timed(policy: str, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        rows = store.policy_window(policy, start_ns, end_ns)
        latencies.append(time.perf_counter() - t0)
        return rows

    deadline = time.monotonic() + seconds
    polls = 0
    next_at = time.monotonic()
    while time.monotonic() < deadline:
        windows.poll(time.time(), timed)
        polls += 1
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    store.close()
    out.put((polls, latencies))


def run(url: str, database: str, n: int, args: argparse.Namespace, server: psutil.Process | None) -> dict[str, Any]:
    out: multiprocessing.Queue[Any] = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=replica, args=(url, database, args.policies, args.interval, args.seconds,
                                                           out)) for _ in range(n)]  # fmt: skip
    cpu0 = sum(server.cpu_times()[:2]) if server else 0.0
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    wall = time.monotonic() - t0
    cpu = sum(server.cpu_times()[:2]) - cpu0 if server else float("nan")
    latencies = sorted(x for _, lat in results for x in lat)
    queries = len(latencies)
    return {
        "replicas": n, "polls_per_s": sum(p for p, _ in results) / wall, "queries_per_s": queries / wall,
        "p50_ms": statistics.median(latencies) * 1e3, "p95_ms": latencies[int(0.95 * (queries - 1))] * 1e3,
        "server_cpu_ms_per_query": cpu / queries * 1e3 if queries else float("nan"),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a real ClickHouse (http://user:password@host:8123); default: the stand-in")
    parser.add_argument("--policies", type=int, default=2, help="policies each replica polls (default 2)")
    parser.add_argument("--scores", type=int, default=60_000, help="scores per policy in the window")
    parser.add_argument("--interval", type=float, default=0.5, help="poll interval in s (default 0.5; evalsi: 5)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each replica count polls (default 20)")
    args = parser.parse_args()
    database = f"bench_windows_{uuid.uuid4().hex[:8]}"
    stand_in = None
    server: psutil.Process | None = None
    if args.url:
        url = args.url
    else:
        from clickhouse_http import start_stand_in

        stand_in = start_stand_in(Path(tempfile.mkdtemp()) / "clickhouse")
        url = stand_in.url
        server = psutil.Process(stand_in.proc.pid)
    try:
        t0 = time.monotonic()
        fill(url, database, args.policies, args.scores)
        print(f"filled {args.policies} policies x {args.scores} scores in {time.monotonic() - t0:.1f} s", flush=True)
        rows = [run(url, database, n, args, server) for n in (1, 2, 3)]
    finally:
        if stand_in is not None:
            stand_in.stop()
    base = rows[0]
    print(f"{'replicas':>8} {'polls/s':>8} {'queries/s':>10} {'p50 ms':>8} {'p95 ms':>8} {'server CPU ms/query':>20}"
          f" {'p50 vs 1':>9} {'queries/s vs 1':>15}")  # fmt: skip
    for r in rows:
        print(f"{r['replicas']:>8} {r['polls_per_s']:>8.2f} {r['queries_per_s']:>10.2f} {r['p50_ms']:>8.1f}"
              f" {r['p95_ms']:>8.1f} {r['server_cpu_ms_per_query']:>20.1f} {r['p50_ms'] / base['p50_ms']:>9.2f}"
              f" {r['queries_per_s'] / base['queries_per_s']:>15.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
