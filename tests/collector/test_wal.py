"""The write-ahead log (`service.durability: {mode: wal}`): what was answered survives kill -9 and is stored once,
through a real `evalsi serve`, in one process and with pipeline workers; and the log's own file format and rules."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import httpx
import pytest
from budget import examples
from google.rpc import status_pb2
from hypothesis import HealthCheck, given, settings, strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from otlp_requests import chain_request
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.collector.config import ConfigError, parse_config
from evalsi.component import Next, Refused, Settings
from evalsi.model.span import SpanBatch
from evalsi.receivers.otlp import OtlpReceiver
from evalsi.receivers.otlp.config import OtlpReceiverConfig
from evalsi.runtime.telemetry import SelfMetrics
from evalsi.wal import (
    Disk,
    DurabilityConfig,
    ReplayedSpans,
    WriteAheadLog,
    _encode,
    read_segment,
    scan_segment,
    span_key,
    without_stored_spans,
)

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _request(first: int, traces: int, per_trace: int = 3) -> bytes:
    ids = [(0xFEED).to_bytes(8, "big") + t.to_bytes(8, "big") for t in range(first, first + traces)]
    return chain_request(ids, per_trace, service="wal-test").SerializeToString()


def _config(tmp: Path, *, workers: int = 1, decision_wait: str = "30s") -> dict[str, Any]:
    cfg = serve_config(tmp / "store")
    cfg["service"]["workers"] = workers
    cfg["service"]["durability"] = {"mode": "wal", "directory": str(tmp / "wal")}
    # traces wait in tail sampling far longer than the test: at the kill, everything answered is in memory only
    cfg["processors"]["tail_sampling"] = {"decision_wait": decision_wait}
    cfg["service"]["pipelines"]["traces"]["processors"] = ["normalize", "tail_sampling"]
    return cfg


def _send(c: Collector, first: int, traces: int) -> None:
    r = httpx.post(c.http + "/v1/traces", content=_request(first, traces), headers=PROTOBUF, timeout=30)
    assert r.status_code == 200, r.text


def _segments(tmp: Path) -> list[Path]:
    return sorted((tmp / "wal").glob("wal-*.log"))


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_kill_9_loses_no_answered_span_and_stores_each_once(tmp_path: Path, workers: int) -> None:
    c = start_collector(tmp_path, _config(tmp_path, workers=workers))
    for i in range(20):
        _send(c, 10 * i, 10)  # 20 requests of 10 traces of 3 spans: 600 spans answered 200
    assert c.stored_spans() == 0  # tail sampling holds them all
    assert c.stop(signal.SIGKILL) == -signal.SIGKILL
    assert _segments(tmp_path), "the answered requests are in the log"

    # the restart replays them; a short decision_wait now lets tail sampling hand them to the store
    c = start_collector(tmp_path, _config(tmp_path, workers=workers, decision_wait="200ms"))
    try:
        # a sender whose answer the kill cut off sends its request again: the replay has it already
        _send(c, 190, 10)
        assert c.wait_stored(600) == 600
        time.sleep(1.0)
        assert c.stored_spans() == 600  # each once
        traces = httpx.get(c.api + "/api/v1/traces?limit=1000").json()["traces"]
        assert len(traces) == 200 and {t["span_count"] for t in traces} == {3}
        replayed = [e for e in c.logs() if e.get("msg") == "write-ahead log replayed"]
        assert replayed and replayed[0]["requests"] == 20
        assert "evalsi_wal_duplicate_spans_total 30.0" in httpx.get(c.metrics).text
        # once stored, the log deletes what it no longer needs
        assert wait_until(lambda: sum(p.stat().st_size for p in _segments(tmp_path)) == 0, timeout=10)
    finally:
        assert c.stop() == 0


def test_a_replayed_request_leaves_out_spans_the_store_has(tmp_path: Path) -> None:
    cfg = _config(tmp_path, decision_wait="100ms")
    c = start_collector(tmp_path, cfg)
    _send(c, 0, 4)  # 12 spans, stored
    assert c.wait_stored(12) == 12
    assert c.stop() == 0
    # a log a crash left: the same request again (its spans are in the store) and a new one
    wal = tmp_path / "wal"
    for p in _segments(tmp_path):
        p.unlink()
    (wal / "wal-000000000100.log").write_bytes(
        _encode(1, "traces", "protobuf", "otlp", _request(0, 4))
        + _encode(2, "traces", "protobuf", "otlp", _request(4, 2))
    )
    c = start_collector(tmp_path, cfg)
    try:
        assert c.wait_stored(18) == 18
        time.sleep(1.0)
        assert c.stored_spans() == 18  # the 12 already stored were left out, the 6 new ones stored
        replayed = next(e for e in c.logs() if e.get("msg") == "write-ahead log replayed")
        assert replayed["stored_spans_left_out"] == 12
    finally:
        assert c.stop() == 0


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_a_clean_stop_leaves_no_log_to_replay(tmp_path: Path, workers: int) -> None:
    c = start_collector(tmp_path, _config(tmp_path, workers=workers, decision_wait="100ms"))
    _send(c, 0, 5)
    assert c.wait_stored(15) == 15
    assert c.stop() == 0
    assert sum(p.stat().st_size for p in _segments(tmp_path)) == 0


# --- the log itself -----------------------------------------------------------------------------------------------


def test_records_read_back_and_a_torn_tail_ends_the_segment(tmp_path: Path) -> None:
    a = _encode(1, "traces", "protobuf", "otlp", b"first")
    b = _encode(2, "logs", "json", "otlp/2", b'{"resourceLogs": []}')
    path = tmp_path / "wal-000000000001.log"
    path.write_bytes(a + b + b[: len(b) // 2])  # the process died while writing a third record
    records, why = read_segment(path)
    assert [(r.seq, r.signal, r.format, r.receiver, r.body) for r in records] == [
        (1, "traces", "protobuf", "otlp", b"first"),
        (2, "logs", "json", "otlp/2", b'{"resourceLogs": []}'),
    ]
    assert "torn" in why
    flipped = bytearray(a)
    flipped[-1] ^= 0xFF  # a damaged byte fails the checksum: replay reads past it to the next whole record
    scan = scan_segment(bytes(flipped) + b)
    assert [r.seq for r in scan.records] == [2] and scan.skipped_bytes == len(a) and scan.why == ""
    scan = scan_segment(a + b"\0" * 7 + b + bytes(flipped))  # zeros mid-segment, then a damaged tail
    assert [r.seq for r in scan.records] == [1, 2] and scan.skipped_bytes == 7 and "damaged" in scan.why


def test_append_is_on_disk_before_it_returns_and_retire_follows_the_watermark(tmp_path: Path) -> None:
    async def run() -> None:
        wal = WriteAheadLog(DurabilityConfig(mode="wal", directory=str(tmp_path), max_size_mib=1), SelfMetrics())
        wal.open()
        try:
            seqs = await asyncio.gather(
                *(wal.append("traces", "protobuf", "otlp", b"x" * 100, 10.0 + i) for i in range(50))
            )
            (segment,) = [p for p in tmp_path.glob("wal-*.log") if p.stat().st_size]
            assert len(read_segment(segment)[0]) == 50
            wal._active.opened -= 10  # type: ignore[union-attr]  # as if a second had passed: it closes
            assert wal.retire(100.0) == 0  # written, not handed on yet: no component reports them
            for seq in seqs:
                wal.settled(seq)
            assert wal.retire(5.0) == 0  # something that arrived at 5.0 is still held
            assert segment.exists()
            assert wal.retire(59.0) == 0  # the newest request (59.0) arrived at the watermark
            assert wal.retire(59.5) == 1
            assert not segment.exists()
            wal.settled(await wal.append("traces", "protobuf", "otlp", b"y" * (1024 * 1024), 100.0))
            with pytest.raises(Refused, match="max_size_mib") as refused:
                wal.check_room()
            assert refused.value.unavailable and refused.value.retry_after > 0
        finally:
            wal.close()

    asyncio.run(run())


def test_without_stored_spans_keeps_the_rest_of_the_request() -> None:
    body = _request(0, 2)  # traces ...00 and ...01, spans 1-3 each
    t0 = ((0xFEED).to_bytes(8, "big") + (0).to_bytes(8, "big")).hex()
    asked: list[list[str]] = []

    def stored(trace_ids: list[str], *, project: str | None = None) -> set[tuple[str, str]]:
        asked.append(trace_ids)
        assert project == "default"  # no credential checked, no evalsi.project attribute
        return {(t0, (1).to_bytes(8, "big").hex()), (t0, (2).to_bytes(8, "big").hex())}

    left, skipped = without_stored_spans(body, stored)
    assert skipped == 2 and left is not None
    spans = ExportTraceServiceRequest.FromString(left).resource_spans[0].scope_spans[0].spans
    assert [(s.trace_id.hex()[-2:], int.from_bytes(s.span_id, "big")) for s in spans] == [
        ("00", 3),
        ("01", 1),
        ("01", 2),
        ("01", 3),
    ]
    assert len(asked) == 1 and len(asked[0]) == 2
    everything = without_stored_spans(_request(0, 1), lambda ids, project: {(ids[0], f"{n:016x}") for n in (1, 2, 3)})
    assert everything == (None, 3)


def test_a_span_stored_in_another_project_with_the_same_ids_is_replayed() -> None:
    """Two teams' spans may share trace and span ids: the store holding team a's says nothing of team b's."""
    body = _request(0, 1)
    t0 = ((0xFEED).to_bytes(8, "big") + (0).to_bytes(8, "big")).hex()
    held = {"team-a": {(t0, f"{n:016x}") for n in (1, 2, 3)}}
    asked: list[str | None] = []

    def stored(trace_ids: list[str], *, project: str | None = None) -> set[tuple[str, str]]:
        asked.append(project)
        return held.get(project or "", set())

    assert without_stored_spans(body, stored, "team-b") == (body, 0)  # team b's credential: all replayed
    assert without_stored_spans(body, stored, "team-a") == (None, 3)
    assert asked == ["team-b", "team-a"]

    replayed = ReplayedSpans()
    replayed.add(body, "team-a")
    assert not replayed.again(span_key("team-b", t0, f"{1:016x}"))  # team b's new span, same ids: not a copy
    assert replayed.again(span_key("team-a", t0, f"{1:016x}"))


