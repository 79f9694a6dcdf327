"""The `otlp` exporter: scores as `gen_ai.evaluation.result` log records, and optionally the spans, to an OTLP backend.

Delivery (the exporter helper, `evalsi.exporters.sending`): `consume*` only appends to a bounded in-memory queue;
when it is full the OLDEST items are dropped and counted (`otelcol_exporter_enqueue_failed_*`), so ingest never
waits on the backend and the newest verdicts win. A background task sends batches, retrying what the OTLP spec calls
retryable with exponential backoff and jitter (honouring `Retry-After` / `RetryInfo`); permanent failures are logged,
counted and dropped.

One bad item never blocks the others: an item that cannot be encoded is left out of its request, and a request the
backend refuses for its data (HTTP 400/413/422, gRPC `INVALID_ARGUMENT`) is split in halves, sent again, until each
refused item is alone; only those are dropped, logged with their trace and span ids and counted in
`evalsi_exporter_items_refused_total{kind, reason}` (and `otelcol_exporter_send_failed_*`). The `rejected_*` count of
an answer's `partial_success` is counted the same way (reason `partial success`).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import Field, field_validator

from evalsi.auth.keys import without_password
from evalsi.component import ComponentConfig, Settings, exporter
from evalsi.duration import Duration
from evalsi.exporters.delivery import (
    REFUSED_PARTIAL,
    ItemsRefused,
    RetryConfig,
    SendFailed,
    deliver_items,
    encode_apart,
    http_failure,
    items_refused_counter,
    log_refused,
    spans_to_forward,
)
from evalsi.exporters.otlp_encode import (
    LOGS_METHOD,
    TRACES_METHOD,
    logs_request,
    rejected_in_answer,
    traces_request,
)
from evalsi.exporters.sending import Lane, SendQueue
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import Span, SpanBatch

if TYPE_CHECKING:
    from evalsi.exporters.otlp_grpc import GrpcSender


class TlsConfig(ComponentConfig):
    # None: insecure for `http://` or no scheme, TLS for `https://`
    insecure: bool | None = None
    ca_file: str | None = None


class OtlpExporterConfig(ComponentConfig):
    endpoint: str
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    headers: dict[str, str] = {}
    compression: Literal["gzip", "none"] = "gzip"
    timeout: Duration = 5.0
    tls: TlsConfig = TlsConfig()
    queue_size: int = Field(default=50_000, gt=0)
    batch_size: int = Field(default=512, gt=0)
    # how long a partial batch waits for more before it is sent
    flush_interval: Duration = 0.2
    # how long shutdown keeps sending what is queued before it drops the rest
    shutdown_timeout: Duration = 10.0
    retry_on_failure: RetryConfig = RetryConfig()

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if not v or v.endswith("://") or ("://" in v and not v.startswith(("http://", "https://"))):
            raise ValueError(f"unsupported endpoint {v!r}: use host:port, http://host:port or https://host:port")
        return v.rstrip("/")

    @property
    def insecure(self) -> bool:
        if self.tls.insecure is None:
            return not self.endpoint.startswith("https://")
        return self.tls.insecure


# --- transports -----------------------------------------------------------------------------------


class _HttpSender:
    def __init__(self, config: OtlpExporterConfig) -> None:
        base = config.endpoint if "://" in config.endpoint else f"http://{config.endpoint}"
        self._urls = {LOGS_METHOD: f"{base}/v1/logs", TRACES_METHOD: f"{base}/v1/traces"}
        verify: Any = True
        if config.insecure:
            verify = False
        elif config.tls.ca_file:
            verify = config.tls.ca_file
        self._gzip = config.compression == "gzip"
        headers = {**config.headers, "Content-Type": "application/x-protobuf"}
        if self._gzip:
            headers["Content-Encoding"] = "gzip"
        self._client = httpx.AsyncClient(headers=headers, timeout=config.timeout, verify=verify)

    async def send(self, method: str, body: bytes) -> tuple[int, str]:
        """One export; returns the answer's `partial_success` (rejected items, message)."""
        url = self._urls[method]
        try:
            resp = await self._client.post(url, content=gzip.compress(body) if self._gzip else body)
        except httpx.HTTPError as e:
            raise SendFailed(f"POST {url}: {type(e).__name__}: {e}", retryable=True) from None
        if resp.status_code >= 300:
            raise http_failure(f"POST {url}", resp)  # 400/413/422: refused for its data; 429/502/503/504: retried
        return rejected_in_answer(
            resp.content, spans=method == TRACES_METHOD, content_type=resp.headers.get("content-type", "")
        )

    async def close(self) -> None:
        await self._client.aclose()


# --- the exporter ---------------------------------------------------------------------------------

# how a chunk of each lane is encoded and where it goes
_SIGNALS: dict[str, tuple[str, Callable[..., Any]]] = {
    "scores": (LOGS_METHOD, logs_request),  # (items, refused list or None) -> request
    "spans": (TRACES_METHOD, traces_request),
}


