"""Score-backend outage benchmark: ingest spans/s of a real `evalsi serve` with its score backends up, then down.

One `evalsi serve` (normalize -> tail_sampling -> evaluate, spans and scores to the embedded store, scores also to
the `langfuse` and `otlp` (http/protobuf) exporters with their default delivery settings) takes pre-encoded 5-span
agent traces from `--concurrency` senders without pause. After `--warmup` seconds, two windows of `--seconds` each
are measured on the same load: the backends up, then the backends down (the Langfuse stand-in closes its port:
connection refused; the OTLP logs backend answers 503). For each window: stored spans/s (the store exporter's
`otelcol_exporter_sent_spans_total` over the window), the collector's CPU per stored span, and the peak exporter
queues. Then the backends come back and the script waits until every score the collector stored has reached both,
by key (Langfuse: its score id; OTLP: trace, span, policy, evaluator, name), and exits 1 if any is missing, if any
came twice to the OTLP backend, or if an exporter counted a drop.

The two backends run in a child process (`tests/fake_langfuse.py`, `tests/otlp_logs_backend.py`), so their work
while up competes for the machine's cores but not for this script's GIL. Run `python benchmarks/outage.py --help`;
see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from evaluate import SELECTOR, agent_request  # noqa: E402
from ingest import (  # noqa: E402
    PROTOBUF,
    cpu_seconds,
    log,
    metric_sum,
    serve_config,
    start_collector,
    system_busy_seconds,
)

from evalsi.exporters.langfuse import score_id  # noqa: E402
from evalsi.model.score import Score  # noqa: E402

POLICY_NAME = "bench-outage"
POLICY = """\
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: {name}}}
spec:
  selector: "{selector}"
  sampling: {{rate: {rate}}}
  cascade:
    - ref: builtin/contains
      params: {{any: [order], none: ["I cannot help"], case_insensitive: true}}
    - ref: builtin/latency
      params: {{max_ms: 30000}}
    - ref: builtin/tokens
      params: {{max_total: 20000}}
