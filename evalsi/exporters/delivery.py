"""Delivery to a backend: the retry config, a failed attempt, and the one retry loop every exporter uses
(exponential backoff with jitter, honouring a server's Retry-After, bounded by time and by shutdown)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from evalsi.component import ComponentConfig, Settings
from evalsi.duration import Duration
from evalsi.model.span import BatchKind, Span, SpanBatch
from evalsi.runtime.backoff import RETRYABLE_HTTP, Backoff, retry_after
from evalsi.runtime.telemetry import items_refused_counter


class RetryConfig(ComponentConfig):
    enabled: bool = True
    initial_interval: Duration = 5.0
    max_interval: Duration = 30.0
    max_elapsed_time: Duration = 300.0


class ExporterCounters:
    """The self-metrics of an exporter that delivers scores and spans to a backend, labelled by its id, with the
    Collector's names: sent, send failed and enqueue failed (queue full) per kind, and the scores it does not write by
    design (`scores_not_sent`, labelled by reason too). Its queue's size and capacity are the `SendQueue`'s
    (`evalsi.exporters.sending`)."""

    def __init__(self, settings: Settings) -> None:
        m, cid = settings.metrics, settings.id
        sent = m.counter("otelcol_exporter_sent_scores", "Scores the backend accepted.", ["exporter"])
        self.scores_sent = sent.labels(cid)
        self.scores_failed = m.counter(
            "otelcol_exporter_send_failed_scores",
            "Scores dropped after a permanent failure or when retries ran out.",
            ["exporter"],
        ).labels(cid)
        self.scores_dropped = m.counter(
            "otelcol_exporter_enqueue_failed_scores",
            "Scores dropped because the exporter's queue was full or it was shutting down.",
            ["exporter"],
        ).labels(cid)
        self.scores_not_sent = m.counter(
            "evalsi_exporter_scores_not_sent",
            "Scores the exporter does not write by design (skipped or error outcomes, no value, no trace).",
            ["exporter", "reason"],
        )
        self.spans_sent = m.exporter_sent_spans.labels(cid)
        self.spans_failed = m.exporter_send_failed_spans.labels(cid)
        self.spans_dropped = m.counter(
            "otelcol_exporter_enqueue_failed_spans",
            "Spans dropped because the exporter's queue was full.",
            ["exporter"],
        ).labels(cid)
        # labelled (exporter, kind, reason) at use: items dropped alone, also counted in `*_failed`
        self.items_refused = items_refused_counter(m)
        self.sender_errors = sender_errors_counter(m).labels(cid)


def spans_to_forward(batch: SpanBatch) -> list[Span]:
    """What an exporter forwarding spans to a backend sends of a batch: its sampled spans, once. A session's spans
    were forwarded as their traces completed; a revision only adds canonical fields to spans already forwarded,
    and their OTLP fields are unchanged."""
    if batch.kind is BatchKind.SESSION or batch.revision:
        return []
    return [s for s in batch.spans if s.sampled]


class SendFailed(Exception):
    """One attempt failed; `retryable` says whether trying again may help, `retry_after` when."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


async def deliver(
    attempt: Callable[[], Awaitable[None]],
    retry: RetryConfig,
    *,
    log: logging.Logger,
    what: str,
    deadline: Callable[[], float] = lambda: float("inf"),
    extra: dict[str, Any] | None = None,
) -> bool:
    """Run `attempt` until it succeeds (True) or the failure is permanent, retries are off, `max_elapsed_time`
    would pass, or the next wait would end after `deadline()` (a monotonic time; shutdown sets it) — then log
    and return False for the caller to count. Any other exception counts as a retryable failure: a backend's
    or client's bug must not kill the sender task."""
    started = time.monotonic()
    backoff = Backoff(retry.initial_interval, retry.max_interval, max_retry_after=retry.max_elapsed_time)
    while True:
        try:
            await attempt()
            return True
        except SendFailed as e:
            failure = e
        except Exception as e:
            failure = SendFailed(f"{type(e).__name__}: {e}", retryable=True)
        wait = backoff.next_wait(failure.retry_after)
        now = time.monotonic()
        retry_at = now + wait
        if (
            not failure.retryable
            or not retry.enabled
            or retry_at - started > retry.max_elapsed_time
            or retry_at > deadline()
        ):
            return _dropped(log, what, failure, extra)
        log.warning(f"sending {what} failed; retrying", extra={"error": str(failure), "retry_in_s": round(wait, 2)})
        # wait in short steps: a shutdown that starts meanwhile sets a deadline this retry may no longer meet
        while (left := retry_at - time.monotonic()) > 0:
            if retry_at > deadline():
                return _dropped(log, what, failure, extra)
            await asyncio.sleep(min(left, 0.25))


