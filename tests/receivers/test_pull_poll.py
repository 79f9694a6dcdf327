"""The pull receivers' poll loop with a source written for the test: pages in start order, running traces holding
the watermark back, traces read ahead of one not read twice, equal start times, a source that is down, and the
watermark kept in the store only once what it covers is no longer held."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span
from pydantic import ValidationError

from evalsi.collector.builtin import load_builtin_components
from evalsi.component import REGISTRY, Next, Settings
from evalsi.model.span import SpanBatch
from evalsi.receivers.pull.mlflow import MlflowReceiverConfig
from evalsi.receivers.pull.poll import Listed, Page, PullConfig, PullReceiver, Watermark, check_response
from evalsi.runtime.telemetry import SelfMetrics

NOW_MS = int(time.time() * 1000)


@dataclass
class FakeTrace:
    id: str
    time_ms: int
    complete: bool = True


@dataclass
class FakeSource:
    traces: list[FakeTrace]
    name: str = "fake"
    down: int = 0  # the next `down` calls fail
    listed_from: list[int] = field(default_factory=list)
    fetched: list[str] = field(default_factory=list)

    async def list_since(self, time_ms: int, page_size: int, token: str | None) -> Page:
        if self.down:
            self.down -= 1
            raise httpx.ConnectError("connection refused")
        self.listed_from.append(time_ms)
        found = sorted((t for t in self.traces if t.time_ms >= time_ms), key=lambda t: t.time_ms)
        start = int(token or 0)
        page = found[start : start + page_size]
        more = start + page_size < len(found)
        return Page([Listed(t.id, t.time_ms, t.complete) for t in page], str(start + page_size) if more else None)

    async def fetch(self, listed: list[Listed]) -> bytes:
        rs = ResourceSpans()
        ss = rs.scope_spans.add()
        for t in listed:
            self.fetched.append(t.source_id)
            ss.spans.append(
                Span(
                    trace_id=int(t.source_id).to_bytes(16, "big"),
                    span_id=(1).to_bytes(8, "big"),
                    name=f"trace {t.source_id}",
                    start_time_unix_nano=t.time_ms * 1_000_000,
                    end_time_unix_nano=t.time_ms * 1_000_000 + 1000,
                )
            )
        return ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString()


class Pipeline:
    def __init__(self) -> None:
        self.spans: list[str] = []

    async def consume(self, batch: SpanBatch) -> None:
        self.spans.extend(s.name for s in batch.spans)


@dataclass
class FakeStore:
    watermarks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def read_watermark(self, source: str) -> dict[str, Any] | None:
        return self.watermarks.get(source)

    def write_watermark(self, source: str, watermark: dict[str, Any]) -> None:
        self.watermarks[source] = watermark

    def stored_span_keys(self, trace_ids: list[str], *, project: str | None = None) -> set[tuple[str, str]]:
        return set()


@dataclass
class FakeHost:
    store: FakeStore = field(default_factory=FakeStore)
    held: float | None = None

    def held_since(self) -> float | None:
        return self.held


def receiver(source: FakeSource, host: FakeHost | None = None, **config: Any) -> tuple[PullReceiver, Pipeline]:
    pipeline = Pipeline()
    nxt = Next()
    nxt.traces = pipeline
    settings = Settings("fake", SelfMetrics(), logging.getLogger("test"), host=host or FakeHost())
    cfg = PullConfig(**{"max_requests_per_second": 1000, "page_size": 2, **config})
    return PullReceiver(cfg, settings, nxt, source), pipeline


def run(rec: PullReceiver, polls: int = 1) -> None:
    async def go() -> None:
        rec.watermark = await rec._load_watermark()
        for _ in range(polls):
            await rec.poll()
        await rec.persist()

    asyncio.run(go())


def test_every_trace_is_read_once_across_pages_and_polls() -> None:
    source = FakeSource([FakeTrace(str(i), NOW_MS - 10_000 + i) for i in range(1, 6)])
    rec, pipeline = receiver(source)
    run(rec, polls=3)
    assert pipeline.spans == [f"trace {i}" for i in range(1, 6)]
    source.traces.append(FakeTrace("6", NOW_MS))
    run_again = asyncio.run(rec.poll())
    assert run_again == 1 and pipeline.spans[-1] == "trace 6"


def test_traces_started_at_the_same_time_are_each_read_once() -> None:
    """The watermark keeps the ids seen at its time: a later trace with the same start is read, none twice."""
    same = NOW_MS - 1000
    source = FakeSource([FakeTrace("1", same), FakeTrace("2", same)])
    rec, pipeline = receiver(source)
    run(rec)
    source.traces.append(FakeTrace("3", same))
    asyncio.run(rec.poll())
    assert sorted(pipeline.spans) == ["trace 1", "trace 2", "trace 3"]
    assert rec.watermark == Watermark(same, frozenset({"1", "2", "3"}))


def test_a_running_trace_holds_the_watermark_and_is_read_when_complete() -> None:
    running = FakeTrace("2", NOW_MS - 3000, complete=False)
    source = FakeSource([FakeTrace("1", NOW_MS - 4000), running, FakeTrace("3", NOW_MS - 2000)])
    rec, pipeline = receiver(source)
    run(rec)
    assert pipeline.spans == ["trace 1", "trace 3"]  # the complete one after it is not kept waiting
    assert rec.watermark is not None and rec.watermark.time_ms == NOW_MS - 4000
    asyncio.run(rec.poll())
    assert pipeline.spans == ["trace 1", "trace 3"]  # still running; trace 3 is not read again
    running.complete = True
    asyncio.run(rec.poll())
    assert pipeline.spans == ["trace 1", "trace 3", "trace 2"]
    assert rec.watermark.time_ms == NOW_MS - 2000


def test_a_trace_running_longer_than_max_trace_duration_is_read_as_it_is() -> None:
    source = FakeSource([FakeTrace("1", NOW_MS - 120_000, complete=False)])
    rec, pipeline = receiver(source, max_trace_duration="1m")
    run(rec)
    assert pipeline.spans == ["trace 1"]


def test_the_first_start_reads_lookback_and_a_restart_resumes_from_the_kept_watermark() -> None:
    source = FakeSource([FakeTrace("1", NOW_MS - 7_200_000), FakeTrace("2", NOW_MS - 1000)])
    host = FakeHost()
    rec, pipeline = receiver(source, host, lookback="1h")
    run(rec)
    assert pipeline.spans == ["trace 2"]  # older than lookback: not read
    assert host.store.watermarks == {"fake|fake": {"time_ms": NOW_MS - 1000, "ids": ["2"]}}
    again, pipeline2 = receiver(source, host, lookback="1h")
    run(again)
    assert pipeline2.spans == []
    assert source.listed_from[-1] == NOW_MS - 1000


def test_the_watermark_is_kept_only_once_nothing_handed_on_before_it_is_held() -> None:
    source = FakeSource([FakeTrace("1", NOW_MS - 1000)])
    host = FakeHost(held=0.0)  # something held since before the poll (e.g. waiting in tail sampling)
    rec, _ = receiver(source, host)
    run(rec)
    assert host.store.watermarks == {}  # a crash now reads trace 1 again at the restart
    host.held = None
    asyncio.run(rec.persist())
    assert host.store.watermarks["fake|fake"]["ids"] == ["1"]


def test_a_clean_stop_keeps_the_watermark_once_the_exporters_stored_what_it_covers() -> None:
    """`settle` (the service calls it once the processors drained, the exporters still running): it waits for what
    is held to be stored, then keeps the watermark; a store that never catches up leaves it unkept (read again)."""
    source = FakeSource([FakeTrace("1", NOW_MS - 1000)])
    host = FakeHost(held=0.0)  # the store exporter still writes trace 1
    rec, _ = receiver(source, host)
    run(rec)
    assert host.store.watermarks == {}

    async def stored_soon() -> None:
        await asyncio.sleep(0.2)
        host.held = None

    async def stop() -> float:
        t0 = time.monotonic()
        await asyncio.gather(rec.settle(5.0), stored_soon())
        return time.monotonic() - t0

    assert asyncio.run(stop()) < 2.0  # no longer than the store took
    assert host.store.watermarks["fake|fake"]["ids"] == ["1"]

    stuck = FakeHost(held=0.0)
    rec2, _ = receiver(FakeSource([FakeTrace("2", NOW_MS - 500)]), stuck)
    run(rec2)
    asyncio.run(rec2.settle(0.3))
    assert stuck.store.watermarks == {}  # the next start reads trace 2 again; the store leaves out what it holds


class SlowStore(FakeStore):
    """Its first watermark write blocks until `release`; a write that ends after `closed` is lost, as with a store
    that shut down under it."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()
        self.closed = False

    def write_watermark(self, source: str, watermark: dict[str, Any]) -> None:
        if not self.started.is_set():
            self.started.set()
            self.release.wait(5)
        if not self.closed:
            super().write_watermark(source, watermark)


