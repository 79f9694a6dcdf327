"""Store benchmark: CPU a span of the collector's store writes at a fixed offered rate, base against new.

The collector's half of the store path with pipeline workers: a `clickhouse` exporter on a fresh embedded (chDB)
store, handed span tables as the workers' store links send them (Arrow IPC, `write_rows`: one table per worker every
0.2 s, `--workers` of them) and, with `--scores-per-span`, score batches as the workers' evaluated traces bring them
(`consume_scores`), at `--rates` spans/s for `--seconds`. The tables are built once here (`benchmarks/ingest.py`'s
payloads, decoded, normalized and redacted as a worker does, then `to_arrow`) and every run offers the same bytes.

Each run is a child process importing `evalsi` from one checkout (`--source DIR` is the baseline, e.g. unpacked with
`git archive <rev> | tar -x -C DIR`; this checkout is the new), alternated `--rounds` times. It prints per run:

- CPU µs a span: the child's CPU (every thread, chDB's inserts and merges included) from the first offer until every
  span and score is stored and `--settle` seconds more (merges run behind the inserts), over the spans offered; and
  of it, by thread: Python's (the event loop and the insert threads' calls), chDB's query pool, chDB's merges;
- INSERTs a second (spans and scores, as the exporter calls them) and the rows an INSERT;
- merges a second and the active parts of the traces table at the end (chDB's `system.events`, `system.parts`);
- freshness: from a table's offer until its last row is stored, p50 / p95 / max (what a reader waits to see a span).

Then, per rate, the best CPU of each checkout and the ratio new / base. Nothing is lost: a run that does not store
every row it offered says so and the benchmark exits 1. Figures in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LINK_FLUSH = 0.2  # a worker's store link sends a table this often (`evalsi.collector.workers.link`)
POOL_SPANS = 20_000  # distinct spans built; the runs offer them round and round


def build_tables(path: Path, rows_per_table: int) -> None:
    """Write `POOL_SPANS` spans as Arrow IPC tables of `rows_per_table` rows, as a worker's store link makes them."""
    sys.path.insert(0, str(HERE))
    import ingest

    from evalsi.collector.builtin import load_builtin_components
    from evalsi.component import REGISTRY, Next, Settings
    from evalsi.exporters.clickhouse.rows import ArrowRows
    from evalsi.receivers.otlp.decode import TRACES, checking_codec, decode_encoded
    from evalsi.runtime.telemetry import SelfMetrics

    class Sink:
        mutates_data = False

        def __init__(self) -> None:
            self.spans: list[Any] = []

        async def consume(self, batch: Any) -> None:
            self.spans.extend(batch.spans)

    load_builtin_components()
    metrics, log = SelfMetrics(), logging.getLogger("store_insert")
    sink = Sink()
    redact_next, normalize_next = Next(), Next()
    redact_next.traces = sink
    factory = REGISTRY[("processor", "redact")]
    redact = factory.cls(factory.config(), Settings(id="redact", metrics=metrics, logger=log), redact_next)
    normalize_next.traces = redact
    factory = REGISTRY[("processor", "normalize")]
    normalize = factory.cls(factory.config(), Settings(id="normalize", metrics=metrics, logger=log), normalize_next)
    template = ingest.build_template(500, 1024, 1)
    payloads = ingest.build_payloads(template, POOL_SPANS // 500, 5, 12345, time.time_ns())
    codec = checking_codec(TRACES, 1)
    loop = asyncio.new_event_loop()
    for body in payloads:
        loop.run_until_complete(normalize.consume(decode_encoded(codec.from_protobuf(body).batch, (1, 1),
                                                                 metrics=metrics, log=log)))  # fmt: skip
    spans, rows = sink.spans, ArrowRows()
    with path.open("wb") as out:
        for i in range(0, len(spans) - rows_per_table + 1, rows_per_table):
            body, bad = rows.encode("spans", spans[i : i + rows_per_table])
            assert body is not None and not bad
            out.write(len(body).to_bytes(8, "little"))
            out.write(body)


def read_tables(path: Path) -> list[bytes]:
    data, bodies, i = path.read_bytes(), [], 0
    while i < len(data):
        n = int.from_bytes(data[i : i + 8], "little")
        bodies.append(data[i + 8 : i + 8 + n])
        i += 8 + n
    return bodies


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, by thread name (threads of one name summed)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path("/proc/self/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def status_mb(key: str) -> int:
    """A figure of this process's `/proc/self/status` in MB (`VmRSS`, `VmHWM`)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) >> 10
    raise KeyError(key)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def child(args: argparse.Namespace) -> int:
    """One run, in this process: the exporter of the checkout on `PYTHONPATH`; prints one JSON line."""
    from evalsi.component import Settings
    from evalsi.exporters.clickhouse import ClickHouseConfig, ClickHouseExporter
    from evalsi.exporters.clickhouse.store import TraceStore
    from evalsi.model.score import Score, ScoreBatch
    from evalsi.runtime.telemetry import SelfMetrics

    bodies = read_tables(Path(args.tables))
    rows_per_table = args.rows_per_table
    inserts: dict[str, list[tuple[float, int]]] = {"spans": [], "scores": []}
    insert_spans, insert_scores = TraceStore.insert_spans, TraceStore.insert_scores

    def counted_spans(self: Any, table: Any) -> None:
        insert_spans(self, table)
        inserts["spans"].append((time.monotonic(), table.num_rows))

    def counted_scores(self: Any, table: Any) -> None:
        insert_scores(self, table)
        inserts["scores"].append((time.monotonic(), table.num_rows))

    TraceStore.insert_spans = counted_spans  # type: ignore[method-assign]
    TraceStore.insert_scores = counted_scores  # type: ignore[method-assign]

    def stored(kind: str) -> int:
        return sum(n for _, n in inserts[kind])

    async def run() -> dict[str, Any]:
        config = ClickHouseConfig(endpoint=f"chdb://{args.store}")
        exporter = ClickHouseExporter(config, Settings(id="clickhouse", metrics=SelfMetrics(),
                                                       logger=logging.getLogger("store_insert")))  # fmt: skip
        await exporter.start()
        store = exporter.store
        assert store is not None

        def events() -> dict[str, int]:
            rows = store.backend.query(
                "SELECT event, value FROM system.events WHERE event IN ('Merge', 'MergedRows', 'InsertQuery')"
            )
            return {r["event"]: int(r["value"]) for r in rows}

        before, threads_before = events(), thread_cpu()
        idle_rss = status_mb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here: the peak of the load, not of start-up
        # the scores the workers' evaluated traces bring, made before the clock starts (the collector gets them
        # from its workers' pipes; making them is not the store's work)
        pool = [Score(f"s{j % 3}", value=0.5, trace_id=f"{j // 3:032x}", policy="bench", evaluator="e")
                for j in range(int(rows_per_table * args.scores_per_span) + 1)]  # fmt: skip
        tables_per_s = args.rate / rows_per_table
        n_tables = int(args.seconds * tables_per_s)
        scores_due = 0.0
        offered: list[tuple[float, int]] = []  # (offered at, rows)
        scores_offered = 0
        cpu0, t0 = time.process_time(), time.monotonic()
        for i in range(n_tables):
            at = t0 + i / tables_per_s
            if (wait := at - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            now = time.monotonic()
            exporter.write_rows("spans", bodies[i % len(bodies)], now)
            offered.append((now, rows_per_table))
            scores_due += rows_per_table * args.scores_per_span
            if scores_due >= 1:
                n, scores_due = int(scores_due), scores_due - int(scores_due)
                await exporter.consume_scores(ScoreBatch(pool[:n]))
                scores_offered += n
        offer_s = time.monotonic() - t0
        spans = n_tables * rows_per_table
        deadline = time.monotonic() + 60
        while (stored("spans") < spans or stored("scores") < scores_offered) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stored_at = time.monotonic()
        await asyncio.sleep(args.settle)
        cpu = time.process_time() - cpu0
        peak_rss = status_mb("VmHWM")
        after, threads_after = events(), thread_cpu()
        active = f"SELECT count() AS n FROM system.parts WHERE active AND table = '{store.table}'"
        parts = store.backend.query(active)[0]["n"]
        await exporter.shutdown()
        # freshness: a table is visible once the insert holding its last row returned
        done, latencies, cum_offered = inserts["spans"], [], 0
        k, cum_stored = 0, 0
        for at, n in offered:
            cum_offered += n
            while k < len(done) and cum_stored < cum_offered:
                cum_stored += done[k][1]
                k += 1
            if cum_stored >= cum_offered:
                latencies.append(done[k - 1][0] - at)
        wall = stored_at - t0
        n_inserts = len(inserts["spans"]) + len(inserts["scores"])
        return {
            "spans": spans,
            "stored": stored("spans"),
            "scores": scores_offered,
            "scores_stored": stored("scores"),
            "offer_s": offer_s,
            "cpu_s": cpu,
            "cpu_us_span": 1e6 * cpu / spans,
            "inserts": n_inserts,
            "inserts_per_s": n_inserts / wall,
            "rows_per_insert": (spans + scores_offered) / max(1, n_inserts),
            "merges_per_s": (after.get("Merge", 0) - before.get("Merge", 0)) / (wall + args.settle),
            "parts": int(parts),
            "fresh_p50": percentile(latencies, 0.5),
            "fresh_p95": percentile(latencies, 0.95),
            "fresh_max": max(latencies, default=0.0),
            "idle_rss": idle_rss,
            "peak_rss": peak_rss,
            "threads": {
                name: round(cpu_s - threads_before.get(name, 0.0), 2)
                for name, cpu_s in sorted(threads_after.items(), key=lambda kv: -kv[1])
                if cpu_s - threads_before.get(name, 0.0) >= 0.01
            },
        }

    print(json.dumps(asyncio.run(run())))
    return 0


def run_child(checkout: Path, args: argparse.Namespace, rate: int, tables: Path, rows_per_table: int) -> dict[str, Any]:
    store = Path(tempfile.mkdtemp(prefix="store-insert-"))
    try:
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        cmd = [sys.executable, __file__, "--child", "--rate", str(rate), "--seconds", str(args.seconds),
               "--settle", str(args.settle), "--scores-per-span", str(args.scores_per_span), "--tables", str(tables),
               "--rows-per-table", str(rows_per_table), "--store", str(store / "data")]  # fmt: skip
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=str(store))
        if out.returncode != 0:
            sys.stderr.write(out.stderr)
            raise SystemExit(f"the run from {checkout} failed ({out.returncode})")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(store, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", help="the baseline checkout (its `evalsi` is imported by the base runs)")
    p.add_argument("--rates", type=int, nargs="+", default=[10_000, 20_000], help="offered spans/s")
    p.add_argument("--seconds", type=float, default=20.0, help="how long each run offers")
    p.add_argument("--settle", type=float, default=3.0, help="seconds counted after the last row is stored")
    p.add_argument("--workers", type=int, default=2, help="pipeline workers whose tables are offered")
    p.add_argument("--scores-per-span", type=float, default=0.6, help="scores offered a span (0: none)")
    p.add_argument("--rounds", type=int, default=2, help="base and new alternated this many times per rate")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rate", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tables", help=argparse.SUPPRESS)
    p.add_argument("--rows-per-table", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    sys.path.insert(0, str(ROOT))
    checkouts = [("base", Path(args.source).resolve())] if args.source else []
    checkouts.append(("new", ROOT))
    failed = False
    with tempfile.TemporaryDirectory(prefix="store-insert-tables-") as tmp:
        for rate in args.rates:
            rows_per_table = max(1, min(4_000, round(rate / args.workers * LINK_FLUSH)))
            tables = Path(tmp) / f"tables-{rows_per_table}.arrows"
            if not tables.exists():
                build_tables(tables, rows_per_table)
            print(
                f"\n{rate:,} spans/s offered for {args.seconds:g} s: {args.workers} workers' tables of "
                f"{rows_per_table:,} rows every {LINK_FLUSH:g} s, {args.scores_per_span:g} scores a span"
            )
            print(f"  {'run':5s} {'CPU µs/span':>11s} (Python / chDB queries / merges) {'INSERT/s':>9s} "
                  f"{'rows/INSERT':>11s} {'merges/s':>8s} {'parts':>5s}  freshness p50 / p95 / max (s)"
                  "  RSS MB idle / peak")  # fmt: skip
            best: dict[str, float] = {}
            for _ in range(args.rounds):
                for name, checkout in checkouts:
                    r = run_child(checkout, args, rate, tables, rows_per_table)
                    if r["stored"] < r["spans"] or r["scores_stored"] < r["scores"]:
                        failed = True
                        print(f"  {name}: LOST {r['spans'] - r['stored']} spans, "
                              f"{r['scores'] - r['scores_stored']} scores")  # fmt: skip
                    best[name] = min(best.get(name, float("inf")), r["cpu_us_span"])
                    threads = r["threads"]
                    split = [1e6 * threads.get(t, 0.0) / r["spans"] for t in ("python", "ThreadPool", "MergeMutate")]
                    print(
                        f"  {name:5s} {r['cpu_us_span']:11.1f} ({split[0]:4.1f} / {split[1]:4.1f} / {split[2]:4.1f})"
                        f"{'':16s}{r['inserts_per_s']:9.1f} "
                        f"{r['rows_per_insert']:11,.0f} {r['merges_per_s']:8.2f} {r['parts']:5d}  "
                        f"{r['fresh_p50']:.2f} / {r['fresh_p95']:.2f} / {r['fresh_max']:.2f}  "
                        f"{r['idle_rss']} / {r['peak_rss']}"
                    )
            summary = ", ".join(f"{name} {v:.1f}" for name, v in best.items())
            ratio = f"; new / base {best['new'] / best['base']:.2f}" if "base" in best else ""
            print(f"  best CPU µs a span: {summary}{ratio}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
