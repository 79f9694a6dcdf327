"""OTLP ingest benchmark: a real `evalsi serve`, pre-encoded GenAI span payloads, accepted and stored spans/s.

Builds OTLP ExportTraceServiceRequest payloads (protobuf, straight from the opentelemetry.proto classes: the SDK
cannot make spans fast enough to load a collector), measures the in-process decode floor over the same payloads,
then starts `evalsi serve` on port 0 with a fresh embedded store, sends every payload over OTLP/HTTP and/or
OTLP/gRPC at the given concurrency, and times:

- accepted spans/s: from the first send until the last request is answered OK;
- stored spans/s: from the first send until the exporter reports every span written to the store
  (`otelcol_exporter_sent_spans_total` on the metrics endpoint, polled).

Then it stops the collector with SIGTERM, checks it exits 0, and counts the rows in the store.
Run `python benchmarks/ingest.py --help`; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import http.client
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
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from running_collector import Collector, serve_config, start_collector  # noqa: E402

from evalsi.receivers.otlp.decode import decode_traces_protobuf  # noqa: E402

GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
PROTOBUF = "application/x-protobuf"
SENDING_POLL = 0.5  # seconds between polls of /metrics while the client still sends
SPEED_BAR = 10_000  # the bar: stored spans/s over HTTP on a 2-core machine

MODELS = ["gpt-4o-mini", "gpt-4o", "claude-sonnet-4", "gemini-2.0-flash"]
PROVIDERS = {"gpt-4o-mini": "openai", "gpt-4o": "openai", "claude-sonnet-4": "anthropic", "gemini-2.0-flash": "gcp"}
FINISH = ["stop", "stop", "stop", "length", "tool_calls"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- payloads --------------------------------------------------------------------------------------------


def _kv(key: str, value: Any) -> KeyValue:
    kv = KeyValue(key=key)
    v = kv.value
    if isinstance(value, bool):
        v.bool_value = value
    elif isinstance(value, int):
        v.int_value = value
    elif isinstance(value, float):
        v.double_value = value
    elif isinstance(value, list):
        v.array_value.values.extend(AnyValue(string_value=x) for x in value)
    else:
        v.string_value = value
    return kv


def input_messages(rng: random.Random, size: int) -> str:
    """`gen_ai.input.messages` in the OTel GenAI message format, about `size` bytes of JSON."""
    words = "the a customer asked about order refund shipping invoice status delayed account please help".split()
    system = "You are a helpful support assistant. Answer briefly and cite the order number when relevant."

    def text(n: int) -> str:
        out: list[str] = []
        length = 0
        while length < n:
            w = rng.choice(words)
            out.append(w)
            length += len(w) + 1
        return " ".join(out)

    messages: list[dict[str, Any]] = [
        {"role": "system", "parts": [{"type": "text", "content": system}]},
        {"role": "user", "parts": [{"type": "text", "content": ""}]},
    ]
    base = len(json.dumps(messages, separators=(",", ":")))
    messages[1]["parts"][0]["content"] = text(max(16, size - base))
    return json.dumps(messages, separators=(",", ":"))


def build_template(spans_per_request: int, content_bytes: int, seed: int) -> Any:
    """One request of GenAI chat spans; ids, timestamps and response ids are rewritten per request."""
    rng = random.Random(seed)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(
        [
            _kv("service.name", "support-bot"),
            _kv("service.version", "1.4.2"),
            _kv("deployment.environment.name", "bench"),
            _kv("telemetry.sdk.language", "python"),
        ]
    )
    ss = rs.scope_spans.add()
    ss.scope.name = "opentelemetry.instrumentation.openai_v2"
    ss.scope.version = "2.1b0"
    contents = [input_messages(rng, content_bytes) for _ in range(8)]
    for i in range(spans_per_request):
        model = MODELS[i % len(MODELS)]
        s = ss.spans.add()
        s.name = f"chat {model}"
        s.kind = Span.SPAN_KIND_CLIENT
        s.status.code = Status.STATUS_CODE_OK if i % 50 else Status.STATUS_CODE_ERROR
        s.attributes.extend(
            [
                _kv("gen_ai.operation.name", "chat"),
                _kv("gen_ai.provider.name", PROVIDERS[model]),
                _kv("gen_ai.request.model", model),
                _kv("gen_ai.response.model", model + "-2024-07-18"),
                _kv("gen_ai.usage.input_tokens", rng.randint(50, 4000)),
                _kv("gen_ai.usage.output_tokens", rng.randint(5, 800)),
                _kv("gen_ai.response.id", "chatcmpl-" + "0" * 24),  # rewritten per request
                _kv("gen_ai.response.finish_reasons", [rng.choice(FINISH)]),
                _kv("gen_ai.request.temperature", 0.2),
                _kv("gen_ai.request.max_tokens", 1024),
                _kv("server.address", "api.example.com"),
                _kv("gen_ai.conversation.id", "conv-" + "0" * 16),  # rewritten per request
                _kv("gen_ai.input.messages", contents[i % len(contents)]),
            ]
        )
    return req


RESPONSE_ID_ATTR = 6
CONVERSATION_ATTR = 11


def build_payloads(template: Any, n_requests: int, spans_per_trace: int, run_tag: int, start_ns: int) -> list[bytes]:
    """`n_requests` encoded requests: unique trace ids (spans_per_trace spans each: a root and its children,
    one after the other), timestamps spread over the minute before `start_ns`."""
    payloads = []
    spans = template.resource_spans[0].scope_spans[0].spans
    step_ns = 60_000_000_000 // max(1, n_requests)
    for r in range(n_requests):
        base = start_ns - 60_000_000_000 + r * step_ns
        for i, s in enumerate(spans):
            t, pos = divmod(i, spans_per_trace)
            trace_id = run_tag.to_bytes(4, "big") + r.to_bytes(4, "big") + (t + 1).to_bytes(8, "big")
            s.trace_id = trace_id
            s.span_id = (r * 1_000_000 + i + 1).to_bytes(8, "big")
            s.parent_span_id = b"" if pos == 0 else (r * 1_000_000 + t * spans_per_trace + 1).to_bytes(8, "big")
            # the root spans its children; children run one after another, 150-900 ms each
            if pos == 0:
                s.start_time_unix_nano = base + t * 1_000_000
                s.end_time_unix_nano = s.start_time_unix_nano + 900_000_000 * spans_per_trace
            else:
                s.start_time_unix_nano = base + t * 1_000_000 + (pos - 1) * 900_000_000 + 1_000_000
                s.end_time_unix_nano = s.start_time_unix_nano + 150_000_000 + (i * 7919 % 750) * 1_000_000
            s.attributes[RESPONSE_ID_ATTR].value.string_value = f"chatcmpl-{r:08x}{i:08x}{run_tag:08x}"
            s.attributes[CONVERSATION_ATTR].value.string_value = f"conv-{run_tag:04x}{r:06x}{t:06x}"
        payloads.append(template.SerializeToString())
    return payloads


# --- decode floor ----------------------------------------------------------------------------------------


def floor_rate(payloads: list[bytes], spans_per_request: int, fn: Callable[[bytes], Any], seconds: float) -> float:
    """Spans per CPU-second of `fn` over the payloads, cycled for at least `seconds` (one warm-up request first).
    CPU time of this process, not wall time, so that other load on the machine skews the floor less."""
    fn(payloads[0])
    n = 0
    t0 = time.process_time()
    while True:
        fn(payloads[n % len(payloads)])
        n += 1
        elapsed = time.process_time() - t0
        if elapsed >= seconds and n >= 3:
            return n * spans_per_request / elapsed


def pipeline_step(body: bytes) -> Any:
    """What the collector does per request in Python besides transport: decode, normalize, Arrow columns."""
    from evalsi.exporters.clickhouse.rows import to_arrow
    from evalsi.processors.normalize import normalize_span

    spans = decode_traces_protobuf(body).batch.spans
    for s in spans:
        normalize_span(s)
    return to_arrow(spans)


# --- sending ---------------------------------------------------------------------------------------------


@dataclass
class SendResult:
    ok_requests: int = 0
    accepted_spans: int = 0
    rejected_spans: int = 0
    retries: int = 0
    errors: list[str] = field(default_factory=list)
    last_ok: float = 0.0


def _partial_rejected(body: bytes) -> int:
    if not body:
        return 0
    resp = ExportTraceServiceResponse.FromString(body)
    return resp.partial_success.rejected_spans


def _http_worker(url: str, payloads: list[bytes], take: Callable[[], int | None], spans: int, out: SendResult,
                 lock: threading.Lock, extra_headers: dict[str, str] | None = None) -> None:  # fmt: skip
    # the standard library's client: a load generator should leave the CPU to the collector (with httpx the
    # client, poller included, took ~11% of a core at 9k spans/s; with http.client ~7%)
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=120)
    headers = {"Content-Type": PROTOBUF, **(extra_headers or {})}
    try:
        while (i := take()) is not None:
            for _attempt in range(20):
                try:
                    conn.request("POST", u.path, body=payloads[i], headers=headers)
                    resp = conn.getresponse()
                    content = resp.read()
                except (OSError, http.client.HTTPException) as e:
                    with lock:
                        out.errors.append(f"request {i}: {type(e).__name__}: {e}")
                    conn.close()
                    break
                if resp.status == 200:
                    rejected = _partial_rejected(content)
                    with lock:
                        out.ok_requests += 1
                        out.accepted_spans += spans - rejected
                        out.rejected_spans += rejected
                        out.last_ok = max(out.last_ok, time.perf_counter())
                    break
                if resp.status in (429, 503):
                    with lock:
                        out.retries += 1
                    time.sleep(min(1.0, float(resp.getheader("Retry-After") or "1")))
                    continue
                with lock:
                    out.errors.append(f"request {i}: HTTP {resp.status}: {content[:200]!r}")
                break
    finally:
        conn.close()


def _grpc_worker(target: str, payloads: list[bytes], take: Callable[[], int | None], spans: int, out: SendResult,
                 lock: threading.Lock) -> None:  # fmt: skip
    with grpc.insecure_channel(target) as channel:
        export = channel.unary_unary(GRPC_METHOD)  # no serializers: raw bytes in and out
        while (i := take()) is not None:
            for _attempt in range(20):
                try:
                    body = export(payloads[i], timeout=120)
                except grpc.RpcError as e:
                    code = e.code()
                    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                        with lock:
                            out.retries += 1
                        time.sleep(0.5)
                        continue
                    with lock:
                        out.errors.append(f"request {i}: gRPC {code.name}: {e.details()}")
                    break
                rejected = _partial_rejected(body)
                with lock:
                    out.ok_requests += 1
                    out.accepted_spans += spans - rejected
                    out.rejected_spans += rejected
                    out.last_ok = max(out.last_ok, time.perf_counter())
                break


def send_all(transport: str, c: Collector, payloads: list[bytes], spans: int, concurrency: int,
             headers: dict[str, str] | None = None) -> SendResult:  # fmt: skip
    out = SendResult()
    lock = threading.Lock()
    it = iter(range(len(payloads)))

    def take() -> int | None:
        with lock:
            return next(it, None)

    if transport == "http":
        target, worker, extra = c.http + "/v1/traces", _http_worker, (headers,)
    else:
        target, worker, extra = c.grpc, _grpc_worker, ()
    threads = [
        threading.Thread(target=worker, args=(target, payloads, take, spans, out, lock, *extra), daemon=True)
        for _ in range(concurrency)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# --- watching the collector ------------------------------------------------------------------------------


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _stat(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (the process state first); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(*pids: int) -> float:
    """User+system CPU seconds of processes (all their threads), from /proc."""
    total = 0.0
    for pid in pids:
        if (fields := _stat(pid)) is not None:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def system_seconds(pid: int) -> float:
    """A process's CPU seconds in the kernel (all its threads): page faults, pipe and socket copies, futex waits."""
    fields = _stat(pid)
    return int(fields[12]) / os.sysconf("SC_CLK_TCK") if fields is not None else 0.0


