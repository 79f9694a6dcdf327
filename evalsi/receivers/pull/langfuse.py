"""The `langfuse` pull receiver: reads new traces from a Langfuse project (public API, observations v2, the real-time
read path) and hands them to the traces pipeline as OTLP spans: each observation a span, with Langfuse's fields kept
as `langfuse.*` attributes and read as OTel GenAI attributes (`gen_ai.*`) by type."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status
from pydantic import field_validator

from evalsi.component import Next, Settings, receiver, server_url
from evalsi.duration import Duration
from evalsi.model.ids import SOURCE_SPAN_ID, SOURCE_TRACE_ID
from evalsi.receivers.otlp.decode import decode_encoded
from evalsi.receivers.pull.poll import Listed, Page, PullConfig, Source, SourcesReceiver, check_response

SCOPE = "evalsi.receivers.langfuse"
OBSERVATIONS = "/api/public/v2/observations"
LIST_FIELDS = "core,basic"
FETCH_FIELDS = "core,basic,time,io,metadata,model,usage"
MAX_LIMIT = 1000  # the API's cap on `limit`

_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")

# Langfuse observation types -> the OTel GenAI operation they are (the others are plain spans)
OPERATIONS = {
    "GENERATION": "chat",
    "TOOL": "execute_tool",
    "AGENT": "invoke_agent",
    "EMBEDDING": "embeddings",
}


class LangfuseReceiverConfig(PullConfig):
    host: str
    """The Langfuse server, e.g. https://cloud.langfuse.com or http://langfuse:3000."""
    public_key: str
    """Usually `env:LANGFUSE_PUBLIC_KEY`: the project's keys choose the project read."""
    secret_key: str
    service_name: str = "langfuse"
    """The imported spans' `service.name` (policy selectors read it as `trace.service_name`)."""
    settle: Duration = 30.0
    """Traces that started within this much of now are read at a later poll: Langfuse may make observations
    readable a little after they end."""
    timeout: Duration = 30.0

    _host = field_validator("host")(server_url)

    @field_validator("public_key", "secret_key")
    @classmethod
    def _key(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("is empty: set the project's key, e.g. env:LANGFUSE_PUBLIC_KEY")
        return v


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ns(text: str | None) -> int:
    if not text:
        return 0
    at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp() * 1_000_000) * 1000


def trace_id_of(source_id: str) -> bytes:
    """The OTel trace id of a Langfuse trace: its own when it is one (32 hex: what Langfuse's SDKs and its OTel
    endpoint write), the hex of a UUID, else the first 16 bytes of its sha256."""
    low = source_id.lower()
    if _HEX32.fullmatch(low):
        return bytes.fromhex(low)
    plain = low.replace("-", "")
    if _HEX32.fullmatch(plain):
        return bytes.fromhex(plain)
    return hashlib.sha256(source_id.encode()).digest()[:16]


def span_id_of(source_id: str) -> bytes:
    low = source_id.lower()
    if _HEX16.fullmatch(low):
        return bytes.fromhex(low)
    return hashlib.sha256(source_id.encode()).digest()[:8]


def _value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int) and -(2**63) <= v < 2**63:
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, str):
        return AnyValue(string_value=v)
    return AnyValue(string_value=json.dumps(v, default=str, ensure_ascii=False))


def _json(raw: Any) -> Any:
    """Input and output come as raw strings (JSON text, mostly)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return json.dumps(content, default=str, ensure_ascii=False)


def _message(m: Any, default_role: str) -> dict[str, Any]:
    """One message in the OTel GenAI shape (`role`, `parts`) from OpenAI's (`role`, `content`, `tool_calls`)."""
    if not isinstance(m, dict):
        return {"role": default_role, "parts": [{"type": "text", "content": _text(m)}]}
    parts: list[dict[str, Any]] = []
    if m.get("content") not in (None, ""):
        if m.get("role") == "tool":
            parts.append({"type": "tool_call_response", "id": m.get("tool_call_id"), "response": m["content"]})
        else:
            parts.append({"type": "text", "content": _text(m["content"])})
    for call in m.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        parts.append(
            {"type": "tool_call", "id": call.get("id"), "name": fn.get("name"), "arguments": _json(fn.get("arguments"))}
        )
    return {"role": m.get("role") or default_role, "parts": parts}


