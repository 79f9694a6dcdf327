"""Full-pipeline benchmark: the README's pipeline under load, in one process and in pipeline workers.

A real `evalsi serve` with normalize, redact (default rules), probabilistic_sampler at 100%, tail_sampling
(decision_wait 1 s), evaluate (one policy: a CEL selector and three deterministic evaluators), the embedded store,
and a scores pipeline writing the store and a Prometheus exporter. Pre-encoded GenAI span payloads (those of
`benchmarks/ingest.py`, ~1 KB of content a span) are sent over OTLP/HTTP as fast as they are accepted; then it
waits until every span is stored and every trace evaluated, and prints:

- stored spans/s (first send to the last span stored) and accepted spans/s;
- CPU µs per span, every process of the collector summed (the steadiest figure on a shared machine), and by
  process, with the part of it spent in the kernel and the minor page faults a span (memory mapped and touched
  afresh);
- scores/s (scores handed on, first send to the last trace evaluated);
- freshness p50/p95/p99: from a trace's completion (tail sampling's decision, `decision_wait` after its last span)
  to its scores handed to the scores pipeline (`evalsi_evaluate_freshness_seconds`), plus `decision_wait`: from
  the trace's last span;
- the RSS of every process: idle after start, its peak, and after the load (everything stored and evaluated);
  and, read every 0.25 s during the load, the peak of the processes' RSS summed at one instant and of their PSS
  (proportional set size: a page of a library mapped by three processes counts a third in each), what the machine
  actually gives them: the sum of each process's own peak counts the libraries the workers share once each and
  adds peaks reached at different moments;
- every loss: spans not stored, traces not evaluated (shed or dropped), sessions evicted, refused requests.

`--workers 1 2` runs each setting against a fresh collector, one after the other (`--collector-shard`: with
`service.collector_shard`, the first shard in the collector process); `--source DIR` runs the
collector from another checkout (`git worktree add /tmp/base <rev>`), for a baseline measured in the same session.
`--against mlflow` then sends the first `--against-spans` spans of the same payloads, with the same client, to a
real `mlflow server` (sqlite, `--against-workers` workers) on its OTLP endpoint (`/v1/traces`, which answers once
the spans are written), counts what its store holds, and prints both side by side with the ratios.
Run `python benchmarks/pipeline.py --help`; figures in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ingest  # noqa: E402  (the payloads, the senders, the /proc readers)
from ingest import cpu_seconds, log, metric_sum, minor_faults, send_all, system_seconds  # noqa: E402
from local_server import free_port  # noqa: E402
from running_collector import serve_config, start_collector  # noqa: E402

POLICY = """apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: bench}
spec:
  selector: trace.service_name == 'support-bot'
  sampling: {rate: 1.0}
  cascade:
    - ref: builtin/latency
      params: {max_ms: 60000}
    - ref: builtin/tokens
      params: {max_total: 20000}
    - ref: builtin/cost