def test_durability_config_errors_name_the_key(tmp_path: Path) -> None:
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["durability"] = {"mode": "disk"}
    with pytest.raises(ConfigError, match=r"service\.durability\.mode"):
        parse_config(cfg)
    cfg["service"]["durability"] = {"mode": "wal", "max_size_mib": 0}
    with pytest.raises(ConfigError, match=r"service\.durability\.max_size_mib"):
        parse_config(cfg)
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["durability"] = {"mode": "wal"}
    del cfg["service"]["pipelines"]["traces"]
    del cfg["service"]["pipelines"]["logs"]
    cfg["exporters"] = {"debug": {}}
    cfg["service"]["pipelines"]["traces"] = {"receivers": ["otlp"], "exporters": ["debug"]}
    with pytest.raises(ConfigError, match=r"service\.durability\.mode: .*no pipeline writes a store"):
        parse_config(cfg)


# --- a failing disk -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """What the disk does to one `write` call: `ok`; `short` (takes `at` bytes and returns, as a write may);
    `enospc` / `eio` (takes `at` bytes, then fails); `sync` (takes it all, then fdatasync fails with EIO). Then,
    optionally, the cut back fails (`truncate_fails`) and so do the next `open_fails` new segments."""

    kind: str
    at: int
    truncate_fails: bool = False
    open_fails: int = 0


class FailingDisk(Disk):
    """A disk that writes the real file (so replay reads what it took) and fails as the faults say, one per write
    call, then works."""

    def __init__(self, faults: list[Fault]) -> None:
        self.faults = list(faults)
        self.truncate_fails = False
        self.open_fails = 0
        self.sync_fails = False

    def _fault(self) -> Fault:
        return self.faults.pop(0) if self.faults else Fault("ok", 0)

    def write(self, fd: int, data: memoryview) -> int:
        f = self._fault()
        self.truncate_fails, self.open_fails = f.truncate_fails, f.open_fails
        at = f.at % (len(data) + 1)
        if f.kind == "short" and 0 < at < len(data):
            return super().write(fd, data[:at])
        if f.kind in ("enospc", "eio"):
            if at:
                super().write(fd, data[:at])
            raise OSError(errno.ENOSPC if f.kind == "enospc" else errno.EIO, os.strerror(errno.ENOSPC))
        self.sync_fails = f.kind == "sync"
        return super().write(fd, data)

    def fdatasync(self, fd: int) -> None:
        if self.sync_fails:
            self.sync_fails = False
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        if self.truncate_fails:
            self.truncate_fails = False
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().ftruncate(fd, length)

    def open(self, path: Path) -> int:
        if self.open_fails:
            self.open_fails -= 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().open(path)


faults = st.builds(
    Fault,
    kind=st.sampled_from(["ok", "short", "enospc", "eio", "sync"]),
    at=st.integers(0, 400),
    truncate_fails=st.booleans(),
    open_fails=st.integers(0, 2),
)


@settings(max_examples=examples(ci=60, deep=1_000), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    waves=st.lists(st.lists(st.booleans(), min_size=1, max_size=3), min_size=1, max_size=6),
    plan=st.lists(faults, max_size=8),
)
def test_a_failing_write_never_loses_an_acknowledged_request_nor_replays_a_refused_one(
    tmp_path_factory: pytest.TempPathFactory, waves: list[list[bool]], plan: list[Fault]
) -> None:
    """Requests are appended in waves of concurrent ones (one group commit) while the disk fails as `plan` says, at
    any byte of a record; a request the pipeline refuses after its append (False) is voided. Then the disk works
    again, one more request is answered, and the process dies: replay holds every answered request once, and no
    refused one."""
    directory = tmp_path_factory.mktemp("wal")
    answered: list[bytes] = []

    async def request(wal: WriteAheadLog, body: bytes, pipeline_takes: bool) -> bool:
        try:
            wal.check_room()  # as the receiver does: refused before anything is written
            seq = await wal.append("traces", "protobuf", "otlp", body, time.monotonic())
        except Refused as r:
            assert r.unavailable and r.retry_after > 0 and str(directory) in str(r)
            return False
        if not pipeline_takes:
            await wal.void(seq)
            return False
        wal.settled(seq)
        answered.append(body)
        return True

    async def run() -> None:
        wal = WriteAheadLog(DurabilityConfig(mode="wal", directory=str(directory)), SelfMetrics(), FailingDisk(plan))
        wal.open()
        n = 0
        try:
            for wave in waves:
                await asyncio.gather(*(request(wal, f"request {(n := n + 1)}".encode(), t) for t in wave))
            for _ in range(200):  # the disk has room again: the next request is answered, once the log recovers
                if await request(wal, b"after", True):
                    break
                await asyncio.sleep(0.005)
            assert answered[-1] == b"after"
        finally:
            wal.close()  # kill -9 here: close only stops the writer thread, it writes nothing

    with mock.patch("evalsi.wal.RECOVER_INTERVAL", 0.001):
        asyncio.run(run())
    assert sorted(_replay(directory)) == sorted(answered)  # none lost, none refused, each once


def _replay(directory: Path) -> list[bytes]:
    """The request bodies the next start replays from `directory`, as the service reads them."""

    async def run() -> list[bytes]:
        wal = WriteAheadLog(DurabilityConfig(mode="wal", directory=str(directory)), SelfMetrics())
        wal.open()
        try:
            return [r.body for path in wal.replayable for r in wal.records(path)]
        finally:
            wal.close()

    return asyncio.run(run())


class Store:
    """The pipeline: takes every batch (after refusing the first `refuse` ones, as a full queue does)."""

    def __init__(self, refuse: int = 0) -> None:
        self.refuse = refuse
        self.spans: list[Any] = []

    async def consume(self, batch: SpanBatch) -> None:
        if self.refuse:
            self.refuse -= 1
            raise Refused("queue full", retry_after=1)
        self.spans.extend(batch.spans)


@pytest.mark.parametrize(
    ("fault", "refuse"),
    [
        (Fault("enospc", 100), 0),  # a full disk mid-record: cut back
        (Fault("sync", 0, truncate_fails=True), 0),  # fdatasync fails, and so does the cut back: a new segment
        (Fault("short", 7), 1),  # a short write is no failure; the pipeline refuses after the append: voided
    ],
    ids=["enospc", "cut-back-fails", "pipeline-refuses"],
)
def test_otlp_refuses_before_the_pipeline_takes_a_request_the_log_could_not_write(
    tmp_path: Path, fault: Fault, refuse: int
) -> None:
    """Through the real OTLP receiver: a request whose append fails is answered 503 (HTTP, with Retry-After and the
    directory named) or UNAVAILABLE (gRPC), and nothing of it is taken or replayable; the next request, once the
    disk has room, is taken once and replayed once."""
    directory = tmp_path / "wal"
    disk = FailingDisk([fault, fault])
    store = Store(refuse)
    config = OtlpReceiverConfig.model_validate(
        {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}
    )
    refused_http = _request(0, 2)
    refused_grpc = _request(2, 2)
    taken = _request(4, 2)

    def client(endpoints: dict[str, str]) -> None:
        r = httpx.post(f"http://{endpoints['http']}/v1/traces", content=refused_http, headers=PROTOBUF, timeout=10)
        status = status_pb2.Status.FromString(r.content)
        if refuse:  # the pipeline's own refusal, after the append
            assert r.status_code == 429 and status.message == "queue full"
        else:
            assert r.status_code == 503 and int(r.headers["retry-after"]) > 0
            assert str(directory) in status.message and "disk" in status.message
        assert store.spans == []
        with grpc.insecure_channel(endpoints["grpc"]) as channel:
            stub = TraceServiceStub(channel)
            if not refuse:
                with pytest.raises(grpc.RpcError) as e:
                    stub.Export(ExportTraceServiceRequest.FromString(refused_grpc), timeout=10)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE and str(directory) in e.value.details()
                assert store.spans == []
            stub.Export(ExportTraceServiceRequest.FromString(taken), timeout=10)  # room again: taken

    async def main() -> None:
        wal = WriteAheadLog(DurabilityConfig(mode="wal", directory=str(directory)), SelfMetrics(), disk)
        wal.open()
        wired = Next()
        wired.traces = store
        settings = Settings(id="otlp", metrics=SelfMetrics(), logger=logging.getLogger("t"), wal=wal)
        receiver = OtlpReceiver(config, settings, wired)
        await receiver.start()
        try:
            await asyncio.to_thread(client, dict(receiver.endpoints))
        finally:
            await receiver.shutdown()
            wal.close()

    asyncio.run(main())
    assert sorted(s.span_id for s in store.spans) == sorted(
        s.span_id.hex() for s in ExportTraceServiceRequest.FromString(taken).resource_spans[0].scope_spans[0].spans
    )  # the taken request's 6 spans, once
    assert _replay(directory) == [taken]  # a crash now replays it once, and nothing of the refused ones
