"""What the embedded store's background merges hold while they run: `pipeline.py`'s spans inserted into a fresh
chDB store, each merge of the traces table with the memory it held (`system.merges.memory_usage`) and its algorithm,
and the process's peak.

    .venv/bin/python benchmarks/merge_memory.py [--rows 6000] [--inserts 24] [--settings current earlier]

`--settings` names the traces table's MergeTree settings, one run each (a child process) in the order given:
`current` is the embedded store's (`EMBEDDED_TABLE_SETTINGS`), `earlier` the same before merges went column by
column (Compact parts below 128 MiB, ClickHouse's default `vertical_merge_algorithm_min_rows_to_activate`). Each run
inserts the same Arrow table of `--rows` spans `--inserts` times, 0.3 s apart, as the store's exporter does, then
waits until no merge runs. It prints each merge seen (algorithm, parts, rows, uncompressed MB, the most memory it
held), the peak of the process's anonymous memory over its level before the first insert, and the CPU µs a row of
the inserts and merges together. Figures in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EARLIER = {"min_bytes_for_wide_part": 128 << 20, "vertical_merge_algorithm_min_rows_to_activate": 131072}
"""The settings `earlier` changes: ClickHouse's own default for the vertical merges, and the Compact limit before."""


def _anonymous_mb() -> float:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(kind: str, rows: int, inserts: int) -> dict[str, Any]:
    """One run in this process: the figures as a dict."""
    sys.path.insert(0, str(HERE))
    import ingest

    from evalsi.exporters.clickhouse.backend import ChdbBackend
    from evalsi.exporters.clickhouse.rows import to_arrow
    from evalsi.exporters.clickhouse.schema import EMBEDDED_TABLE_SETTINGS, insert_sql, settings_clause, traces_ddl
    from evalsi.processors.normalize import normalize_span
    from evalsi.receivers.otlp.decode_protobuf import decode_traces_protobuf

    settings = dict(EMBEDDED_TABLE_SETTINGS)
    if kind == "earlier":
        settings.update(EARLIER)
    template = ingest.build_template(500, 1000, 5)  # pipeline.py's spans: 500 a request, ~1 KB of messages, 5 a trace
    payloads = ingest.build_payloads(template, max(1, rows // 500), 4, 7, 1_700_000_000 * 10**9)
    spans = []
    for body in payloads:
        decoded = decode_traces_protobuf(body).batch.spans
        for span in decoded:
            normalize_span(span)
        spans.extend(decoded)
    table = to_arrow(spans)
    backend = ChdbBackend(tempfile.mkdtemp(prefix="evalsi-merge-memory-") + "/store")
    for statement in traces_ddl("otel_traces", settings_clause(settings)):
        backend.command(statement)
    sql = insert_sql("otel_traces", table.schema, "Python(batch)")
    merges: dict[str, dict[str, Any]] = {}
    peak = [0.0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _anonymous_mb())

    start = _anonymous_mb()
    threading.Thread(target=watch, daemon=True).start()
    cpu0 = time.process_time()
    merges_sql = (
        "SELECT result_part_name AS part, merge_algorithm AS algorithm, num_parts AS parts, rows_read AS rows_read, "
        "total_size_bytes_uncompressed AS bytes, memory_usage AS memory FROM system.merges WHERE table = 'otel_traces'"
    )

    def look() -> int:
        found = backend.query(merges_sql)
        for m in found:
            seen = merges.setdefault(m["part"], {**m, "memory": 0})
            seen["memory"] = max(seen["memory"], int(m["memory"]))
            seen["rows_read"] = max(int(seen["rows_read"]), int(m["rows_read"]))
            if m["algorithm"] != "Undecided":
                seen["algorithm"] = m["algorithm"]
        return len(found)

    for _ in range(inserts):
        batch = table  # noqa: F841 - chDB's Python() table function finds the table by this local name
        backend._session.query(sql)  # as ChdbBackend.insert, without its lock and pandas guard: one thread here
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            look()
            time.sleep(0.05)
    while look():
        time.sleep(0.05)
    cpu = time.process_time() - cpu0
    done.set()
    backend.close()
    return {
        "settings": kind,
        "merges": sorted(merges.values(), key=lambda m: m["part"]),
        "peak_over_start_mb": round(peak[0] - start, 1),
        "cpu_us_a_row": round(1e6 * cpu / (rows * inserts), 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=6000, help="spans an insert (~3.2 KB of Arrow each)")
    ap.add_argument("--inserts", type=int, default=24)
    ap.add_argument("--settings", nargs="+", choices=("current", "earlier"), default=["current", "earlier"])
    ap.add_argument("--child", choices=("current", "earlier"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run(args.child, args.rows, args.inserts)))
        return 0
    for kind in args.settings:
        out = subprocess.run(
            [sys.executable, __file__, "--child", kind, "--rows", str(args.rows), "--inserts", str(args.inserts)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        res = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{kind}: {args.inserts} inserts of {args.rows:,} spans")
        for m in res["merges"]:
            print(f"  merge {m['part']}: {m['algorithm']}, {m['parts']} parts, {int(m['rows_read']):,} rows read, "
                  f"{int(m['bytes']) / 1e6:,.0f} MB uncompressed, held up to {m['memory'] / 1e6:,.0f} MB")  # fmt: skip
        print(f"  peak anonymous memory over the start: {res['peak_over_start_mb']:,.0f} MB; "
              f"CPU {res['cpu_us_a_row']} µs a row (inserts and merges)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
