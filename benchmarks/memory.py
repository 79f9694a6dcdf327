"""What each process of a real `evalsi serve` holds, idle and under load: RSS, and where Python objects sit.

The pipeline of `benchmarks/pipeline.py` (normalize, redact, probabilistic_sampler, tail_sampling, evaluate, the
embedded store, scores to the store and Prometheus) with its payloads, with a `sitecustomize` on `PYTHONPATH` that
has the collector process trace its Python allocations (tracemalloc) from start-up, each pipeline worker from when
it is ready (tracing its start-up too would pass the workers' start timeout), and every process write a snapshot's
top sites when sent SIGUSR2 (so a worker's figures are what it allocated since it was ready and still holds).
Snapshots are taken idle (after start), under load (once half the spans are stored) and idle again after
everything is stored and evaluated. RSS is read from /proc at each point, and the peak (VmHWM) at the end; RSS
minus what tracemalloc traces is native memory: chDB, Arrow buffers, upb arenas, the interpreter and its modules.

tracemalloc slows every allocation (about 2x CPU): this script is for where memory goes, not for speed.
Run `python benchmarks/memory.py --help`; figures in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ingest  # noqa: E402
import pipeline  # noqa: E402
from ingest import metric_sum, send_all  # noqa: E402
from running_collector import start_collector  # noqa: E402

SITE = """
import os, signal, sys, tracemalloc
if "--multiprocessing-fork" not in sys.argv:
    tracemalloc.start()  # the collector: from start-up
signal.signal(signal.SIGUSR1, lambda signum, frame: tracemalloc.is_tracing() or tracemalloc.start())
def _dump(signum, frame):
    if not tracemalloc.is_tracing():
        return
    snap = tracemalloc.take_snapshot()
    current, peak = tracemalloc.get_traced_memory()
    by_line = snap.statistics("lineno")
    by_file = snap.statistics("filename")
    out = {"current": current, "peak": peak,
           "lines": [(str(s.traceback[0]), s.size, s.count) for s in by_line[:TOP]],
           "files": [(str(s.traceback[0].filename), s.size, s.count) for s in by_file[:TOP]]}
    label = open(os.path.join(OUT, "label")).read().strip()
    with open(os.path.join(OUT, f"{os.getpid()}-{label}.json"), "w") as f:
        import json
        json.dump(out, f)
signal.signal(signal.SIGUSR2, _dump)
"""


def rss_mb(pid: int, field: str = "VmRSS:") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return 0.0


def snapshot(pids: dict[str, int], out: Path, label: str, wait: float = 60.0) -> dict[str, Any]:
    """Have every process write its top sites; wait for the files."""
    (out / "label").write_text(label)
    rss = {name: round(rss_mb(pid), 1) for name, pid in pids.items()}
    for pid in pids.values():
        os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + wait
    files = {name: out / f"{pid}-{label}.json" for name, pid in pids.items()}
    while time.monotonic() < deadline and not all(f.exists() for f in files.values()):
        time.sleep(0.2)
    time.sleep(0.5)
    return {"rss_mb": rss, "python": {n: json.loads(f.read_text()) for n, f in files.items() if f.exists()}}


def stop(c: Any) -> None:
    """SIGTERM, sent again while the collector runs: a snapshot taken in a signal handler can hold the main thread
    long enough for the event loop's signal wake-up pipe to overflow, which loses the first SIGTERM."""
    for _ in range(10):
        c.proc.send_signal(signal.SIGTERM)
        try:
            c.proc.wait(30)
            return
        except subprocess.TimeoutExpired:
            continue
    c.proc.kill()


def short(site: str) -> str:
    for marker in ("/site-packages/", "/evalsi/", "/lib/python3"):
        if marker in site:
            return ("evalsi/" if marker == "/evalsi/" else "") + site.split(marker, 1)[1]
    return site


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spans", type=int, default=100_000)
    p.add_argument("--spans-per-request", type=int, default=500)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--top", type=int, default=12, help="sites listed per process and snapshot")
    p.add_argument("--source", help="run the collector from this checkout")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="evalsi-memory-"))
    site, out = workdir / "site", workdir / "snapshots"
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(f"OUT = {str(out)!r}\nTOP = {args.top}\n" + SITE)
    (workdir / "policies").mkdir()
    (workdir / "policies" / "bench.yaml").write_text(pipeline.POLICY)
    cfg = pipeline.config_for(workdir / "store", args.workers, workdir / "policies")
    template = ingest.build_template(args.spans_per_request, 1024, 1)
    payloads = ingest.build_payloads(template, args.spans // args.spans_per_request, 5,
                                     random.Random(1).getrandbits(31) | 1, time.time_ns())  # fmt: skip
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH",)}
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(site), args.source, saved["PYTHONPATH"]) if x)
    report: dict[str, Any] = {}
    try:
        c = start_collector(workdir, cfg, timeout=300)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    pids = {"collector": c.proc.pid, **{f"worker {i}": pid for i, pid in enumerate(c.ready.get("workers", []))}}
    try:
        for name, pid in pids.items():
            if name != "collector":
                os.kill(pid, signal.SIGUSR1)  # workers trace from now on
        time.sleep(3)
        report["idle after start"] = snapshot(pids, out, "idle")
        result: dict[str, Any] = {}
        sender = threading.Thread(
            target=lambda: result.setdefault("sent", send_all("http", c, payloads, args.spans_per_request, 8))
        )
        sender.start()
        total = len(payloads) * args.spans_per_request
        with httpx.Client(timeout=10) as client:
            while metric_sum(client.get(c.metrics).text, "otelcol_exporter_sent_spans_total") < total / 2:
                time.sleep(0.2)
            report["under load (half stored)"] = snapshot(pids, out, "load")
            sender.join()
            traces = total // 5
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                text = client.get(c.metrics).text
                done = sum(metric_sum(text, m) for m in pipeline.FINISHED)
                if metric_sum(text, "otelcol_exporter_sent_spans_total") >= total and done >= traces:
                    break
                time.sleep(0.5)
        time.sleep(3)
        report["idle after load"] = snapshot(pids, out, "after")
        report["peak rss_mb"] = {n: round(rss_mb(pid, "VmHWM:"), 1) for n, pid in pids.items()}
    finally:
        stop(c)
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for label, snap in report.items():
        if label == "peak rss_mb":
            print(f"\npeak RSS MB: {snap}")
            continue
        print(f"\n== {label}: RSS MB {snap['rss_mb']}")
        for name, py in snap["python"].items():
            print(f"  {name}: Python objects {py['current'] / 2**20:.1f} MB traced (peak {py['peak'] / 2**20:.1f}), "
                  f"native and the rest {snap['rss_mb'][name] - py['current'] / 2**20:.0f} MB")  # fmt: skip
            for f, size, count in py["files"][: args.top]:
                print(f"    {size / 2**20:8.1f} MB {count:9,} objects  {short(f)}")
            print("    top lines:")
            for line, size, count in py["lines"][: args.top]:
                print(f"    {size / 2**20:8.1f} MB {count:9,} objects  {short(line)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