def minor_faults(pid: int) -> int:
    """A process's minor page faults so far: memory it touched for the first time since it was mapped, e.g. a
    block glibc mapped on its own and unmapped when freed; 0 once it is gone."""
    fields = _stat(pid)
    return int(fields[7]) if fields is not None else 0


def system_busy_seconds() -> float:
    """CPU seconds spent busy by the whole machine (all cores), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (threads of one name summed)."""
    out: dict[str, float] = defaultdict(float)
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[name] += (int(fields[11]) + int(fields[12])) / tick
    return dict(out)


class StorePoller(threading.Thread):
    """Polls the exporter's sent-spans counter until it reaches the target (set once sending is done)."""

    def __init__(self, metrics_url: str, interval: float, timeout: float) -> None:
        super().__init__(daemon=True)
        self.url = metrics_url
        self.interval = interval
        self.timeout = timeout
        self.target: int | None = None
        self.stored = 0.0
        self.done_at: float | None = None
        self.peak_queue = 0.0
        self._stop_event = threading.Event()
        self._target_set = threading.Event()

    def set_target(self, spans: int) -> None:
        """Every request is answered: poll at full pace until the store holds `spans`."""
        self.target = spans
        self._target_set.set()

    def run(self) -> None:
        started = time.perf_counter()
        with httpx.Client(timeout=10) as client:
            while not self._stop_event.is_set():
                try:
                    text = client.get(self.url).text
                except httpx.HTTPError:
                    text = ""
                now = time.perf_counter()
                if text:
                    self.stored = metric_sum(text, "otelcol_exporter_sent_spans_total")
                    self.peak_queue = max(self.peak_queue, metric_sum(text, "otelcol_exporter_queue_size"))
                if self.target is not None and self.stored >= self.target:
                    self.done_at = now
                    return
                if now - started > self.timeout:
                    return
                if self.target is not None:
                    time.sleep(self.interval)
                else:  # while the client sends, a slower pace: each scrape costs the collector and this process CPU
                    self._target_set.wait(max(self.interval, SENDING_POLL))

    def stop(self) -> None:
        self._stop_event.set()


