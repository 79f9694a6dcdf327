"""Who holds each process's memory at its peak under `benchmarks/pipeline.py`'s load: RSS by kind and by holder.

The pipeline, payloads and load of `benchmarks/memory.py` (normalize, redact, probabilistic_sampler, tail_sampling
with decision_wait 1 s, evaluate, the embedded store), with a `sitecustomize` on `PYTHONPATH` that starts a thread
in the collector and in each pipeline worker reading, every `--every` seconds:

- RSS, and of it the anonymous and the file-backed part (`/proc/self/status`; the embedded store's library is
  file-backed);
- glibc's heap: in use, free, and in blocks mapped on their own (`mallinfo2`); Python's allocated blocks
  (`sys.getallocatedblocks`, ~60 a decoded span); pyarrow's pool (what Arrow columns and IPC buffers hold);
- what the pipeline holds: spans in tail_sampling's buffer and outbox, traces in evaluate's queue, spans in a
  worker's store link, rows queued for the store in the collector (found once by type among the live objects).

No tracemalloc, so the figures are those of a normal run (a few % more CPU). What is neither glibc's, Python's nor
Arrow's in a process's anonymous memory is chDB's own allocator (jemalloc, inside the engine) in the collector, and
upb's arenas and the interpreter's own in a worker. It prints, per process, the reading at its RSS peak, the peak
of each figure over the run, and the reading after the load.
Run `python benchmarks/memory_holders.py --help`.
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
import ctypes, json, os, sys, threading, time

class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]

HOLDERS = ("TailSampling", "EvaluationQueue", "StoreLink", "ClickHouseExporter")

def _reading(holders):
    r = {"t": time.time()}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile"):
            r[k] = int(v.split()[0]) >> 10
    try:
        f = ctypes.CDLL(None).mallinfo2
        f.restype = _Mallinfo2
        m = f()
        r.update(glibc_in_use=m.uordblks >> 20, glibc_free=m.fordblks >> 20, glibc_mapped=m.hblkhd >> 20)
    except (OSError, AttributeError):
        pass
    r["python_blocks"] = sys.getallocatedblocks()
    pa = sys.modules.get("pyarrow")
    if pa is not None and hasattr(pa, "default_memory_pool"):
        r["arrow"] = pa.default_memory_pool().bytes_allocated() >> 20
    for name, o in holders.items():
        try:
            if name == "TailSampling":
                r["tail_sampling_buffer_spans"] = sum(len(t.spans) for t in list(o._buffer.traces.values()))
                r["tail_sampling_outbox_spans"] = o._outbox_spans
            elif name == "EvaluationQueue":
                r["evaluate_queue_traces"] = o.waiting
            elif name == "StoreLink":
                r["store_link_spans"] = len(o._spans)
            elif name == "ClickHouseExporter":
                r["store_queue_rows"] = o._queue.held
        except (AttributeError, RuntimeError):
            pass
    return r

def _look(holders):
    import gc
    frozen = gc.get_freeze_count()
    if frozen:  # a worker froze its start-up objects (evalsi.collector.heap.tune_gc): look there too
        gc.unfreeze()
    try:
        for o in gc.get_objects():
            if type(o).__name__ in HOLDERS:
                holders[type(o).__name__] = o
    finally:
        if frozen:
            gc.freeze()

def _run():
    role = "worker" if "--multiprocessing-fork" in sys.argv else "collector"
    holders, looked, wanted = {}, 0.0, 3 if role == "worker" else 2
    with open(os.path.join(OUT, f"{role}-{os.getpid()}.jsonl"), "w") as out:
        while True:
            time.sleep(EVERY)
            try:
                if len(holders) < wanted and time.time() - looked > 1:
                    looked = time.time()
                    _look(holders)
                reading = _reading(holders)
            except Exception as e:
                reading = {"error": repr(e)}
            out.write(json.dumps(reading) + "\\n")
            out.flush()

if sys.argv[:1] != ["-c"] or "--multiprocessing-fork" in sys.argv:  # not multiprocessing's resource tracker
    threading.Thread(target=_run, daemon=True, name="memory-holders").start()
"""

FIGURES = (
    "VmRSS", "RssAnon", "RssFile", "glibc_in_use", "glibc_free", "glibc_mapped", "python_blocks", "arrow",
    "tail_sampling_buffer_spans", "tail_sampling_outbox_spans", "evaluate_queue_traces", "store_link_spans",
    "store_queue_rows",
)  # fmt: skip


def summary(path: Path) -> dict[str, Any] | None:
    readings = [r for r in map(json.loads, filter(None, path.read_text().splitlines())) if "VmRSS" in r]
    if len(readings) < 3:
        return None
    peak = max(readings, key=lambda r: r["VmRSS"])
    return {
        "at the RSS peak": {k: peak[k] for k in FIGURES if k in peak},
        "peak of each": {k: max(r.get(k, 0) for r in readings) for k in FIGURES if any(k in r for r in readings)},
        "after the load": {k: readings[-1][k] for k in FIGURES if k in readings[-1]},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spans", type=int, default=60_000)
    p.add_argument("--spans-per-request", type=int, default=500)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--every", type=float, default=0.25, help="seconds between readings")
    p.add_argument("--source", help="run the collector from this checkout")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="evalsi-holders-"))
    site, out = workdir / "site", workdir / "readings"
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(f"OUT = {str(out)!r}\nEVERY = {args.every}\n" + SITE)
    (workdir / "policies").mkdir()
    (workdir / "policies" / "bench.yaml").write_text(pipeline.POLICY)
    cfg = pipeline.config_for(workdir / "store", args.workers, workdir / "policies")
    template = ingest.build_template(args.spans_per_request, 1024, 1)
    payloads = ingest.build_payloads(template, args.spans // args.spans_per_request, 5,
                                     random.Random(1).getrandbits(31) | 1, time.time_ns())  # fmt: skip
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(site), args.source, saved) if x)
    try:
        c = start_collector(workdir, cfg, timeout=300)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    report: dict[str, Any] = {}
    try:
        time.sleep(2)
        sent = send_all("http", c, payloads, args.spans_per_request, 8)
        total, traces = sent.accepted_spans, sent.accepted_spans // 5
        with httpx.Client(timeout=10) as client:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                text = client.get(c.metrics).text
                done = sum(metric_sum(text, m) for m in pipeline.FINISHED)
                if metric_sum(text, "otelcol_exporter_sent_spans_total") >= total and done >= traces:
                    break
                time.sleep(0.5)
        time.sleep(3)
    finally:
        for _ in range(10):
            c.proc.send_signal(signal.SIGTERM)
            try:
                c.proc.wait(30)
                break
            except subprocess.TimeoutExpired:
                continue
        for f in sorted(out.glob("*.jsonl"), key=lambda f: (not f.name.startswith("collector"), f.name)):
            s = summary(f)
            if s is not None:
                report[f.stem] = s
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for name, s in report.items():
        print(f"{name}:")
        for label, figures in s.items():
            print(f"  {label}: " + ", ".join(f"{k} {v:,}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
