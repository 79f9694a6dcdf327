"""Delivery to a backend: the retry config, a failed attempt, and the one retry loop every exporter uses
(exponential backoff with jitter, honouring a server's Retry-After, bounded by time and by shutdown)."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from evalsi.component import ComponentConfig, Settings
from evalsi.duration import Duration
from evalsi.span import Span, SpanBatch

# the OTLP spec's retryable HTTP statuses, which Langfuse and most HTTP APIs share
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})


class RetryConfig(ComponentConfig):
    enabled: bool = True
    initial_interval: Duration = 5.0
    max_interval: Duration = 30.0
    max_elapsed_time: Duration = 300.0


class ExporterCounters:
    """The self-metrics of an exporter that delivers scores and spans to a backend, labelled by its id, with the
    Collector's names: sent, send failed and enqueue failed (queue full) per kind, the scores it does not write by
    design (`scores_not_sent`, labelled by reason too), and its queue's size and capacity."""

    def __init__(self, settings: Settings, capacity: int) -> None:
        m, cid = settings.metrics, settings.id
        self.queue_size = m.exporter_queue_size.labels(cid)
        m.exporter_queue_capacity.labels(cid).set(capacity)
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


def spans_to_forward(batch: SpanBatch) -> list[Span]:
    """What an exporter forwarding spans to a backend sends of a batch: its sampled spans, once. A session's spans
    were forwarded as their traces completed; a revision only adds canonical fields to spans already forwarded,
    and their OTLP fields are unchanged."""
    if batch.unit == "session" or batch.revision:
        return []
    return [s for s in batch.spans if s.sampled]


class SendFailed(Exception):
    """One attempt failed; `retryable` says whether trying again may help, `retry_after` when."""

    def __init__(self, message: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time()) if when else None


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
    delay = retry.initial_interval
    while True:
        try:
            await attempt()
            return True
        except SendFailed as e:
            failure = e
        except Exception as e:
            failure = SendFailed(f"{type(e).__name__}: {e}", retryable=True)
        wait = failure.retry_after if failure.retry_after is not None else delay * random.uniform(0.8, 1.2)
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
        delay = min(delay * 2, retry.max_interval)


def _dropped(log: logging.Logger, what: str, failure: SendFailed, extra: dict[str, Any] | None) -> bool:
    log.error(
        f"dropping {what} the backend would not take",
        extra={"error": str(failure), "retryable": failure.retryable, **(extra or {})},
    )
    return False