"""
SPANS_PER_TRACE = 5
TEMPLATES = 500
RUN_TAG_TEMPLATE = 1  # the run tag of the template traces; each sent trace gets a fresh one
EVALUATE_COUNTERS = (
    "evalsi_evaluate_scores_total",
    "evalsi_evaluate_traces_total",
    "evalsi_evaluate_traces_dropped_total",
)
GOAL_RATIO = 0.9  # the bar: ingest during the outage within 10% of normal


# --- the backends, in a child process -------------------------------------------------------------------


def backend_process(conn: Connection) -> None:
    """Serve the Langfuse stand-in and the OTLP logs backend; obey `down`, `up`, `report`, `quit` from the pipe."""
    sys.path.insert(0, str(ROOT.parent / "tests"))
    from fake_langfuse import FakeLangfuse
    from otlp_logs_backend import OtlpLogsBackend

    langfuse = FakeLangfuse().start()
    otlp = OtlpLogsBackend()
    conn.send({"langfuse": langfuse.host, "otlp": otlp.endpoint, "pid": os.getpid()})
    while True:
        cmd = conn.recv()
        if cmd == "down":
            langfuse.stop()
            with otlp.lock:
                otlp.down = True
        elif cmd == "up":
            langfuse.start()
            with otlp.lock:
                otlp.down = False
        elif cmd == "counts":
            conn.send({"langfuse": len(langfuse.stored), "otlp": len(otlp.keys)})
            continue
        elif cmd == "report":
            with langfuse.lock, otlp.lock:
                conn.send(
                    {
                        "langfuse_ids": set(langfuse.stored),
                        "langfuse_attempts": len(langfuse.attempts),
                        "langfuse_violations": langfuse.violations[:20],
                        "otlp_keys": Counter(otlp.keys),
                        "otlp_refused": otlp.refused,
                        "otlp_problems": otlp.problems[:20],
                    }
                )
            continue
        elif cmd == "quit":
            langfuse.stop()
            otlp.stop()
            conn.send("bye")
            return
        conn.send("ok")


class Backends:
    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no grpc or thread state forked
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=backend_process, args=(child,), daemon=True)
        self.proc.start()
        self.where: dict[str, Any] = self.conn.recv()

    def ask(self, cmd: str) -> Any:
        self.conn.send(cmd)
        return self.conn.recv()

    def close(self) -> None:
        try:
            self.ask("quit")
        except (EOFError, OSError):
            pass
        self.proc.join(10)


# --- load -------------------------------------------------------------------------------------------------


def trace_templates(n: int) -> list[tuple[bytes, bytes]]:
    """`n` distinct encoded agent traces and the 16-byte trace id in each, to stamp fresh ids on."""
    now = time.time_ns()
    out = []
    for i in range(n):
        tid = RUN_TAG_TEMPLATE.to_bytes(4, "big") + i.to_bytes(12, "big")
        out.append((agent_request(i, RUN_TAG_TEMPLATE, now - (n - i) * 1_000_000), tid))
    return out


class Load:
    """Senders that post requests of `traces_per_request` traces each, without pause, until stopped. Every trace
    gets a new id (the template's id swapped in the encoded bytes: same length, so the protobuf stays valid), and
    encoded requests of one resource each concatenate into one valid request (repeated fields merge)."""

    def __init__(
        self, url: str, templates: list[tuple[bytes, bytes]], traces_per_request: int, senders: int, rate: float
    ) -> None:
        self.url = url
        self.rate = rate  # spans/s offered; 0: as fast as the collector answers
        self._t0 = 0.0
        self.templates = templates
        self.per_request = traces_per_request
        self.run_tag = random.getrandbits(31) | 1
        self.accepted_spans = 0
        self.errors: list[str] = []
        self._next = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._threads = [threading.Thread(target=self._send, daemon=True) for _ in range(senders)]

    def start(self) -> None:
        self._t0 = time.perf_counter()
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._halt.set()
        for t in self._threads:
            t.join()

    def _body(self) -> bytes:
        with self._lock:
            first = self._next
            self._next += self.per_request
        if self.rate:
            due = self._t0 + first * SPANS_PER_TRACE / self.rate
            time.sleep(max(0.0, due - time.perf_counter()))
        parts = []
        for n in range(first, first + self.per_request):
            body, tid = self.templates[n % len(self.templates)]
            parts.append(body.replace(tid, self.run_tag.to_bytes(4, "big") + n.to_bytes(12, "big")))
        return b"".join(parts)

    def _send(self) -> None:
        with httpx.Client(timeout=60, headers={"Content-Type": PROTOBUF}) as client:
            while not self._halt.is_set():
                body = self._body()
                try:
                    resp = client.post(self.url, content=body)
                except httpx.HTTPError as e:
                    with self._lock:
                        self.errors.append(f"{type(e).__name__}: {e}")
                    continue
                if resp.status_code == 200:
                    with self._lock:
                        self.accepted_spans += self.per_request * SPANS_PER_TRACE
                elif resp.status_code in (429, 503):  # the collector's own backpressure: honour it, count nothing
                    time.sleep(min(1.0, float(resp.headers.get("Retry-After", "1"))))
                else:
                    with self._lock:
                        self.errors.append(f"HTTP {resp.status_code}: {resp.text[:200]}")


# --- watching ---------------------------------------------------------------------------------------------


def labelled(text: str, name: str, exporter: str) -> float:
    """One exporter's sample of a metric (`metric_sum` adds every exporter's)."""
    prefix = f'{name}{{exporter="{exporter}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


@dataclass
class Window:
    name: str
    seconds: float = 0.0
    stored_spans: float = 0.0
    accepted_spans: int = 0
    server_cpu_s: float = 0.0
    backend_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    busy_cpu_s: float = 0.0
    scores_made: float = 0.0  # by the policies, in the window
    traces_evaluated: float = 0.0
    traces_not_evaluated: float = 0.0  # dropped by the evaluate processor (its queue was full)
    peak_queue: dict[str, float] = field(default_factory=dict)

    @property
    def stored_per_s(self) -> float:
        return self.stored_spans / self.seconds if self.seconds else 0.0

    @property
    def server_us_per_span(self) -> float:
        return 1e6 * self.server_cpu_s / self.stored_spans if self.stored_spans else 0.0

    @property
    def other_cpu_pct(self) -> float:
        own = self.server_cpu_s + self.backend_cpu_s + self.client_cpu_s
        return max(0.0, 100 * (self.busy_cpu_s - own) / self.seconds) if self.seconds else 0.0


class Sampler:
    """Reads the collector's metrics and CPU at window edges; polls queue sizes in between."""

    def __init__(self, metrics_url: str, server_pid: int, backend_pid: int) -> None:
        self.url = metrics_url
        self.server_pid = server_pid
        self.backend_pid = backend_pid
        self.client = httpx.Client(timeout=30)

    def metrics(self) -> str:
        return self.client.get(self.url).text

    def measure(self, name: str, seconds: float, load: Load) -> Window:
        w = Window(name)
        text = self.metrics()
        stored0, accepted0 = labelled(text, "otelcol_exporter_sent_spans_total", "clickhouse"), load.accepted_spans
        evaluated0 = [metric_sum(text, n) for n in EVALUATE_COUNTERS]
        cpu0, back0 = cpu_seconds(self.server_pid), cpu_seconds(self.backend_pid)
        client0, busy0 = time.process_time(), system_busy_seconds()
        t0 = time.perf_counter()
        while (left := seconds - (time.perf_counter() - t0)) > 0:
            time.sleep(min(0.5, left))
            text = self.metrics()
            for exp in ("langfuse", "otlp/http", "clickhouse"):
                q = labelled(text, "otelcol_exporter_queue_size", exp)
                w.peak_queue[exp] = max(w.peak_queue.get(exp, 0.0), q)
        w.seconds = time.perf_counter() - t0
        text = self.metrics()
        w.stored_spans = labelled(text, "otelcol_exporter_sent_spans_total", "clickhouse") - stored0
        w.scores_made, w.traces_evaluated, w.traces_not_evaluated = (
            metric_sum(text, n) - v for n, v in zip(EVALUATE_COUNTERS, evaluated0, strict=True)
        )
        w.accepted_spans = load.accepted_spans - accepted0
        w.server_cpu_s = cpu_seconds(self.server_pid) - cpu0
        w.backend_cpu_s = cpu_seconds(self.backend_pid) - back0
        w.client_cpu_s = time.process_time() - client0
        w.busy_cpu_s = system_busy_seconds() - busy0
        return w