"""
DECISION_WAIT_S = 1.0
FINISHED = ("evalsi_evaluate_traces_total", "evalsi_evaluate_traces_shed_total", "evalsi_evaluate_traces_dropped_total")
"""A trace is done once evaluated, shed (`overload: shed`), or dropped (before `overload` existed)."""


@dataclass
class Result:
    workers: int
    source: str
    spans: int
    traces: int
    accepted_per_s: float = 0.0
    stored_per_s: float = 0.0
    evaluated_s: float = 0.0
    cpu_us_per_span: float = 0.0
    cpu_us_by_process: dict[str, float] = field(default_factory=dict)
    faults_by_process: dict[str, float] = field(default_factory=dict)  # minor page faults a span
    kernel_us_by_process: dict[str, float] = field(default_factory=dict)  # of the CPU, in the kernel
    scores: float = 0.0
    scores_per_s: float = 0.0
    freshness_s: dict[str, float | None] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)
    idle_rss_mb: dict[str, float] = field(default_factory=dict)
    after_rss_mb: dict[str, float] = field(default_factory=dict)
    together_mb: dict[str, float] = field(default_factory=dict)  # peak of the summed RSS and PSS, read together
    losses: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


@dataclass
class Peer:
    """A peer server fed the same payloads: what it stored, how fast, at what CPU."""

    name: str
    workers: int
    spans: int
    stored: int = 0
    stored_per_s: float = 0.0
    cpu_us_per_span: float = 0.0
    rss_mb: float = 0.0
    retries: int = 0
    failures: list[str] = field(default_factory=list)


def session_pids(leader: int) -> list[int]:
    """Every process in the session `leader` started (a server and its workers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == leader:  # the session id
                pids.append(int(entry))
    return pids


def run_mlflow(args: argparse.Namespace, payloads: list[bytes], workdir: Path) -> Peer:
    """The same payloads into a real `mlflow server`'s OTLP endpoint: stored spans/s and CPU a span of the server's
    every process, counted from its store when the load is done."""
    n = max(1, args.against_spans // args.spans_per_request)
    part = payloads[:n]
    peer = Peer("mlflow server", args.against_workers, n * args.spans_per_request)
    tmp = workdir / "mlflow"
    tmp.mkdir(parents=True)
    port = free_port()
    cmd = [str(Path(sys.executable).parent / "mlflow"), "server",
           "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db", "--default-artifact-root", str(tmp / "artifacts"),
           "--host", "127.0.0.1", "--port", str(port), "--workers", str(args.against_workers)]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with (tmp / "server.log").open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, cwd=tmp, start_new_session=True,
                                env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                peer.failures.append(f"mlflow server did not start: {(tmp / 'server.log').read_text()[-1500:]}")
                return peer
            time.sleep(0.5)
        made = httpx.post(base + "/api/2.0/mlflow/experiments/create", json={"name": "bench"}, timeout=30)
        made.raise_for_status()
        experiment = made.json()["experiment_id"]
        pids = session_pids(proc.pid)
        log(f"[mlflow] sending {len(part)} requests x {args.spans_per_request} spans ({len(pids)} processes)")
        cpu0 = cpu_seconds(*pids)
        t0 = time.perf_counter()
        sent = send_all("http", argparse.Namespace(http=base), part, args.spans_per_request, args.concurrency,
                        headers={"x-mlflow-experiment-id": experiment})  # fmt: skip
        elapsed = (sent.last_ok or time.perf_counter()) - t0
        pids = session_pids(proc.pid)
        cpu1 = cpu_seconds(*pids)
        peer.retries = sent.retries
        peer.failures += sent.errors[:3]
        peer.rss_mb = round(sum(peak_rss_mb(pid) for pid in pids), 1)
        with sqlite3.connect(tmp / "mlflow.db") as db:
            peer.stored = db.execute("SELECT count(*) FROM spans").fetchone()[0]
        peer.stored_per_s = peer.stored / max(1e-9, elapsed)
        peer.cpu_us_per_span = 1e6 * (cpu1 - cpu0) / max(1, peer.stored)
        if peer.stored != peer.spans:
            peer.failures.append(f"mlflow stored {peer.stored:,} of {peer.spans:,} spans")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    return peer


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """A quantile of a Prometheus histogram (cumulative (le, count) pairs), interpolated in its bucket."""
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_count) / max(1e-9, count - prev_count))
        prev_le, prev_count = le, count
    return None


def histogram(text: str, name: str) -> list[tuple[float, float]]:
    sums: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            sums[float("inf") if le == "+Inf" else float(le)] = sums.get(
                float("inf") if le == "+Inf" else float(le), 0.0
            ) + float(line.rsplit(" ", 1)[1])
    return sorted(sums.items())


