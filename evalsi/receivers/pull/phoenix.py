"""The `phoenix` pull receiver: reads new traces from an Arize Phoenix server (its REST API, `/v1/projects/...`),
project by project, and hands their spans to the traces pipeline with their OpenInference attributes, under their own
trace and span ids."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status
from pydantic import Field, field_validator

from evalsi.component import Next, Settings, receiver, server_url
from evalsi.duration import Duration
from evalsi.receivers.otlp.decode import decode_encoded
from evalsi.receivers.pull.poll import Listed, Page, PullConfig, Source, SourceError, SourcesReceiver, check_response

SCOPE = "evalsi.receivers.phoenix"
"""The instrumentation scope of the imported spans (their attributes are those Phoenix stored)."""
SPAN_KIND = "openinference.span.kind"
# attributes an OpenInference exporter sends as JSON strings, which Phoenix parses and stores as objects
# (phoenix.trace.attributes.JSON_STRING_ATTRIBUTES): sent on as JSON strings again
JSON_STRING_ATTRIBUTES = ("document.metadata", "llm.prompt_template.variables", "metadata", "tool.parameters")
TRACES_PER_FETCH = 50
SPANS_PER_PAGE = 1000  # Phoenix's cap
STATUS_CODES = {"OK": Status.STATUS_CODE_OK, "ERROR": Status.STATUS_CODE_ERROR}


class PhoenixReceiverConfig(PullConfig):
    endpoint: str
    """The Phoenix server, e.g. http://phoenix:6006."""
    projects: list[str] = Field(min_length=1)
    """Projects to read, by name or by id (Phoenix's `UHJvamVjdDox` form)."""
    headers: dict[str, str] = {}
    """Extra request headers, e.g. `Authorization: "Bearer ${env:PHOENIX_API_KEY}"`."""
    timeout: Duration = 30.0
    settle: Duration = 30.0
    """A trace is listed once it started this long ago: Phoenix knows a span only once it has ended and been
    exported, so a younger trace may still lack spans (its start time may even move back)."""

    _endpoint = field_validator("endpoint")(server_url)

    @field_validator("projects")
    @classmethod
    def _projects(cls, v: list[str]) -> list[str]:
        if any(not p.strip() for p in v):
            raise ValueError("a project is empty: give its name or its id")
        if any(c in p for p in v for c in "/?#"):
            raise ValueError("a project name with '/', '?' or '#' cannot be read through Phoenix's API: give its id")
        if len(set(v)) != len(v):
            raise ValueError("a project is listed twice")
        return v


