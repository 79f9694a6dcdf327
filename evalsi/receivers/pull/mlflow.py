"""The `mlflow` pull receiver: reads new traces from an MLflow tracking server (REST API 3.0), experiment by
experiment, and hands their spans to the traces pipeline with MLflow's own attributes, under MLflow's trace ids.

It hands them in the form MLflow's OTLP export sends: MLflow's REST API decodes each `mlflow.*` attribute (a string
as the string, an object as a key-value list) where the export sends the JSON text MLflow holds, so those values are
JSON-encoded again here and the `mlflow` mapper reads one form. The trace's metadata gives back what the REST form
lost: the root span's inputs and outputs as written (`mlflow.traceInputs`, `mlflow.traceOutputs`) and its session
and user (`mlflow.trace.session`, `mlflow.trace.user`, set on the root span as `session.id` and `user.id`)."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any

import httpx
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span
from pydantic import Field, field_validator

from evalsi.component import Next, Settings, receiver, server_url
from evalsi.duration import Duration
from evalsi.receivers.otlp.decode import any_value, decode_encoded
from evalsi.receivers.pull.poll import (
    Listed,
    Page,
    PullConfig,
    Source,
    SourceError,
    SourcesReceiver,
    check_response,
)

SCOPE = "evalsi.receivers.mlflow"
"""The instrumentation scope of the imported spans (their attributes are MLflow's, as its tracer wrote them)."""

ENCODED_PREFIX = "mlflow."
"""The attributes MLflow JSON-encodes whoever sets them; others are handed as their writer sent them."""

# trace metadata -> the root span's attribute it gives back (inputs and outputs as written, up to 250 characters)
ROOT_CONTENT = {"mlflow.traceInputs": "mlflow.spanInputs", "mlflow.traceOutputs": "mlflow.spanOutputs"}
# trace metadata -> the root span's attribute it is set as (what MLflow's own exporters set for them)
ROOT_IDENTITY = {"mlflow.trace.session": "session.id", "mlflow.trace.user": "user.id"}


class MlflowReceiverConfig(PullConfig):
    tracking_uri: str
    """The tracking server, e.g. http://mlflow:5000."""
    experiments: list[str] = Field(min_length=1)
    """Experiments to read, by id or by name (a name is looked up at start)."""
    headers: dict[str, str] = {}
    """Extra request headers, e.g. `Authorization: env:MLFLOW_AUTH`."""
    timeout: Duration = 30.0

    _tracking_uri = field_validator("tracking_uri")(server_url)

    @field_validator("experiments")
    @classmethod
    def _experiments(cls, v: list[str]) -> list[str]:
        if any(not e.strip() for e in v):
            raise ValueError("an experiment is empty: give its id or its name")
        if len(set(v)) != len(v):
            raise ValueError("an experiment is listed twice")
        return v


def _ms(request_time: str) -> int:
    """`2026-12-02T07:59:12.374Z` (protobuf JSON's Timestamp) in ms since the epoch."""
    return int(datetime.fromisoformat(request_time.replace("Z", "+00:00")).timestamp() * 1000)


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


class MlflowSource:
    """One experiment of a tracking server."""

    def __init__(self, client: httpx.AsyncClient, uri: str, experiment: str) -> None:
        self.client, self.uri, self.experiment = client, uri, experiment
        self.experiment_id: str | None = experiment if experiment.isdigit() else None
        self.experiment_name: str | None = None if experiment.isdigit() else experiment
        self.name = f"mlflow {uri} experiment {experiment}"

    async def resolve(self) -> None:
        """The experiment's id and name (the name is the imported spans' service.name)."""
        if self.experiment_id is None:
            resp = await self.client.get(
                "/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": self.experiment}
            )
            if resp.status_code == 404:
                raise SourceError(f"no experiment named {self.experiment!r} at {self.uri}")
            self.experiment_id = str(check_response(resp, "get experiment")["experiment"]["experiment_id"])
        else:
            resp = await self.client.get("/api/2.0/mlflow/experiments/get", params={"experiment_id": self.experiment})
            if resp.status_code == 404:
                raise SourceError(f"no experiment with id {self.experiment} at {self.uri}")
            self.experiment_name = str(check_response(resp, "get experiment")["experiment"]["name"])

    async def list_since(self, time_ms: int, page_size: int, token: str | None) -> Page:
        if self.experiment_id is None or self.experiment_name is None:
            await self.resolve()
        body: dict[str, Any] = {
            "locations": [{"type": "MLFLOW_EXPERIMENT", "mlflow_experiment": {"experiment_id": self.experiment_id}}],
            "filter": f"trace.timestamp_ms >= {int(time_ms)}",
            "max_results": page_size,
            "order_by": ["timestamp_ms ASC"],
        }
        if token:
            body["page_token"] = token
        data = check_response(await self.client.post("/api/3.0/mlflow/traces/search", json=body), "search traces")
        listed = [
            Listed(t["trace_id"], _ms(t["request_time"]), t.get("state", "OK") != "IN_PROGRESS")
            for t in data.get("traces", [])
        ]
        return Page(listed, data.get("next_page_token") or None)

    async def fetch(self, listed: list[Listed]) -> bytes:
        resource = ResourceSpans()
        resource.resource.attributes.extend(
            [
                _kv("service.name", self.experiment_name or self.experiment),
                _kv("mlflow.experimentId", self.experiment_id or ""),
                _kv("evalsi.source", "mlflow"),
            ]
        )
        scope = resource.scope_spans.add()
        scope.scope.name = SCOPE
        for i in range(0, len(listed), 50):
            ids = [t.source_id for t in listed[i : i + 50]]
            resp = await self.client.get("/api/3.0/mlflow/traces/batchGet", params={"trace_ids": ids})
            data = check_response(resp, "get traces")
            for trace in data.get("traces", []):
                metadata = (trace.get("trace_info") or {}).get("trace_metadata") or {}
                for span in trace.get("spans", []):
                    scope.spans.append(as_exported(_span(span), metadata))
        return ExportTraceServiceRequest(resource_spans=[resource]).SerializeToString()