def peak_rss_mb(pid: int, line_name: str = "VmHWM:") -> float:
    """A process's peak RSS (or, with "VmRSS:", its RSS now) in MB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(line_name):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class TogetherPeak:
    """The peak of the processes' RSS and PSS summed at one instant, read every `every` seconds in a thread."""

    def __init__(self, pids: list[int], every: float = 0.25) -> None:
        self.pids, self.every = pids, every
        self.peak = {"rss": 0.0, "pss": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            total = {"rss": 0.0, "pss": 0.0}
            for pid in self.pids:
                with contextlib.suppress(OSError):
                    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                        key, _, value = line.partition(":")
                        if key in ("Rss", "Pss"):
                            total[key.lower()] += int(value.split()[0]) / 1024
            for key, mb in total.items():
                self.peak[key] = max(self.peak[key], mb)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {key: round(mb, 1) for key, mb in self.peak.items()}


def config_for(store: Path, workers: int, policy_dir: Path, decision_wait: float = DECISION_WAIT_S) -> dict[str, Any]:
    cfg = serve_config(store)
    cfg["exporters"]["clickhouse"].pop("flush_interval", None)  # the product default
    cfg["exporters"]["prometheus"] = {"endpoint": "127.0.0.1:0"}
    cfg["processors"] = {
        "normalize": {},
        "redact": {},
        "probabilistic_sampler": {"sampling_percentage": 100},
        "tail_sampling": {"decision_wait": f"{decision_wait:g}s"},
        "evaluate": {"policies": [str(policy_dir / "*.yaml")]},
    }
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "redact", "probabilistic_sampler", "tail_sampling", "evaluate"]
    pipelines["logs"]["processors"] = ["normalize"]
    pipelines["scores"] = {"exporters": ["clickhouse", "prometheus"]}
    cfg["service"]["workers"] = workers
    return cfg