def _iso(time_ms: int) -> str:
    return datetime.fromtimestamp(time_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def _datetime(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _ms(value: str) -> int:
    """An ISO time with microseconds in ms since the epoch, rounded down (so a `start_time >=` query finds it)."""
    return _ns(value) // 1_000_000


def _ns(value: str) -> int:
    when = _datetime(value)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = int(when.replace(microsecond=0).timestamp())
    return seconds * 1_000_000_000 + when.microsecond * 1000


class PhoenixSource:
    """One project of a Phoenix server."""

    def __init__(self, client: httpx.AsyncClient, endpoint: str, project: str, settle: float) -> None:
        self.client, self.endpoint, self.project, self.settle = client, endpoint, project, settle
        self.project_name: str | None = None
        self.name = f"phoenix {endpoint} project {project}"
        self._path = f"/v1/projects/{quote(project, safe='')}"
        self._until: str | None = None  # the upper bound on start time of the pages of one listing

    async def resolve(self) -> None:
        """The project's name (the imported spans' service.name)."""
        resp = await self.client.get(self._path)
        if resp.status_code == 404:
            raise SourceError(f"no project {self.project!r} at {self.endpoint} (yet): it is read once it exists")
        self.project_name = str(check_response(resp, "get project")["data"]["name"])

    async def list_since(self, time_ms: int, page_size: int, token: str | None) -> Page:
        """Traces started at or after `time_ms` (and at least `settle` ago), oldest first. A trace is complete once
        its root span (no parent) is in Phoenix: an exporter sends a span when it ends, and a root ends last."""
        if self.project_name is None:
            await self.resolve()
        if token is None:
            self._until = _iso(int((time.time() - self.settle) * 1000))
        params: dict[str, Any] = {
            "start_time": _iso(time_ms),
            "end_time": self._until,
            "sort": "start_time",
            "order": "asc",
            "limit": page_size,
            "include_spans": "true",
        }
        if token:
            params["cursor"] = token
        data = check_response(await self.client.get(f"{self._path}/traces", params=params), "list traces")
        listed = [
            Listed(
                str(t["trace_id"]),
                _ms(t["start_time"]),
                any(s.get("parent_id") is None for s in t.get("spans") or ()),
            )
            for t in data.get("data", [])
        ]
        return Page(listed, data.get("next_cursor") or None)

    async def fetch(self, listed: list[Listed]) -> bytes:
        resource = ResourceSpans()
        resource.resource.attributes.extend(
            [
                _kv("service.name", self.project_name or self.project),
                _kv("phoenix.project.name", self.project_name or self.project),
                _kv("evalsi.source", "phoenix"),
            ]
        )
        scope = resource.scope_spans.add()
        scope.scope.name = SCOPE
        for i in range(0, len(listed), TRACES_PER_FETCH):
            ids = [t.source_id for t in listed[i : i + TRACES_PER_FETCH]]
            cursor: str | None = None
            while True:
                params: dict[str, Any] = {"trace_id": ids, "limit": SPANS_PER_PAGE}
                if cursor:
                    params["cursor"] = cursor
                data = check_response(await self.client.get(f"{self._path}/spans", params=params), "get spans")
                for span in data.get("data", []):
                    scope.spans.append(otlp_span(span))
                cursor = data.get("next_cursor") or None
                if not cursor:
                    break
        return ExportTraceServiceRequest(resource_spans=[resource]).SerializeToString()


# --- Phoenix's span JSON to OTLP ---------------------------------------------------------------------


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _any(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, list | tuple):
        return AnyValue(array_value=ArrayValue(values=[_any(v) for v in value]))
    return AnyValue(string_value=json.dumps(value, default=str))


def _json_string_prefix(key: str) -> str | None:
    """The JSON-string attribute `key` lies in (`tool.parameters` of `tool.parameters.properties.x.type`), if any."""
    parts = key.split(".")
    for n in range(1, len(parts) + 1):
        prefix = ".".join(parts[:n])
        if any(prefix == name or prefix.endswith("." + name) for name in JSON_STRING_ATTRIBUTES):
            return prefix
    return None


def _put(tree: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        child = tree.get(part)
        if not isinstance(child, dict):
            child = tree[part] = {}
        tree = child
    if path:
        tree[path[-1]] = value


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    """As an OpenInference exporter sends attributes: dotted keys, lists of objects by index, lists of scalars kept."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list | tuple) and any(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _flatten(f"{prefix}.{i}", v, out)
    elif value is not None:
        out[prefix] = value


def attributes(span: dict[str, Any]) -> dict[str, Any]:
    """A Phoenix span's attributes as its sender wrote them: flattened, JSON-string attributes as JSON strings, and
    `openinference.span.kind` (Phoenix keeps it as the span's kind) when the sender set one."""
    flat: dict[str, Any] = {}
    _flatten("", span.get("attributes") or {}, flat)
    out: dict[str, Any] = {}
    json_strings: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        prefix = _json_string_prefix(key)
        if prefix is None:
            out[key] = value
        elif key == prefix:
            out[key] = value if isinstance(value, str) else json.dumps(value)
        else:
            _put(json_strings.setdefault(prefix, {}), key[len(prefix) + 1 :].split("."), value)
    for prefix, tree in json_strings.items():
        out[prefix] = json.dumps(tree)
    kind = span.get("span_kind")
    if SPAN_KIND not in out and isinstance(kind, str) and kind and kind.upper() != "UNKNOWN":
        out[SPAN_KIND] = kind  # UNKNOWN is Phoenix's word for "none": such a span is left to the other mappers
    return out


def _span_id(value: Any, size: int, what: str) -> bytes:
    try:
        raw = bytes.fromhex(str(value))
    except ValueError:
        raw = b""
    if len(raw) != size:
        raise SourceError(f"a span's {what} {value!r} is not {size * 2} hex digits")
    return raw


def otlp_span(data: dict[str, Any]) -> Span:
    """An OTLP span from Phoenix's span JSON (`GET /v1/projects/{project}/spans`)."""
    context = data.get("context") or {}
    span = Span(
        trace_id=_span_id(context.get("trace_id"), 16, "trace id"),
        span_id=_span_id(context.get("span_id"), 8, "span id"),
        name=str(data.get("name") or ""),
        kind=Span.SPAN_KIND_INTERNAL,
    )
    if data.get("parent_id"):
        span.parent_span_id = _span_id(data["parent_id"], 8, "parent id")
    try:
        span.start_time_unix_nano = _ns(data["start_time"])
        span.end_time_unix_nano = _ns(data["end_time"]) if data.get("end_time") else span.start_time_unix_nano
    except (KeyError, TypeError, ValueError):
        raise SourceError(f"span {context.get('span_id')!r} has no valid start or end time") from None
    span.attributes.extend(KeyValue(key=k, value=_any(v)) for k, v in attributes(data).items())
    span.status.code = STATUS_CODES.get(str(data.get("status_code") or "").upper(), Status.STATUS_CODE_UNSET)
    if data.get("status_message"):
        span.status.message = str(data["status_message"])
    for event in data.get("events") or ():
        e = span.events.add()
        e.name = str(event.get("name") or "")
        try:
            e.time_unix_nano = _ns(event["timestamp"])
        except (KeyError, TypeError, ValueError):
            e.time_unix_nano = span.start_time_unix_nano
        flat: dict[str, Any] = {}
        _flatten("", event.get("attributes") or {}, flat)
        e.attributes.extend(KeyValue(key=k, value=_any(v)) for k, v in flat.items())
    return span


@receiver("phoenix", config=PhoenixReceiverConfig, signals=("traces",), decode=decode_encoded)
class PhoenixReceiver(SourcesReceiver):
    """One poll loop per project."""

    def __init__(self, config: PhoenixReceiverConfig, settings: Settings, next: Next) -> None:
        client = httpx.AsyncClient(
            base_url=config.endpoint, headers={**config.headers, "Accept": "application/json"}, timeout=config.timeout
        )
        sources: list[Source] = [PhoenixSource(client, config.endpoint, p, config.settle) for p in config.projects]
        super().__init__(config, settings, next, client, sources)