def test_a_stop_in_the_middle_of_a_watermark_write_writes_it_again_before_the_store_closes() -> None:
    """Shutdown cancels the persist loop; a write it had started runs on in its thread and may end after the
    exporters closed the store. `settle` must write that watermark again, or a restart reads those traces again."""
    store = SlowStore()
    rec, _ = receiver(FakeSource([FakeTrace("1", NOW_MS - 1000)]), FakeHost(store=store))

    async def go() -> None:
        rec.watermark = await rec._load_watermark()
        await rec.poll()
        writing = asyncio.create_task(rec.persist())
        assert await asyncio.to_thread(store.started.wait, 5)
        writing.cancel()  # what `shutdown` does to the persist loop
        with contextlib.suppress(asyncio.CancelledError):
            await writing
        await rec.settle(1.0)
        store.closed = True  # the exporters shut down after `settle`
        store.release.set()  # the first write's thread ends now, too late

    asyncio.run(go())
    assert store.watermarks["fake|fake"]["ids"] == ["1"]


def test_a_source_that_is_down_is_retried_with_backoff_and_counted() -> None:
    source = FakeSource([FakeTrace("1", NOW_MS - 1000)], down=2)
    rec, pipeline = receiver(source, poll_interval="10ms", retry_initial="10ms", retry_max="50ms")
    metrics = rec._settings.metrics

    async def go() -> None:
        await rec.start()
        deadline = time.monotonic() + 10
        while not pipeline.spans and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await rec.shutdown()

    asyncio.run(go())
    assert pipeline.spans == ["trace 1"]
    errors = metrics.registry.get_sample_value(
        "evalsi_pull_errors_total", {"receiver": "fake", "reason": "ConnectError"}
    )
    assert errors == 2