# --- the run ----------------------------------------------------------------------------------------------


def collector_config(tmp: Path, where: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    (tmp / "policies").mkdir(parents=True, exist_ok=True)
    (tmp / "policies" / f"{POLICY_NAME}.yaml").write_text(
        POLICY.format(name=POLICY_NAME, selector=SELECTOR.replace('"', '\\"'), rate=args.sampling)
    )
    cfg = serve_config(tmp / "store")
    cfg["exporters"]["clickhouse"].pop("flush_interval", None)  # the product default
    cfg["processors"]["tail_sampling"] = {"decision_wait": "200ms"}
    cfg["processors"]["evaluate"] = {"policies": ["policies/*.yaml"]}
    delivery: dict[str, Any] = {}
    if args.queue_size:
        delivery["queue_size"] = args.queue_size
    cfg["exporters"]["langfuse"] = {
        "host": where["langfuse"],
        "public_key": "env:LANGFUSE_PUBLIC_KEY",
        "secret_key": "env:LANGFUSE_SECRET_KEY",
        **delivery,
    }
    cfg["exporters"]["otlp/http"] = {"endpoint": where["otlp"], "protocol": "http/protobuf", **delivery}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse", "langfuse", "otlp/http"]}
    return cfg


@dataclass
class Outcome:
    windows: list[Window] = field(default_factory=list)
    scores_stored: int = 0
    recovery_s: float | None = None
    langfuse_expected: int = 0
    langfuse_missing: int = 0
    langfuse_attempts: int = 0
    otlp_expected: int = 0
    otlp_missing: int = 0
    otlp_duplicated: int = 0
    otlp_refused: int = 0
    drops: dict[str, float] = field(default_factory=dict)
    accounting: dict[str, float] = field(default_factory=dict)  # the last counts `wait_accounted` saw
    failures: list[str] = field(default_factory=list)


def run(args: argparse.Namespace, tmp: Path) -> Outcome:
    out = Outcome()
    log(f"building {TEMPLATES} agent-trace templates ...")
    templates = trace_templates(TEMPLATES)
    backends = Backends()
    os.environ.setdefault("LANGFUSE_PUBLIC_KEY", "pk-lf-test")
    os.environ.setdefault("LANGFUSE_SECRET_KEY", "sk-lf-test")
    c = start_collector(tmp, collector_config(tmp, backends.where, args))
    load = Load(c.http + "/v1/traces", templates, args.traces_per_request, args.concurrency, args.rate)
    sampler = Sampler(c.metrics, c.proc.pid, backends.where["pid"])
    report: dict[str, Any] = {}
    try:
        log(f"sending {args.traces_per_request} traces ({args.traces_per_request * SPANS_PER_TRACE} spans) per "
            f"request from {args.concurrency} senders; warm-up {args.warmup:g} s")  # fmt: skip
        load.start()
        time.sleep(args.warmup)
        log(f"window 1: backends up, {args.seconds:g} s")
        out.windows.append(sampler.measure("backends up", args.seconds, load))
        backends.ask("down")
        log(f"window 2: backends down (Langfuse: connection refused; OTLP: 503), {args.seconds:g} s")
        out.windows.append(sampler.measure("backends down", args.seconds, load))
        load.stop()
        backends.ask("up")
        log("backends up again; waiting until every score is delivered or counted as dropped ...")
        out.recovery_s = wait_accounted(sampler, args.drain_timeout, out.accounting)
        text = sampler.metrics()
        for exp, kind in (("langfuse", "scores"), ("otlp/http", "log_records")):
            for what in ("enqueue_failed", "send_failed"):
                out.drops[f"{exp} {what}"] = labelled(text, f"otelcol_exporter_{what}_{kind}_total", exp)
        report = backends.ask("report")
    finally:
        load.stop()
        try:
            rc = c.stop(timeout=120)
        except subprocess.TimeoutExpired:
            c.proc.kill()
            rc = c.proc.wait()
            out.failures.append("evalsi serve did not exit within 120 s of SIGTERM (killed)")
        backends.close()
    if rc != 0:
        out.failures.append(f"evalsi serve exited {rc}")
    if load.errors:
        out.failures.append(f"{len(load.errors)} request(s) to the collector failed; first: {load.errors[0]}")
    stored = stored_scores(tmp / "store")
    out.scores_stored = len(stored)
    fields = ("project", "trace_id", "span_id", "policy", "evaluator", "run_id", "trial")
    expected_lf = {score_id(Score(s["name"], **{k: s[k] for k in fields})) for s in stored if s["outcome"] == "scored"}
    expected_otlp = {(s["trace_id"], s["span_id"], s["policy"], s["evaluator"], s["name"]) for s in stored}
    out.langfuse_expected, out.otlp_expected = len(expected_lf), len(expected_otlp)
    out.langfuse_attempts = report["langfuse_attempts"]
    out.langfuse_missing = len(expected_lf - report["langfuse_ids"])
    out.otlp_missing = len(expected_otlp - set(report["otlp_keys"]))
    out.otlp_duplicated = sum(n - 1 for n in report["otlp_keys"].values() if n > 1)
    out.otlp_refused = report["otlp_refused"]
    if out.recovery_s is None:
        out.failures.append(
            f"scores still unaccounted for {args.drain_timeout:g} s after the backends' return: {out.accounting}"
        )
    if out.langfuse_missing:
        out.failures.append(f"{out.langfuse_missing:,} of {len(expected_lf):,} scores never reached Langfuse")
    if out.otlp_missing:
        out.failures.append(f"{out.otlp_missing:,} of {len(expected_otlp):,} scores never reached the OTLP backend")
    if out.otlp_duplicated:
        out.failures.append(f"{out.otlp_duplicated} score records reached the OTLP backend twice")
    for what, n in out.drops.items():
        if n:
            out.failures.append(f"{what}: {n:,.0f}")
    if report["langfuse_violations"] or report["otlp_problems"]:
        out.failures.append(f"protocol problems: {report['langfuse_violations'] + report['otlp_problems']}")
    return out


def labelled_sum(text: str, name: str, exporter: str) -> float:
    """A metric's samples for one exporter, summed over its other labels."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'exporter="{exporter}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_accounted(sampler: Sampler, timeout: float, last: dict[str, float]) -> float | None:
    """Seconds until each score exporter has sent, dropped or (Langfuse) skipped by design every score the policies
    made, and evaluation is idle; None if that does not happen within `timeout`."""
    started = time.perf_counter()
    previous = -1.0
    while time.perf_counter() - started < timeout:
        text = sampler.metrics()
        produced = metric_sum(text, "evalsi_evaluate_scores_total")
        idle = metric_sum(text, "evalsi_evaluate_queue_size") == 0 and produced == previous
        previous = produced
        langfuse = sum(
            labelled_sum(text, f"{name}_total", "langfuse")
            for name in ("otelcol_exporter_sent_scores", "otelcol_exporter_send_failed_scores",
                         "otelcol_exporter_enqueue_failed_scores", "evalsi_exporter_scores_not_sent")
        )  # fmt: skip
        otlp = sum(
            labelled_sum(text, f"otelcol_exporter_{name}_log_records_total", "otlp/http")
            for name in ("sent", "send_failed", "enqueue_failed")
        )
        last.update(
            produced=produced,
            langfuse=langfuse,
            otlp=otlp,
            evaluate_queue=metric_sum(text, "evalsi_evaluate_queue_size"),
            evaluate_dropped=metric_sum(text, "evalsi_evaluate_traces_dropped_total"),
        )
        if idle and produced and langfuse >= produced and otlp >= produced:
            return time.perf_counter() - started
        time.sleep(0.5)
    return None


def stored_scores(store: Path) -> list[dict[str, Any]]:
    """Every score in the store (each key once), read by a separate process once the collector has released it."""
    code = (
        "import sys; from chdb import session; s = session.Session(sys.argv[1]); "
        "print(s.query('SELECT Project, TraceId, SpanId, Policy, Evaluator, Name, RunId, Trial, Outcome "
        "FROM default.evalsi_scores FINAL', 'TabSeparated').bytes().decode())"
    )
    res = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip()[-500:])
    names = ("project", "trace_id", "span_id", "policy", "evaluator", "name", "run_id", "trial", "outcome")
    rows = []
    for line in res.stdout.splitlines():
        if line.count("\t") != len(names) - 1:
            continue
        row: dict[str, Any] = dict(zip(names, line.split("\t"), strict=True))
        row["trial"] = int(row["trial"])
        rows.append(row)
    return rows


# --- main -------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0, help="length of each measured window (default 30)")
    p.add_argument("--warmup", type=float, default=5.0, help="load before the first window (default 5)")
    p.add_argument("--concurrency", type=int, default=4, help="sender threads (default 4)")
    p.add_argument("--rate", type=float, default=0.0, help="spans/s offered (default 0: as fast as taken)")
    p.add_argument("--traces-per-request", type=int, default=20, help="5-span traces per request (default 20)")
    p.add_argument("--sampling", type=float, default=0.1, help="the policy's sampling rate (default 0.1)")
    p.add_argument("--queue-size", type=int, default=None, help="both score exporters' queue_size (default: product's)")
    p.add_argument("--drain-timeout", type=float, default=300.0, help="wait for delivery at most (default 300)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="evalsi-bench-outage-"))
    try:
        out = run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    up, down = out.windows[0], out.windows[1]
    ratio = down.stored_per_s / up.stored_per_s if up.stored_per_s else 0.0
    cpu_ratio = up.server_us_per_span / down.server_us_per_span if down.server_us_per_span else 0.0
    if args.json:
        windows = [
            {**asdict(w), "stored_per_s": w.stored_per_s, "server_us_per_span": w.server_us_per_span,
             "other_cpu_pct": w.other_cpu_pct}
            for w in out.windows
        ]  # fmt: skip
        doc = {
            "params": vars(args),
            "windows": windows,
            "ratio_stored_per_s": ratio,
            "ratio_cpu_per_span": cpu_ratio,
            **{k: v for k, v in asdict(out).items() if k != "windows"},
        }
        print(json.dumps(doc, indent=2))
    else:
        offered = f"{args.rate:,.0f} spans/s offered" if args.rate else "as fast as taken"
        print(f"\n{args.concurrency} senders x {args.traces_per_request * SPANS_PER_TRACE} spans per request, "
              f"{offered}, policy sampling {args.sampling:g}, "
              f"exporter queue_size {args.queue_size or 'default'}")  # fmt: skip
        print(f"{'window':<14} {'stored/s':>9} {'accepted/s':>11} {'server CPU':>11} {'µs/span':>8} "
              f"{'backends CPU':>13} {'other CPU':>10} {'scores/s':>9} {'evaluated':>10} {'not eval.':>10}"
              f"  peak queues")  # fmt: skip
        for w in out.windows:
            queues = ", ".join(f"{k} {v:,.0f}" for k, v in w.peak_queue.items())
            print(f"{w.name:<14} {w.stored_per_s:>9,.0f} {w.accepted_spans / w.seconds:>11,.0f} "
                  f"{100 * w.server_cpu_s / w.seconds:>10.0f}% {w.server_us_per_span:>8.0f} "
                  f"{100 * w.backend_cpu_s / w.seconds:>12.0f}% {w.other_cpu_pct:>9.0f}% "
                  f"{w.scores_made / w.seconds:>9,.0f} {w.traces_evaluated:>10,.0f} {w.traces_not_evaluated:>10,.0f}"
                  f"  {queues}")  # fmt: skip
        met = "met" if ratio >= GOAL_RATIO else "MISSED"
        print(f"down/up stored spans/s: {ratio:.2f} (goal >= {GOAL_RATIO}: {met}); "
              f"CPU per span up/down: {cpu_ratio:.2f}")  # fmt: skip
        rec = "-" if out.recovery_s is None else f"{out.recovery_s:.1f} s"
        print(f"scores stored {out.scores_stored:,}; "
              f"all delivered {rec} after the backends came back")  # fmt: skip
        print(f"Langfuse: {out.langfuse_expected - out.langfuse_missing:,} of {out.langfuse_expected:,} score ids "
              f"({out.langfuse_attempts:,} requests accepted or refused after the server was reached); "
              f"OTLP: {out.otlp_expected - out.otlp_missing:,} of {out.otlp_expected:,} keys, "
              f"{out.otlp_duplicated} duplicated, {out.otlp_refused} requests answered 503")  # fmt: skip
    for f in out.failures:
        print(f"FAIL [outage] {f}")
    return 1 if out.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
