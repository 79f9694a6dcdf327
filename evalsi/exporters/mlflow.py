"""The `mlflow` exporter: forwards spans to MLflow's OTLP endpoint and writes scores as MLflow assessments (feedback).

Delivery (the exporter helper, `evalsi.exporters.sending`): `consume` and `consume_scores` only append to bounded
in-memory queues (`queue_size` each); when one is full its OLDEST items are dropped and counted, so ingest never
waits on MLflow. Two background tasks send: spans in OTLP/protobuf batches paced to `spans_per_second` (an MLflow
tracking server ingests about 100 spans/s), and scores as `POST /api/3.0/mlflow/traces/tr-<trace id>/assessments`.
Both retry 429/502/503/504 and network errors with the shared backoff loop (`evalsi.exporters.delivery`); other 4xx
are permanent: logged, counted, dropped.

One bad item never blocks the others. An assessment is encoded to JSON when its score is queued: one that cannot be
(an id that is not hex, a NaN or infinite value, a string that is not UTF-8, a timestamp out of range) is dropped
there. An assessment MLflow refuses (400, 413, 422) is dropped alone: it was its own request. A span batch MLflow
refuses (422 "Cannot convert OpenTelemetry span", 400, 413) is split in halves, sent again, until each refused span is
alone. Each dropped item is logged with its trace and span ids and counted in
`evalsi_exporter_items_refused_total{kind, reason}` and `*_send_failed_*`.

Idempotency: every assessment carries `evalsi.key` (a UUID5 of `Score.key`) in its metadata. The first time this
process writes to a trace it reads the trace's assessments and remembers the keys present; a score whose key is
there is not written again, so a replay or a restarted collector adds no duplicate. A score for a trace MLflow does
not have yet (its spans still queued here, or not yet ingested) waits, without holding up other scores, for at most
`trace_wait`.

Plain httpx against MLflow's REST API, not the `mlflow` client: no heavy import, no global tracking state, and no
blocking calls on the event loop.
"""

from __future__ import annotations

import asyncio
import datetime
import gzip
import re
import time
import uuid
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator, model_validator

from evalsi.component import ComponentConfig, Settings, exporter, server_url
from evalsi.duration import Duration
from evalsi.exporters.delivery import (
    RETRYABLE_HTTP,
    ExporterCounters,
    ItemsRefused,
    RetryConfig,
    SendFailed,
    cannot_encode,
    deliver,
    deliver_items,
    encode_apart,
    encode_json,
    http_failure,
    log_refused,
    retry_after,
    spans_to_forward,
)
from evalsi.exporters.otlp_encode import traces_request
from evalsi.exporters.sending import Lane, SendQueue, score_lane, span_lane
from evalsi.model.ids import is_canonical_trace_id
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import Span, SpanBatch

OTLP_TRACES_PATH = "/v1/traces"
EXPERIMENT_HEADER = "x-mlflow-experiment-id"
TRACES_PATH = "/api/3.0/mlflow/traces"
EXPERIMENT_BY_NAME_PATH = "/api/2.0/mlflow/experiments/get-by-name"
EXPERIMENT_CREATE_PATH = "/api/2.0/mlflow/experiments/create"
DEFAULT_EXPERIMENT_ID = "0"  # MLflow's "Default" experiment, present on every tracking server
KEY_METADATA = "evalsi.key"
# a fixed namespace so the same Score.key always gives the same `evalsi.key`, in any process
SCORE_KEY_NAMESPACE = uuid.UUID("0c6f1d2e-8a43-5b7e-b1f4-2d9e7a3c5b18")
# how many traces' written keys are remembered; a trace evicted from this is read again before its next write
KNOWN_TRACES = 10_000
SOURCE_TYPES = {
    "llm_judge": "LLM_JUDGE",
    "human": "HUMAN",
    "code": "CODE",
    "external": "CODE",
    "checker": "CODE",
    "imported": "CODE",
}
_SPAN_ID = re.compile(r"^[0-9a-f]{16}$")