def messages(value: Any, default_role: str) -> list[dict[str, Any]]:
    """A generation's input or output as OTel GenAI messages: a list of messages, `{messages: [...]}`, one message
    or a choice (`{message: ...}`), or text."""
    if isinstance(value, dict) and isinstance(value.get("messages"), list):
        value = value["messages"]
    if isinstance(value, dict) and isinstance(value.get("message"), dict):
        value = value["message"]
    if isinstance(value, list):
        return [_message(m, default_role) for m in value]
    return [_message(value, default_role)]


def span_of(o: dict[str, Any]) -> Span:
    """An OTLP span for a Langfuse observation (v2 API fields)."""
    span = Span(
        trace_id=trace_id_of(o["traceId"]),
        span_id=span_id_of(o["id"]),
        name=o.get("name") or o.get("type", "observation").lower(),
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=_ns(o.get("startTime")),
        end_time_unix_nano=_ns(o.get("endTime")) or _ns(o.get("startTime")),
    )
    if o.get("parentObservationId"):
        span.parent_span_id = span_id_of(o["parentObservationId"])
    kind = str(o.get("type") or "SPAN").upper()
    attrs: dict[str, Any] = {
        "langfuse.observation.id": o["id"],
        "langfuse.trace.id": o["traceId"],
        "langfuse.observation.type": kind,
    }
    if o["id"].lower() != span.span_id.hex():
        attrs[SOURCE_SPAN_ID] = o["id"]
    for key, attr in (("level", "langfuse.observation.level"), ("environment", "langfuse.environment"),
                      ("version", "langfuse.version"), ("sessionId", "session.id"), ("userId", "user.id")):  # fmt: skip
        if o.get(key):
            attrs[attr] = o[key]
    if o.get("sessionId"):
        attrs["gen_ai.conversation.id"] = o["sessionId"]
    inp, out = _json(o.get("input")), _json(o.get("output"))
    if inp is not None:
        attrs["langfuse.observation.input"] = o["input"] if isinstance(o["input"], str) else json.dumps(inp)
    if out is not None:
        attrs["langfuse.observation.output"] = o["output"] if isinstance(o["output"], str) else json.dumps(out)
    if o.get("metadata"):
        attrs["langfuse.observation.metadata"] = json.dumps(o["metadata"], default=str)
    operation = OPERATIONS.get(kind)
    if operation is not None:
        attrs["gen_ai.operation.name"] = operation
    if kind in ("GENERATION", "EMBEDDING"):
        if o.get("model"):
            attrs["gen_ai.request.model"] = attrs["gen_ai.response.model"] = o["model"]
        usage = o.get("usageDetails") or {}
        if "input" in usage:
            attrs["gen_ai.usage.input_tokens"] = int(usage["input"])
        if "output" in usage:
            attrs["gen_ai.usage.output_tokens"] = int(usage["output"])
        if o.get("totalCost") is not None:
            attrs["langfuse.observation.cost_usd"] = float(o["totalCost"])
        if kind == "GENERATION":
            if inp is not None:
                attrs["gen_ai.input.messages"] = json.dumps(messages(inp, "user"), ensure_ascii=False)
            if out is not None:
                attrs["gen_ai.output.messages"] = json.dumps(messages(out, "assistant"), ensure_ascii=False)
    elif kind == "TOOL":
        attrs["gen_ai.tool.name"] = o.get("name") or "tool"
        if inp is not None:
            attrs["gen_ai.tool.call.arguments"] = (
                json.dumps(inp, ensure_ascii=False) if not isinstance(inp, str) else inp
            )
        if out is not None:
            attrs["gen_ai.tool.call.result"] = json.dumps(out, ensure_ascii=False) if not isinstance(out, str) else out
    elif kind == "AGENT":
        attrs["gen_ai.agent.name"] = o.get("name") or "agent"
    span.attributes.extend(KeyValue(key=k, value=_value(v)) for k, v in attrs.items())
    if o.get("level") == "ERROR":
        span.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message=o.get("statusMessage") or ""))
    return span


