"""The cost of the state replicas share through the store (`replicas:`), at 1, 2 and 3 replicas: each replica is a
thread with its own client of one ClickHouse (the chDB-backed HTTP stand-in in its own process, or a real server with
`--url`), as replicas of `evalsi serve` would be.

    .venv/bin/python benchmarks/replicas.py                       # the stand-in, 1-3 replicas
    .venv/bin/python benchmarks/replicas.py --calls 4000 --sessions 60

Judge ledger: the replicas spend one budget of `--calls` judge calls (no judge: `reserve` only) until each is
refused. Printed: claims and ledger writes, a claim's latency (its read and its write, p50/p95), and CPU µs per
reservation against `LocalLedger`'s in the same run (the single-machine default). The writes a deployment makes per
second are its claims (a few per budget period and replica) plus one flush a second per replica whose spend changed.

Sessions: `--sessions` ten-turn sessions whose turns are spread over the replicas (stored and noted by the replica
that received them), then one tick of every replica once they are quiet. Printed: the activity write per tick, the
quiet-sessions query per tick (every replica makes one a tick), and per evaluated session the latency the store adds
to its evaluation (its spans read, plus its evaluated record), beyond the `session_timeout` it waits anyway.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clickhouse_http import start_stand_in  # noqa: E402

from evalsi.component import Settings  # noqa: E402
from evalsi.evaluators.judge_client import LocalLedger  # noqa: E402
from evalsi.evaluators.shared_ledger import SharedLedger  # noqa: E402
from evalsi.exporters.clickhouse.backend import open_backend  # noqa: E402
from evalsi.exporters.clickhouse.store import TraceStore  # noqa: E402
from evalsi.model.span import Span  # noqa: E402
from evalsi.processors.evaluate.owned_sessions import OwnedSessions  # noqa: E402
from evalsi.replicas import Membership, ReplicasConfig  # noqa: E402
from evalsi.runtime.telemetry import SelfMetrics  # noqa: E402

NAMES = ("r0", "r1", "r2")


class Timed:
    """A store whose calls are timed, by method."""

    def __init__(self, store: TraceStore) -> None:
        self.store = store
        self.times: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.store, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.times.setdefault(name, []).append(time.perf_counter() - t0)

        return timed


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
    return f"{statistics.median(values) * 1e3:.1f} / {p95 * 1e3:.1f}"


def _open(url: str, database: str) -> TraceStore:
    store = TraceStore(open_backend(url, database=database))
    store.create_schema()
    return store


def _parallel(fns: list[Callable[[], None]]) -> float:
    threads = [threading.Thread(target=f) for f in fns]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def ledger_run(url: str, database: str, n: int, calls: int, show: bool = True) -> None:
    stores = [Timed(_open(url, database)) for _ in range(n)]
    budget = f"bench-{uuid.uuid4().hex[:6]}#0"
    ledgers = [
        SharedLedger(lambda s=s: s, project="default", replica=NAMES[i], replicas=lambda: n, budget_slice=0.25)  # type: ignore[misc]
        for i, s in enumerate(stores)
    ]
    made = [0] * n
    cpu = [0.0] * n

    def replica(i: int) -> None:
        t0 = time.thread_time()
        while ledgers[i].reserve((budget, 1), calls, None, None):
            made[i] += 1
        ledgers[i].flush()
        cpu[i] = time.thread_time() - t0

    wall = _parallel([lambda i=i: replica(i) for i in range(n)])
    local = LocalLedger()
    t0 = time.thread_time()
    while local.reserve((budget, 1), calls, None, None):
        pass
    local_us = (time.thread_time() - t0) / calls * 1e6
    claims = sum(ledger.claims for ledger in ledgers)
    writes = sum(ledger.writes for ledger in ledgers)
    reads = [t for s in stores for t in s.times.get("judge_ledger", [])]
    written = [t for s in stores for t in s.times.get("write_judge_ledger", [])]
    shared_us = sum(cpu) / sum(made) * 1e6
    if not show:
        return
    print(
        f"ledger  replicas={n}  calls made={sum(made)} (budget {calls}, over by {sum(made) - calls})  "
        f"claims={claims}  writes={writes}  read ms p50/p95={_ms(reads)}  write ms p50/p95={_ms(written)}  "
        f"wall={wall:.2f}s  CPU µs/reservation shared={shared_us:.1f} local={local_us:.2f} "
        f"(x{shared_us / local_us:.0f})"
    )
    for s in stores:
        s.store.close()


def _turn(session: str, n: int, t0: int) -> list[Span]:
    trace = uuid.uuid4().hex
    root = Span(trace, uuid.uuid4().hex[:16], "", "chat", "SERVER", t0 + n * 10**9, t0 + n * 10**9 + 5 * 10**8)
    root.session_id = session
    return [root]


def sessions_run(url: str, database: str, n: int, sessions: int) -> None:
    stores = [Timed(_open(url, database)) for _ in range(n)]
    settings = Settings(id="evaluate", metrics=SelfMetrics(), logger=__import__("logging").getLogger("bench"))
    evaluated: list[int] = []
    owners = []
    for i, store in enumerate(stores):
        config = ReplicasConfig.model_validate({"self": NAMES[i], "static": list(NAMES[:n]), "session_timeout": 10})

        def evaluate(spans: list[Span], done: Callable[[], None]) -> None:
            evaluated.append(len(spans))
            done()

        owners.append(OwnedSessions(config, Membership(config), lambda s=store: s, evaluate, settings))  # type: ignore[misc]
    t0 = time.time_ns()
    tag = uuid.uuid4().hex[:6]
    for k in range(sessions):
        for turn in range(10):
            spans = _turn(f"bench-{tag}-{k}", turn, t0)
            stores[turn % n].store.write(spans)
            owners[turn % n].note(spans)
    for o in owners:
        o.flush()  # the activity each replica writes (one write a tick)
    later = time.time_ns() + 11 * 10**9
    wall = _parallel([lambda o=o: (o.tick(now_ns=later), o.flush()) and None for o in owners])  # type: ignore[func-returns-value]
    spans_read = [t for s in stores for t in s.times.get("session_spans", [])]
    quiet = [t for s in stores for t in s.times.get("quiet_sessions", [])]
    notes = [t for s in stores for t in s.times.get("note_sessions", [])]
    marks = [t for s in stores for t in s.times.get("mark_sessions_evaluated", [])]
    per_session = statistics.median(spans_read) + statistics.median(marks) / max(1, len(evaluated) / n)
    print(
        f"sessions replicas={n}  evaluated={len(evaluated)} of {sessions} (turns each: {set(evaluated)})  "
        f"activity write ms p50/p95={_ms(notes)}  quiet query ms p50/p95={_ms(quiet)}  "
        f"spans read ms p50/p95={_ms(spans_read)}  added latency/session ≈ {per_session * 1e3:.1f} ms  "
        f"tick wall={wall:.2f}s"
    )
    for s in stores:
        s.store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="", help="a ClickHouse server (default: the stand-in in its own process)")
    parser.add_argument("--calls", type=int, default=2000, help="the judge budget, in calls")
    parser.add_argument("--sessions", type=int, default=30)
    args = parser.parse_args()
    stand_in = None
    url = args.url
    if not url:
        stand_in = start_stand_in(Path(tempfile.mkdtemp()) / "clickhouse")
        url = stand_in.url
    try:
        database = f"evalsi_bench_{uuid.uuid4().hex[:6]}"
        ledger_run(url, database, 1, 100, show=False)  # warm up: the client's first queries and inserts load code
        for n in (1, 2, 3):
            ledger_run(url, database, n, args.calls)
        for n in (1, 2, 3):
            sessions_run(url, database, n, args.sessions)
    finally:
        if stand_in is not None:
            stand_in.stop()


if __name__ == "__main__":
    main()