def run(args: argparse.Namespace, workers: int, payloads: list[bytes], workdir: Path) -> Result:
    spans_total = len(payloads) * args.spans_per_request
    traces = spans_total // args.spans_per_trace
    res = Result(workers, args.source or "this checkout", spans_total, traces)
    tmp = workdir / f"workers-{workers}"
    (tmp / "policies").mkdir(parents=True)
    (tmp / "policies" / "bench.yaml").write_text(POLICY)
    cfg = config_for(tmp / "store", workers, tmp / "policies", args.decision_wait)
    if args.collector_shard:
        cfg["service"]["collector_shard"] = True
    saved = os.environ.get("PYTHONPATH")
    if args.source:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (args.source, saved) if p)
    try:
        c = start_collector(tmp, cfg, timeout=180)
    except AssertionError as e:
        res.failures.append(f"evalsi serve did not start: {e}")
        return res
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    pids = {"collector": c.proc.pid, **{f"worker {i}": p for i, p in enumerate(c.ready.get("workers", []))}}
    profilers = []
    if args.profile:  # py-spy on every process for the load (raw folded stacks, one file a process)
        out = Path(args.profile)
        out.mkdir(parents=True, exist_ok=True)
        extra = ["--gil"] if args.gil else []
        for name, pid in pids.items():
            proc = ingest.start_profiler(pid, out / f"workers{workers}-{name.replace(' ', '')}.txt", 100, extra)
            if proc is not None:
                profilers.append(proc)
    res.idle_rss_mb = {name: round(peak_rss_mb(pid, "VmRSS:"), 1) for name, pid in pids.items()}
    try:
        together = TogetherPeak(list(pids.values()))
        cpu0 = cpu_seconds(*pids.values())
        cpu0_by = {name: cpu_seconds(pid) for name, pid in pids.items()}
        faults0_by = {name: minor_faults(pid) for name, pid in pids.items()}
        kernel0_by = {name: system_seconds(pid) for name, pid in pids.items()}
        log(f"[workers={workers}] sending {len(payloads)} requests x {args.spans_per_request} spans")
        t0 = time.perf_counter()
        sent = paced(c, payloads, args) if args.rate else send_all("http", c, payloads, args.spans_per_request,
                                                                    args.concurrency)  # fmt: skip
        res.accepted_per_s = sent.accepted_spans / ((sent.last_ok or time.perf_counter()) - t0)
        stored_at = evaluated_at = None
        text = ""
        deadline = time.monotonic() + args.timeout
        with httpx.Client(timeout=10) as client:
            while time.monotonic() < deadline and (stored_at is None or evaluated_at is None):
                text = client.get(c.metrics).text
                now = time.perf_counter()
                if stored_at is None and metric_sum(text, "otelcol_exporter_sent_spans_total") >= sent.accepted_spans:
                    stored_at = now
                done = sum(metric_sum(text, m) for m in FINISHED)
                if evaluated_at is None and done >= traces:
                    evaluated_at = now
                time.sleep(0.1)
        cpu1 = cpu_seconds(*pids.values())
        cpu1_by = {name: cpu_seconds(pid) for name, pid in pids.items()}
        faults1_by = {name: minor_faults(pid) for name, pid in pids.items()}
        kernel1_by = {name: system_seconds(pid) for name, pid in pids.items()}
        for proc in profilers:
            ingest.stop_profiler(proc)
        res.together_mb = together.stop()
        res.rss_mb = {name: round(peak_rss_mb(pid), 1) for name, pid in pids.items()}
        res.after_rss_mb = {name: round(peak_rss_mb(pid, "VmRSS:"), 1) for name, pid in pids.items()}
        if stored_at is None or evaluated_at is None:
            res.failures.append(f"not done after {args.timeout}s: stored={stored_at is not None}, "
                                f"evaluated={evaluated_at is not None}")  # fmt: skip
        end = evaluated_at or time.perf_counter()
        res.stored_per_s = sent.accepted_spans / ((stored_at or end) - t0)
        res.evaluated_s = end - t0
        res.cpu_us_per_span = 1e6 * (cpu1 - cpu0) / max(1, sent.accepted_spans)
        res.cpu_us_by_process = {name: round(1e6 * (cpu1_by[name] - cpu0_by[name]) / max(1, sent.accepted_spans), 1)
                                 for name in pids}  # fmt: skip
        res.kernel_us_by_process = {
            name: round(1e6 * (kernel1_by[name] - kernel0_by[name]) / max(1, sent.accepted_spans), 1) for name in pids
        }
        res.faults_by_process = {name: round((faults1_by[name] - faults0_by[name]) / max(1, sent.accepted_spans), 2)
                                 for name in pids}  # fmt: skip
        res.scores = metric_sum(text, "evalsi_evaluate_scores_total")
        res.scores_per_s = res.scores / (end - t0)
        buckets = histogram(text, "evalsi_evaluate_freshness_seconds")
        res.freshness_s = {
            q: (None if (v := quantile(buckets, float(q[1:]) / 100)) is None else round(v + args.decision_wait, 3))
            for q in ("p50", "p95", "p99")
        }
        res.losses = {
            "spans not accepted": res.spans - sent.accepted_spans,
            "traces shed": metric_sum(text, "evalsi_evaluate_traces_shed_total"),
            "traces dropped": metric_sum(text, "evalsi_evaluate_traces_dropped_total"),
            "traces not evaluated": traces - metric_sum(text, "evalsi_evaluate_traces_total"),
            "sessions evicted": metric_sum(text, "evalsi_sessions_evicted_total"),
            "scores dropped": metric_sum(text, "evalsi_evaluate_scores_dropped_total"),
            "retried requests (429/503)": float(sent.retries),
        }
    finally:
        code = c.stop(signal.SIGTERM, timeout=300)
        if code != 0:
            res.failures.append(f"collector exited {code}")
    return res