def _dropped(log: logging.Logger, what: str, failure: SendFailed, extra: dict[str, Any] | None) -> bool:
    log.error(
        f"dropping {what} the backend would not take",
        extra={"error": str(failure), "retryable": failure.retryable, **(extra or {})},
    )
    return False


# --- one bad item never blocks the others ------------------------------------------------------------

# why an item was dropped alone: the `reason` label of `evalsi_exporter_items_refused_total`, a bounded set
REFUSED_ENCODE = "encode"  # it cannot be encoded for the backend (an id that is not hex, NaN in JSON, bad UTF-8)
REFUSED_INVALID = "invalid"  # the backend refused it for its data (HTTP 400/422, gRPC INVALID_ARGUMENT, a 207 item)
REFUSED_TOO_LARGE = "too large"  # HTTP 413, gRPC "message larger than max", alone
REFUSED_PARTIAL = "partial success"  # an OTLP backend took the request but rejected some of it (which, it does not say)
# HTTP answers that refuse a request for the data in it: a part of the request may pass
REFUSED_HTTP = {400: REFUSED_INVALID, 413: REFUSED_TOO_LARGE, 422: REFUSED_INVALID}

T = TypeVar("T")
P = TypeVar("P")
R = TypeVar("R")


class ItemsRefused(SendFailed):
    """The backend refused a request for the data in it (HTTP 400, 413, 422, gRPC INVALID_ARGUMENT, an item error in
    a 207 answer): not retryable as it is, but a part of it may pass. `deliver_items` sends halves until each refused
    item is alone, and drops only those."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, retryable=False)
        self.reason = reason


def cannot_encode(error: BaseException) -> ItemsRefused:
    """The refusal of an item the exporter cannot encode for its backend."""
    return ItemsRefused(f"cannot encode: {type(error).__name__}: {error}", reason=REFUSED_ENCODE)


def encode_apart(
    items: Sequence[T], encode: Callable[[Sequence[T], list[tuple[T, Exception]]], R]
) -> tuple[R, list[T], list[tuple[T, ItemsRefused]]]:
    """Encode `items` one by one with `encode(items, unencodable)`: the request, the items in it, and each item left
    out (an id that is not hex, ...) with its refusal, to be dropped alone."""
    unencodable: list[tuple[T, Exception]] = []
    request = encode(items, unencodable)
    left_out = {id(item) for item, _ in unencodable}
    good = [item for item in items if id(item) not in left_out]
    return request, good, [(item, cannot_encode(error)) for item, error in unencodable]


def http_failure(what: str, resp: Any) -> SendFailed:
    """The failure for an HTTP answer of 300 or more: retryable for 429/502/503/504 (with its Retry-After), a data
    refusal (`ItemsRefused`) for 400/413/422, else permanent for the whole request (401, 403, 404, 500, ...)."""
    message = f"{what}: HTTP {resp.status_code} {resp.text[:200]}"
    if resp.status_code in REFUSED_HTTP:
        return ItemsRefused(message, reason=REFUSED_HTTP[resp.status_code])
    retryable = resp.status_code in RETRYABLE_HTTP
    return SendFailed(
        message, retryable=retryable, retry_after=retry_after(resp.headers.get("retry-after")) if retryable else None
    )


@dataclass
class ItemsOutcome(Generic[T]):
    """What became of the items given to `deliver_items`."""

    # in requests the backend took
    sent: list[T] = field(default_factory=list)
    # given up on for no fault of their own: retries ran out, shutdown, a permanent failure of the whole request
    # (401, 404, ...)
    failed: list[T] = field(default_factory=list)
    # each refused alone, for its data
    refused: list[tuple[T, ItemsRefused]] = field(default_factory=list)


async def deliver_items(
    items: Sequence[T],
    prepare: Callable[[list[T]], P],
    send: Callable[[P], Awaitable[None]],
    retry: RetryConfig,
    *,
    log: logging.Logger,
    what: str,
    deadline: Callable[[], float] = lambda: float("inf"),
    extra: dict[str, Any] | None = None,
) -> ItemsOutcome[T]:
    """Send `items` in one request, `prepare`d (encoded) once and `send` through `deliver`, so availability failures
    are retried as always. When the request is refused for its data (`send` raises `ItemsRefused`) or cannot be
    encoded (`prepare` raises anything), each half is sent on its own, and so on until each bad item is alone: it is
    returned in `refused`, and every other item is delivered. A request never goes again as it was; n items that all
    fail take at most 2n - 1 requests. Once `deadline()` has passed, the parts not yet sent are `failed`."""
    outcome: ItemsOutcome[T] = ItemsOutcome()
    parts = [list(items)]
    first = True
    while parts:
        part = parts.pop()
        if not part:
            continue
        if not first and time.monotonic() >= deadline():
            outcome.failed.extend(part)
            continue
        first = False
        refusal: ItemsRefused | None = None
        try:
            payload = prepare(part)
        except Exception as e:
            refusal = cannot_encode(e)
        else:
            refusals: list[ItemsRefused] = []

            async def attempt(payload: P = payload, refusals: list[ItemsRefused] = refusals) -> None:
                try:
                    await send(payload)
                except ItemsRefused as e:  # not a failed delivery: the items are at fault, not the backend
                    refusals.append(e)

            delivered = await deliver(
                attempt, retry, log=log, what=what, deadline=deadline, extra={**(extra or {}), "count": len(part)}
            )
            if not delivered:
                outcome.failed.extend(part)
                continue
            if not refusals:
                outcome.sent.extend(part)
                continue
            refusal = refusals[-1]
        if len(part) == 1:
            outcome.refused.append((part[0], refusal))
            continue
        log.warning(
            f"the backend refused {len(part)} {what} for their data; sending each half on its own to find the bad ones",
            extra={"error": str(refusal), "reason": refusal.reason, **(extra or {})},
        )
        mid = len(part) // 2
        parts += [part[mid:], part[:mid]]  # the first half goes first
    return outcome


def sender_errors_counter(metrics: Any) -> Any:
    """`evalsi_exporter_sender_errors_total{exporter}`: unexpected errors a sender task logged and survived."""
    return metrics.counter(
        "evalsi_exporter_sender_errors",
        "Unexpected errors in an exporter's background sender: logged with their traceback; the sender went on.",
        ["exporter"],
    )


def log_refused(log: logging.Logger, what: str, refusal: ItemsRefused, **ids: Any) -> None:
    """Log one item dropped alone, with its trace and span ids (in `ids`)."""
    log.error(
        f"dropping {what} the backend refused ({refusal.reason}); the rest of its batch goes on",
        extra={"reason": refusal.reason, "error": str(refusal)[:500], **ids},
    )


def encode_json(body: Any) -> bytes:
    """A JSON request body, strict as the APIs that parse it: raises on NaN and infinities (JSON has none) and on
    strings that are not UTF-8 (half a surrogate pair), so a score that cannot be sent is known before it is queued."""
    return json.dumps(body, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()