class MlflowConfig(ComponentConfig):
    tracking_uri: str  # e.g. http://mlflow:5000
    # where spans go: an experiment id, or a name that is looked up (and created if missing) before the first send;
    # neither: MLflow's Default experiment ("0")
    experiment_id: str | None = None
    experiment_name: str | None = None
    # extra request headers, e.g. `Authorization: env:MLFLOW_AUTH` behind an authenticating proxy
    headers: dict[str, str] = {}
    compression: Literal["gzip", "none"] = "gzip"
    timeout: Duration = 10.0
    # items held per signal (spans, scores) while MLflow is slow or down
    queue_size: int = Field(default=10_000, gt=0)
    # spans per OTLP request, and scores written at once
    batch_size: int = Field(default=100, gt=0)
    # the pace spans are sent at: above it a tracking server falls behind and times out
    spans_per_second: float = Field(default=100.0, gt=0)
    # how long a partial batch waits for more before it is sent
    flush_interval: Duration = 0.2
    # how long a score waits for its trace to appear in MLflow before it is dropped and counted
    trace_wait: Duration = 300.0
    # how long shutdown keeps sending what is queued before it drops the rest
    shutdown_timeout: Duration = 10.0
    retry_on_failure: RetryConfig = RetryConfig()

    _tracking_uri = field_validator("tracking_uri")(server_url)

    @model_validator(mode="after")
    def _one_experiment(self) -> MlflowConfig:
        if self.experiment_id is not None and self.experiment_name is not None:
            raise ValueError("set experiment_id or experiment_name, not both")
        if self.experiment_id == "" or self.experiment_name == "":
            raise ValueError("experiment_id / experiment_name is empty: set one, or neither for the Default one")
        return self


def score_key(score: Score) -> str:
    """The `evalsi.key` of this verdict: a UUID5 of its idempotency key, the same on every retry and replay."""
    return str(uuid.uuid5(SCORE_KEY_NAMESPACE, "\x1f".join(str(part) for part in score.key)))


def mlflow_trace_id(trace_id: str) -> str:
    """MLflow's id for an OTel trace: `tr-` + the 32-hex trace id."""
    return "tr-" + trace_id


def not_sendable(score: Score) -> str | None:
    """Why this score is not written to MLflow, or None when it is."""
    if score.outcome == "skipped":
        return "skipped"
    if score.outcome == "scored" and score.value is None and score.passed is None and score.label is None:
        return "no value"
    if not score.trace_id:
        return "no trace"
    return None


def assessment_body(score: Score) -> dict[str, Any]:
    """The `CreateAssessment` JSON for a verdict, a feedback on its trace (and span). An error outcome becomes a
    feedback with MLflow's `error` field and no value. Raises ValueError on ids MLflow cannot link."""
    trace_id = score.trace_id.lower()
    if not is_canonical_trace_id(trace_id):
        raise ValueError(f"trace id {score.trace_id!r} is not 32 hex digits")
    feedback: dict[str, Any]
    metadata = {
        KEY_METADATA: score_key(score),
        "evalsi.policy": score.policy,
        "evalsi.evaluator": score.evaluator,
        "evalsi.evaluator_version": score.evaluator_version,
        "evalsi.outcome": score.outcome,
    }
    if score.outcome == "error":
        feedback = {"value": None, "error": {"error_code": score.reason or "error"}}
        if score.explanation:
            feedback["error"]["error_message"] = score.explanation
    elif score.value is not None:
        feedback = {"value": float(score.value)}
    elif score.passed is not None:
        feedback = {"value": bool(score.passed)}
    else:
        feedback = {"value": str(score.label)}
    if score.outcome == "scored":
        # the parts of the verdict that are not the feedback's value
        if score.label is not None and not isinstance(feedback["value"], str):
            metadata["evalsi.label"] = score.label
        if score.passed is not None and not isinstance(feedback["value"], bool):
            metadata["evalsi.passed"] = str(score.passed).lower()
    if score.reason:
        metadata["evalsi.reason"] = score.reason
    if score.run_id:
        metadata["evalsi.run_id"], metadata["evalsi.trial"] = score.run_id, str(score.trial)
    when = datetime.datetime.fromtimestamp(score.timestamp_unix_nano / 1e9, tz=datetime.UTC)
    stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assessment: dict[str, Any] = {
        "assessment_name": score.name,
        "trace_id": mlflow_trace_id(trace_id),
        "source": {"source_type": SOURCE_TYPES.get(score.source, "CODE"), "source_id": score.evaluator or "evalsi"},
        "create_time": stamp,
        "last_update_time": stamp,
        "feedback": feedback,
        "metadata": metadata,
    }
    if score.span_id:
        span_id = score.span_id.lower()
        if not _SPAN_ID.match(span_id):
            raise ValueError(f"span id {score.span_id!r} is not 16 hex digits")
        assessment["span_id"] = span_id
    if score.explanation and score.outcome != "error":
        assessment["rationale"] = score.explanation
    return {"assessment": assessment}


