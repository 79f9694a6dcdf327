"""The `phoenix` exporter: writes scores as Arize Phoenix annotations, on the span (`POST /v1/span_annotations`), the
trace (`POST /v1/trace_annotations`) or the session (`POST /v1/session_annotations`) they belong to.

Delivery (the exporter helper, `evalsi.exporters.sending`): `consume_scores` only appends to a bounded in-memory
queue (`queue_size`); when it is full its OLDEST scores are dropped and counted, so ingest never waits on Phoenix. A
background task sends up to `batch_size` annotations at a time, one request each (`sync=true`, so Phoenix answers once
it stored it, or 404 when it has no such span or trace), on one keep-alive client. 429/502/503/504, network errors and
404 (the span may still be on its way into Phoenix) are retried with the shared backoff loop
(`evalsi.exporters.delivery`), for at most `retry_on_failure.max_elapsed_time`; other 4xx are permanent.

One bad score never blocks the others: one that cannot be encoded (an id that is not hex, a NaN value, a string that
is not UTF-8) is dropped when it is queued, one Phoenix refuses (400, 413, 422, e.g. the reserved name `note`) is
dropped alone; each is logged with its trace and span ids and counted in
`evalsi_exporter_items_refused_total{kind, reason}` and `otelcol_exporter_send_failed_scores_total`.

Idempotency: every annotation carries an `identifier`, a UUID5 of `Score.key`. Phoenix upserts annotations on
(name, span or trace, identifier), so a retry, a replay or a restarted collector updates the same annotation instead
of adding one. Only `scored` outcomes are sent: skipped and error verdicts are not annotations; they are counted in
`evalsi_exporter_scores_not_sent`. Scores only: send spans to Phoenix with the `otlp` exporter (`<endpoint>/v1/traces`).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from evalsi.component import ComponentConfig, Settings, exporter, server_url
from evalsi.duration import Duration
from evalsi.exporters.delivery import (
    ExporterCounters,
    ItemsOutcome,
    ItemsRefused,
    RetryConfig,
    SendFailed,
    cannot_encode,
    deliver_items,
    encode_json,
    http_failure,
    log_refused,
)
from evalsi.exporters.sending import Lane, SendQueue, score_lane
from evalsi.model.ids import is_canonical_trace_id
from evalsi.model.score import Score, ScoreBatch

SPAN_ANNOTATIONS_PATH = "/v1/span_annotations"
TRACE_ANNOTATIONS_PATH = "/v1/trace_annotations"
SESSION_ANNOTATIONS_PATH = "/v1/session_annotations"
# a fixed namespace so the same Score.key always gives the same annotation identifier, in any process
SCORE_KEY_NAMESPACE = uuid.UUID("3d5e8f1a-6b2c-5c4d-8e7f-9a0b1c2d3e4f")
AnnotatorKind = Literal["LLM", "CODE", "HUMAN"]
ANNOTATOR_KINDS: dict[str, AnnotatorKind] = {"llm_judge": "LLM", "human": "HUMAN"}
_SPAN_ID = re.compile(r"^[0-9a-f]{16}$")


class PhoenixConfig(ComponentConfig):
    endpoint: str  # e.g. http://phoenix:6006
    # extra request headers, e.g. `Authorization: "Bearer ${env:PHOENIX_API_KEY}"`
    headers: dict[str, str] = {}
    timeout: Duration = 10.0
    # scores held while Phoenix is slow or down
    queue_size: int = Field(default=50_000, gt=0)
    # annotations in flight at once (one request each)
    batch_size: int = Field(default=20, gt=0)
    # how long a partial batch waits for more before it is sent
    flush_interval: Duration = 0.2
    # how long shutdown keeps sending what is queued before it drops the rest
    shutdown_timeout: Duration = 10.0
    retry_on_failure: RetryConfig = RetryConfig()

    _endpoint = field_validator("endpoint")(server_url)


def annotation_identifier(score: Score) -> str:
    """The annotation's `identifier`: a UUID5 of the score's idempotency key, the same on every retry and replay."""
    return str(uuid.uuid5(SCORE_KEY_NAMESPACE, "\x1f".join(str(part) for part in score.key)))


def not_sendable(score: Score) -> str | None:
    """Why this score is not written to Phoenix, or None when it is."""
    if score.outcome != "scored":
        return score.outcome
    if score.value is None and score.passed is None and score.label is None:
        return "no value"
    if not score.trace_id and not score.session_id:
        return "no trace or session"
    return None


def annotation(score: Score) -> tuple[str, dict[str, Any]]:
    """Where a scored verdict goes and its annotation JSON. Raises ValueError on ids Phoenix cannot link."""
    result: dict[str, Any] = {}
    if score.value is not None:
        result["score"] = float(score.value)
    elif score.passed is not None:
        result["score"] = 1.0 if score.passed else 0.0
    if score.label is not None:
        result["label"] = score.label
    elif score.passed is not None:
        result["label"] = "pass" if score.passed else "fail"
    if score.explanation:
        result["explanation"] = score.explanation
    metadata: dict[str, Any] = {
        "evalsi.policy": score.policy,
        "evalsi.evaluator": score.evaluator,
        "evalsi.evaluator_version": score.evaluator_version,
        "evalsi.source": score.source,
    }
    if score.passed is not None:
        metadata["evalsi.passed"] = score.passed
    if score.reason:
        metadata["evalsi.reason"] = score.reason
    if score.run_id:
        metadata["evalsi.run_id"], metadata["evalsi.trial"] = score.run_id, score.trial
    body: dict[str, Any] = {
        "name": score.name,
        "annotator_kind": ANNOTATOR_KINDS.get(score.source, "CODE"),
        "result": result,
        "metadata": metadata,
        "identifier": annotation_identifier(score),
    }
    if not score.trace_id:
        return SESSION_ANNOTATIONS_PATH, {**body, "session_id": score.session_id}
    trace_id = score.trace_id.lower()
    if not is_canonical_trace_id(trace_id):
        raise ValueError(f"trace id {score.trace_id!r} is not 32 hex digits")
    if not score.span_id:
        return TRACE_ANNOTATIONS_PATH, {**body, "trace_id": trace_id}
    span_id = score.span_id.lower()
    if not _SPAN_ID.match(span_id):
        raise ValueError(f"span id {score.span_id!r} is not 16 hex digits")
    return SPAN_ANNOTATIONS_PATH, {**body, "span_id": span_id}


@dataclass(slots=True)
class _QueuedScore:
    """An annotation ready to send: where, its request body encoded once, and what names it in logs."""

    path: str
    identifier: str
    trace_id: str
    span_id: str
    name: str
    content: bytes


@exporter("phoenix", config=PhoenixConfig, signals=("scores",))
class PhoenixExporter:
    def __init__(self, config: PhoenixConfig, settings: Settings) -> None:
        self._config = config
        self._log = settings.logger
        self._counters = counters = ExporterCounters(settings)
        self._cid = settings.id
        self._client: httpx.AsyncClient | None = None
        self._scores: Lane[_QueuedScore] = score_lane(
            counters, config.batch_size, self._send_scores, capacity=config.queue_size
        )
        self._queue = SendQueue(
            settings,
            (self._scores,),
            full="drop_oldest",
            flush_interval=config.flush_interval,
            shutdown_timeout=config.shutdown_timeout,
            attempt_timeout=config.timeout,
            what="phoenix",
            log_extra={"endpoint": config.endpoint},
        )

    @property
    def held(self) -> int:
        return self._queue.held

    async def start(self) -> None:
        c = self._config
        self._client = httpx.AsyncClient(
            base_url=c.endpoint,
            timeout=c.timeout,
            headers={**c.headers, "Accept": "application/json"},
            limits=httpx.Limits(max_connections=c.batch_size, max_keepalive_connections=c.batch_size),
        )
        self._queue.start()

    async def consume_scores(self, batch: ScoreBatch) -> None:
        queued: list[_QueuedScore] = []
        for score in batch:
            reason = not_sendable(score)
            if reason is not None:
                self._counters.scores_not_sent.labels(self._cid, reason).inc()
                continue
            try:
                path, body = annotation(score)
                content = encode_json({"data": [body]})
            except Exception as e:  # an id Phoenix cannot link, NaN, bad UTF-8: counting beats a 422 later
                ids = {"trace_id": score.trace_id, "span_id": score.span_id, "score": score.name}
                self._refuse(cannot_encode(e), **ids)
                continue
            queued.append(_QueuedScore(path, body["identifier"], score.trace_id, score.span_id, score.name, content))
        # when full, the oldest go: ingest must never wait for Phoenix, and fresh verdicts matter most
        self._queue.offer(self._scores, queued)

    async def _post(self, item: _QueuedScore) -> None:
        """One attempt; a 404 (no such span or trace in Phoenix yet) is retried like an outage."""
        assert self._client is not None
        try:
            resp = await self._client.post(
                item.path, params={"sync": "true"}, content=item.content, headers={"Content-Type": "application/json"}
            )
        except httpx.HTTPError as e:
            raise SendFailed(f"POST {item.path}: {type(e).__name__}: {e}", retryable=True) from None
        if resp.status_code == 404:
            raise SendFailed(f"POST {item.path}: HTTP 404 {resp.text[:200]}", retryable=True)
        if resp.status_code >= 300:  # 400/413/422: this annotation refused for its data; 429/502/503/504: retried
            raise http_failure(f"POST {item.path}", resp)

    async def _send_scores(self, items: list[_QueuedScore]) -> None:
        outcomes = await asyncio.gather(*(self._send_score(item) for item in items), return_exceptions=True)
        for item, outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, Exception):  # a bug: the other scores went on; this one is counted
                self._counters.sender_errors.inc()
                self._counters.scores_failed.inc()
                self._log.error(
                    "writing an annotation to Phoenix failed unexpectedly; dropped",
                    exc_info=outcome,
                    extra={"trace_id": item.trace_id, "span_id": item.span_id, "identifier": item.identifier},
                )

    async def _send_score(self, item: _QueuedScore) -> None:
        outcome: ItemsOutcome[_QueuedScore] = await deliver_items(
            [item],
            lambda part: part[0],
            self._post,
            self._config.retry_on_failure,
            log=self._log,
            what="an annotation",
            deadline=self._queue.deadline,
            extra={
                "identifier": item.identifier,
                "trace_id": item.trace_id,
                "span_id": item.span_id,
                "endpoint": self._config.endpoint,
            },
        )
        self._counters.scores_sent.inc(len(outcome.sent))
        self._counters.scores_failed.inc(len(outcome.failed))
        for _, refusal in outcome.refused:
            self._refuse(refusal, trace_id=item.trace_id, span_id=item.span_id, score=item.name)

    def _refuse(self, refusal: ItemsRefused, **ids: Any) -> None:
        """Count and log one score dropped alone."""
        self._counters.scores_failed.inc()
        self._counters.items_refused.labels(self._cid, "scores", refusal.reason).inc()
        log_refused(self._log, "an annotation", refusal, endpoint=self._config.endpoint, **ids)

    async def shutdown(self) -> None:
        """Stop taking work and send what is queued, for at most `shutdown_timeout`."""
        await self._queue.shutdown()
        if self._client is not None:
            await self._client.aclose()