def _span(data: dict[str, Any]) -> Span:
    """An OTLP span from MLflow's (protobuf JSON of the same message: ids in base64)."""
    try:
        span = json_format.ParseDict(data, Span(), ignore_unknown_fields=True)
    except json_format.ParseError as e:
        raise SourceError(f"a span is not an OTLP span: {e}") from None
    if len(span.trace_id) != 16 and data.get("trace_id"):
        span.trace_id = base64.b64decode(data["trace_id"])[:16]
    return span


def _encoded(value: AnyValue) -> str | None:
    """An attribute value as MLflow holds it (and exports it over OTLP): the JSON text of the value."""
    if value.WhichOneof("value") is None:
        return None
    return json.dumps(any_value(value), ensure_ascii=False)


def _written(held: str, written: str) -> bool:
    """Whether `written` (a root span's inputs or outputs from the trace's metadata, as the tracer wrote them) is
    what MLflow holds as `held`: the same, or a JSON text inside a string that MLflow holds as the value it encodes
    (MLflow's store does that to every such string). A metadata value cut at 250 characters is not JSON: never."""
    try:
        value, kept = json.loads(written), json.loads(held)
    except ValueError:
        return False
    if value == kept:
        return True
    if not isinstance(value, str):
        return False
    try:
        return bool(json.loads(value) == kept)
    except ValueError:
        return False


def as_exported(span: Span, metadata: dict[str, str]) -> Span:
    """A span of MLflow's REST form in the form MLflow's OTLP export sends it (see the module's docstring)."""
    for kv in span.attributes:
        if kv.key.startswith(ENCODED_PREFIX):
            encoded = _encoded(kv.value)
            if encoded is not None:
                kv.value.CopyFrom(AnyValue(string_value=encoded))
    if span.parent_span_id:
        return span
    present = {kv.key: kv for kv in span.attributes}
    for meta_key, key in ROOT_CONTENT.items():
        written, kv = metadata.get(meta_key), present.get(key)
        if written and kv is not None and kv.value.string_value != written and _written(kv.value.string_value, written):
            kv.value.CopyFrom(AnyValue(string_value=written))
    for meta_key, key in ROOT_IDENTITY.items():
        if metadata.get(meta_key) and key not in present:
            span.attributes.append(_kv(key, metadata[meta_key]))
    return span


@receiver("mlflow", config=MlflowReceiverConfig, signals=("traces",), decode=decode_encoded)
class MlflowReceiver(SourcesReceiver):
    """One poll loop per experiment."""

    def __init__(self, config: MlflowReceiverConfig, settings: Settings, next: Next) -> None:
        client = httpx.AsyncClient(base_url=config.tracking_uri, headers=config.headers, timeout=config.timeout)
        sources: list[Source] = [MlflowSource(client, config.tracking_uri, e) for e in config.experiments]
        super().__init__(config, settings, next, client, sources)
