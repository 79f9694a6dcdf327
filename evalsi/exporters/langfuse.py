"""The `langfuse` exporter: scores to Langfuse's public API (`POST /api/public/scores`), one idempotent id each, and
the spans to its OTLP endpoint (`POST /api/public/otel/v1/traces`).

Delivery (the exporter helper, `evalsi.exporters.sending`): `consume_scores` and `consume` only append to bounded
in-memory queues (one for scores, one for spans, so a flood of spans never pushes out a score); when one is full its
OLDEST items are dropped and counted, so ingest never waits on Langfuse. One background task per queue sends: up to
`batch_size` scores at a time (the API takes one score per request, so a batch is that many requests in flight on one
keep-alive client), and `span_batch_size` spans per OTLP request, encoded by `evalsi.exporters.otlp_encode`. Both
retry 429/502/503/504 and network errors with the shared loop in `evalsi.exporters.delivery`; other 4xx are
permanent: logged, counted, dropped. Each score's `id` is derived from `Score.key`, so a retry or a replay upserts
the same Langfuse score instead of adding one. Scores never wait for their trace's spans: Langfuse links a score to a
trace that arrives later. Only `scored` outcomes are sent: skipped and error verdicts are not scores in Langfuse's
model; they are counted in `evalsi_exporter_scores_not_sent`.

One bad item never blocks the others. A score is encoded to JSON when it is queued: one that cannot be (an id that is
not hex, a NaN or infinite value, a string that is not UTF-8) is dropped there. A score Langfuse refuses (400, 413,
422, or an item error in a 207 answer) is dropped alone: it was its own request. A span request refused for its data
(400, 413, 422) is split in halves, sent again, until each refused span is alone. Each dropped item is logged with its
trace and span ids and counted in `evalsi_exporter_items_refused_total{kind, reason}` and `*_send_failed_*`.

Plain httpx, not the langfuse SDK: the SDK registers its own global tracer provider and drops scores for traces it
did not sample.
"""

from __future__ import annotations

import asyncio
import datetime
import gzip
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from evalsi.component import ComponentConfig, Settings, exporter, server_url
from evalsi.duration import Duration
from evalsi.exporters.delivery import (
    REFUSED_INVALID,
    REFUSED_PARTIAL,
    RETRYABLE_HTTP,
    ExporterCounters,
    ItemsOutcome,
    ItemsRefused,
    RetryConfig,
    SendFailed,
    cannot_encode,
    deliver_items,
    encode_apart,
    encode_json,
    http_failure,
    log_refused,
    spans_to_forward,
)
from evalsi.exporters.otlp_encode import rejected_in_answer, traces_request
from evalsi.exporters.sending import Lane, SendQueue, score_lane, span_lane
from evalsi.model.ids import is_canonical_trace_id
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import Span, SpanBatch

SCORES_PATH = "/api/public/scores"
TRACES_PATH = "/api/public/otel/v1/traces"
# Langfuse's API reference asks direct OTLP exporters for this header (real-time ingestion); older servers ignore it
INGESTION_VERSION = "4"
# a fixed namespace so the same Score.key always gives the same Langfuse score id, in any process
SCORE_ID_NAMESPACE = uuid.UUID("5b0f7c1e-3f7a-5d4e-9a51-6c1a2f0e8d47")
DataType = Literal["NUMERIC", "BOOLEAN", "CATEGORICAL"]
_SPAN_ID = re.compile(r"^[0-9a-f]{16}$")