@exporter("otlp", config=OtlpExporterConfig, signals=("traces", "scores"))
class OtlpExporter:
    mutates_data = False
    """`MutatesData`: it only reads the spans it is handed, so a fan-out hands it the batch itself."""

    def __init__(self, config: OtlpExporterConfig, settings: Settings) -> None:
        self._config = config
        self._log = settings.logger
        m, cid = settings.metrics, settings.id
        self.scores: Lane[Score] = Lane(
            "scores",
            config.batch_size,
            lambda chunk: self._send(self.scores, chunk),
            sent=m.exporter_sent_log_records.labels(cid),
            failed=m.exporter_send_failed_log_records.labels(cid),
            dropped=m.counter(
                "otelcol_exporter_enqueue_failed_log_records",
                "Log records (scores) dropped because the exporter's queue was full.",
                ["exporter"],
            ).labels(cid),
        )
        self.spans: Lane[Span] = Lane(
            "spans",
            config.batch_size,
            lambda chunk: self._send(self.spans, chunk),
            sent=m.exporter_sent_spans.labels(cid),
            failed=m.exporter_send_failed_spans.labels(cid),
            dropped=m.counter(
                "otelcol_exporter_enqueue_failed_spans",
                "Spans dropped because the exporter's queue was full.",
                ["exporter"],
            ).labels(cid),
        )
        # one sender, scores first; `queue_size` is shared, and a full queue drops the oldest scores first
        self._queue = SendQueue(
            settings,
            (self.scores, self.spans),
            capacity=config.queue_size,
            ordered=True,
            full="drop_oldest",
            flush_interval=config.flush_interval,
            shutdown_timeout=config.shutdown_timeout,
            attempt_timeout=config.timeout,
            what="otlp",
            log_extra={"endpoint": without_password(config.endpoint)},
        )
        self._cid = cid
        self._refused = items_refused_counter(m)
        self._sender: GrpcSender | _HttpSender | None = None

    @property
    def held(self) -> int:
        return self._queue.held

    async def start(self) -> None:
        c = self._config
        if c.protocol == "grpc":
            from evalsi.exporters.otlp_grpc import GrpcSender  # grpc only where it sends: ~8 MB a process

            ca_file = c.tls.ca_file
            self._sender = GrpcSender(c.endpoint, c.headers, c.compression, c.timeout, c.insecure, ca_file)
        else:
            self._sender = _HttpSender(c)
        self._queue.start()

    async def consume(self, batch: SpanBatch) -> None:
        spans = spans_to_forward(batch)
        if spans:
            self._queue.offer(self.spans, spans)

    async def consume_scores(self, batch: ScoreBatch) -> None:
        if batch.scores:
            self._queue.offer(self.scores, list(batch.scores))

    async def _send(self, queue: Lane[Any], chunk: list[Any]) -> None:
        assert self._sender is not None
        method, encode = _SIGNALS[queue.kind]
        request, good, refused = encode_apart(chunk, encode)
        for item, refusal in refused:
            self._refuse(queue, item, refusal)
        if not good:
            return

        def prepare(part: list[Any]) -> bytes:
            # the whole batch is encoded already; a part (after a refusal) is encoded again
            return (request if len(part) == len(good) else encode(part)).SerializeToString()

        sender = self._sender
        partial: list[tuple[int, str]] = []

        async def send(body: bytes) -> None:
            rejected, message = await sender.send(method, body)
            if rejected:
                partial.append((rejected, message))

        outcome = await deliver_items(
            good,
            prepare,
            send,
            self._config.retry_on_failure,
            log=self._log,
            what=queue.kind,
            deadline=self._queue.deadline,
            extra={"endpoint": without_password(self._config.endpoint)},
        )
        for item, refusal in outcome.refused:
            self._refuse(queue, item, refusal)
        queue.failed.inc(len(outcome.failed))
        # an answer's partial_success: the backend took the request but not all of it, and does not say which
        rejected = min(sum(n for n, _ in partial), len(outcome.sent))
        queue.sent.inc(len(outcome.sent) - rejected)
        if rejected:
            queue.failed.inc(rejected)
            self._refused.labels(self._cid, queue.kind, REFUSED_PARTIAL).inc(rejected)
            self._log.error(
                f"the backend rejected {rejected} {queue.kind} of a request it took (partial success)",
                extra={
                    "count": rejected,
                    "error": "; ".join(m for _, m in partial if m)[:500],
                    "endpoint": self._config.endpoint,
                },
            )

    def _refuse(self, queue: Lane[Any], item: Any, refusal: ItemsRefused) -> None:
        """Count and log one item dropped alone."""
        queue.failed.inc()
        self._refused.labels(self._cid, queue.kind, refusal.reason).inc()
        ids = {"trace_id": item.trace_id, "span_id": item.span_id, "endpoint": self._config.endpoint}
        if queue is self.scores:
            log_refused(self._log, "a score", refusal, score=item.name, policy=item.policy, **ids)
        else:
            log_refused(self._log, "a span", refusal, span_name=item.name, **ids)

    async def shutdown(self) -> None:
        """Stop taking work and send what is queued, for at most `shutdown_timeout`."""
        await self._queue.shutdown()
        if self._sender is not None:
            await self._sender.close()
