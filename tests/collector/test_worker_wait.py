"""`service.worker_wait`: a request that finds its worker full waits for room before it is refused, through a real
`evalsi serve` with two workers. A worker is stopped with SIGSTOP, so it takes nothing until it is continued."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp_requests import chain_request
from running_collector import Collector, serve_config, start_collector

PROTOBUF = {"Content-Type": "application/x-protobuf"}
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _body(first: int, traces: int = 3) -> bytes:
    """A request of `traces` traces of 2 spans, all owned by worker 0 of 2 (an even low half of the trace id)."""
    ids = [(0xBEEF).to_bytes(8, "big") + (2 * t).to_bytes(8, "big") for t in range(first, first + traces)]
    return chain_request(ids, service="wait-test").SerializeToString()


def _collector(tmp_path: Path, wait: str) -> Collector:
    cfg = serve_config(tmp_path / "store")
    cfg["service"].update(workers=2, worker_max_in_flight=1, worker_wait=wait)
    return start_collector(tmp_path, cfg)


@pytest.fixture
def waiting(tmp_path: Path) -> Iterator[Collector]:
    c = _collector(tmp_path, "2s")
    yield c
    for pid in c.ready["workers"]:
        os.kill(pid, signal.SIGCONT)
    c.stop()


def _post(c: Collector, body: bytes) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = httpx.post(c.http + "/v1/traces", content=body, headers=PROTOBUF, timeout=30)
    return r, time.monotonic() - t0


def _metric(c: Collector, name: str) -> float:
    for line in httpx.get(c.metrics).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_request_waits_for_room_is_taken_when_the_worker_frees_and_refused_when_not(waiting: Collector) -> None:
    c = waiting
    worker = c.ready["workers"][0]
    os.kill(worker, signal.SIGSTOP)
    assert _post(c, _body(0))[0].status_code == 200  # the worker's one request in flight, not taken

    # room frees within worker_wait: the sender gets 200, not 429, once the worker takes the first request
    answer: list[tuple[httpx.Response, float]] = []
    sender = threading.Thread(target=lambda: answer.append(_post(c, _body(10))))
    sender.start()
    time.sleep(0.6)
    assert not answer, "answered while its worker was full"
    os.kill(worker, signal.SIGCONT)
    sender.join(10)
    r, seconds = answer[0]
    assert r.status_code == 200, r.text
    assert 0.5 < seconds < 2.0
    assert c.wait_stored(12) == 12

    # no room within worker_wait: 429 with Retry-After after the wait, and nothing of it is stored
    os.kill(worker, signal.SIGSTOP)
    assert _post(c, _body(20))[0].status_code == 200
    r, seconds = _post(c, _body(30))
    assert r.status_code == 429 and r.headers["Retry-After"] == "1"
    assert "pipeline worker 0 has 1 requests not yet taken" in r.text
    assert 1.9 < seconds < 4.0
    assert _metric(c, "evalsi_worker_wait_seconds_total") > 2.4  # the two waits, ~0.6 s and ~2 s

    # a gRPC sender's deadline shorter than worker_wait: refused before it, so the sender can tell and retry
    with grpc.insecure_channel(c.grpc) as channel:
        export = channel.unary_unary(EXPORT)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            export(_body(40), timeout=0.8)
        seconds = time.monotonic() - t0
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    assert seconds < 0.8

    os.kill(worker, signal.SIGCONT)
    assert c.wait_stored(18) == 18  # the accepted requests (0, 10, 20), none of the refused ones
    time.sleep(1.0)
    assert c.stored_spans() == 18


def test_worker_wait_0_refuses_at_once(tmp_path: Path) -> None:
    c = _collector(tmp_path, "0s")
    worker = c.ready["workers"][0]
    try:
        os.kill(worker, signal.SIGSTOP)
        assert _post(c, _body(0))[0].status_code == 200
        r, seconds = _post(c, _body(10))
        assert r.status_code == 429 and seconds < 0.5
        # a request for the other worker is not held back by the full one
        other = ExportTraceServiceRequest.FromString(_body(20, 1))
        for s in other.resource_spans[0].scope_spans[0].spans:
            s.trace_id = s.trace_id[:15] + b"\x01"
        assert _post(c, other.SerializeToString())[0].status_code == 200
    finally:
        os.kill(worker, signal.SIGCONT)
        c.stop()