def test_answers_retried_and_refused() -> None:
    from evalsi.receivers.pull.poll import SourceError, Unavailable

    req = httpx.Request("GET", "http://x")
    with pytest.raises(Unavailable) as e:
        check_response(httpx.Response(429, headers={"retry-after": "7"}, request=req), "list")
    assert e.value.retry_after == 7
    with pytest.raises(Unavailable):
        check_response(httpx.Response(502, request=req), "list")
    with pytest.raises(SourceError, match="HTTP 400"):
        check_response(httpx.Response(400, text="bad filter", request=req), "list")
    assert check_response(httpx.Response(200, json={"a": 1}, request=req), "list") == {"a": 1}


def test_config_errors_name_the_key() -> None:
    load_builtin_components()
    assert REGISTRY[("receiver", "mlflow")].config is MlflowReceiverConfig
    with pytest.raises(ValidationError, match="experiments"):
        MlflowReceiverConfig(tracking_uri="http://mlflow:5000", experiments=[])
    with pytest.raises(ValidationError, match="tracking_uri"):
        MlflowReceiverConfig(tracking_uri="file:///tmp/mlruns", experiments=["1"])
    with pytest.raises(ValidationError, match="poll_interval"):
        MlflowReceiverConfig(tracking_uri="http://mlflow:5000", experiments=["1"], poll_interval="0s")
    with pytest.raises(ValidationError, match="listed twice"):
        MlflowReceiverConfig(tracking_uri="http://mlflow:5000", experiments=["1", "1"])
