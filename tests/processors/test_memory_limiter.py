"""memory_limiter: its config errors, its state machine on a fake memory reading, where it may be listed, how it reads
cgroup limits, and a real `evalsi serve` (one process and two workers) that a burst pushes over the limit: the senders
get retryable refusals, the collector accepts again once the memory is released, and every span it acknowledged is
stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.collector.config import ConfigError, parse_config
from evalsi.component import Next, Refused, Settings
from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.span import Span, SpanBatch
from evalsi.processors.memory_limiter import (
    ITEMS_PER_CHECK,
    MIB,
    Limiter,
    Limits,
    MemoryLimiter,
    MemoryLimiterConfig,
    cgroup_memory_limit,
    limits,
    total_memory,
)
from evalsi.runtime.telemetry import SelfMetrics

PROTOBUF = {"Content-Type": "application/x-protobuf"}


# --- config ------------------------------------------------------------------------------------------------------


def _doc(body: dict[str, Any], processors: list[str] | None = None, workers: int = 1) -> dict[str, Any]:
    return {
        "receivers": {"otlp": {}},
        "processors": {"memory_limiter": body, "normalize": {}},
        "exporters": {"clickhouse": {}},
        "service": {
            "workers": workers,
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": processors or ["memory_limiter", "normalize"],
                    "exporters": ["clickhouse"],
                },
            },
        },
    }


@pytest.mark.parametrize(
    ("body", "key", "says"),
    [
        ({}, "", "set limit_mib or limit_percentage: without a limit the memory_limiter would never refuse"),
        ({"limit_mib": 0}, "", "set limit_mib or limit_percentage"),
        ({"limit_mib": 100, "spike_limit_mib": 100}, "spike_limit_mib", "must be below limit_mib (100 >= 100)"),
        ({"limit_mib": 100, "spike_limit_mib": 150}, "spike_limit_mib", "every request would be refused"),
        ({"limit_percentage": 80, "spike_limit_percentage": 80}, "spike_limit_percentage", "below limit_percentage"),
        ({"limit_percentage": 120}, "limit_percentage", "from 1 to 100, got 120"),
        ({"limit_mib": 100, "limit_percentage": 50}, "limit_percentage", "not both"),
        ({"limit_mib": 100, "spike_limit_percentage": 10}, "spike_limit_percentage", "limit_percentage, which is not"),
        ({"limit_percentage": 50, "spike_limit_mib": 10}, "spike_limit_mib", "limit_mib, which is not set"),
        ({"limit_mib": -1}, "limit_mib", "greater than or equal to 0"),
        ({"limit_mib": 100, "check_interval": "0s"}, "check_interval", "must be greater than 0"),
        ({"limit_mib": 100, "check_interval": "1x"}, "check_interval", "invalid duration"),
        (
            {"limit_mib": 100, "min_gc_interval_when_soft_limited": "1s", "min_gc_interval_when_hard_limited": "5s"},
            "",
            "min_gc_interval_when_soft_limited must be at least min_gc_interval_when_hard_limited",
        ),
        ({"limit_mib": 100, "ballast_size_mib": 10}, "ballast_size_mib", "unknown key"),
    ],
)
def test_config_errors_name_the_key(body: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_doc(body))
    where = "processors.memory_limiter" + ("." + key if key else "")
    assert any(e.startswith(where + ":") and says in e for e in info.value.errors), info.value.errors


def test_defaults_and_limits_as_the_collector_computes_them() -> None:
    config = MemoryLimiterConfig(limit_mib=4000)
    assert (config.check_interval, config.spike_limit_mib) == (1.0, 0)
    assert limits(config) == Limits(4000 * MIB, 3200 * MIB, "limit_mib")  # spike: 20% of the limit
    assert limits(MemoryLimiterConfig(limit_mib=4000, spike_limit_mib=800)).soft == 3200 * MIB

    machine = 1000 * MIB

    def memory() -> tuple[int, str]:
        return machine, "a test's memory"

    found = limits(MemoryLimiterConfig(limit_percentage=80, spike_limit_percentage=15), memory)
    assert (found.hard, found.soft) == (800 * MIB, 650 * MIB)  # the Collector README's example
    assert found.source == "80% of 1000 MiB, a test's memory"
    assert limits(MemoryLimiterConfig(limit_percentage=50), memory).soft == 400 * MIB


def test_the_docs_example_is_a_valid_config_and_its_errors_are_the_real_ones() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "processors" / "memory_limiter.md").read_text()
    example = yaml.safe_load(doc.split("```yaml\n", 1)[1].split("```", 1)[0])
    example |= {"receivers": {"otlp": {}}, "exporters": {"clickhouse": {}}}
    config = parse_config(example)
    assert limits(config.component("processor", "memory_limiter")) == Limits(2000 * MIB, 1600 * MIB, "limit_mib")
    errors = doc.split("is an error naming the key:\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    for body in ({}, {"limit_mib": 800, "spike_limit_mib": 800}, {"limit_mib": 1, "limit_percentage": 1}):
        with pytest.raises(ConfigError) as info:
            parse_config(_doc(body))
        assert set(info.value.errors) <= set(errors), info.value.errors


@pytest.mark.parametrize("workers", [1, 2])
def test_it_must_be_the_first_processor_of_its_pipeline(workers: int) -> None:
    """Refused by config validation, so `evalsi validate` says so before anything starts."""
    with pytest.raises(ConfigError) as info:
        parse_config(_doc({"limit_mib": 100}, ["normalize", "memory_limiter"], workers))
    assert (
        "service.pipelines.traces.processors.1: processor 'memory_limiter' must be listed first: it refuses data "
        "where the receivers hand it on, so the sender keeps it and retries; after 'normalize' it would refuse"
    ) in "\n".join(info.value.errors)


# --- reading the host: cgroups ---------------------------------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_cgroup_v2_limit_is_the_smallest_on_the_way_up(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "proc/self/mountinfo": "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
            "proc/self/cgroup": "0::/system.slice/evalsi.service\n",
            "proc/meminfo": "MemTotal:       16384000 kB\nMemFree:        1000 kB\n",
            "sys/fs/cgroup/system.slice/evalsi.service/memory.max": "max\n",
            "sys/fs/cgroup/system.slice/memory.max": f"{2048 * MIB}\n",
        },
    )
    assert cgroup_memory_limit(root) == (2048 * MIB, "/sys/fs/cgroup/system.slice/memory.max")
    assert total_memory(root) == (2048 * MIB, "the cgroup limit in /sys/fs/cgroup/system.slice/memory.max")


def test_cgroup_namespace_and_v1_hybrid(tmp_path: Path) -> None:
    # a container: /proc/self/cgroup shows the host's path, the mount is the container's own cgroup
    root = _tree(
        tmp_path / "container",
        {
            "proc/self/mountinfo": "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
            "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n",
            "proc/self/cgroup": "4:memory:/docker/4f1e\n0::/\n",
            "proc/meminfo": "MemTotal:       16384000 kB\n",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{512 * MIB}\n",
        },
    )
    assert cgroup_memory_limit(root) == (512 * MIB, "/sys/fs/cgroup/memory/memory.limit_in_bytes")
    # v1 with no limit writes a page-rounded 2^63: the machine's memory counts
    root = _tree(
        tmp_path / "host",
        {
            "proc/self/mountinfo": "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
            "proc/self/cgroup": "4:memory:/user.slice\n",
            "proc/meminfo": "MemTotal:       1024000 kB\n",
            "sys/fs/cgroup/memory/user.slice/memory.limit_in_bytes": "9223372036854771712\n",
        },
    )
    assert cgroup_memory_limit(root) is None
    assert total_memory(root) == (1024000 * 1024, "the machine's memory (/proc/meminfo)")


# --- the state machine, on a fake memory reading --------------------------------------------------------------------


class FakeMemory:
    """Memory readings a test sets; a release (garbage collection) lowers them to `after_release`."""

    def __init__(self) -> None:
        self.now = 0.0
        self.usage = 0
        self.after_release: int | None = None
        self.releases: list[tuple[float, str]] = []

    def measure(self) -> int:
        return self.usage

    def release(self, why: str) -> None:
        self.releases.append((self.now, why))
        if self.after_release is not None:
            self.usage = self.after_release


def _limiter(memory: FakeMemory, log: logging.Logger) -> Limiter:
    return Limiter(
        Limits(hard=1000 * MIB, soft=800 * MIB, source="test"),
        memory.measure,
        memory.release,
        gc_soft=10.0,
        gc_hard=0.0,
        log=log,
        clock=lambda: memory.now,
    )


def test_state_machine_refuses_above_soft_and_collects_garbage_as_the_collector(
    caplog: pytest.LogCaptureFixture,
) -> None:
    memory = FakeMemory()
    limiter = _limiter(memory, logging.getLogger("test.memory_limiter"))
    caplog.set_level(logging.INFO, "test.memory_limiter")

    def check(at: float, usage_mib: int) -> bool:
        memory.now, memory.usage = at, usage_mib * MIB
        limiter.check()
        return limiter.refusing

    assert not check(0, 799)
    assert memory.releases == []
    # crossing the soft limit: garbage is collected once, and it did not help
    assert check(1, 800)
    assert memory.releases == [(1, "soft")]
    assert check(2, 900) and check(3, 850)
    assert memory.releases == [(1, "soft")]  # not again before min_gc_interval_when_soft_limited (10s)
    # above the hard limit: at every check (min_gc_interval_when_hard_limited 0), logged once per crossing
    assert check(4, 1000) and check(5, 1200) and check(6, 1100)
    assert memory.releases[1:] == [(4, "hard"), (5, "hard"), (6, "hard")]
    assert check(7, 900)  # between the limits: refusing, no collection (the last was 1 s ago)
    assert check(8, 1000)  # above the hard limit again: a new crossing
    # while refusing, garbage is collected again every 10 s: memory freed since is handed back
    memory.after_release = 500 * MIB
    assert not check(18, 820)
    assert memory.releases[-1] == (18, "soft") and limiter.usage == 500 * MIB
    assert not check(19, 700)

    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    soft = [m for level, m in lines if level == "WARNING" and "above the soft limit" in m]
    hard = [m for level, m in lines if level == "WARNING" and "above the hard limit" in m]
    back = [m for level, m in lines if level == "INFO" and "below the soft limit" in m]
    assert len(soft) == 1 and "refusing data (503, retryable)" in soft[0]
    assert len(hard) == 2  # crossings at 4 s and at 8 s
    assert len(back) == 1


def test_gc_that_brings_memory_below_soft_on_the_crossing_keeps_accepting() -> None:
    memory = FakeMemory()
    limiter = _limiter(memory, logging.getLogger("test.memory_limiter"))
    memory.after_release = 600 * MIB
    memory.usage = 850 * MIB
    limiter.check()
    assert not limiter.refusing and limiter.usage == 600 * MIB and memory.releases == [(0, "soft")]


def _processor(metrics: SelfMetrics, taken: list[Any]) -> tuple[MemoryLimiter, FakeMemory]:
    class Recorder:
        async def consume(self, batch: SpanBatch) -> None:
            taken.append(batch)

        async def consume_logs(self, batch: LogBatch) -> None:
            taken.append(batch)

    nxt = Next()
    nxt.traces = nxt.logs = Recorder()
    settings = Settings(id="memory_limiter", metrics=metrics, logger=logging.getLogger("test.memory_limiter"))
    proc = MemoryLimiter(MemoryLimiterConfig(limit_mib=1, check_interval=0.2), settings, nxt)
    memory = FakeMemory()
    proc.limiter = _limiter(memory, settings.logger)
    return proc, memory


def test_a_refused_batch_is_not_taken_and_is_counted() -> None:
    metrics = SelfMetrics()
    taken: list[Any] = []
    proc, memory = _processor(metrics, taken)
    assert proc.limiter is not None
    batch = SpanBatch([Span("1" * 32, f"{n:016x}", "", "s", "INTERNAL", 1, 2) for n in range(3)])

    asyncio.run(proc.consume(batch))
    assert taken == [batch]

    memory.now, memory.usage = 100, 900 * MIB
    proc.limiter.check()
    with pytest.raises(Refused) as info:
        asyncio.run(proc.consume(batch))
    assert info.value.unavailable and info.value.retry_after == 1.0  # at least 1 s, whatever check_interval
    assert str(info.value) == "memory_limiter: the collector uses 900 MiB, above its soft limit of 800 MiB; retry later"
    assert taken == [batch]
    refused = metrics.registry.get_sample_value(
        "otelcol_processor_refused_spans_total", {"processor": "memory_limiter"}
    )
    assert refused == 3

    # the longer it refuses, the longer it asks senders to wait, up to 30 s
    delays = []
    for memory.now in (107, 200):
        proc.limiter.check()
        with pytest.raises(Refused) as info:
            asyncio.run(proc.consume(batch))
        delays.append(info.value.retry_after)
    assert delays == [7, 30]


def test_a_fast_sender_is_checked_again_before_the_next_timed_check() -> None:
    """Between two timed checks memory grows with what is taken: past ITEMS_PER_CHECK items admitted, the next
    batch is measured first, so a fast sender meets the refusal within that many items, not a check_interval later."""
    taken: list[Any] = []
    proc, memory = _processor(SelfMetrics(), taken)
    assert proc.limiter is not None
    batch = SpanBatch([Span("1" * 32, f"{n:016x}", "", "s", "INTERNAL", 1, 2) for n in range(500)])
    memory.usage = 100 * MIB
    proc.limiter.check()
    past_soft = 0  # items taken while memory was at or above the soft limit (800 MiB)
    with pytest.raises(Refused):
        for _ in range(100):  # no timed check runs here: only what admit checks itself
            asyncio.run(proc.consume(batch))
            past_soft += len(batch) if memory.usage >= 800 * MIB else 0
            memory.usage += 100 * MIB  # each batch takes 100 MiB
    assert memory.usage < 800 * MIB + (ITEMS_PER_CHECK // len(batch) + 1) * 100 * MIB
    assert past_soft < ITEMS_PER_CHECK  # refused within one check's worth of items past the limit
    assert len(taken) == 7  # 100 MiB + 7 batches reach the soft limit: the 8th is measured first and refused


def test_log_records_are_refused_and_counted_as_log_records() -> None:
    metrics = SelfMetrics()
    taken: list[Any] = []
    proc, memory = _processor(metrics, taken)
    assert proc.limiter is not None
    logs = LogBatch([LogRecord(1, 1), LogRecord(2, 2)])
    asyncio.run(proc.consume_logs(logs))
    memory.usage = 800 * MIB  # at the soft limit counts as above it, as in the Collector
    proc.limiter.check()
    with pytest.raises(Refused):
        asyncio.run(proc.consume_logs(logs))
    assert taken == [logs]
    labels = {"processor": "memory_limiter"}
    assert metrics.registry.get_sample_value("otelcol_processor_refused_log_records_total", labels) == 2
    assert metrics.registry.get_sample_value("otelcol_processor_refused_spans_total", labels) == 0


def test_in_a_pipeline_worker_it_hands_everything_on_and_measures_nothing() -> None:
    """The collector process decides; a worker's instance passes batches on and collects garbage when asked."""
    taken: list[Any] = []

    class Recorder:
        async def consume(self, batch: SpanBatch) -> None:
            taken.append(batch)

    nxt = Next()
    nxt.traces = Recorder()
    settings = Settings(
        id="memory_limiter",
        metrics=SelfMetrics(),
        logger=logging.getLogger("test"),
        worker=object(),  # type: ignore[arg-type]
    )
    proc = MemoryLimiter(MemoryLimiterConfig(limit_mib=1), settings, nxt)
    asyncio.run(proc.start())
    batch = SpanBatch([Span("1" * 32, "2" * 16, "", "s", "INTERNAL", 1, 2)])
    asyncio.run(proc.consume(batch))
    assert taken == [batch] and proc.limiter is None  # 1 MiB is far below any process: it would refuse
    proc.collect_garbage()
    asyncio.run(proc.shutdown())


