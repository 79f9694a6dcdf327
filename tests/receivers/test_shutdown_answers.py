"""What senders get while `evalsi serve` shuts down: after SIGTERM the OTLP receiver keeps its listeners open while
requests in flight finish, answering new ones 503 with `Retry-After` (HTTP, a Status carrying `RetryInfo`) or
UNAVAILABLE with `RetryInfo` (gRPC), so OTLP clients retry, on another replica or after the restart. Every answer is
one of those or a 200 whose spans are stored; none hangs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from running_collector import Collector, serve_config, start_collector

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
SPANS_PER_REQUEST = 5
TIMEOUT = 10  # s per request: an answer that takes longer is a hang


def spans_request(trace_id: bytes, span_ids: list[bytes]) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "shutdown-test"
    ss = rs.scope_spans.add()
    now = time.time_ns()
    for span_id in span_ids:
        span = ss.spans.add(trace_id=trace_id, span_id=span_id, name="during-shutdown", kind=1)
        span.start_time_unix_nano, span.end_time_unix_nano = now, now + 1000
    return req


def json_body(req: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON: hex ids."""
    doc = json_format.MessageToDict(req, use_integers_for_enums=True)
    for span, pb in zip(doc["resourceSpans"][0]["scopeSpans"][0]["spans"], req.resource_spans[0].scope_spans[0].spans,
                        strict=True):  # fmt: skip
        span["traceId"], span["spanId"] = pb.trace_id.hex(), pb.span_id.hex()
    return json.dumps(doc).encode()


def retry_delay(status: status_pb2.Status) -> float | None:
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.ToNanoseconds() / 1e9
    return None


@dataclass
class Sender:
    """Sends requests of fresh spans of one trace back to back until it is refused (then, as an OTLP client, it
    would wait and retry: it stops) or something else happens (a failure of this test)."""

    collector: Collector
    trace_id: bytes
    transport: str  # "http/protobuf", "http/json" or "grpc"
    acked: list[str] = field(default_factory=list)  # span ids answered 200
    outcomes: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            if self.transport == "grpc":
                self._run_grpc()
            else:
                self._run_http(PROTOBUF if self.transport == "http/protobuf" else JSON)
        except Exception as e:  # a hang (timeout), a reset, a refused connection: never expected here
            self.unexpected.append(f"{type(e).__name__}: {e}")
        finally:
            self.done.set()

    def _next(self) -> tuple[ExportTraceServiceRequest, list[str]]:
        ids = [os.urandom(8) for _ in range(SPANS_PER_REQUEST)]
        return spans_request(self.trace_id, ids), [i.hex() for i in ids]

    def _run_http(self, media: str) -> None:
        with httpx.Client(base_url=self.collector.http, timeout=TIMEOUT) as client:
            while True:
                req, ids = self._next()
                body = req.SerializeToString() if media == PROTOBUF else json_body(req)
                resp = client.post("/v1/traces", content=body, headers={"content-type": media})
                if resp.status_code == 200:
                    self.outcomes["200"] += 1
                    self.acked += ids
                    continue
                self.outcomes[str(resp.status_code)] += 1
                if not shutdown_refusal(resp, media):
                    self.unexpected.append(f"{resp.status_code} {resp.headers} {resp.content[:200]!r}")
                return

    def _run_grpc(self) -> None:
        with grpc.insecure_channel(self.collector.grpc) as channel:
            stub = TraceServiceStub(channel)
            while True:
                req, ids = self._next()
                try:
                    stub.Export(req, timeout=TIMEOUT)
                except grpc.RpcError as e:
                    self.outcomes[e.code().name] += 1  # type: ignore[attr-defined]
                    if not grpc_shutdown_refusal(e):
                        self.unexpected.append(f"{e.code()} {e.details()} {e.trailing_metadata()}")  # type: ignore[attr-defined]
                    return
                self.outcomes["OK"] += 1
                self.acked += ids


def shutdown_refusal(resp: httpx.Response, media: str) -> bool:
    """A 503 that tells an OTLP/HTTP client to retry: `Retry-After`, and a Status in the request's encoding carrying
    the same delay as `RetryInfo`; the connection is closed, so the client reconnects (perhaps elsewhere)."""
    if resp.status_code != 503 or resp.headers.get("content-type") != media:
        return False
    status = status_pb2.Status()
    if media == JSON:
        json_format.Parse(resp.text, status)
    else:
        status.ParseFromString(resp.content)
    return (
        status.code == code_pb2.UNAVAILABLE
        and "shutting down" in status.message
        and resp.headers.get("retry-after") == "5"
        and retry_delay(status) == 5
        and resp.headers.get("connection") == "close"
    )


