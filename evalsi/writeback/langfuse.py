"""The `langfuse` exporter: scores to Langfuse's public API (`POST /api/public/scores`), one idempotent id each, and
the spans to its OTLP endpoint (`POST /api/public/otel/v1/traces`).

Delivery: `consume_scores` and `consume` only append to bounded in-memory queues (one for scores, one for spans, so
a flood of spans never pushes out a score); when one is full its OLDEST items are dropped and counted, so ingest
never waits on Langfuse. One background task per queue sends: up to `batch_size` scores at a time (the API takes one
score per request, so a batch is that many requests in flight on one keep-alive client), and `span_batch_size` spans
per OTLP request, encoded by `evalsi.exporters.otlp_encode`. Both retry 429/502/503/504 and network errors with the
shared loop in `evalsi.exporters.delivery`; other 4xx are permanent: logged, counted, dropped. Each score's `id` is
derived from `Score.key`, so a retry or a replay upserts the same Langfuse score instead of adding one. Scores never
wait for their trace's spans: Langfuse links a score to a trace that arrives later. Only `scored` outcomes are sent:
skipped and error verdicts are not scores in Langfuse's model; they are counted in `evalsi_exporter_scores_not_sent`.

Plain httpx, not the langfuse SDK: the SDK registers its own global tracer provider and drops scores for traces it
did not sample.
"""

from __future__ import annotations

import asyncio
import datetime
import gzip
import re
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import httpx
from pydantic import Field, field_validator

from evalsi.component import ComponentConfig, Settings, exporter
from evalsi.duration import Duration
from evalsi.exporters.delivery import (
    RETRYABLE_HTTP,
    ExporterCounters,
    RetryConfig,
    SendFailed,
    deliver,
    retry_after,
    spans_to_forward,
)
from evalsi.exporters.otlp_encode import traces_request
from evalsi.score import Score, ScoreBatch
from evalsi.span import Span, SpanBatch

SCORES_PATH = "/api/public/scores"
TRACES_PATH = "/api/public/otel/v1/traces"
# Langfuse's API reference asks direct OTLP exporters for this header (real-time ingestion); older servers ignore it
INGESTION_VERSION = "4"
# a fixed namespace so the same Score.key always gives the same Langfuse score id, in any process
SCORE_ID_NAMESPACE = uuid.UUID("5b0f7c1e-3f7a-5d4e-9a51-6c1a2f0e8d47")
DataType = Literal["NUMERIC", "BOOLEAN", "CATEGORICAL"]
_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
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

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")) or v.endswith("://"):
            raise ValueError(f"unsupported host {v!r}: use http://host:port or https://host")
        return v.rstrip("/")

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
    if score.trace_id:
        trace_id = score.trace_id.lower()
        if not _TRACE_ID.match(trace_id):
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


T = TypeVar("T")


def bounded_extend(queue: deque[T], items: list[T], limit: int) -> int:
    """Append `items`, then drop the oldest beyond `limit`; returns how many were dropped."""
    queue.extend(items)
    over = len(queue) - limit
    for _ in range(max(0, over)):
        queue.popleft()
    return max(0, over)