# --- end to end: a real `evalsi serve` -----------------------------------------------------------------------------

PAYLOAD_BYTES = MIB  # a span attribute, e.g. a long prompt: held while tail_sampling assembles its trace
SPANS_PER_REQUEST = 4
# the soft limit above the idle memory (after a warm-up request): some 20 burst requests cross it, and once the
# burst is collected and handed back, what it leaves (some 20 MiB: the store's and the allocators' growth) is
# well below it
HEADROOM_MIB = 80
SPIKE_MIB = 40


def _burst_request(t0: int) -> tuple[bytes, set[str]]:
    """One span per trace; the low halves of the trace ids 0, 1, 2, 3 spread them over every worker."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "memory-limiter-e2e"
    spans = rs.scope_spans.add().spans
    ids = set()
    for n in range(SPANS_PER_REQUEST):
        s = spans.add()
        s.trace_id, s.span_id, s.name = os.urandom(8) + n.to_bytes(8, "big"), os.urandom(8), "llm call"
        s.start_time_unix_nano, s.end_time_unix_nano = t0, t0 + 1_000_000
        attr = s.attributes.add()
        attr.key, attr.value.string_value = "payload", os.urandom(PAYLOAD_BYTES // 2).hex()
        ids.add(s.trace_id.hex())
    return req.SerializeToString(), ids


def _config(store: Path, workers: int, limit_mib: int) -> dict[str, Any]:
    cfg = serve_config(store)
    cfg["service"]["workers"] = workers
    cfg["processors"]["memory_limiter"] = {
        "check_interval": "100ms",
        "limit_mib": limit_mib,
        "spike_limit_mib": SPIKE_MIB,
        "min_gc_interval_when_soft_limited": "1s",
    }
    # tail_sampling holds each burst's spans for decision_wait (real memory, held by a real processor); redact
    # then masks the payload, so the store writes small rows and its own caches do not grow with the burst
    cfg["processors"]["tail_sampling"] = {"decision_wait": "5s"}
    cfg["processors"]["redact"] = {"blocked_key_patterns": ["^payload$"]}
    cfg["service"]["pipelines"]["traces"]["processors"] = ["memory_limiter", "normalize", "tail_sampling", "redact"]
    return cfg


def _metrics(c: Collector) -> dict[str, float]:
    out = {}
    for line in httpx.get(c.metrics).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _usage(c: Collector) -> float:
    return _metrics(c)['evalsi_memory_limiter_usage_bytes{processor="memory_limiter"}']


def _warm_up(c: Collector) -> set[str]:
    """One request through every process: what the first one costs (the store's insert path, the decoding threads'
    heaps; some 30 MiB) is part of the idle memory a limit is set above."""
    body, ids = _burst_request(time.time_ns())
    assert httpx.post(c.http + "/v1/traces", content=body, headers=PROTOBUF).status_code == 200
    assert c.wait_stored(len(ids)) == len(ids)
    time.sleep(1)
    return ids


def _idle_usage(tmp: Path, workers: int) -> float:
    """What the collector and its workers take when idle, measured by the limiter itself with a limit far away."""
    tmp.mkdir()
    c = start_collector(tmp, _config(tmp / "store", workers, 1 << 20))
    try:
        _warm_up(c)
        return _usage(c)
    finally:
        assert c.stop() == 0


def _status(body: bytes) -> status_pb2.Status:
    return status_pb2.Status.FromString(body)


def _retry_delay(status: status_pb2.Status) -> float:
    [detail] = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    info = error_details_pb2.RetryInfo()
    detail.Unpack(info)
    return info.retry_delay.ToNanoseconds() / 1e9


def _post_until_accepted(http: httpx.Client, url: str, body: bytes, timeout: float = 60) -> None:
    """As an OTLP sender does: a 503 is retried after its Retry-After."""
    deadline = time.monotonic() + timeout
    while True:
        r = http.post(url, content=body, headers=PROTOBUF)
        if r.status_code == 200:
            return
        assert r.status_code == 503 and time.monotonic() < deadline, r.text
        time.sleep(float(r.headers["retry-after"]))


def _resident(pids: list[int]) -> tuple[int, int]:
    """RSS and its anonymous part (what the limiter counts), summed over the processes."""
    rss = anon = 0
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines())
        rss += int(fields["VmRSS"].split()[0]) * 1024
        anon += int(fields["RssAnon"].split()[0]) * 1024
    return rss, anon


@pytest.mark.parametrize("workers", [1, 2])
def test_a_burst_over_the_limit_is_refused_retryably_then_accepted_and_nothing_acknowledged_is_lost(
    tmp_path: Path, workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    idle = _idle_usage(tmp_path / "idle", workers)
    limit_mib = int(idle // MIB) + HEADROOM_MIB + SPIKE_MIB
    c = start_collector(tmp_path, _config(tmp_path / "store", workers, limit_mib))
    pids = [c.proc.pid, *c.ready["workers"]]
    peak = [0, 0]  # RSS, anonymous
    watching = threading.Event()

    def watch() -> None:  # the test's own reading of every process, 20 times a second
        while not watching.is_set():
            with contextlib.suppress(FileNotFoundError):
                peak[:] = map(max, peak, _resident(pids))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        acknowledged = _warm_up(c)
        assert _usage(c) < (limit_mib - SPIKE_MIB) * MIB, "idle above the soft limit: the probe was off"
        refused: list[tuple[bytes, set[str]]] = []
        accepted = 0
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "memory-limiter-sdk"}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        exporter = OTLPSpanExporter(endpoint=c.http + "/v1/traces", timeout=60)
        sdk_spans: list[Any] = []  # every span the SDK exported
        sdk_result: list[SpanExportResult] = []

        def sdk_refused() -> bool:  # the SDK's exporter logs each retry it makes after a 503
            return any("Service Unavailable" in r.getMessage() for r in caplog.records)

        def sdk_export() -> None:
            # memory near the soft limit swings as request bodies pass through, so an export may land in a moment
            # the limiter accepts: then the SDK exports a new span, until one export has been refused and retried
            for _ in range(20):
                memory.clear()
                with provider.get_tracer("tests.memory_limiter").start_as_current_span("sdk span"):
                    pass
                spans = list(memory.get_finished_spans())
                sdk_spans.extend(spans)
                sdk_result.append(exporter.export(spans))
                if sdk_refused():
                    return

        sdk = threading.Thread(target=sdk_export)
        t0 = time.time_ns()
        started = time.monotonic()
        with httpx.Client(timeout=30) as http:
            # the burst: requests until the limiter refuses one, then a few more that it refuses too
            for _ in range(200):
                body, ids = _burst_request(t0)
                r = http.post(c.http + "/v1/traces", content=body, headers=PROTOBUF)
                if r.status_code == 200:  # before the first refusal, or after a collection freed memory meanwhile
                    acknowledged |= ids
                    accepted += 1
                    continue
                assert r.status_code == 503, r.text
                status = _status(r.content)
                assert status.code == code_pb2.UNAVAILABLE
                assert status.message.startswith("memory_limiter: the collector uses ")
                delay = _retry_delay(status)  # how long the limiter has refused so far, at least 1 s
                assert 1.0 <= delay < 5 and r.headers["retry-after"] == str(round(delay))
                refused.append((body, ids))
                if len(refused) == 3:
                    break
            assert len(refused) == 3, "the burst never crossed the soft limit"

            # the OpenTelemetry SDK's exporter, refused too: it waits Retry-After and tries again until accepted
            sdk.start()

            # gRPC while refusing: UNAVAILABLE with RetryInfo, which OTLP clients retry (a request the limiter takes,
            # memory having fallen meanwhile on a loaded machine, is acknowledged like any other and must be stored)
            e: Any = None
            with grpc.insecure_channel(c.grpc) as channel:
                for _ in range(50):
                    grpc_body, grpc_ids = _burst_request(t0)
                    try:
                        TraceServiceStub(channel).Export(ExportTraceServiceRequest.FromString(grpc_body), timeout=10)
                    except grpc.RpcError as refused_rpc:
                        e = refused_rpc
                        break
                    acknowledged |= grpc_ids
            assert e is not None, "gRPC was never refused while memory was over the soft limit"
            assert e.code() == grpc.StatusCode.UNAVAILABLE
            details = _status(dict(e.trailing_metadata())["grpc-status-details-bin"])
            assert details.code == code_pb2.UNAVAILABLE and 1.0 <= _retry_delay(details) < 5

            # tail_sampling hands the held traces on after decision_wait; collected, the memory falls
            assert wait_until(lambda: _metrics(c)['evalsi_memory_limiter_refusing{processor="memory_limiter"}'] == 0)
            recovered_after, recovered_at = time.monotonic() - started, _usage(c)
            sdk.join(120)
            exporter.shutdown()
            provider.shutdown()
            assert sdk_result and all(r == SpanExportResult.SUCCESS for r in sdk_result)
            sdk_retries = [r for r in caplog.records if "Service Unavailable" in r.getMessage()]
            assert sdk_retries, "the SDK's export was never refused"

            # the senders kept what was refused and send it again, as long as it is refused (the memory it takes
            # may cross the soft limit again): it is accepted
            for body, ids in [*refused, (grpc_body, grpc_ids)]:
                _post_until_accepted(http, c.http + "/v1/traces", body)
                acknowledged |= ids
        acknowledged |= {format(s.context.trace_id, "032x") for s in sdk_spans}

        def stored() -> set[str]:
            return {t["trace_id"] for t in httpx.get(c.api + "/api/v1/traces?limit=10000").json()["traces"]}

        assert wait_until(lambda: stored() >= acknowledged, timeout=30)
        assert stored() == acknowledged  # every acknowledged span, each trace once

        m = _metrics(c)
        limiter_refused = m['otelcol_processor_refused_spans_total{processor="memory_limiter"}']
        receiver_refused = sum(v for k, v in m.items() if k.startswith("otelcol_receiver_refused_spans_total{"))
        # 3 burst requests, the gRPC one and the SDK's refused attempts (at least one), nothing refused elsewhere
        assert limiter_refused >= 4 * SPANS_PER_REQUEST + 1
        assert limiter_refused == receiver_refused
        assert m['evalsi_memory_limiter_garbage_collections_total{limit="soft",processor="memory_limiter"}'] >= 1
        assert m['evalsi_memory_limiter_limit_bytes{limit="hard",processor="memory_limiter"}'] == limit_mib * MIB
        logs = [e["msg"] for e in c.logs() if "memory_limiter" in str(e.get("msg"))]
        # once per crossing (not per check), each followed by its recovery; near the soft limit memory may cross
        # it again (sending the refused requests again, bodies in transit with workers)
        crossings = sum("above the soft limit" in msg for msg in logs)
        assert crossings >= 1 and crossings == sum("below the soft limit of" in msg for msg in logs)
        print(
            f"\nworkers={workers}: idle {idle / MIB:.0f} MiB, soft limit {limit_mib - SPIKE_MIB} MiB, hard limit "
            f"{limit_mib} MiB; crossed after {accepted} requests of {SPANS_PER_REQUEST} MiB; peak anonymous "
            f"{peak[1] / MIB:.0f} MiB (RSS {peak[0] / MIB:.0f} MiB); accepting again after {recovered_after:.1f}s "
            f"at {recovered_at / MIB:.0f} MiB; {crossings} crossings; {int(limiter_refused)} spans refused, "
            f"{len(acknowledged)} acknowledged and stored"
        )
    finally:
        watching.set()
        watcher.join()
        assert c.stop() == 0
