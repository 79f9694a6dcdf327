"""A real full disk under a real `evalsi serve`: the store lives on a small tmpfs that the test fills. Ingest turns to
503 with Retry-After once the store's queue is full, `/readyz` says why, and every acknowledged span is stored once
space returns. Needs root to mount the tmpfs (CI runs as root); skipped otherwise, saying so. tests/exporters/
test_store_failures.py covers the same paths with the failure injected, everywhere."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from running_collector import serve_config, start_collector

PROTOBUF = {"Content-Type": "application/x-protobuf"}
T0 = time.time_ns() - 60_000_000_000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; test_store_failures.py injects the same failure")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}); test_store_failures.py injects it")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    """Fill the filesystem to the last block."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 1 << 12, 1 << 9):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def _request(trace: int, n: int) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="disk-full")))
    spans = rs.scope_spans.add().spans
    for i in range(n):
        s = Span(
            trace_id=trace.to_bytes(16, "big"),
            span_id=(i + 1).to_bytes(8, "big"),
            name=f"step {i}",
            start_time_unix_nano=T0 + i,
            end_time_unix_nano=T0 + i + 1000,
        )
        s.attributes.append(KeyValue(key="payload", value=AnyValue(string_value="x" * 512)))
        spans.append(s)
    return req.SerializeToString()


def test_a_full_disk_refuses_ingest_with_503_and_loses_nothing_acknowledged(small_disk: Path, tmp_path: Path) -> None:
    cfg = serve_config(small_disk / "store")
    retry = {"initial_interval": "100ms", "max_interval": "500ms"}
    cfg["exporters"]["clickhouse"].update({"queue_size": 3000, "batch_size": 500, "retry_on_failure": retry})
    c = start_collector(tmp_path, cfg)
    try:
        filler = _fill(small_disk)
        acknowledged = 0
        refused: httpx.Response | None = None
        deadline = time.monotonic() + 60
        for trace in range(1, 200):
            r = httpx.post(c.http + "/v1/traces", content=_request(trace, 100), headers=PROTOBUF, timeout=30)
            while r.status_code == 429 and time.monotonic() < deadline:
                # the queue filled before the store's first failed write was seen (a busy machine): as a sender
                # does, retry after Retry-After; the store's refusal (503) follows
                time.sleep(float(r.headers.get("Retry-After", "1")))
                r = httpx.post(c.http + "/v1/traces", content=_request(trace, 100), headers=PROTOBUF, timeout=30)
            if r.status_code == 200:
                acknowledged += 100
                continue
            refused = r
            break
        assert refused is not None, f"{acknowledged} spans acknowledged on a full disk, none refused"
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        status = status_pb2.Status.FromString(refused.content)
        assert "refuses writes" in status.message and "queue" in status.message
        ready = httpx.get(c.api + "/readyz")
        assert ready.status_code == 503 and "refuses writes" in ready.text
        filler.unlink()  # space returns
        assert c.wait_stored(acknowledged, timeout=60) == acknowledged
        assert httpx.get(c.api + "/readyz").status_code == 200
        r = httpx.post(c.http + "/v1/traces", content=_request(999, 10), headers=PROTOBUF)
        assert r.status_code == 200
        assert c.wait_stored(acknowledged + 10) == acknowledged + 10
    finally:
        code = c.stop()
    assert code == 0, c.log_path.read_text()[-3000:]


def test_sigterm_during_a_full_disk_exits_non_zero_saying_what_was_not_stored(small_disk: Path, tmp_path: Path) -> None:
    cfg = serve_config(small_disk / "store")
    cfg["exporters"]["clickhouse"].update(
        {"drain_timeout": "1s", "retry_on_failure": {"initial_interval": "100ms", "max_interval": "500ms"}}
    )
    c = start_collector(tmp_path, cfg)
    _fill(small_disk)
    r = httpx.post(c.http + "/v1/traces", content=_request(1, 50), headers=PROTOBUF)
    assert r.status_code == 200
    time.sleep(1.0)
    started = time.monotonic()
    code = c.stop(timeout=60)
    assert time.monotonic() - started < 30
    log = c.log_path.read_text()
    assert code == 1, log[-3000:]
    assert "stopped with acknowledged data not stored: 50 spans" in log
