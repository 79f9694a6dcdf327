"""A local OTLP/HTTP logs backend (`POST /v1/logs`, official protos) that keeps the score records it accepts and
answers 503 while it is `down`, to play a backend outage for the `otlp` exporter."""

from __future__ import annotations

import gzip
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse

EVENT_NAME = "gen_ai.evaluation.result"


def record_key(record: Any) -> tuple[str, str, str, str, str]:
    """What identifies a score in a `gen_ai.evaluation.result` record: OTLP logs carry no id, so the evaluated
    span's ids plus the policy, evaluator and score name (the online part of `Score.key`)."""
    attrs = {kv.key: kv.value.string_value for kv in record.attributes}
    return (
        record.trace_id.hex(),
        record.span_id.hex(),
        attrs.get("evalsi.policy", ""),
        attrs.get("evalsi.evaluator", ""),
        attrs.get("gen_ai.evaluation.name", ""),
    )


class Server(ThreadingHTTPServer):
    # socketserver's default backlog of 5 drops the SYNs of a 50-request burst, and the client's TCP waits 1-3 s
    # before it tries again: a backlog a real server has keeps the stand-in from looking slow
    request_queue_size = 128


class OtlpLogsBackend:
    """Accepts OTLP/HTTP protobuf logs; while `down` is set answers 503 (no Retry-After, so the exporter backs off)."""

    def __init__(self) -> None:
        self.down = False
        self.refused = 0  # requests answered 503
        self.keys: Counter[tuple[str, str, str, str, str]] = Counter()  # every accepted evaluation record, by key
        self.problems: list[str] = []
        self.lock = threading.Lock()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, body = backend.handle(self.path, dict(self.headers), raw)
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, bytes]:
        with self.lock:
            if self.down:
                self.refused += 1
                return 503, b""
            if path != "/v1/logs" or headers.get("Content-Type") != "application/x-protobuf":
                self.problems.append(f"{path} {headers.get('Content-Type')}")
                return 400, b""
            if headers.get("Content-Encoding") == "gzip":
                raw = gzip.decompress(raw)
            req = ExportLogsServiceRequest.FromString(raw)
            for rl in req.resource_logs:
                for sl in rl.scope_logs:
                    for record in sl.log_records:
                        if record.event_name == EVENT_NAME:
                            self.keys[record_key(record)] += 1
            return 200, ExportLogsServiceResponse().SerializeToString()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