@exporter("langfuse", config=LangfuseConfig, signals=("traces", "scores"))
class LangfuseExporter:
    def __init__(self, config: LangfuseConfig, settings: Settings) -> None:
        self._config = config
        self._log = settings.logger
        self._counters = ExporterCounters(settings, config.queue_size + config.span_queue_size)
        self._cid = settings.id
        self._items: deque[dict[str, Any]] = deque()
        self._spans: deque[Span] = deque()
        self._client: httpx.AsyncClient | None = None
        self._wake = asyncio.Event()
        self._span_wake = asyncio.Event()
        self._stopping = False
        self._deadline = float("inf")  # when shutdown stops sending
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def held(self) -> int:
        return len(self._items) + len(self._spans)

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
        self._tasks = [
            asyncio.create_task(self._send_loop(self._items, self._wake, c.batch_size, self._send_scores, "scores")),
            asyncio.create_task(
                self._send_loop(self._spans, self._span_wake, c.span_batch_size, self._send_spans, "spans")
            ),
        ]

    async def consume_scores(self, batch: ScoreBatch) -> None:
        bodies: list[dict[str, Any]] = []
        for score in batch:
            reason = not_sendable(score)
            if reason is not None:
                self._counters.scores_not_sent.labels(self._cid, reason).inc()
                continue
            try:
                bodies.append(score_body(score))
            except ValueError as e:  # cannot ever be linked in Langfuse; counting beats a 400 later
                self._counters.scores_failed.inc()
                self._log.error("score not sent to Langfuse", extra={"error": str(e), "score": score.name})
        if not bodies:
            return
        if self._stopping:
            self._counters.scores_dropped.inc(len(bodies))
            return
        # drop the oldest: ingest must never wait for Langfuse, and fresh verdicts matter most
        over = bounded_extend(self._items, bodies, self._config.queue_size)
        if over:
            self._counters.scores_dropped.inc(over)
            self._log.warning("langfuse export queue full; dropped the oldest scores", extra={"dropped": over})
        self._counters.queue_size.set(self.held)
        if len(self._items) >= self._config.batch_size:
            self._wake.set()

    async def consume(self, batch: SpanBatch) -> None:
        spans = spans_to_forward(batch)
        if not spans:
            return
        if self._stopping:
            self._counters.spans_dropped.inc(len(spans))
            return
        over = bounded_extend(self._spans, spans, self._config.span_queue_size)
        if over:
            self._counters.spans_dropped.inc(over)
            self._log.warning("langfuse span queue full; dropped the oldest spans", extra={"dropped": over})
        self._counters.queue_size.set(self.held)
        if len(self._spans) >= self._config.span_batch_size:
            self._span_wake.set()

    async def _send_loop(
        self,
        items: deque[Any],
        wake: asyncio.Event,
        batch_size: int,
        send: Callable[[list[Any]], Awaitable[None]],
        what: str,
    ) -> None:
        failed = self._counters.scores_failed if what == "scores" else self._counters.spans_failed
        while True:
            if not self._stopping:
                try:
                    await asyncio.wait_for(wake.wait(), timeout=self._config.flush_interval)
                except TimeoutError:
                    pass
            wake.clear()
            while items:
                n = min(batch_size, len(items))
                await send([items.popleft() for _ in range(n)])
                self._counters.queue_size.set(self.held)
                if self._stopping and time.monotonic() >= self._deadline and items:
                    failed.inc(len(items))
                    self._log.error(
                        f"shutdown timeout: dropping {what} not yet sent to Langfuse",
                        extra={"count": len(items), "host": self._config.host},
                    )
                    items.clear()
                    self._counters.queue_size.set(self.held)
            if self._stopping:
                return

    async def _post(self, path: str, **request: Any) -> None:
        assert self._client is not None
        try:
            resp = await self._client.post(path, **request)
        except httpx.HTTPError as e:
            raise SendFailed(f"POST {path}: {type(e).__name__}: {e}", retryable=True) from None
        if resp.status_code < 300:
            return
        retryable = resp.status_code in RETRYABLE_HTTP
        raise SendFailed(
            f"POST {path}: HTTP {resp.status_code} {resp.text[:200]}",
            retryable=retryable,
            retry_after=retry_after(resp.headers.get("retry-after")) if retryable else None,
        )

    async def _send_scores(self, bodies: list[dict[str, Any]]) -> None:
        await asyncio.gather(*(self._send_score(body) for body in bodies))

    async def _send_score(self, body: dict[str, Any]) -> None:
        delivered = await deliver(
            lambda: self._post(SCORES_PATH, json=body),
            self._config.retry_on_failure,
            log=self._log,
            what="a score",
            deadline=lambda: self._deadline,
            extra={"score_id": body["id"], "host": self._config.host},
        )
        (self._counters.scores_sent if delivered else self._counters.scores_failed).inc()

    async def _send_spans(self, spans: list[Span]) -> None:
        try:
            body = traces_request(spans).SerializeToString()
        except Exception as e:  # e.g. an id that is not hex: the batch can never be sent, the loop must live
            self._counters.spans_failed.inc(len(spans))
            self._log.error("cannot encode spans as OTLP; dropped", extra={"count": len(spans), "error": str(e)})
            return
        headers = {"Content-Type": "application/x-protobuf", "x-langfuse-ingestion-version": INGESTION_VERSION}
        if self._config.compression == "gzip":
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        delivered = await deliver(
            lambda: self._post(TRACES_PATH, content=body, headers=headers),
            self._config.retry_on_failure,
            log=self._log,
            what="spans",
            deadline=lambda: self._deadline,
            extra={"count": len(spans), "host": self._config.host},
        )
        (self._counters.spans_sent if delivered else self._counters.spans_failed).inc(len(spans))

    async def shutdown(self) -> None:
        """Stop taking work and send what is queued, for at most `shutdown_timeout`."""
        self._stopping = True
        self._deadline = time.monotonic() + self._config.shutdown_timeout
        self._wake.set()
        self._span_wake.set()
        if self._tasks:
            try:
                await asyncio.wait_for(
                    asyncio.gather(*self._tasks), timeout=self._config.shutdown_timeout + self._config.timeout + 1
                )
            except TimeoutError:
                self._log.error("langfuse exporter did not drain in time", extra={"host": self._config.host})
        if self._client is not None:
            await self._client.aclose()