class LangfuseConfig(ComponentConfig):
    host: str  # e.g. http://langfuse:3000 or https://cloud.langfuse.com
    public_key: str  # usually `env:LANGFUSE_PUBLIC_KEY`
    secret_key: str  # usually `env:LANGFUSE_SECRET_KEY`
    timeout: Duration = 10.0
    # scores held while Langfuse is slow or down
    queue_size: int = Field(default=50_000, gt=0)
    # scores in flight at once (one request each)
    batch_size: int = Field(default=50, gt=0)
    # spans held for the OTLP endpoint (traces pipeline), apart from the scores
    span_queue_size: int = Field(default=10_000, gt=0)
    # spans per OTLP request
    span_batch_size: int = Field(default=256, gt=0)
    # of the OTLP span requests (Langfuse takes `Content-Encoding: gzip`); scores are small JSON, sent as is
    compression: Literal["gzip", "none"] = "gzip"
    # how long a partial batch waits for more before it is sent
    flush_interval: Duration = 0.2
    # how long shutdown keeps sending what is queued before it drops the rest
    shutdown_timeout: Duration = 10.0
    retry_on_failure: RetryConfig = RetryConfig()

    _host = field_validator("host")(server_url)

    @field_validator("public_key", "secret_key")
    @classmethod
    def _key(cls, v: str) -> str:
        if not v:
            raise ValueError("empty: set it, usually as `env:VAR` (the project's API keys in Langfuse settings)")
        return v


def score_id(score: Score) -> str:
    """The Langfuse score id for this verdict: a UUID5 of its idempotency key, the same on every retry and replay."""
    return str(uuid.uuid5(SCORE_ID_NAMESPACE, "\x1f".join(str(part) for part in score.key)))


def not_sendable(score: Score) -> str | None:
    """Why this score is not written to Langfuse, or None when it is."""
    if score.outcome != "scored":
        return score.outcome
    if score.value is None and score.passed is None and score.label is None:
        return "no value"
    if not score.trace_id and not score.session_id:
        return "no trace or session"
    return None


def score_body(score: Score) -> dict[str, Any]:
    """The `CreateScoreRequest` JSON for a scored verdict. Raises ValueError on ids Langfuse cannot link."""
    data_type: DataType
    value: float | str
    if score.value is not None:
        data_type, value = "NUMERIC", float(score.value)
    elif score.passed is not None:
        data_type, value = "BOOLEAN", 1 if score.passed else 0
    else:
        data_type, value = "CATEGORICAL", str(score.label)
    body: dict[str, Any] = {"id": score_id(score), "name": score.name, "value": value, "dataType": data_type}
    source_trace = score.metadata.get("source_trace_id")
    if source_trace:  # a trace the `langfuse` receiver imported, whose ids there are not OTel ids
        body["traceId"] = str(source_trace)
        if score.metadata.get("source_span_id"):
            body["observationId"] = str(score.metadata["source_span_id"])
    elif score.trace_id:
        trace_id = score.trace_id.lower()
        if not is_canonical_trace_id(trace_id):
            raise ValueError(f"trace id {score.trace_id!r} is not 32 hex digits")
        body["traceId"] = trace_id
        if score.span_id:
            span_id = score.span_id.lower()
            if not _SPAN_ID.match(span_id):
                raise ValueError(f"span id {score.span_id!r} is not 16 hex digits")
            body["observationId"] = span_id
    else:
        body["sessionId"] = score.session_id
    if score.explanation:
        body["comment"] = score.explanation
    metadata: dict[str, Any] = {
        "policy": score.policy,
        "evaluator": score.evaluator,
        "evaluator_version": score.evaluator_version,
        "outcome": score.outcome,
        "reason": score.reason,
        "source": score.source,
    }
    if score.label is not None and data_type != "CATEGORICAL":
        metadata["label"] = score.label
    if score.passed is not None and data_type != "BOOLEAN":
        metadata["passed"] = score.passed
    if score.run_id:
        metadata["run_id"], metadata["trial"] = score.run_id, score.trial
    body["metadata"] = metadata
    ts = datetime.datetime.fromtimestamp(score.timestamp_unix_nano / 1e9, tz=datetime.UTC)
    body["timestamp"] = ts.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return body


@dataclass(slots=True)
class _QueuedScore:
    """A score ready to send: its request body, encoded once, and what names it in logs."""

    id: str
    trace_id: str
    span_id: str
    name: str
    content: bytes


