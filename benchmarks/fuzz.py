"""Fuzz benchmark: a real `evalsi serve` (one process, or `--workers N`) fed 100,000+ attacker's inputs as fast as it
takes them over several connections, checked answer by answer and as a whole.

The inputs are tests/fuzz_inputs.py's, the same as tests/receivers/test_fuzz.py's:

- structured: hypothesis strategies building OTLP trace and log requests with hostile field values on the wire (ids
  of every wrong length, times past the int64/uint64 edges, enum numbers out of range, NaN/inf doubles, AnyValues
  nested up to 5,000 deep, strings up to 1 MB, invalid UTF-8, 100,000 attributes, 10,000 spans, empty everything)
  and OTLP/JSON with hostile JSON; each example sent as protobuf over HTTP and over gRPC (or as JSON, plain and
  compressed);
- mutation: the real captures of tests/fixtures and an SDK-encoded request, with bits flipped, bytes inserted, cut
  short, length varints set huge, fields duplicated and spliced; gzip/deflate/zstd (corrupted too), compression
  bombs, wrong Content-Type/Content-Encoding, gRPC to every method; malformed HTTP on a raw socket;
- api: every GET route of the API with hostile path segments and query strings, and JSON bodies (near-valid and
  random) to POST /v1/evaluate, /v1/feedback, /v1/runs and /v1/traces/select;
- size (`--heavy`, a few): 20 MiB requests of 400,000+ minimal spans or 10,000,000 empty attributes, over HTTP and
  gRPC: what one request of the allowed size costs.

Checked: no 5xx (HTTP) and no INTERNAL/UNKNOWN/DEADLINE_EXCEEDED (gRPC) for any input; every 4xx on the OTLP port a
google.rpc.Status in the request's encoding (BadRequest on 400s); the process never dies (a dead one is restarted on a
new store and the run goes on); no stall: a valid span sent every `--probe-interval` s (HTTP and gRPC in turn) is
answered within `--stall-after` s, each stall saved with the inputs in flight; RSS of the collector (and its workers)
after warm-up, at its peak and at the end; every valid probe span acknowledged, and `--after-spans` spans sent with
the OpenTelemetry SDK after the fuzzing, found in the store through the API; errors in the collector's log. Each
failure kind is saved under `--out` with its smallest input, minimized (byte chunks removed while it still fails).

Run `python benchmarks/fuzz.py --help`; figures in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import multiprocessing
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import fuzz_inputs as F  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis.errors import HypothesisDeprecationWarning  # noqa: E402
from running_collector import Collector, serve_config, start_collector  # noqa: E402

KINDS = ("structured", "mutation", "api")
# hypothesis draws in its own thread while the senders' libraries use the global `random` module, which it takes for
# a strategy of ours doing so (they draw nothing from it)
warnings.filterwarnings("ignore", "Do not use the `random` module inside strategies", HypothesisDeprecationWarning)
HTTP_TIMEOUT = 60.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the collector ----------------------------------------------------------------------------------------------


class Target:
    """The running collector (restarted on a new store if it dies) and where it listens; `generation` changes on a
    restart, so the senders reconnect."""

    def __init__(self, workdir: Path, workers: int) -> None:
        self.workdir = workdir
        self.workers = workers
        self.generation = 0
        self.collector: Collector | None = None
        self.deaths: list[str] = []
        self.lock = threading.Lock()
        self.ready = threading.Event()  # cleared while a restart is under way: the senders wait
        self.cpu_of_dead = 0.0  # CPU seconds of the collectors that died (last read while they ran)
        self.start(0)

    def start(self, generation: int) -> None:
        TARGETS.append(self)
        d = self.workdir / f"collector-{generation}"
        d.mkdir(parents=True, exist_ok=True)
        cfg = serve_config(d / "store")
        cfg["service"]["workers"] = self.workers
        c = start_collector(d, cfg, timeout=180)
        # the addresses first, the generation last: a sender that sees the new generation finds the new addresses
        self.otlp, self.api, self.grpc_target = _host_port(c.http), _host_port(c.api), c.grpc
        self.pids = [c.proc.pid, *c.ready.get("workers", [])]
        self.collector = c
        self.generation = generation
        self.ready.set()

    def restart(self, why: str, cpu_seen: float) -> None:
        with self.lock:
            self.ready.clear()
            self.deaths.append(why)
            self.cpu_of_dead += cpu_seen
            if self.collector is not None and self.collector.proc.poll() is None:
                self.collector.stop(signal.SIGKILL, timeout=60)  # its workers end with it
            self.start(self.generation + 1)

    def alive(self) -> bool:
        return self.collector is not None and self.collector.proc.poll() is None

    def last_exception(self) -> str:
        """The last exception the collector's log shows (its last `Error: message` line), to tell 5xx apart."""
        if self.collector is None:
            return ""
        try:
            with self.collector.log_path.open("rb") as f:
                f.seek(max(0, f.seek(0, 2) - 65536))
                tail = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        found = [ln for ln in tail if re.match(r"^[\w.]+(Error|Exception)\b.*", ln)]
        return found[-1][:160] if found else ""


TARGETS: list[Target] = []  # every collector this script started, killed at exit if still running


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.split("://", 1)[-1].rpartition(":")
    return host, int(port)


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


# --- the record -------------------------------------------------------------------------------------------------


_NORMAL = [(re.compile(r"[0-9a-f]{16,}"), "<hex>"), (re.compile(r"\d+"), "N"), (re.compile(r"'[^']*'"), "'…'")]


def signature(inp: F.FuzzInput, problem: str, exception: str = "") -> str:
    """A failure kind: where, and the problem with its numbers and quoted values taken out; for a 5xx the exception
    the collector logged with it (two 500s with the same body are told apart by their cause)."""
    text = problem.split(":", 1)[0] if problem.startswith(("HTTP 5", "gRPC ")) else problem[:90]
    if problem.startswith(("HTTP 5", "gRPC ")):
        rest = problem.split(":", 1)[1] if ":" in problem else ""
        text += ":" + (exception[:100] if exception else rest[:80])
    for pattern, repl in _NORMAL:
        text = pattern.sub(repl, text)
    where = inp.path.split("?", 1)[0] if inp.port == "api" else inp.port
    return f"{inp.kind} {where}: {text}"


