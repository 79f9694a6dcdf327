"""A local stand-in for a Langfuse server that checks every request against Langfuse's published API.

No Langfuse server can run here (it needs Postgres, ClickHouse, Redis and S3), so `FakeLangfuse` enforces what the
public API documents for `POST /api/public/scores` (CreateScoreRequest, upserted by `id` as Langfuse does), for
the OTLP endpoint `POST /api/public/otel/v1/traces` (OTLP/HTTP: Basic auth, protobuf, optional gzip, a decodable
ExportTraceServiceRequest), and for `GET /api/public/v2/observations` (its query parameters, field groups and
cursor pages, as the Python SDK 5.2's `observations.get_many` documents them), serving observations a test adds.
It can be stopped and started again on the same port, keeping what it stored, to play
a backend outage.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PK, SK = "pk-lf-test", "sk-lf-test"
SCORES_PATH = "/api/public/scores"
TRACES_PATH = "/api/public/otel/v1/traces"
DATA_TYPES = {"NUMERIC", "BOOLEAN", "CATEGORICAL"}
OBSERVATIONS_PATH = "/api/public/v2/observations"
FIELD_GROUPS = {
    "core": ("id", "traceId", "startTime", "endTime", "projectId", "parentObservationId", "type"),
    "basic": (
        "name",
        "level",
        "statusMessage",
        "version",
        "environment",
        "bookmarked",
        "public",
        "userId",
        "sessionId",
        "isRootObservation",
    ),
    "time": ("completionStartTime", "createdAt", "updatedAt"),
    "io": ("input", "output"),
    "metadata": ("metadata",),
    "model": ("model", "internalModelId", "modelParameters"),
    "usage": ("usageDetails", "costDetails", "totalCost", "usagePricingTierName"),
    "prompt": ("promptId", "promptName", "promptVersion"),
    "metrics": ("latency", "timeToFirstToken"),
    "trace_context": ("tags", "release", "traceName"),
}
OBSERVATION_PARAMS = {"fields", "expandMetadata", "limit", "cursor", "name", "userId", "sessionId", "type", "traceId",
                      "level", "parentObservationId", "isRootObservation", "environment", "fromStartTime",
                      "toStartTime", "version", "filter"}  # fmt: skip
SCORE_FIELDS = {"id", "traceId", "sessionId", "observationId", "datasetRunId", "name", "value", "dataType", "comment",
                "metadata", "environment", "configId", "queueId", "timestamp"}  # fmt: skip


def _time(text: str) -> datetime.datetime:
    at = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if at.tzinfo is None:
        raise ValueError("no time zone")
    return at


class Server(ThreadingHTTPServer):
    # socketserver's default backlog of 5 drops the SYNs of a 50-request burst, and the client's TCP waits 1-3 s
    # before it tries again: a backlog a real server has keeps the stand-in from looking slow
    request_queue_size = 128


class FakeLangfuse:
    """Answers the scripted statuses first, then 200; stores accepted scores by id and spans by (trace, span) id;
    records protocol violations. Scores for traces it has no spans of are accepted, as Langfuse documents."""

    def __init__(
        self,
        failures: list[int] | None = None,
        span_failures: list[int] | None = None,
        max_body: int | None = None,
        item_error: Callable[[dict[str, Any]], str | None] | None = None,
    ) -> None:
        self.failures = list(failures or [])  # for score requests
        self.span_failures = list(span_failures or [])  # for OTLP span requests
        # a body limit, as a server or its proxy has: a larger request (as sent) is answered 413
        self.max_body = max_body
        self.too_large = 0  # requests answered 413
        # a score this returns a message for is answered 207 with that item error (Langfuse's multi-status answer)
        self.item_error = item_error
        self.attempts: list[dict[str, Any]] = []  # score bodies, every attempt
        self.stored: dict[str, dict[str, Any]] = {}  # score id -> last accepted body
        self.span_requests: list[ExportTraceServiceRequest] = []  # accepted OTLP requests
        self.span_headers: list[dict[str, str]] = []  # headers of every OTLP attempt
        self.spans: dict[tuple[str, str], Any] = {}  # (trace id hex, span id hex) -> the OTLP span
        self.violations: list[str] = []
        self.observations: list[dict[str, Any]] = []  # what GET /api/public/v2/observations serves (all fields)
        self.observation_queries: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.port = 0
        self.server: ThreadingHTTPServer | None = None

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- checks ---------------------------------------------------------------------------------------

    def _auth(self, headers: dict[str, str]) -> list[str]:
        expected = "Basic " + base64.b64encode(f"{PK}:{SK}".encode()).decode()
        return [] if headers.get("Authorization") == expected else ["auth"]

    def check_score(self, headers: dict[str, str], raw: bytes) -> tuple[dict[str, Any], list[str]]:
        problems = self._auth(headers)
        if not headers.get("Content-Type", "").startswith("application/json"):
            problems.append("content type")
        body = json.loads(raw)
        if not isinstance(body, dict):
            return {}, [*problems, "body is not one CreateScoreRequest object"]
        for key, kind in (("id", str), ("name", str), ("dataType", str)):
            if not isinstance(body.get(key), kind):
                problems.append(f"{key} missing or not {kind.__name__}")
        trace_id = body.get("traceId")
        if "traceId" in body and not (
            isinstance(trace_id, str) and (re.fullmatch(r"[0-9a-f]{32}", trace_id) or trace_id in self.trace_ids)
        ):
            problems.append("traceId is neither 32 hex (an OTel id) nor the id of a trace this Langfuse holds")
        if "traceId" not in body and "sessionId" not in body:
            problems.append("neither traceId nor sessionId")
        observation = body.get("observationId")
        if "observationId" in body and not (
            isinstance(observation, str)
            and (re.fullmatch(r"[0-9a-f]{16}", observation) or observation in self.observation_ids)
        ):
            problems.append("observationId is neither 16 hex nor the id of an observation this Langfuse holds")
        data_type, value = body.get("dataType"), body.get("value")
        if data_type not in DATA_TYPES:
            problems.append(f"dataType {data_type}")
        if data_type == "NUMERIC" and (isinstance(value, bool) or not isinstance(value, int | float)):
            problems.append("NUMERIC value is not a number")
        if data_type == "BOOLEAN" and value not in (0, 1):
            problems.append("BOOLEAN value is not 0/1")
        if data_type == "CATEGORICAL" and not isinstance(value, str):
            problems.append("CATEGORICAL value is not a string")
        if "comment" in body and not isinstance(body["comment"], str):
            problems.append("comment is not a string")
        if "metadata" in body and not isinstance(body["metadata"], dict):
            problems.append("metadata is not an object")
        problems += [f"unknown field {k}" for k in body if k not in SCORE_FIELDS]
        return body, problems

    def check_traces(self, headers: dict[str, str], raw: bytes) -> tuple[ExportTraceServiceRequest, list[str]]:
        problems = self._auth(headers)
        if headers.get("Content-Type") != "application/x-protobuf":
            problems.append(f"OTLP content type {headers.get('Content-Type')!r}")
        if headers.get("Content-Encoding") == "gzip":
            raw = gzip.decompress(raw)
        elif headers.get("Content-Encoding") not in (None, "identity"):
            problems.append(f"content encoding {headers.get('Content-Encoding')!r}")
        try:
            req = ExportTraceServiceRequest.FromString(raw)
        except DecodeError as e:
            return ExportTraceServiceRequest(), [*problems, f"not an ExportTraceServiceRequest: {e}"]
        if not req.resource_spans:
            problems.append("no resource spans")
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    if len(span.trace_id) != 16 or len(span.span_id) != 8:
                        problems.append("span without a 16-byte trace id and an 8-byte span id")
                    if not span.name:
                        problems.append("span without a name")
        return req, problems

    @property
    def trace_ids(self) -> set[str]:
        return {o["traceId"] for o in self.observations}

    @property
    def observation_ids(self) -> set[str]:
        return {o["id"] for o in self.observations}

    def list_observations(self, headers: dict[str, str], query: dict[str, str]) -> tuple[int, str, bytes]:
        """`GET /api/public/v2/observations`: filters, field groups, and cursor pages newest first (the receiver
        must not rely on an order the API does not promise)."""
        self.observation_queries.append(query)
        problems = self._auth(headers)
        problems += [f"unknown query parameter {k}" for k in query if k not in OBSERVATION_PARAMS]
        groups = query.get("fields", "core,basic").split(",")
        problems += [f"unknown field group {g}" for g in groups if g not in FIELD_GROUPS]
        try:
            limit = int(query.get("limit", "50"))
            if not 1 <= limit <= 1000:
                problems.append("limit outside 1..1000")
        except ValueError:
            problems.append("limit is not an integer")
            limit = 50
        bounds = {}
        for key in ("fromStartTime", "toStartTime"):
            if key in query:
                try:
                    bounds[key] = _time(query[key])
                except ValueError:
                    problems.append(f"{key} is not ISO 8601")
        if query.get("isRootObservation") not in (None, "true", "false"):
            problems.append("isRootObservation is not a boolean")
        try:
            offset = int(base64.b64decode(query["cursor"]).decode()) if "cursor" in query else 0
        except ValueError:
            problems.append("cursor is not one this server gave")
            offset = 0
        if problems:
            self.violations += problems
            return 400, "application/json", json.dumps({"message": "; ".join(problems)}).encode()
        found = [
            o for o in self.observations
            if ("traceId" not in query or o["traceId"] == query["traceId"])
            and (query.get("isRootObservation") != "true" or not o.get("parentObservationId"))
            and ("fromStartTime" not in bounds or _time(o["startTime"]) >= bounds["fromStartTime"])
            and ("toStartTime" not in bounds or _time(o["startTime"]) < bounds["toStartTime"])
        ]  # fmt: skip
        found.sort(key=lambda o: _time(o["startTime"]), reverse=True)
        page = found[offset : offset + limit]
        keep = {f for g in ["core", *groups] for f in FIELD_GROUPS[g]}
        data = [{k: v for k, v in o.items() if k in keep} for o in page]
        more = offset + limit < len(found)
        cursor = base64.b64encode(str(offset + limit).encode()).decode() if more else None
        return 200, "application/json", json.dumps({"data": data, "meta": {"cursor": cursor}}).encode()

    # --- answers --------------------------------------------------------------------------------------

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, str, bytes]:
        with self.lock:
            if self.max_body is not None and len(raw) > self.max_body:
                self.too_large += 1
                return 413, "application/json", b'{"message": "request entity too large"}'
            if path == SCORES_PATH:
                return self._score(headers, raw)
            if path == TRACES_PATH:
                return self._traces(headers, raw)
            self.violations.append(f"path {path}")
            return 404, "application/json", b'{"message": "not found"}'

    def _score(self, headers: dict[str, str], raw: bytes) -> tuple[int, str, bytes]:
        body, problems = self.check_score(headers, raw)
        self.attempts.append(body)
        if problems:
            self.violations += problems
            return 400, "application/json", json.dumps({"message": "; ".join(problems)}).encode()
        if self.failures:
            return self.failures.pop(0), "application/json", b'{"message": "scripted failure"}'
        if self.item_error is not None and (message := self.item_error(body)):
            errors = [{"id": body["id"], "status": 400, "message": message, "error": message}]
            return 207, "application/json", json.dumps({"successes": [], "errors": errors}).encode()
        self.stored[body["id"]] = body  # Langfuse upserts a score by id
        return 200, "application/json", json.dumps({"id": body["id"]}).encode()

    def _traces(self, headers: dict[str, str], raw: bytes) -> tuple[int, str, bytes]:
        self.span_headers.append(headers)
        req, problems = self.check_traces(headers, raw)
        if problems:
            self.violations += problems
            return 400, "application/json", json.dumps({"message": "; ".join(problems)}).encode()
        if self.span_failures:
            return self.span_failures.pop(0), "application/json", b'{"message": "scripted failure"}'
        self.span_requests.append(req)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    self.spans[(span.trace_id.hex(), span.span_id.hex())] = span
        return 200, "application/x-protobuf", ExportTraceServiceResponse().SerializeToString()

    # --- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> FakeLangfuse:
        """Listen (again) on the same port; port 0 the first time. What was stored is kept."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                path, _, raw_query = self.path.partition("?")
                if path == OBSERVATIONS_PATH:
                    query = {k: v[-1] for k, v in parse_qs(raw_query).items()}
                    with fake.lock:
                        status, content_type, payload = fake.list_observations(dict(self.headers), query)
                else:
                    status, content_type, payload = 404, "application/json", b'{"message": "not found"}'
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, content_type, payload = fake.handle(self.path, dict(self.headers), raw)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                if status in (429, 503):
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(payload)

        self.server = Server(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Close the listening socket: clients get connection refused until `start()`."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self) -> FakeLangfuse:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