def _item_errors(resp: httpx.Response) -> list[dict[str, Any]]:
    """The per-item errors of a 207 (multi-status) answer, as Langfuse's batch endpoints give them."""
    if resp.status_code != 207:
        return []
    try:
        errors = resp.json().get("errors") or []
    except (ValueError, AttributeError):
        return []
    return [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []


@exporter("langfuse", config=LangfuseConfig, signals=("traces", "scores"))
class LangfuseExporter:
    mutates_data = False
    """`MutatesData`: it only reads the spans it is handed, so a fan-out hands it the batch itself."""

    def __init__(self, config: LangfuseConfig, settings: Settings) -> None:
        self._config = config
        self._log = settings.logger
        self._counters = counters = ExporterCounters(settings)
        self._cid = settings.id
        self._client: httpx.AsyncClient | None = None
        # two lanes, each with its own bound and sender: a flood of spans never pushes out a score
        self._scores: Lane[_QueuedScore] = score_lane(
            counters, config.batch_size, self._send_scores, capacity=config.queue_size
        )
        self._spans: Lane[Span] = span_lane(
            counters, config.span_batch_size, self._send_spans, capacity=config.span_queue_size
        )
        self._queue = SendQueue(
            settings,
            (self._scores, self._spans),
            full="drop_oldest",
            flush_interval=config.flush_interval,
            shutdown_timeout=config.shutdown_timeout,
            attempt_timeout=config.timeout,
            what="langfuse",
            log_extra={"host": config.host},
        )

    @property
    def held(self) -> int:
        return self._queue.held

    async def start(self) -> None:
        c = self._config
        self._client = httpx.AsyncClient(
            base_url=c.host,
            auth=(c.public_key, c.secret_key),
            timeout=c.timeout,
            headers={"Accept": "application/json"},
            # the score requests of one batch, plus the one span request
            limits=httpx.Limits(max_connections=c.batch_size + 1, max_keepalive_connections=c.batch_size + 1),
        )
        self._queue.start()

    async def consume_scores(self, batch: ScoreBatch) -> None:
        bodies: list[_QueuedScore] = []
        for score in batch:
            reason = not_sendable(score)
            if reason is not None:
                self._counters.scores_not_sent.labels(self._cid, reason).inc()
                continue
            try:
                body = score_body(score)
                bodies.append(_QueuedScore(body["id"], score.trace_id, score.span_id, score.name, encode_json(body)))
            except Exception as e:  # an id Langfuse cannot link, NaN, bad UTF-8: counting beats a 400 later
                ids = {"trace_id": score.trace_id, "span_id": score.span_id, "score": score.name}
                self._refuse("scores", cannot_encode(e), **ids)
        # when full, the oldest go: ingest must never wait for Langfuse, and fresh verdicts matter most
        self._queue.offer(self._scores, bodies)

    async def consume(self, batch: SpanBatch) -> None:
        self._queue.offer(self._spans, spans_to_forward(batch))

    async def _post(self, path: str, **request: Any) -> httpx.Response:
        """One attempt; the answer when it is a 2xx, else the failure (`ItemsRefused` for 400/413/422)."""
        assert self._client is not None
        try:
            resp = await self._client.post(path, **request)
        except httpx.HTTPError as e:
            raise SendFailed(f"POST {path}: {type(e).__name__}: {e}", retryable=True) from None
        if resp.status_code >= 300:
            raise http_failure(f"POST {path}", resp)
        return resp

    async def _post_score(self, content: bytes) -> None:
        resp = await self._post(SCORES_PATH, content=content, headers={"Content-Type": "application/json"})
        errors = _item_errors(resp)  # one score per request: an item error is this score's
        if errors:
            status = errors[0].get("status")
            message = f"POST {SCORES_PATH}: HTTP 207 item error {status}: {str(errors[0].get('message'))[:200]}"
            if status in RETRYABLE_HTTP or (isinstance(status, int) and status >= 500):
                raise SendFailed(message, retryable=True)
            raise ItemsRefused(message, reason=REFUSED_INVALID)

    async def _send_scores(self, items: list[_QueuedScore]) -> None:
        outcomes = await asyncio.gather(*(self._send_score(item) for item in items), return_exceptions=True)
        for item, outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, Exception):  # a bug: the other scores went on; this one is counted
                self._counters.sender_errors.inc()
                self._counters.scores_failed.inc()
                self._log.error(
                    "sending a score to Langfuse failed unexpectedly; dropped",
                    exc_info=outcome,
                    extra={"trace_id": item.trace_id, "span_id": item.span_id, "score_id": item.id},
                )

    async def _send_score(self, item: _QueuedScore) -> None:
        outcome: ItemsOutcome[_QueuedScore] = await deliver_items(
            [item],
            lambda part: part[0].content,
            self._post_score,
            self._config.retry_on_failure,
            log=self._log,
            what="a score",
            deadline=self._queue.deadline,
            extra={"score_id": item.id, "trace_id": item.trace_id, "span_id": item.span_id, "host": self._config.host},
        )
        self._counters.scores_sent.inc(len(outcome.sent))
        self._counters.scores_failed.inc(len(outcome.failed))
        for _, refusal in outcome.refused:
            self._refuse(
                "scores", refusal, trace_id=item.trace_id, span_id=item.span_id, score=item.name, score_id=item.id
            )

    async def _send_spans(self, spans: list[Span]) -> None:
        request, good, refused = encode_apart(spans, traces_request)
        for span, refusal in refused:
            self._refuse("spans", refusal, trace_id=span.trace_id, span_id=span.span_id, span_name=span.name)
        if not good:
            return
        gzipped = self._config.compression == "gzip"
        headers = {"Content-Type": "application/x-protobuf", "x-langfuse-ingestion-version": INGESTION_VERSION}
        if gzipped:
            headers["Content-Encoding"] = "gzip"

        def prepare(part: list[Span]) -> bytes:
            # the whole batch is encoded already; a part (after a refusal) is encoded again
            body = (request if len(part) == len(good) else traces_request(part)).SerializeToString()
            return gzip.compress(body) if gzipped else body

        rejected: list[tuple[int, str]] = []

        async def send(body: bytes) -> None:
            resp = await self._post(TRACES_PATH, content=body, headers=headers)
            n, message = rejected_in_answer(resp.content, spans=True, content_type=resp.headers.get("content-type", ""))
            if n:
                rejected.append((n, message))

        outcome = await deliver_items(
            good,
            prepare,
            send,
            self._config.retry_on_failure,
            log=self._log,
            what="spans",
            deadline=self._queue.deadline,
            extra={"host": self._config.host},
        )
        for span, refusal in outcome.refused:
            self._refuse("spans", refusal, trace_id=span.trace_id, span_id=span.span_id, span_name=span.name)
        self._counters.spans_failed.inc(len(outcome.failed))
        # an answer's partial_success: Langfuse took the request but not all of it, and does not say which
        partial = min(sum(n for n, _ in rejected), len(outcome.sent))
        self._counters.spans_sent.inc(len(outcome.sent) - partial)
        if partial:
            self._counters.spans_failed.inc(partial)
            self._counters.items_refused.labels(self._cid, "spans", REFUSED_PARTIAL).inc(partial)
            self._log.error(
                f"Langfuse rejected {partial} spans of a request it took (partial success)",
                extra={"count": partial, "error": "; ".join(m for _, m in rejected if m)[:500]},
            )

    def _refuse(self, kind: str, refusal: ItemsRefused, **ids: Any) -> None:
        """Count and log one score or span dropped alone."""
        (self._counters.scores_failed if kind == "scores" else self._counters.spans_failed).inc()
        self._counters.items_refused.labels(self._cid, kind, refusal.reason).inc()
        log_refused(self._log, "a score" if kind == "scores" else "a span", refusal, host=self._config.host, **ids)

    async def shutdown(self) -> None:
        """Stop taking work and send what is queued, for at most `shutdown_timeout`."""
        await self._queue.shutdown()
        if self._client is not None:
            await self._client.aclose()