@dataclass
class Failure:
    signature: str
    count: int = 0
    first: str = ""  # the first problem, as said
    smallest: F.FuzzInput | None = None
    answer: F.Answer | None = None


@dataclass
class Record:
    started: float = field(default_factory=time.monotonic)
    sent: Counter[str] = field(default_factory=Counter)  # by kind
    sent_sub: Counter[str] = field(default_factory=Counter)  # by kind/sub
    answers: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))  # kind/port -> label
    failures: dict[str, Failure] = field(default_factory=dict)
    no_answer: Counter[str] = field(default_factory=Counter)  # port/sub -> count (connection closed, timeout)
    slow: list[tuple[float, str, int]] = field(default_factory=list)  # (seconds, sub, body bytes) over 5 s
    seconds: Counter[str] = field(default_factory=Counter)  # answer time summed by kind/sub
    size_in_flight: int = 0  # size inputs being answered now
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, inp: F.FuzzInput, a: F.Answer, problems: list[str], during_size: bool = False) -> None:
        with self.lock:
            self.sent[inp.kind] += 1
            self.sent_sub[f"{inp.kind}/{inp.sub.split('/')[0]}"] += 1
            port = {"otlp": "http", "raw": "raw http"}.get(inp.port, inp.port)
            self.answers[f"{inp.kind} / {port}"][a.label] += 1
            if not a.status and not a.code:
                self.no_answer[f"{inp.port} {inp.sub.split('/')[0]}: {a.error.split(':', 1)[0]}"] += 1
            self.seconds[f"{inp.kind} {inp.port} {inp.sub.split('/')[0]}"] += a.seconds
            if a.seconds > 5:
                self.slow.append((a.seconds, f"{inp.kind} {inp.port} {inp.sub}", len(inp.body)))
            for p in problems:
                if p.startswith("API answer 5"):
                    continue  # a 5xx not in JSON: the 5xx itself is the failure
                sig = signature(inp, p, a.headers.get("x-collector-exception", ""))
                if during_size and inp.kind != "size":
                    sig += " [while size inputs ran]"
                f = self.failures.setdefault(sig, Failure(sig, first=p))
                f.count += 1
                if f.smallest is None or len(inp.body) + len(inp.path) < len(f.smallest.body) + len(f.smallest.path):
                    f.smallest, f.answer = inp, a