def paced(c: Any, payloads: list[bytes], args: argparse.Namespace) -> Any:
    """Send at `--rate` spans/s: each second's requests at once, then wait for the next second."""
    per_second = max(1, round(args.rate / args.spans_per_request))
    total = None
    start = time.perf_counter()
    for k in range(0, len(payloads), per_second):
        part = send_all("http", c, payloads[k : k + per_second], args.spans_per_request, args.concurrency)
        if total is None:
            total = part
        else:
            total.accepted_spans += part.accepted_spans
            total.retries += part.retries
            total.errors += part.errors
            total.last_ok = part.last_ok
        wait = start + (k // per_second + 1) - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("--spans", type=int, default=200_000)
    p.add_argument("--spans-per-request", type=int, default=500)
    p.add_argument("--spans-per-trace", type=int, default=5)
    p.add_argument("--content-bytes", type=int, default=1024)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--decision-wait", type=float, default=DECISION_WAIT_S,
                   help="tail_sampling's decision_wait in seconds (the product's default is 5)")  # fmt: skip
    p.add_argument("--rate", type=float, help="send at this many spans/s (default: as fast as accepted)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="settings to run, one after the other")
    p.add_argument("--source", help="run the collector from this checkout (a baseline)")
    p.add_argument("--collector-shard", action="store_true",
                   help="service.collector_shard: the collector process runs the first shard itself")  # fmt: skip
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", metavar="DIR", help="py-spy record (raw) every process during the load, into DIR")
    p.add_argument("--gil", action="store_true", help="with --profile: sample only the thread holding the GIL")
    p.add_argument("--against", choices=["mlflow"], help="then the same payloads into this peer, side by side")
    p.add_argument("--against-spans", type=int, default=20_000, help="how many of the spans the peer is sent")
    p.add_argument("--against-workers", type=int, default=2, help="the peer server's worker processes")
    args = p.parse_args(argv)
    n_requests = args.spans // args.spans_per_request
    template = ingest.build_template(args.spans_per_request, args.content_bytes, args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="evalsi-pipeline-"))
    results = []
    peer = None
    try:
        for k, workers in enumerate(args.workers):
            tag = random.Random(args.seed + k).getrandbits(31) | 1
            payloads = ingest.build_payloads(template, n_requests, args.spans_per_trace, tag, time.time_ns())
            results.append(run(args, workers, payloads, workdir))
        if args.against == "mlflow":
            tag = random.Random(args.seed).getrandbits(31) | 1  # the first run's payloads, ids and all
            payloads = ingest.build_payloads(template, n_requests, args.spans_per_trace, tag, time.time_ns())
            peer = run_mlflow(args, payloads, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps({"evalsi": [asdict(r) for r in results], "peer": peer and asdict(peer)}, indent=1))
    else:
        for r in results:
            print(f"\nworkers={r.workers} ({r.source}): {r.spans:,} spans, {r.traces:,} traces")
            print(f"  accepted {r.accepted_per_s:,.0f} spans/s; stored {r.stored_per_s:,.0f} spans/s; "
                  f"{r.cpu_us_per_span:.0f} µs CPU a span (every process)")  # fmt: skip
            print(f"  {r.scores:,.0f} scores, {r.scores_per_s:,.0f}/s; all evaluated after {r.evaluated_s:.1f}s")
            print(f"  freshness from a trace's last span: {r.freshness_s}")
            print(f"  CPU µs a span by process: {r.cpu_us_by_process}, of which in the kernel "
                  f"{r.kernel_us_by_process}; minor page faults a span: {r.faults_by_process}")  # fmt: skip
            print(f"  peak RSS MB: {r.rss_mb} (sum {sum(r.rss_mb.values()):,.0f}); summed at one instant, peak "
                  f"RSS {r.together_mb.get('rss', 0):,.0f}, PSS {r.together_mb.get('pss', 0):,.0f}")  # fmt: skip
            print(f"  RSS MB idle after start: {r.idle_rss_mb}; after the load: {r.after_rss_mb}")
            print(f"  losses: {r.losses}")
            for f in r.failures:
                print(f"  FAILED: {f}")
        if peer is not None:
            print(f"\n{peer.name} ({peer.workers} workers): {peer.stored:,} of {peer.spans:,} spans stored")
            print(f"  stored {peer.stored_per_s:,.0f} spans/s; {peer.cpu_us_per_span:,.0f} µs CPU a span "
                  f"(every process); peak RSS {peer.rss_mb:,.0f} MB (all processes); "
                  f"{peer.retries} requests retried")  # fmt: skip
            for f in peer.failures:
                print(f"  FAILED: {f}")
            for r in results:
                if r.stored_per_s and peer.stored_per_s and peer.cpu_us_per_span:
                    rate, cpu = r.stored_per_s / peer.stored_per_s, r.cpu_us_per_span / peer.cpu_us_per_span
                    print(f"  evalsi workers={r.workers} against it: {rate:.1f}x the stored spans/s, "
                          f"{cpu:.2f}x the CPU a span")  # fmt: skip
    return 1 if any(r.failures for r in results) or (peer and peer.failures) else 0


if __name__ == "__main__":
    sys.exit(main())