def grpc_shutdown_refusal(e: grpc.RpcError) -> bool:
    """UNAVAILABLE with `RetryInfo` in `grpc-status-details-bin` (the server's own stop answers it without)."""
    if e.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
        return False
    details = dict(e.trailing_metadata() or ()).get("grpc-status-details-bin")  # type: ignore[attr-defined]
    if details is None:
        return False
    status = status_pb2.Status.FromString(details)
    return status.code == code_pb2.UNAVAILABLE and retry_delay(status) == 5


class SlowUpload:
    """One OTLP/HTTP request whose body is half sent: in flight when SIGTERM comes, finished during the drain."""

    def __init__(self, collector: Collector, trace_id: bytes) -> None:
        self.ids = [os.urandom(8) for _ in range(SPANS_PER_REQUEST)]
        self.body = spans_request(trace_id, self.ids).SerializeToString()
        host, port = collector.ready["receivers"]["otlp"]["http"].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
        head = (
            f"POST /v1/traces HTTP/1.1\r\nHost: {host}\r\nContent-Type: {PROTOBUF}\r\n"
            f"Content-Length: {len(self.body)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + self.body[: len(self.body) // 2])

    def finish(self) -> int:
        """The rest of the body; the answer's status."""
        self.sock.sendall(self.body[len(self.body) // 2 :])
        answer = b""
        while b"\r\n" not in answer:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        self.sock.close()
        return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else -1


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not in {timeout}s: {what}")
        time.sleep(0.02)


def test_sigterm_while_clients_send(tmp_path: Path) -> None:
    c = start_collector(tmp_path, serve_config(tmp_path / "store"))
    trace_id = os.urandom(16)
    try:
        slow = SlowUpload(c, trace_id)  # its headers are in: the receiver counts it in flight
        senders = [Sender(c, trace_id, t) for t in ("http/protobuf", "http/json", "grpc")]
        for s in senders:
            threading.Thread(target=s.run, daemon=True).start()
        wait_for(lambda: all(len(s.acked) >= 5 * SPANS_PER_REQUEST or s.done.is_set() for s in senders), 30,
                 "every sender answered 200 five times")  # fmt: skip

        c.proc.send_signal(signal.SIGTERM)
        for s in senders:  # each goes on sending until it is refused
            assert s.done.wait(TIMEOUT + 5), f"{s.transport} sender still waiting for an answer"

        # a sender that comes late, on a new connection, is refused the same way (the listeners are open: the
        # slow upload is still in flight)
        with httpx.Client(base_url=c.http, timeout=TIMEOUT) as late:
            resp = late.post("/v1/traces", content=b"", headers={"content-type": PROTOBUF})
        assert shutdown_refusal(resp, PROTOBUF), (resp.status_code, resp.headers, resp.content)
        with grpc.insecure_channel(c.grpc) as channel, pytest.raises(grpc.RpcError) as refused:
            TraceServiceStub(channel).Export(ExportTraceServiceRequest(), timeout=TIMEOUT)
        assert grpc_shutdown_refusal(refused.value), refused.value
        # load balancers see it leave: /readyz says so while the API still answers
        ready = httpx.get(c.api + "/readyz", timeout=TIMEOUT)
        assert ready.status_code == 503 and "shutting down" in ready.text, ready.text
        # the request in flight when SIGTERM came is taken whole
        assert slow.finish() == 200

        assert c.proc.wait(30) == 0, c.log_path.read_text()[-3000:]
    finally:
        c.stop(signal.SIGKILL)

    counts = {s.transport: dict(s.outcomes) for s in senders}
    print(f"answers during shutdown: {counts}; late senders: 503, UNAVAILABLE; slow upload in flight: 200")
    for s in senders:
        assert not s.unexpected, (s.transport, s.unexpected, counts)
        refused = s.outcomes["UNAVAILABLE" if s.transport == "grpc" else "503"]
        assert refused == 1 and s.outcomes["OK" if s.transport == "grpc" else "200"] >= 5, counts
    # the receiver counted every refusal, and closed its listeners once the drain was over
    [stopped] = [e for e in c.logs() if e.get("msg") == "stopped listening"]
    assert stopped["refused_while_draining"] == len(senders) + 2, stopped
    with pytest.raises(httpx.ConnectError):
        httpx.post(c.http + "/v1/traces", content=b"", headers={"content-type": PROTOBUF}, timeout=2)

    # every span answered 200 is in the store, and nothing of a refused request: read it with the collector stopped
    stored = json.loads(c.cli("traces", "show", trace_id.hex(), "--json", api=False).stdout)["spans"]
    acked = [i for s in senders for i in s.acked] + [i.hex() for i in slow.ids]
    assert sorted(s["span_id"] for s in stored) == sorted(acked)