def save_input(out: Path, name: str, inp: F.FuzzInput, extra: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.bin").write_bytes(inp.body)
    (out / f"{name}.json").write_text(json.dumps({**inp.describe(), **extra}, indent=1, default=str))


# --- producing inputs -------------------------------------------------------------------------------------------


def variants(inp: F.FuzzInput, rng: random.Random) -> list[F.FuzzInput]:
    """One structured example over more than one way in: protobuf over HTTP (plain and compressed) and gRPC; JSON
    plain and compressed. Each is an input of its own."""
    body, out = inp.body, [inp]
    if inp.port == "grpc":
        path = F.TRACES_PATH if inp.path == F.TRACES_RPC else F.LOGS_PATH
        for enc in ("", rng.choice(("gzip", "zstd", "deflate"))):
            headers = {"Content-Type": F.PROTOBUF} | ({"Content-Encoding": enc} if enc else {})
            sub = inp.sub.replace("grpc", "protobuf") + (f"/{enc}" if enc else "")
            out.append(F.FuzzInput("structured", sub, "otlp", path=path, headers=headers, body=F._compress(body, enc)))
    elif "Content-Encoding" not in inp.headers:
        if inp.media == F.PROTOBUF:
            rpc = F.TRACES_RPC if inp.path == F.TRACES_PATH else F.LOGS_RPC
            out.append(
                F.FuzzInput(
                    "structured",
                    inp.sub.replace("protobuf", "grpc"),
                    "grpc",
                    path=rpc,
                    body=body,
                    grpc_compression=rng.random() < 0.25,
                )
            )
            enc = rng.choice(("gzip", "zstd", "deflate"))
            headers = {**inp.headers, "Content-Encoding": enc}
            out.append(
                F.FuzzInput(
                    "structured",
                    f"{inp.sub}/{enc}",
                    "otlp",
                    path=inp.path,
                    headers=headers,
                    body=F._compress(body, enc),
                )
            )
        else:
            enc = rng.choice(("gzip", "zstd", "deflate"))
            headers = {**inp.headers, "Content-Encoding": enc}
            out.append(
                F.FuzzInput(
                    "structured",
                    f"{inp.sub}/{enc}",
                    "otlp",
                    path=inp.path,
                    headers=headers,
                    body=F._compress(body, enc),
                )
            )
    return out


def structured_stream(sink: queue.Queue[F.FuzzInput | None], seed_: int, stop: threading.Event) -> None:
    """Draws structured examples with hypothesis (generation only, in chunks of 500 with their own seed: hypothesis
    keeps what it drew, so one endless run would grow) into `sink` until `stop`."""
    rng = random.Random(seed_)
    chunk = 0
    while not stop.is_set():

        @settings(
            max_examples=500,
            database=None,
            phases=[Phase.generate],
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @seed(seed_ * 1_000_003 + chunk)
        @given(F.structured_inputs())
        def draw(inp: F.FuzzInput) -> None:
            if stop.is_set():
                return
            for v in variants(inp, rng):
                while not stop.is_set():
                    try:
                        sink.put(v, timeout=0.5)
                        break
                    except queue.Full:
                        pass

        draw()
        chunk += 1


def heavy_inputs() -> list[F.FuzzInput]:
    """Requests at the size limits that cost the most to take, over HTTP and gRPC: 20 MiB of 10,000,000 empty
    attributes on one span, of 10,000,000 empty events, of 10,000,000 empty resources (of spans, of log records) or
    scopes, one 20 MiB string; and the
    largest count of items a request may hold (100,000 minimal spans, 100,000 minimal log records)."""
    limit = F.MAX_BODY - 64
    ids = F.f_bytes(1, bytes(range(1, 17))) + F.f_bytes(2, bytes(range(1, 9))) + F.f_fixed64(7, F.NOW)

    def one_span(extra: bytes) -> bytes:
        return F.f_bytes(1, F.f_bytes(2, F.f_bytes(2, ids + extra)))

    n = (limit - 40) // 2
    bodies = {
        "10M-attributes": (F.TRACES_PATH, one_span(b"\x4a\x00" * n)),  # KeyValue{} as field 9 of a Span
        "10M-events": (F.TRACES_PATH, one_span(b"\x5a\x00" * n)),  # Span.Event{} as field 11
        "10M-resources": (F.TRACES_PATH, b"\x0a\x00" * n),  # ResourceSpans{}
        "10M-scopes": (F.TRACES_PATH, F.f_bytes(1, b"\x12\x00" * (n - 8))),  # ScopeSpans{} in one resource
        "10M-log-resources": (F.LOGS_PATH, b"\x0a\x00" * n),  # ResourceLogs{}
        "20MiB-string": (F.TRACES_PATH, one_span(F.f_bytes(9, F.key_value(b"k", F.f_bytes(1, b"x" * (limit - 100)))))),
        "100k-spans": (F.TRACES_PATH, F.f_bytes(1, F.f_bytes(2, F.f_bytes(2, ids) * 100_000))),
        "100k-log-records": (F.LOGS_PATH, F.f_bytes(1, F.f_bytes(2, F.f_bytes(2, F.f_fixed64(1, F.NOW)) * 100_000))),
    }
    out = []
    for name, (path, body) in bodies.items():
        out.append(
            F.FuzzInput("size", f"{name}/http", "otlp", path=path, headers={"Content-Type": F.PROTOBUF}, body=body)
        )
        rpc = F.TRACES_RPC if path == F.TRACES_PATH else F.LOGS_RPC
        out.append(F.FuzzInput("size", f"{name}/grpc", "grpc", path=rpc, body=body))
    return out


# --- sending ----------------------------------------------------------------------------------------------------


class Sender(threading.Thread):
    def __init__(self, n: int, target: Target, inputs: queue.Queue[F.FuzzInput | None], record: Record) -> None:
        super().__init__(daemon=True, name=f"sender-{n}")
        self.target = target
        self.inputs = inputs
        self.record = record
        self.current: F.FuzzInput | None = None
        self.current_since = 0.0
        self._generation = -1
        self._otlp: http.client.HTTPConnection | None = None
        self._api: http.client.HTTPConnection | None = None
        self._channel: grpc.Channel | None = None

    def _connect(self) -> None:
        if self._generation == self.target.generation:
            return
        for c in (self._otlp, self._api):
            if c is not None:
                c.close()
        if self._channel is not None:
            self._channel.close()
        t = self.target
        self._otlp = F.Connection(*t.otlp, timeout=HTTP_TIMEOUT)
        self._api = F.Connection(*t.api, timeout=HTTP_TIMEOUT)
        self._channel = grpc.insecure_channel(
            t.grpc_target, options=[("grpc.max_send_message_length", 64 * 2**20), ("grpc.enable_retries", 0)]
        )
        self._generation = t.generation

    def send(self, inp: F.FuzzInput) -> F.Answer:
        self._connect()
        assert self._otlp is not None and self._api is not None and self._channel is not None
        if inp.port == "grpc":
            return F.send_grpc(self._channel, inp, timeout=HTTP_TIMEOUT)
        if inp.port == "raw":
            return F.send_raw(self.target.otlp, inp)
        conn = self._otlp if inp.port == "otlp" else self._api
        return F.send_http(conn, inp)

    def run(self) -> None:
        while True:
            inp = self.inputs.get()
            if inp is None:
                return
            self.target.ready.wait()
            self.current, self.current_since = inp, time.monotonic()
            generation = self.target.generation
            size_before = self.record.size_in_flight
            if inp.kind == "size":
                with self.record.lock:
                    self.record.size_in_flight += 1
            a = self.send(inp)
            if inp.kind == "size":
                with self.record.lock:
                    self.record.size_in_flight -= 1
            during_size = bool(size_before or self.record.size_in_flight)
            self.current = None
            if a.status >= 500 or a.code in ("INTERNAL", "UNKNOWN"):
                time.sleep(0.05)  # the traceback is written after the answer
                a.headers["x-collector-exception"] = self.target.last_exception()
            if (not a.status and not a.code) or a.code == "UNAVAILABLE":
                if not self.target.alive() or generation != self.target.generation:
                    continue  # the collector died under it: the monitor records that, with what was in flight
            self.record.add(inp, a, F.problems(inp, a), during_size)


def _probe_loop(
    otlp: tuple[str, int], grpc_target: str, service: str, interval: float, results: Any, stop: Any
) -> None:
    """The probe, in a process of its own (the fuzzing's threads would slow its answers down by the GIL): a valid
    one-span request every `interval` s, OTLP/HTTP and gRPC in turn; each answer put on `results`."""
    conn = F.Connection(*otlp, timeout=30)
    channel = grpc.insecure_channel(grpc_target)
    n = 0
    while not stop.is_set():
        body, traces = F.probe_request(service)
        if n % 2 == 0:
            inp = F.FuzzInput("probe", "http", "otlp", headers={"Content-Type": F.PROTOBUF}, body=body)
            a = F.send_http(conn, inp)
            ok = a.status == 200
        else:
            a = F.send_grpc(channel, F.FuzzInput("probe", "grpc", "grpc", path=F.TRACES_RPC, body=body), 30)
            ok = a.code == "OK"
        results.put(("http" if n % 2 == 0 else "grpc", a.seconds, a.label, ok, traces))
        n += 1
        stop.wait(max(0.0, interval - a.seconds))
    channel.close()


class Prober(threading.Thread):
    """Runs the probe process (started again for a restarted collector) and reads its answers: each must come
    within `bound` s; a later or refused one is a stall, recorded with the inputs in flight then."""

    def __init__(
        self, target: Target, service: str, interval: float, bound: float, senders: list[Sender], out: Path
    ) -> None:
        super().__init__(daemon=True, name="prober")
        self.target, self.service, self.interval, self.bound = target, service, interval, bound
        self.senders = senders
        self.out = out
        self.latencies: list[float] = []
        self.by_transport: dict[str, list[float]] = defaultdict(list)
        self.stalls: list[dict[str, Any]] = []
        self.acked: dict[int, list[str]] = defaultdict(list)  # collector generation -> trace ids acknowledged
        self.refused = Counter[str]()
        self.stop_event = threading.Event()

    def run(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        while not self.stop_event.is_set():
            t = self.target
            generation = t.generation
            results, stop = ctx.Queue(), ctx.Event()
            args = (t.otlp, t.grpc_target, self.service, self.interval, results, stop)
            proc = ctx.Process(target=_probe_loop, args=args, daemon=True)
            proc.start()
            while not self.stop_event.is_set() and generation == self.target.generation:
                try:
                    transport, seconds, label, ok, traces = results.get(timeout=0.5)
                except queue.Empty:
                    continue
                self._answer(generation, transport, seconds, label, ok, traces)
            stop.set()
            proc.join(40)
            while True:  # what it answered before it stopped
                try:
                    self._answer(generation, *results.get(timeout=0.1))
                except queue.Empty:
                    break
            if proc.is_alive():
                proc.kill()

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the probe process has had a first answer."""
        deadline = time.monotonic() + timeout
        while not self.latencies and time.monotonic() < deadline:
            time.sleep(0.1)

    def _answer(self, generation: int, transport: str, seconds: float, label: str, ok: bool, traces: list[str]) -> None:
        if generation != self.target.generation or not self.target.ready.is_set():
            return  # answered by a collector that died since, or is being replaced (its death is the failure)
        self.latencies.append(seconds)
        self.by_transport[transport].append(seconds)
        if ok:
            self.acked[generation].extend(traces)
        else:
            self.refused[label] += 1
        if seconds > self.bound or not ok:
            in_flight = [(s.current, time.monotonic() - s.current_since) for s in self.senders if s.current is not None]
            self._stall(
                F.Answer(code=label if transport == "grpc" else "", status=0, seconds=seconds),
                in_flight,
                ok,
                transport,
                label,
            )

    def _stall(
        self, a: F.Answer, in_flight: list[tuple[F.FuzzInput | None, float]], ok: bool, transport: str, label: str
    ) -> None:
        k = len(self.stalls)
        suspects = sorted(
            (i for i in in_flight if i[0] is not None), key=lambda x: -x[1]
        )  # the longest in flight first
        entry = {
            "seconds": round(a.seconds, 2),
            "probe": transport,
            "answer": label,
            "answered ok": ok,
            "in flight": [f"{i.kind} {i.port} {i.sub} ({len(i.body):,} B, {s:.1f} s)" for i, s in suspects[:6]],  # type: ignore[union-attr]
        }
        self.stalls.append(entry)
        if k < 20:
            for j, (inp, _) in enumerate(suspects[:3]):
                assert inp is not None
                save_input(self.out / "stalls", f"stall{k:02d}-suspect{j}", inp, {"stall": entry})


class Monitor(threading.Thread):
    """RSS and CPU every 0.5 s; notices a dead collector (or kills one past `rss_cap_mb`, before the machine's OOM
    killer picks a process of its own), records it with what was in flight, and starts another on a new store."""

    def __init__(self, target: Target, senders: list[Sender], record: Record, out: Path, rss_cap_mb: float) -> None:
        super().__init__(daemon=True, name="monitor")
        self.target, self.senders, self.record, self.out = target, senders, record, out
        self.rss_cap_mb = rss_cap_mb
        self.samples: list[tuple[float, float, float]] = []  # (t, collector MB, workers MB)
        self.cpu_seen = 0.0  # of the collector running now and its workers
        self.stop_event = threading.Event()

    def rss(self) -> tuple[float, float]:
        pids = self.target.pids
        return rss_mb(pids[0]), sum(rss_mb(p) for p in pids[1:])

    def cpu(self) -> float:
        """CPU seconds of every collector of the run and their workers."""
        return self.target.cpu_of_dead + max(self.cpu_seen, cpu_seconds(self.target.pids))

    def run(self) -> None:
        while not self.stop_event.is_set():
            collector, workers = self.rss()
            over = collector + workers > self.rss_cap_mb
            if over or not self.target.alive():
                c = self.target.collector
                assert c is not None
                in_flight = [s.current for s in self.senders if s.current is not None]
                if over:  # SIGABRT first: faulthandler (PYTHONFAULTHANDLER) writes every thread's stack to its log
                    c.proc.send_signal(signal.SIGABRT)
                    try:
                        c.proc.wait(10)
                    except subprocess.TimeoutExpired:
                        c.proc.kill()
                        c.proc.wait()
                    why = f"RSS {collector:,.0f} MB (+ workers {workers:,.0f} MB) past --rss-cap-mb: killed it"
                    sig = f"collector RSS past {self.rss_cap_mb:,.0f} MB"
                else:
                    why = f"evalsi serve exited {c.proc.poll()}"
                    sig = f"collector died (exit {c.proc.poll()})"
                last_minute = [round(m) for _, m, _ in self.samples[-120::10]]
                why += f" (log: {c.log_path}); RSS MB of the last minute: {last_minute}"
                log(f"FAIL {why}; restarting it on a new store")
                k = len(self.target.deaths)
                for j, inp in enumerate(in_flight):
                    assert inp is not None
                    save_input(self.out / "deaths", f"death{k}-in-flight{j}", inp, {"death": why})
                with self.record.lock:
                    f = self.record.failures.setdefault(sig, Failure(sig, first=why))
                    f.count += 1
                self.target.restart(why, self.cpu_seen)
                self.cpu_seen = 0.0
                continue
            self.cpu_seen = max(self.cpu_seen, cpu_seconds(self.target.pids))
            self.samples.append((time.monotonic(), collector, workers))
            self.stop_event.wait(0.5)


# --- after the fuzzing ------------------------------------------------------------------------------------------


def send_with_sdk(target: Target, service: str, spans: int) -> list[str]:
    """`spans` spans (10 a trace) through the OpenTelemetry SDK's OTLP/HTTP exporter; their trace ids."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    host, port = target.otlp
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://{host}:{port}/v1/traces")))
    tracer = provider.get_tracer("fuzz.after")
    traces = []
    for t in range(max(1, spans // 10)):
        with tracer.start_as_current_span(f"after {t}") as root:
            traces.append(format(root.get_span_context().trace_id, "032x"))
            for i in range(9):
                with tracer.start_as_current_span(f"child {i}") as child:
                    child.set_attribute("gen_ai.usage.input_tokens", i)
    provider.force_flush(30_000)
    provider.shutdown()
    return traces


def stored_spans(target: Target, service: str) -> dict[str, int]:
    host, port = target.api
    resp = httpx.get(f"http://{host}:{port}/api/v1/traces", params={"service": service, "limit": 10_000}, timeout=60)
    resp.raise_for_status()
    return {t["trace_id"]: t["span_count"] for t in resp.json()["traces"]}


def wait_stored(target: Target, service: str, want: dict[str, int], timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    got: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            got = stored_spans(target, service)
        except httpx.HTTPError:
            pass
        if all(got.get(t, 0) >= n for t, n in want.items()):
            break
        time.sleep(0.5)
    return got


def replay(target: Target, inp: F.FuzzInput, sig: str) -> bool:
    """Does `inp` still fail the same way, alone?"""
    sender = Sender(0, target, queue.Queue(), Record())
    a = sender.send(inp)
    if inp.port in ("otlp", "api") and sender._otlp is not None:
        sender._otlp.close()
    if not target.alive():
        target.restart("during minimizing", 0.0)
        return sig.startswith("collector died")
    exception = ""
    if a.status >= 500 or a.code in ("INTERNAL", "UNKNOWN"):
        time.sleep(0.05)
        exception = target.last_exception()
    return any(signature(inp, p, exception) == sig for p in F.problems(inp, a))


def minimize(target: Target, inp: F.FuzzInput, sig: str, budget: int) -> tuple[F.FuzzInput, int]:
    """Remove chunks of the body (halves, then smaller) while the input still fails with `sig`, within `budget`
    replays. Compressed bodies are kept whole (a cut one fails another way)."""
    if "Content-Encoding" in inp.headers or inp.port == "raw" or not inp.body:
        return inp, 0
    best = inp
    tries = 0
    chunk = max(1, len(best.body) // 2)
    while chunk >= 1 and tries < budget:
        i = 0
        shrunk = False
        while i < len(best.body) and tries < budget:
            body = best.body[:i] + best.body[i + chunk :]
            cand = F.FuzzInput(**{**best.__dict__, "body": body})
            tries += 1
            if replay(target, cand, sig):
                best, shrunk = cand, True
            else:
                i += chunk
        if not shrunk:
            chunk //= 2
    return best, tries


def log_errors(workdir: Path) -> tuple[Counter[str], dict[str, str]]:
    """ERROR (and CRITICAL) lines of every collector's log, by message and reason; the first full line of each."""
    found: Counter[str] = Counter()
    first: dict[str, str] = {}
    for path in sorted(workdir.glob("collector-*/serve.log")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if str(entry.get("level", "")).upper() in ("ERROR", "CRITICAL"):
                key = re.sub(r"\d+", "N", str(entry.get("msg", ""))[:100])
                if entry.get("reason"):
                    key += f" ({entry['reason']})"
                found[key] += entry.get("count", 1) if "dropping" in key else 1
                first.setdefault(key, line[:1500])
    return found, first


# --- the run ----------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    os.environ["PYTHONFAULTHANDLER"] = "1"  # the collectors write their threads' stacks to their log if aborted
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    workdir = Path(tempfile.mkdtemp(prefix="evalsi-fuzz-"))
    rng = random.Random(args.seed)
    log(f"building seeds and bombs; starting evalsi serve (workers {args.workers}) in {workdir}")
    F.seeds()
    F.bombs()
    F.api_routes()
    F.evaluator_refs()
    heavy = heavy_inputs() if args.heavy else []
    target = Target(workdir, args.workers)
    service = f"fuzz-probe-{args.seed}"
    record = Record()
    inputs: queue.Queue[F.FuzzInput | None] = queue.Queue(maxsize=4 * args.connections)
    senders = [Sender(i, target, inputs, record) for i in range(args.connections)]
    prober = Prober(target, service, args.probe_interval, args.stall_after, senders, out)
    monitor = Monitor(target, senders, record, out, args.rss_cap_mb)
    structured: queue.Queue[F.FuzzInput | None] = queue.Queue(maxsize=64)
    stop_drawing = threading.Event()
    drawer = threading.Thread(target=structured_stream, args=(structured, args.seed, stop_drawing), daemon=True)
    weights = [float(x) for x in args.mix.split(",")]
    warm = min(args.warmup, args.inputs // 10)
    heavy_at = {int(args.inputs * (k + 1) / (args.heavy + 1)) for k in range(args.heavy)} if heavy else set()
    rss_warm: tuple[float, float] | None = None
    rss_series: list[tuple[int, float]] = []
    for t in (prober, monitor):
        t.start()
    prober.wait_ready()
    for t in (*senders, drawer):
        t.start()
    t0 = time.monotonic()
    cpu_start = monitor.cpu()
    client_start = time.process_time()
    produced = 0
    deadline = t0 + args.duration if args.duration else float("inf")
    try:
        while produced < args.inputs and time.monotonic() < deadline:
            if produced in heavy_at:  # a round of size inputs, all at once (8 senders take them together)
                for h in heavy:
                    inputs.put(h)
            kind = rng.choices(KINDS, weights)[0]
            if kind == "structured":
                inp = structured.get()
            elif kind == "mutation":
                inp = F.mutation_input(random.Random(rng.getrandbits(64)))
            else:
                inp = F.api_input(random.Random(rng.getrandbits(64)))
            assert inp is not None
            if args.skip and any(x in f"{inp.kind} {inp.port} {inp.sub}" for x in args.skip):
                continue
            inputs.put(inp)
            produced += 1
            if produced == warm:
                rss_warm = monitor.rss()
                log(f"warm-up done ({warm:,} inputs): RSS {rss_warm[0]:.0f} MB (+ workers {rss_warm[1]:.0f} MB)")
            if produced % 5000 == 0:
                rss_series.append((produced, monitor.rss()[0]))
                el = time.monotonic() - t0
                log(
                    f"{produced:,} inputs in {el:.0f}s ({produced / el:.0f}/s); failures {len(record.failures)}; "
                    f"stalls {len(prober.stalls)}; deaths {len(target.deaths)}; RSS {monitor.rss()[0]:.0f} MB"
                )
    finally:
        stop_drawing.set()
        for _ in senders:
            inputs.put(None)
        for s in senders:
            s.join(300)
    fuzz_s = time.monotonic() - t0
    cpu_end = monitor.cpu()
    client_cpu = time.process_time() - client_start
    log(f"fuzzing done: {produced:,} inputs in {fuzz_s:.0f}s; sending {args.after_spans} spans with the SDK")
    after = send_with_sdk(target, service, args.after_spans) if target.alive() else []
    time.sleep(args.probe_interval * 2)
    prober.stop_event.set()
    prober.join(60)
    want = {t: 1 for t in prober.acked[target.generation]} | {t: 10 for t in after}
    got = wait_stored(target, service, want, timeout=120)
    missing_probes = [t for t in prober.acked[target.generation] if got.get(t, 0) < 1]
    missing_after = [t for t in after if got.get(t, 0) < 10]
    time.sleep(2)
    rss_end = monitor.rss()
    monitor.stop_event.set()
    monitor.join(10)
    assert target.collector is not None
    peak = (  # VmHWM of the collector running now; the largest sampled, of any collector of the run
        max(rss_mb(target.pids[0], "VmHWM"), max((c for _, c, _ in monitor.samples), default=0)),
        max(sum(rss_mb(p, "VmHWM") for p in target.pids[1:]), max((w for _, _, w in monitor.samples), default=0)),
    )
    errors, first_error = log_errors(workdir)
    for msg, n in errors.items():  # acknowledged (200) and then not stored: a broken promise
        if "dropping" in msg or "giving up" in msg:
            sig = f"acknowledged, then not stored: {msg}"
            record.failures[sig] = Failure(sig, count=n, first=first_error[msg])

    # minimize and save every failure kind (on the live collector)
    minimized: dict[str, tuple[int, int, int]] = {}
    for k, (sig, f) in enumerate(sorted(record.failures.items(), key=lambda kv: -kv[1].count)):
        if f.smallest is None:
            continue
        small, tries = minimize(target, f.smallest, sig, args.minimize_budget) if target.alive() else (f.smallest, 0)
        minimized[sig] = (len(f.smallest.body), len(small.body), tries)
        meta = {
            "signature": sig,
            "count": f.count,
            "first problem": f.first,
            "answer": {
                "status": f.answer.status,
                "code": f.answer.code,
                "headers": f.answer.headers,
                "body": f.answer.body[:2000].decode("utf-8", "backslashreplace"),
            }
            if f.answer
            else None,
            "original body bytes": len(f.smallest.body),
            "minimize replays": tries,
        }
        save_input(out / "failures", f"failure{k:02d}", small, meta)
        if small is not f.smallest:
            save_input(out / "failures", f"failure{k:02d}-original", f.smallest, meta)

    code = target.collector.stop(signal.SIGTERM, timeout=120)
    result = {
        "args": vars(args),
        "inputs": produced,
        "seconds": round(fuzz_s, 1),
        "throughput": round(produced / fuzz_s, 1) if fuzz_s else None,
        "sent": dict(record.sent),
        "sent_sub": dict(record.sent_sub),
        "answers": {k: dict(v) for k, v in record.answers.items()},
        "failures": {
            s: {"count": f.count, "first": f.first[:300], "minimized": minimized.get(s)}
            for s, f in record.failures.items()
        },
        "answer seconds by kind": dict(record.seconds.most_common(15)),
        "collector cpu s": round(cpu_end - cpu_start, 1),
        "client cpu s": round(client_cpu, 1),
        "no_answer": dict(record.no_answer),
        "slow": sorted(record.slow, reverse=True)[:10],
        "probes": len(prober.latencies),
        "probe p99 by transport": {k: _pct(v, 99) for k, v in prober.by_transport.items()},
        "probe max by transport": {k: round(max(v), 2) for k, v in prober.by_transport.items() if v},
        "probe p50": _pct(prober.latencies, 50),
        "probe p99": _pct(prober.latencies, 99),
        "probe max": max(prober.latencies, default=0),
        "stalls": prober.stalls,
        "probe refusals": dict(prober.refused),
        "probes acked": sum(len(v) for v in prober.acked.values()),
        "missing probes": len(missing_probes),
        "after traces": len(after),
        "missing after traces": len(missing_after),
        "rss warm": rss_warm,
        "rss peak": peak,
        "rss end": rss_end,
        "rss series": rss_series,
        "rss max sampled": max((c for _, c, _ in monitor.samples), default=0),
        "deaths": target.deaths,
        "log errors": dict(errors.most_common(20)),
        "exit code": code,
    }
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print_report(result, record)
    shutil.rmtree(workdir, ignore_errors=True) if not args.keep else log(f"kept {workdir}")
    bad = record.failures or prober.stalls or missing_probes or missing_after or code != 0
    return 1 if bad else 0


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(len(s) * p / 100))], 3)


def print_report(r: dict[str, Any], record: Record) -> None:
    print(
        f"\n{r['inputs']:,} inputs in {r['seconds']:.0f} s ({r['throughput']:.0f}/s), workers {r['args']['workers']}, "
        f"{r['args']['connections']} connections, seed {r['args']['seed']}\n"
    )
    print("inputs by kind: " + ", ".join(f"{k} {v:,}" for k, v in sorted(r["sent"].items(), key=lambda kv: -kv[1])))
    print(
        "RSS MB every 10,000 inputs: "
        + ", ".join(f"{n // 1000}k {mb:.0f}" for n, mb in r["rss series"] if n % 10_000 == 0)
    )
    print()
    print("| inputs | kind / port | answers |")
    print("|---:|---|---|")
    for key in sorted(r["answers"]):
        answers = r["answers"][key]
        n = sum(answers.values())
        shown = ", ".join(f"{lab} {c:,}" for lab, c in sorted(answers.items(), key=lambda kv: -kv[1]))
        print(f"| {n:,} | {key} | {shown} |")
    print("\n| failure kind | count | minimized body (bytes) |")
    print("|---|---:|---|")
    for sig, f in sorted(r["failures"].items(), key=lambda kv: -kv[1]["count"]):
        m = f["minimized"]
        shown = f"{m[0]:,} → {m[1]:,}" if m else ""
        print(f"| {sig.replace('|', '/')} | {f['count']:,} | {shown} |")
    if not r["failures"]:
        print("| none | 0 | |")
    warm, peak, end = r["rss warm"] or (0, 0), r["rss peak"], r["rss end"]
    print(
        f"\nRSS MB (collector / its workers): after warm-up {warm[0]:.0f} / {warm[1]:.0f}; peak (VmHWM) "
        f"{peak[0]:.0f} / {peak[1]:.0f}; end {end[0]:.0f} / {end[1]:.0f}; growth end - warm-up "
        f"{end[0] - warm[0]:+.0f} / {end[1] - warm[1]:+.0f} MiB"
    )
    print(
        f"probes: {r['probes']} (p50 {r['probe p50']} s, p99 {r['probe p99']} s, max {r['probe max']:.2f} s); "
        f"stalls (> bound or refused) {len(r['stalls'])}; refusals {r['probe refusals'] or 'none'}"
    )
    print(
        f"stored: probes acknowledged {r['probes acked']}, missing {r['missing probes']}; SDK traces after "
        f"{r['after traces']} (10 spans each), missing {r['missing after traces']}"
    )
    print(
        f"collector deaths: {len(r['deaths'])}; exit code on SIGTERM {r['exit code']}; "
        f"log errors: {r['log errors'] or 'none'}"
    )
    if r["no_answer"]:
        print(
            "no answer (connection closed or timed out):",
            ", ".join(f"{k} {v}" for k, v in sorted(r["no_answer"].items(), key=lambda kv: -kv[1])[:8]),
        )
    print(
        f"CPU during the fuzzing: collector {r['collector cpu s']:.0f} s, this script {r['client cpu s']:.0f} s, in "
        f"{r['seconds']:.0f} s; answer time by kind: "
        + ", ".join(f"{k} {v:.0f}s" for k, v in list(r["answer seconds by kind"].items())[:8])
    )
    if r["slow"]:
        print("slowest answers:", "; ".join(f"{s:.1f}s {what} ({n:,} B)" for s, what, n in r["slow"][:5]))
    print(f"probe p99 / max by transport (s): {r['probe p99 by transport']} / {r['probe max by transport']}")
    for st in r["stalls"][:8]:
        print(f"  stall {st['seconds']}s ({st['probe']} probe: {st['answer']}): in flight {st['in flight'][:3]}")


def load_input(spec: str) -> F.FuzzInput:
    """A saved input (its .json, with the .bin beside it) or `size:NAME` (one of heavy_inputs(), by its sub)."""
    if spec.startswith("size:"):
        found = [h for h in heavy_inputs() if h.sub == spec[5:]]
        if not found:
            raise SystemExit(f"no size input {spec[5:]!r}; there are {[h.sub for h in heavy_inputs()]}")
        return found[0]
    meta = json.loads(Path(spec).read_text())
    keys = ("kind", "sub", "port", "method", "path", "headers", "grpc_compression")
    body = Path(spec).with_suffix(".bin").read_bytes()
    return F.FuzzInput(**{k: meta[k] for k in keys}, body=gzip.decompress(body) if meta.get("body_gzip") else body)


def prefill(target: Target, traces: int) -> None:
    """`traces` traces of 5 valid spans each, stored before a replay (for inputs whose cost grows with the store)."""
    conn = F.Connection(*target.otlp, timeout=120)
    for start in range(0, traces, 1000):
        spans = b""
        for _ in range(min(1000, traces - start)):
            trace = os.urandom(16)
            for i in range(5):
                spans += F.f_bytes(
                    2,
                    F.f_bytes(1, trace)
                    + F.f_bytes(2, os.urandom(7) + b"\x01")
                    + F.f_bytes(5, b"prefill %d" % i)
                    + F.f_fixed64(7, F.NOW)
                    + F.f_fixed64(8, F.NOW + 1000),
                )
        resource = F.f_bytes(1, F.key_value(b"service.name", F.f_bytes(1, b"prefill")))
        body = F.f_bytes(1, F.f_bytes(1, resource) + F.f_bytes(2, spans))
        a = F.send_http(conn, F.FuzzInput("prefill", "", "otlp", headers={"Content-Type": F.PROTOBUF}, body=body))
        if a.status != 200:
            raise RuntimeError(f"prefill refused: {a.label} {a.body[:200]!r}")
    want = traces
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # every trace stored before the input is sent
        host, port = target.api
        got = httpx.get(
            f"http://{host}:{port}/api/v1/traces", params={"service": "prefill", "limit": 10_000}, timeout=120
        ).json()["traces"]
        if len(got) >= min(want, 10_000):
            return
        time.sleep(1)


def _send_into(target: Target, inp: F.FuzzInput, answers: list[F.Answer]) -> None:
    answers.append(Sender(0, target, queue.Queue(), Record()).send(inp))


def replay_main(args: argparse.Namespace) -> int:
    """Send each saved input to a fresh collector while a probe runs: the answer, what in it breaks the contract,
    the slowest probe, the collector's RSS peak and the errors it logged. A saved input's .json may also ask for
    `prefill_traces` (traces stored first), `concurrent` (that many copies at once) and `then_get` (a GET sent
    after, or while the copies run, and checked too)."""
    failed = False
    for spec in args.replay:
        inp = load_input(spec)
        meta = json.loads(Path(spec).read_text()) if spec.endswith(".json") else {}
        workdir = Path(tempfile.mkdtemp(prefix="evalsi-fuzz-replay-"))
        target = Target(workdir, args.workers)
        if meta.get("prefill_traces"):
            log(f"storing {meta['prefill_traces']:,} traces first")
            prefill(target, meta["prefill_traces"])
        prober = Prober(target, "fuzz-replay", 0.25, args.stall_after, [], workdir / "out")
        prober.start()
        try:
            prober.wait_ready()
            copies = int(meta.get("concurrent", args.burst))
            answers: list[F.Answer] = []
            threads = [threading.Thread(target=_send_into, args=(target, inp, answers)) for _ in range(copies)]
            for t in threads:
                t.start()
            found: list[str] = []
            then = meta.get("then_get")
            if then and copies > 1:  # while the copies run
                time.sleep(1)
                after = F.FuzzInput("replay", "then", "api", method="GET", path=then)
                b = Sender(0, target, queue.Queue(), Record()).send(after)
                print(f"  GET {then} while {copies} copies run: {b.label} in {b.seconds:.2f} s")
                if b.seconds > args.stall_after or b.status != 200:
                    found.append(f"GET {then} while {copies} copies ran: {b.label} after {b.seconds:.2f} s")
            for t in threads:
                t.join(900)
            time.sleep(2)
            slowest = max(prober.latencies, default=0.0)
            for a in answers:
                found += F.problems(inp, a)
            if then and copies == 1:  # what the input left in the store breaks a read afterwards
                after = F.FuzzInput("replay", "then", "api", method="GET", path=then)
                b = Sender(0, target, queue.Queue(), Record()).send(after)
                found += [f"then GET {then}: {p}" for p in F.problems(after, b)]
            if not target.alive():
                found.append(f"evalsi serve died (exit {target.collector.proc.poll() if target.collector else None})")
            if slowest > args.stall_after:
                found.append(f"a probe sent meanwhile took {slowest:.2f} s (bound {args.stall_after:g} s)")
            errors, _ = log_errors(workdir)
            found += [f"logged: {m} x{n}" for m, n in errors.items() if "dropping" in m or "giving up" in m]
            a = max(answers, key=lambda x: x.seconds)
            print(
                f"{spec}: {copies} x {inp.kind} {inp.port} {inp.method} {inp.path[:80]} ({len(inp.body):,} B) -> "
                f"{a.label} in {a.seconds:.2f} s (slowest); slowest probe {slowest:.2f} s; RSS "
                f"{rss_mb(target.pids[0]):.0f} MB, peak {rss_mb(target.pids[0], 'VmHWM'):.0f} MB",
                flush=True,
            )
            print(f"  answer: {(a.body[:300] or a.headers.get('details', '')[:300] or a.error)!r}")
            for f in dict.fromkeys(found):
                print(f"  FAIL {f}")
            failed |= bool(found)
        finally:
            prober.stop_event.set()
            if target.collector is not None:
                target.collector.stop(signal.SIGKILL, timeout=60)
            shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--inputs", type=int, default=100_000, help="inputs to send (the size rounds not counted)")
    p.add_argument(
        "--seed", type=int, default=1, help="a seed makes the same inputs (the connections decide their order)"
    )
    p.add_argument("--duration", type=float, default=0, help="stop producing after this many seconds (0: no cap)")
    p.add_argument("--workers", type=int, default=0, help="service.workers (0 and 1: one process)")
    p.add_argument("--connections", type=int, default=8, help="sender threads, each with its own connections")
    p.add_argument("--mix", default="35,45,20", help="weights of structured,mutation,api")
    p.add_argument("--heavy", type=int, default=2, help="rounds of the 16 size inputs (spread over the run)")
    p.add_argument("--warmup", type=int, default=5000, help="inputs before the warm-up RSS is read")
    p.add_argument("--probe-interval", type=float, default=1.0)
    p.add_argument("--stall-after", type=float, default=2.0, help="a probe answered later than this is a stall")
    p.add_argument("--after-spans", type=int, default=500, help="spans sent with the SDK after the fuzzing")
    p.add_argument("--minimize-budget", type=int, default=150, help="replays to minimize each failure kind")
    p.add_argument(
        "--out",
        default=str(Path(tempfile.gettempdir()) / "evalsi-fuzz"),
        help="where failures, stalls, deaths and result.json go",
    )
    p.add_argument(
        "--rss-cap-mb",
        type=float,
        default=8000,
        help="kill the collector (a failure) once it and its workers hold more (the machine is shared)",
    )
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        metavar="TEXT",
        help="leave out inputs whose 'kind port sub' holds one of these (to tell which kind does what)",
    )
    p.add_argument("--keep", action="store_true", help="keep the collector's work directory (store, log)")
    p.add_argument("--burst", type=int, default=1, help="with --replay: send this many copies of each at once")
    p.add_argument(
        "--replay",
        nargs="+",
        metavar="INPUT",
        help="send saved inputs (.json beside its .bin, or size:NAME) to a fresh collector and check them",
    )
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the collectors are stopped below
    try:
        return replay_main(args) if args.replay else run(args)
    finally:
        for t in TARGETS:
            if t.collector is not None and t.collector.proc.poll() is None:
                t.collector.stop(signal.SIGKILL, timeout=60)


if __name__ == "__main__":
    sys.exit(main())