@dataclass
class _PendingScore:
    key: str
    trace_id: str  # MLflow's: tr-...
    body: dict[str, Any]
    since: float  # monotonic time it was queued
    content: bytes = b""  # `body` as JSON, encoded once
    span_id: str = ""  # the OTel span id, for logs
    name: str = ""  # the score's, for logs
    not_before: float = 0.0
    waits: int = 0  # how often it found its trace missing


class _TraceMissing(Exception):
    """MLflow has no such trace (yet)."""


def _no_such_trace(resp: httpx.Response) -> bool:
    """MLflow's own "not found" for a trace; a 404 from anything else (a wrong path, a proxy) is a real failure."""
    if resp.status_code != 404:
        return False
    try:
        return resp.json().get("error_code") == "RESOURCE_DOES_NOT_EXIST"
    except ValueError:
        return False


def _failure(what: str, resp: httpx.Response) -> SendFailed:
    retryable = resp.status_code in RETRYABLE_HTTP
    return SendFailed(
        f"{what}: HTTP {resp.status_code} {resp.text[:200]}",
        retryable=retryable,
        retry_after=retry_after(resp.headers.get("retry-after")) if retryable else None,
    )


@exporter("mlflow", config=MlflowConfig, signals=("traces", "scores"))
class MlflowExporter:
    mutates_data = False
    """`MutatesData`: it only reads the spans it is handed, so a fan-out hands it the batch itself."""

    def __init__(self, config: MlflowConfig, settings: Settings) -> None:
        self._config = config
        self._log = settings.logger
        self._cid = settings.id
        self._counters = counters = ExporterCounters(settings)
        # spans queued or in flight per trace: a score for such a trace waits for them
        self._spans_pending: Counter[str] = Counter()
        # keys already in MLflow per trace (MLflow trace id), for the traces this process wrote to lately
        self._written: OrderedDict[str, set[str]] = OrderedDict()
        self._experiment_id = config.experiment_id
        self._client: httpx.AsyncClient | None = None
        self._next_span_slot = 0.0  # monotonic time the next span batch may go, for `spans_per_second`
        self._spans: Lane[Span] = span_lane(
            counters, config.batch_size, self._pace_and_send, capacity=config.queue_size, done=self._spans_done
        )
        # a score goes once its trace has no spans queued here and its wait (for a trace MLflow lacks) is over;
        # one whose trace is missing is put back, so it counts as held while it is written
        self._scores: Lane[_PendingScore] = score_lane(
            counters,
            config.batch_size,
            self._write_scores,
            capacity=config.queue_size,
            wake_at=1,
            select=self._ready_scores,
            held_in_flight=True,
        )
        self._queue = SendQueue(
            settings,
            (self._spans, self._scores),
            full="drop_oldest",
            flush_interval=config.flush_interval,
            shutdown_timeout=config.shutdown_timeout,
            attempt_timeout=config.timeout,
            what="mlflow",
            log_extra={"tracking_uri": config.tracking_uri},
        )

    @property
    def held(self) -> int:
        return self._queue.held

    async def start(self) -> None:
        c = self._config
        headers = {**c.headers, "Accept": "application/json"}
        self._client = httpx.AsyncClient(base_url=c.tracking_uri, headers=headers, timeout=c.timeout)
        self._queue.start()

    # --- intake -----------------------------------------------------------------------------------

    async def consume(self, batch: SpanBatch) -> None:
        spans = spans_to_forward(batch)
        for span in spans:
            self._spans_pending[span.trace_id] += 1
        # when full, the oldest go: ingest must never wait for MLflow
        self._queue.offer(self._spans, spans)

    async def consume_scores(self, batch: ScoreBatch) -> None:
        pending: list[_PendingScore] = []
        now = time.monotonic()
        for score in batch:
            reason = not_sendable(score)
            if reason is not None:
                self._counters.scores_not_sent.labels(self._cid, reason).inc()
                continue
            try:
                body = assessment_body(score)
                content = encode_json(body)
            except Exception as e:  # an id MLflow cannot link, NaN, bad UTF-8: counting beats a 400 later
                ids = {"trace_id": score.trace_id, "span_id": score.span_id, "score": score.name}
                self._refuse("scores", cannot_encode(e), **ids)
                continue
            pending.append(
                _PendingScore(
                    score_key(score),
                    body["assessment"]["trace_id"],
                    body,
                    now,
                    content=content,
                    span_id=score.span_id,
                    name=score.name,
                )
            )
        self._queue.offer(self._scores, pending)

    # --- spans ------------------------------------------------------------------------------------

    def _spans_done(self, spans: list[Span]) -> None:
        """Spans sent, failed or dropped: their traces' scores need not wait for them any more."""
        for span in spans:
            left = self._spans_pending[span.trace_id] - 1
            if left > 0:
                self._spans_pending[span.trace_id] = left
            else:
                del self._spans_pending[span.trace_id]
        self._queue.wake(self._scores)

    async def _pace_and_send(self, chunk: list[Span]) -> None:
        # the chunk stays counted in `_spans_pending` until sent, so its traces' scores wait
        await self._pace(len(chunk))
        await self._send_spans(chunk)

    async def _pace(self, n: int) -> None:
        now = time.monotonic()
        wait = self._next_span_slot - now
        if wait > 0:
            await asyncio.sleep(min(wait, max(0.0, self._queue.deadline() - now)))
        self._next_span_slot = max(now, self._next_span_slot) + n / self._config.spans_per_second

    async def _send_spans(self, chunk: list[Span]) -> None:
        request, good, refused = encode_apart(chunk, traces_request)
        for span, refusal in refused:
            self._refuse("spans", refusal, trace_id=span.trace_id, span_id=span.span_id, span_name=span.name)
        if not good:
            return

        def prepare(part: list[Span]) -> bytes:
            # the whole batch is encoded already; a part (after a refusal) is encoded again
            body = (request if len(part) == len(good) else traces_request(part)).SerializeToString()
            return gzip.compress(body) if self._config.compression == "gzip" else body

        # MLflow stores a request's spans all or none: one it cannot convert (422) refuses them all, so the batch is
        # split until that span is alone
        outcome = await deliver_items(
            good,
            prepare,
            self._post_spans,
            self._config.retry_on_failure,
            log=self._log,
            what="spans",
            deadline=self._queue.deadline,
            extra={"tracking_uri": self._config.tracking_uri},
        )
        for span, refusal in outcome.refused:
            self._refuse("spans", refusal, trace_id=span.trace_id, span_id=span.span_id, span_name=span.name)
        self._counters.spans_sent.inc(len(outcome.sent))
        self._counters.spans_failed.inc(len(outcome.failed))

    def _refuse(self, kind: str, refusal: ItemsRefused, **ids: Any) -> None:
        """Count and log one score or span dropped alone."""
        (self._counters.scores_failed if kind == "scores" else self._counters.spans_failed).inc()
        self._counters.items_refused.labels(self._cid, kind, refusal.reason).inc()
        what = "an assessment" if kind == "scores" else "a span"
        log_refused(self._log, what, refusal, tracking_uri=self._config.tracking_uri, **ids)

    async def _post_spans(self, body: bytes) -> None:
        assert self._client is not None
        headers = {"Content-Type": "application/x-protobuf", EXPERIMENT_HEADER: await self._experiment()}
        if self._config.compression == "gzip":
            headers["Content-Encoding"] = "gzip"
        try:
            resp = await self._client.post(OTLP_TRACES_PATH, content=body, headers=headers)
        except httpx.HTTPError as e:
            raise SendFailed(f"POST {OTLP_TRACES_PATH}: {type(e).__name__}: {e}", retryable=True) from None
        if resp.status_code >= 300:  # 400/413/422: refused for its data; 429/502/503/504: retried
            raise http_failure(f"POST {OTLP_TRACES_PATH}", resp)

    async def _experiment(self) -> str:
        """The experiment id spans go to; a configured name is looked up, and created when missing, once."""
        if self._experiment_id is not None:
            return self._experiment_id
        name = self._config.experiment_name
        if name is None:
            self._experiment_id = DEFAULT_EXPERIMENT_ID
            return self._experiment_id
        assert self._client is not None
        try:
            resp = await self._client.get(EXPERIMENT_BY_NAME_PATH, params={"experiment_name": name})
            if resp.status_code == 404:
                resp = await self._client.post(EXPERIMENT_CREATE_PATH, json={"name": name})
                if resp.status_code < 300:
                    self._experiment_id = str(resp.json()["experiment_id"])
                    self._log.info("created MLflow experiment", extra={"name": name, "id": self._experiment_id})
                    return self._experiment_id
                if "RESOURCE_ALREADY_EXISTS" in resp.text:  # another writer created it meanwhile
                    resp = await self._client.get(EXPERIMENT_BY_NAME_PATH, params={"experiment_name": name})
        except httpx.HTTPError as e:
            raise SendFailed(f"experiment {name!r}: {type(e).__name__}: {e}", retryable=True) from None
        if resp.status_code >= 300:
            raise _failure(f"experiment {name!r}", resp)
        self._experiment_id = str(resp.json()["experiment"]["experiment_id"])
        return self._experiment_id

    # --- scores -----------------------------------------------------------------------------------

    def _ready_scores(self, queued: deque[_PendingScore], n: int) -> list[_PendingScore]:
        """Up to `n` queued scores whose trace has no spans still queued here and whose wait is over."""
        now = time.monotonic()
        ready: list[_PendingScore] = []
        waiting: list[_PendingScore] = []
        while queued and len(ready) < n:
            item = queued.popleft()
            if item.not_before > now or item.trace_id[3:] in self._spans_pending:
                waiting.append(item)
            else:
                ready.append(item)
        queued.extendleft(reversed(waiting))
        return ready

    async def _write_scores(self, ready: list[_PendingScore]) -> None:
        """Write the scores, each trace's in order and the traces at once."""
        by_trace: dict[str, list[_PendingScore]] = {}
        for item in ready:
            by_trace.setdefault(item.trace_id, []).append(item)
        results = await asyncio.gather(
            *(self._write_items(t, items) for t, items in by_trace.items()), return_exceptions=True
        )
        for trace_id, result in zip(by_trace, results, strict=True):
            if isinstance(result, Exception):  # a bug: the other traces' scores went on
                self._counters.sender_errors.inc()
                self._log.error(
                    "writing a trace's assessments failed unexpectedly", exc_info=result, extra={"trace_id": trace_id}
                )

    async def _write_items(self, trace_id: str, items: list[_PendingScore]) -> None:
        """Write one trace's scores in order, skipping keys MLflow already has; put them all back if the trace is
        not in MLflow yet."""
        for i, item in enumerate(items):
            try:
                written = await self._keys_in_mlflow(trace_id)
                if written is None:
                    raise _TraceMissing
                if item.key in written:
                    self._counters.scores_not_sent.labels(self._cid, "already in mlflow").inc()
                    continue
                missing: list[bool] = []
                # one assessment per request: one MLflow refuses (400, 413, 422) is dropped alone
                outcome = await deliver_items(
                    [item],
                    lambda part: part[0],
                    lambda item, missing=missing: self._post_assessment(item, missing),
                    self._config.retry_on_failure,
                    log=self._log,
                    what="an assessment",
                    deadline=self._queue.deadline,
                    extra={"trace_id": trace_id, "key": item.key, "tracking_uri": self._config.tracking_uri},
                )
                if missing:  # the trace went away between the read and the write
                    self._written.pop(trace_id, None)
                    raise _TraceMissing
            except _TraceMissing:
                self._park(items[i:])
                return
            except Exception:  # a bug, not MLflow: say so at once, count this score, go on with the next
                self._counters.sender_errors.inc()
                self._counters.scores_failed.inc()
                self._log.exception(
                    "writing an assessment failed unexpectedly; dropped",
                    extra={"trace_id": trace_id.removeprefix("tr-"), "span_id": item.span_id, "key": item.key},
                )
                continue
            if outcome.sent:
                written.add(item.key)
                self._counters.scores_sent.inc()
            elif outcome.refused:
                otel_trace_id = trace_id.removeprefix("tr-")
                refusal = outcome.refused[0][1]
                self._refuse(
                    "scores", refusal, trace_id=otel_trace_id, span_id=item.span_id, score=item.name, key=item.key
                )
            else:
                self._counters.scores_failed.inc()

    def _park(self, items: list[_PendingScore]) -> None:
        now = time.monotonic()
        parked: list[_PendingScore] = []
        for item in items:
            if now - item.since >= self._config.trace_wait:
                self._counters.scores_failed.inc()
                self._log.error(
                    "dropping a score: its trace never appeared in MLflow (sampled out, or its spans not sent)",
                    extra={"trace_id": item.trace_id, "key": item.key, "waited_s": round(now - item.since, 1)},
                )
                continue
            item.waits += 1
            delay = min(self._config.flush_interval * 2**item.waits, self._config.retry_on_failure.max_interval)
            item.not_before = now + delay
            parked.append(item)
        self._scores.requeue(parked)

    async def _keys_in_mlflow(self, trace_id: str) -> set[str] | None:
        """The `evalsi.key`s of the trace's assessments, read once per trace and then kept; None when MLflow has
        no such trace yet."""
        known = self._written.get(trace_id)
        if known is not None:
            self._written.move_to_end(trace_id)
            return known
        found: list[set[str] | None] = []

        async def read() -> None:
            assert self._client is not None
            path = f"{TRACES_PATH}/{trace_id}"
            try:
                resp = await self._client.get(path)
            except httpx.HTTPError as e:
                raise SendFailed(f"GET {path}: {type(e).__name__}: {e}", retryable=True) from None
            if _no_such_trace(resp):
                found.append(None)
                return
            if resp.status_code >= 300:
                raise _failure(f"GET {path}", resp)
            assessments = resp.json().get("trace", {}).get("trace_info", {}).get("assessments", [])
            found.append({k for a in assessments if (k := (a.get("metadata") or {}).get(KEY_METADATA))})

        ok = await deliver(
            read,
            self._config.retry_on_failure,
            log=self._log,
            what="a trace's assessments",
            deadline=self._queue.deadline,
            extra={"trace_id": trace_id, "tracking_uri": self._config.tracking_uri},
        )
        if not ok:
            # not knowing what is there, writing could duplicate: wait and read again, as for a missing trace
            raise _TraceMissing
        keys = found[-1]
        if keys is not None:
            self._written[trace_id] = keys
            if len(self._written) > KNOWN_TRACES:
                self._written.popitem(last=False)
        return keys

    async def _post_assessment(self, item: _PendingScore, missing: list[bool]) -> None:
        """One attempt at writing an assessment; a 404 (no such trace) is not a failure to retry here but is
        recorded in `missing`, so the score waits for its trace with the others."""
        assert self._client is not None
        path = f"{TRACES_PATH}/{item.trace_id}/assessments"
        try:
            resp = await self._client.post(path, content=item.content, headers={"Content-Type": "application/json"})
        except httpx.HTTPError as e:
            raise SendFailed(f"POST {path}: {type(e).__name__}: {e}", retryable=True) from None
        if _no_such_trace(resp):
            missing.append(True)
            return
        if resp.status_code >= 300:  # 400/413/422: this assessment refused for its data; 429/502/503/504: retried
            raise http_failure(f"POST {path}", resp)

    # --- lifecycle --------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop taking work and send what is queued, for at most `shutdown_timeout`."""
        await self._queue.shutdown()
        if self._client is not None:
            await self._client.aclose()