# --- profiling -------------------------------------------------------------------------------------------


def start_profiler(pid: int, out: Path, rate: int, extra: list[str]) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        log("--profile: py-spy not found (`pip install py-spy`); not profiling")
        return None
    cmd = [exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--threads",
           "--nonblocking", "--output", str(out)]  # fmt: skip
    cmd += extra
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)  # let it attach before the load starts
    return proc


def stop_profiler(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _frame(frame: str) -> str:
    """`func (path/to/file.py:123)` as `func (file.py)`: one entry per function."""
    func, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if parts else path
    return f"{func} ({short})"


# Where a span's time goes in the collector, by the function a sample is under (the first that matches, from
# the leaf up). Names as py-spy reports them; a stage whose function is renamed just stops matching.
STAGES = [
    ("decode (protobuf -> Span)", ("decode_traces_protobuf", "decode_traces_json")),
    ("normalize processor", ("Normalize.consume",)),
    ("to_arrow (Span -> Arrow)", ("to_arrow",)),
    ("store insert (chDB)", ("ChdbBackend.insert", "ServerBackend.insert")),
    ("HTTP transport (uvicorn/starlette)", ("RequestResponseCycle.run_asgi", "HttpToolsProtocol.data_received")),
    ("gRPC transport", ("GrpcTransport._handle", "_handle_call", "_handle_rpc")),
    ("/metrics scrape", ("generate_latest",)),
]


def _stage(frames: list[str]) -> str:
    for f in reversed(frames):
        name = f.split(" (", 1)[0]
        for stage, funcs in STAGES:
            if name in funcs:
                return stage
    return "other"


def summarize_profile(raw: Path, seconds: float, rate: int, top: int) -> dict[str, Any]:
    """Top functions by self and inclusive samples, as % of one core over the profiled time."""
    self_s: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        thread, frames = frames[0], [_frame(f) for f in frames[1:]]
        total += n
        threads[thread] += n
        stages[_stage(frames)] += n
        if frames:
            self_s[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    core = max(1.0, seconds * rate) / 100  # samples in 1% of one core
    return {
        "samples": total,
        "seconds": round(seconds, 2),
        "busy_core_pct": round(total / core, 1),
        "threads": [(t, round(n / core, 1)) for t, n in threads.most_common(8)],
        "stages": [(t, round(n / core, 1)) for t, n in stages.most_common()],
        "self": [(f, round(n / core, 1)) for f, n in self_s.most_common(top)],
        "inclusive": [(f, round(n / core, 1)) for f, n in incl.most_common(top)],
    }


def print_profile(p: dict[str, Any]) -> None:
    log(f"\nprofile of the collector: {p['samples']} samples over {p['seconds']} s, "
        f"busy {p['busy_core_pct']}% of one core (py-spy counts non-idle threads)")  # fmt: skip
    log("  by thread (% of one core):")
    for t, pct in p["threads"]:
        log(f"    {pct:6.1f}%  {t}")
    log("  by pipeline stage (% of one core):")
    for t, pct in p["stages"]:
        log(f"    {pct:6.1f}%  {t}")
    for title in ("self", "inclusive"):
        log(f"  top functions, {title} (% of one core):")
        for f, pct in p[title]:
            log(f"    {pct:6.1f}%  {f}")


# --- one run ---------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    transport: str
    concurrency: int
    requests: int
    spans: int
    accepted_spans: int = 0
    accepted_s: float = 0.0
    stored_s: float | None = None
    accepted_per_s: float = 0.0
    stored_per_s: float | None = None
    retries: int = 0
    server_cpu_pct: float = 0.0
    server_cpu_us_per_span: float = 0.0
    server_threads_cpu_s: dict[str, float] = field(default_factory=dict)
    process_cpu_us_per_span: dict[str, float] = field(default_factory=dict)
    client_cpu_pct: float = 0.0
    other_cpu_pct: float = 0.0
    load_before: float = 0.0
    peak_queue: float = 0.0
    exit_code: int | None = None
    rows_in_store: int | None = None
    failures: list[str] = field(default_factory=list)
    profile: dict[str, Any] | None = None


def count_rows(store: Path) -> int:
    """Rows in the store, read by a separate process once the collector has released it."""
    code = (
        "import sys; from chdb import session; s = session.Session(sys.argv[1]); "
        "print(s.query('SELECT count() FROM default.otel_traces', 'CSV').bytes().decode().strip())"
    )
    res = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip()[-500:])
    return int(res.stdout.strip().splitlines()[-1])


def run_one(args: argparse.Namespace, transport: str, payloads: list[bytes], workdir: Path) -> RunResult:
    spans = args.spans_per_request
    res = RunResult(transport, args.concurrency, len(payloads), len(payloads) * spans)
    tmp = workdir / transport
    tmp.mkdir()
    store = tmp / "store"
    config = serve_config(store)
    exporter = config["exporters"]["clickhouse"]
    if args.no_normalize:
        config["processors"] = {}
        for pipeline in config["service"]["pipelines"].values():
            pipeline["processors"] = []
    elif args.mappers:
        config["processors"]["normalize"] = {"mappers": args.mappers.split(",")}
    exporter.pop("flush_interval", None)  # the product defaults unless asked otherwise
    if args.workers > 1:
        config["service"]["workers"] = args.workers
    if args.worker_max_in_flight:
        config["service"]["worker_max_in_flight"] = args.worker_max_in_flight
    if args.durability == "wal":
        config["service"]["durability"] = {"mode": "wal", "directory": str(tmp / "wal")}
    if args.flush_interval:
        exporter["flush_interval"] = args.flush_interval
    if args.batch_size:
        exporter["batch_size"] = args.batch_size
    if args.queue_size:
        exporter["queue_size"] = args.queue_size
    log(f"[{transport}] starting evalsi serve (store {store})")
    saved_pythonpath = os.environ.get("PYTHONPATH")
    if args.gc_threshold is not None:
        # an experiment, not a product setting: the collector's cyclic GC tuned through a sitecustomize.py
        site = tmp / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(
            f"import gc\ngc.set_threshold({args.gc_threshold}, 10, 10)\n"
            if args.gc_threshold
            else "import gc\ngc.disable()\n"
        )
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), saved_pythonpath) if p)
    try:
        c = start_collector(tmp, config)
    except AssertionError as e:  # it exited, or never logged "ready"
        res.failures.append(f"evalsi serve did not start: {e}")
        return res
    finally:
        if saved_pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_pythonpath
    pid = c.proc.pid
    pids = [pid, *c.ready.get("workers", [])]  # the collector and its pipeline workers
    try:
        profiler = None
        if args.profile:
            raw = Path(args.profile) / f"{transport}.raw.txt"
            raw.parent.mkdir(parents=True, exist_ok=True)
            extra = [flag for on, flag in ((args.native, "--native"), (args.gil, "--gil"), (args.idle, "--idle")) if on]
            profiler = start_profiler(pid, raw, args.profile_rate, extra)
            # each pipeline worker into its own raw file, for a look with any folded-stack tool
            worker_profilers = [
                start_profiler(w, raw.with_name(f"{transport}.worker{i}.raw.txt"), args.profile_rate, extra)
                for i, w in enumerate(pids[1:])
            ]
        poller = StorePoller(c.metrics, args.poll_interval, args.store_timeout)
        res.load_before = os.getloadavg()[0]
        cpu0, threads0, client0, sys0 = cpu_seconds(*pids), thread_cpu(pid), time.process_time(), system_busy_seconds()
        each0 = [cpu_seconds(p) for p in pids]
        log(f"[{transport}] sending {len(payloads)} requests x {spans} spans, concurrency {args.concurrency}")
        t0 = time.perf_counter()
        poller.start()
        sent = send_all(transport, c, payloads, spans, args.concurrency)
        res.accepted_spans = sent.accepted_spans
        res.retries = sent.retries
        res.accepted_s = (sent.last_ok or time.perf_counter()) - t0
        res.accepted_per_s = sent.accepted_spans / res.accepted_s if res.accepted_s else 0.0
        poller.set_target(sent.accepted_spans)
        poller.join()
        t1 = poller.done_at or time.perf_counter()
        cpu1, threads1, client1, sys1 = cpu_seconds(*pids), thread_cpu(pid), time.process_time(), system_busy_seconds()
        names = ["collector", *(f"worker {i}" for i in range(len(pids) - 1))]
        res.process_cpu_us_per_span = {
            name: round(1e6 * (cpu_seconds(p) - before) / max(1, sent.accepted_spans), 1)
            for name, p, before in zip(names, pids, each0, strict=True)
        }
        if profiler is not None:
            stop_profiler(profiler)
            for wp in worker_profilers:
                if wp is not None:
                    stop_profiler(wp)
            if raw.exists():
                res.profile = summarize_profile(raw, t1 - t0, args.profile_rate, args.profile_top)
        res.peak_queue = poller.peak_queue
        res.server_cpu_pct = 100 * (cpu1 - cpu0) / (t1 - t0)
        # the cost of a span, whatever else the machine was doing: the steadiest figure on a shared machine
        res.server_cpu_us_per_span = 1e6 * (cpu1 - cpu0) / max(1, sent.accepted_spans)
        res.client_cpu_pct = 100 * (client1 - client0) / (t1 - t0)
        # what else ran on the machine meanwhile (other sessions, py-spy): the figures are only as good as this is low
        res.other_cpu_pct = max(0.0, 100 * (sys1 - sys0) / (t1 - t0) - res.server_cpu_pct - res.client_cpu_pct)
        res.server_threads_cpu_s = {
            k: round(v - threads0.get(k, 0.0), 2) for k, v in threads1.items() if v - threads0.get(k, 0.0) >= 0.05
        }
        if poller.done_at is not None:
            res.stored_s = poller.done_at - t0
            res.stored_per_s = sent.accepted_spans / res.stored_s
        else:
            res.failures.append(
                f"store holds {int(poller.stored)} of {sent.accepted_spans} accepted spans after {args.store_timeout}s"
            )
        if sent.errors:
            res.failures.append(f"{len(sent.errors)} request(s) failed; first: {sent.errors[0]}")
        if sent.rejected_spans:
            res.failures.append(f"{sent.rejected_spans} span(s) rejected by the collector (partial success)")
        if sent.accepted_spans != res.spans:
            res.failures.append(f"accepted {sent.accepted_spans} of {res.spans} spans sent")
    finally:
        log(f"[{transport}] stopping the collector (SIGTERM)")
        try:
            res.exit_code = c.stop(signal.SIGTERM, timeout=120)
        except subprocess.TimeoutExpired:
            c.proc.kill()
            res.exit_code = c.proc.wait()
            res.failures.append("collector did not exit within 120 s of SIGTERM (killed)")
    if res.exit_code != 0:
        tail = "\n".join(c.log_path.read_text().splitlines()[-20:])
        res.failures.append(f"collector exited {res.exit_code}; log tail:\n{tail}")
    try:
        res.rows_in_store = count_rows(store)
    except Exception as e:
        res.failures.append(f"cannot count the rows in the store: {e}")
    else:
        if res.rows_in_store != res.accepted_spans:
            res.failures.append(f"store holds {res.rows_in_store} rows, {res.accepted_spans} spans were accepted")
    return res