class LangfuseSource:
    """The traces of one Langfuse project (its API keys choose it)."""

    def __init__(self, client: httpx.AsyncClient, host: str, settle_s: float, service_name: str) -> None:
        self.client, self.settle_s, self.service_name = client, settle_s, service_name
        self.name = f"langfuse {host}"
        self._listed: list[Listed] = []

    async def _pages(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            query = {**params, **({"cursor": cursor} if cursor else {})}
            data = check_response(await self.client.get(OBSERVATIONS, params=query), "list observations")
            found += data.get("data", [])
            cursor = (data.get("meta") or {}).get("cursor")
            if not cursor or not data.get("data"):
                return found

    async def list_since(self, time_ms: int, page_size: int, token: str | None) -> Page:
        """Root observations (one per trace) started since `time_ms`, read at the first call of a poll and served
        in start order (the API's cursor pages are not in start order)."""
        if token is None:
            until_ms = int((time.time() - self.settle_s) * 1000)
            if until_ms <= time_ms:
                return Page([])
            params = {
                "isRootObservation": "true", "fromStartTime": _iso(time_ms), "toStartTime": _iso(until_ms),
                "fields": LIST_FIELDS, "limit": MAX_LIMIT,
            }  # fmt: skip
            roots = await self._pages(params)
            by_trace: dict[str, Listed] = {}
            for r in roots:
                listed = Listed(r["traceId"], _ns(r["startTime"]) // 1_000_000, r.get("endTime") is not None)
                seen = by_trace.get(listed.source_id)
                if seen is None or listed.time_ms < seen.time_ms:
                    by_trace[listed.source_id] = listed
            self._listed = sorted(by_trace.values(), key=lambda t: (t.time_ms, t.source_id))
        start = int(token or 0)
        page = self._listed[start : start + page_size]
        more = start + page_size < len(self._listed)
        return Page(page, str(start + page_size) if more else None)

    async def fetch(self, listed: list[Listed]) -> bytes:
        resource = ResourceSpans()
        resource.resource.attributes.extend(
            [KeyValue(key="service.name", value=_value(self.service_name)),
             KeyValue(key="evalsi.source", value=_value("langfuse"))]
        )  # fmt: skip
        scope = resource.scope_spans.add()
        scope.scope.name = SCOPE
        for t in listed:
            params = {"traceId": t.source_id, "fields": FETCH_FIELDS, "limit": MAX_LIMIT}
            observations = await self._pages(params)
            for key in ("sessionId", "userId"):  # a trace's, in Langfuse: on every span of it here
                value = next((o[key] for o in observations if o.get(key)), None)
                for o in observations:
                    if value and not o.get(key):
                        o[key] = value
            for o in observations:
                span = span_of(o)
                if t.source_id.lower() != span.trace_id.hex():
                    span.attributes.append(KeyValue(key=SOURCE_TRACE_ID, value=_value(t.source_id)))
                scope.spans.append(span)
        return ExportTraceServiceRequest(resource_spans=[resource]).SerializeToString()


@receiver("langfuse", config=LangfuseReceiverConfig, signals=("traces",), decode=decode_encoded)
class LangfuseReceiver(SourcesReceiver):
    """The project the keys choose: one poll loop."""

    def __init__(self, config: LangfuseReceiverConfig, settings: Settings, next: Next) -> None:
        auth = base64.b64encode(f"{config.public_key}:{config.secret_key}".encode()).decode()
        client = httpx.AsyncClient(
            base_url=config.host, headers={"Authorization": f"Basic {auth}"}, timeout=config.timeout
        )
        sources: list[Source] = [LangfuseSource(client, config.host, config.settle, config.service_name)]
        super().__init__(config, settings, next, client, sources)