# --- main ------------------------------------------------------------------------------------------------


def fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def print_table(runs: list[RunResult], floors: dict[str, float]) -> None:
    decode = floors.get("decode")
    head = ["transport", "conc", "spans", "accepted/s", "stored/s", "parse floor/s", "decode floor/s",
            "pipeline floor/s", "stored/decode", "server CPU", "server µs/span", "client CPU", "other CPU"]  # fmt: skip
    rows = [head]
    for r in runs:
        ratio = "-" if r.stored_per_s is None or not decode else f"{r.stored_per_s / decode:.2f}"
        rows.append(
            [
                r.transport,
                str(r.concurrency),
                f"{r.spans:,}",
                fmt_rate(r.accepted_per_s),
                fmt_rate(r.stored_per_s),
                fmt_rate(floors.get("parse")),
                fmt_rate(decode),
                fmt_rate(floors.get("pipeline")),
                ratio,
                f"{r.server_cpu_pct:.0f}%",
                f"{r.server_cpu_us_per_span:.0f}",
                f"{r.client_cpu_pct:.0f}%",
                f"{r.other_cpu_pct:.0f}%",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for n, row in enumerate(rows):
        print(
            "  ".join(
                cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Ingest benchmark: accepted and stored spans/s of a real `evalsi serve` against the decode floor.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--transport", choices=["http", "grpc", "both"], default="http",
                   help="OTLP transport; `both` runs HTTP then gRPC, each against a fresh collector")  # fmt: skip
    p.add_argument("--spans", type=int, default=200_000, help="total spans to send per transport")
    p.add_argument("--spans-per-request", type=int, default=500)
    p.add_argument("--spans-per-trace", type=int, default=5, help="a root span and its children")
    p.add_argument("--content-bytes", type=int, default=1024, help="size of the gen_ai.input.messages attribute")
    p.add_argument("--concurrency", type=int, default=8, help="client threads, one connection each")
    p.add_argument("--floor-seconds", type=float, default=2.0, help="time spent on each decode floor")
    p.add_argument("--no-floor", action="store_true", help="skip the in-process floors")
    p.add_argument("--flush-interval", help="exporter flush_interval (None: the product default)")
    p.add_argument("--batch-size", type=int, help="exporter batch_size (None: the product default)")
    p.add_argument("--queue-size", type=int, help="exporter queue_size (None: the product default)")
    p.add_argument("--poll-interval", type=float, default=0.05,
                   help="seconds between polls of /metrics once every request is answered")  # fmt: skip
    p.add_argument("--store-timeout", type=float, default=600, help="give up waiting for the store after this")
    p.add_argument("--profile", metavar="DIR",
                   help="record the collector with py-spy during the load (raw stacks in DIR) and print the top "
                        "functions")  # fmt: skip
    p.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--profile-top", type=int, default=25, help="functions listed per profile table")
    p.add_argument("--native", action="store_true", help="py-spy --native (C frames too; slower)")
    p.add_argument("--gil", action="store_true",
                   help="py-spy --gil: only the thread holding the GIL (%% = GIL utilization)")  # fmt: skip
    p.add_argument("--idle", action="store_true", help="py-spy --idle: count idle (waiting) threads too")
    p.add_argument("--workers", type=int, default=1,
                   help="service.workers: pipeline worker processes (server CPU then sums them all)")  # fmt: skip
    p.add_argument("--durability", choices=["memory", "wal"], default="memory",
                   help="service.durability.mode (wal: each request fsynced before it is answered)")  # fmt: skip
    p.add_argument("--worker-max-in-flight", type=int, help="service.worker_max_in_flight (None: the default)")
    p.add_argument("--no-normalize", action="store_true",
                   help="run the pipeline without the normalize processor (to see its share)")  # fmt: skip
    p.add_argument("--mappers", metavar="NAMES",
                   help="comma-separated normalize mappers to enable (default: all), e.g. otel_genai")  # fmt: skip
    p.add_argument("--gc-threshold", type=int, metavar="N",
                   help="experiment: run the collector with gc.set_threshold(N, 10, 10) (0: gc.disable()), "
                        "injected with a sitecustomize.py, to measure what the cyclic GC costs")  # fmt: skip
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (stores, logs, configs)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout instead of a table")
    args = p.parse_args(argv)
    if args.spans < args.spans_per_request or args.spans_per_request < 1 or args.spans_per_trace < 1:
        p.error("need --spans >= --spans-per-request >= 1 and --spans-per-trace >= 1")
    if args.concurrency < 1:
        p.error("--concurrency must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n_requests = args.spans // args.spans_per_request
    transports = ["http", "grpc"] if args.transport == "both" else [args.transport]

    t = time.perf_counter()
    template = build_template(args.spans_per_request, args.content_bytes, args.seed)
    now = time.time_ns()
    payloads = {
        tr: build_payloads(
            template, n_requests, args.spans_per_trace, random.Random(args.seed + k).getrandbits(31) | 1, now
        )
        for k, tr in enumerate(transports)
    }
    first = next(iter(payloads.values()))
    size = sum(len(b) for b in first) / len(first)
    per_span = size / args.spans_per_request
    log(f"built {n_requests} requests x {args.spans_per_request} spans per transport "
        f"({size / 1024:.0f} KiB each, {per_span:.0f} B/span) in {time.perf_counter() - t:.1f}s")  # fmt: skip

    floors: dict[str, float] = {}
    if not args.no_floor:
        sample = first[: max(1, min(len(first), 50))]
        spr = args.spans_per_request
        log("measuring the in-process floors (collector not running yet)")
        floors["parse"] = floor_rate(sample, spr, ExportTraceServiceRequest.FromString, args.floor_seconds)
        floors["decode"] = floor_rate(sample, spr, decode_traces_protobuf, args.floor_seconds)
        floors["pipeline"] = floor_rate(sample, spr, pipeline_step, args.floor_seconds)
        log("  parse (FromString): {:,.0f} spans/s; decode (decode_traces_protobuf): {:,.0f} spans/s; "
            "pipeline (decode + normalize + to_arrow): {:,.0f} spans/s".format(*floors.values()))  # fmt: skip

    workdir = Path(tempfile.mkdtemp(prefix="evalsi-bench-"))
    runs: list[RunResult] = []
    try:
        for tr in transports:
            runs.append(run_one(args, tr, payloads[tr], workdir))
            r = runs[-1]
            log(f"[{tr}] accepted {fmt_rate(r.accepted_per_s)} spans/s, stored {fmt_rate(r.stored_per_s)} spans/s, "
                f"server CPU {r.server_cpu_pct:.0f}% (CPU s by thread: {r.server_threads_cpu_s}), "
                f"peak queue {r.peak_queue:,.0f}")  # fmt: skip
            log(f"[{tr}] CPU µs a span by process: {r.process_cpu_us_per_span}")
            if r.stored_s is not None:
                log(f"[{tr}] after the last answer: {r.stored_s - r.accepted_s:.2f}s until stored, {r.retries} retries")
            if r.profile:
                print_profile(r.profile)
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    failed = False
    if args.json:
        doc = {
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
            "params": {k: v for k, v in vars(args).items() if k != "json"},
            "floors_spans_per_s": floors,
            "runs": [asdict(r) for r in runs],
        }
        print(json.dumps(doc, indent=2))
    else:
        print()
        print_table(runs, floors)
        print()
    for r in runs:
        for f in r.failures:
            failed = True
            log(f"FAIL [{r.transport}]: {f}")
        if not r.failures:
            log(f"ok [{r.transport}]: collector exited 0; the store holds all {r.rows_in_store:,} accepted spans")
        if r.transport == "http" and r.stored_per_s is not None:
            met = "met" if r.stored_per_s >= SPEED_BAR else "MISSED"
            log(f"speed bar (stored >= {SPEED_BAR:,} spans/s over HTTP): {met} ({r.stored_per_s:,.0f} spans/s)")
    if failed:
        log("FAIL: see above")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
