"""What decoding an OTLP request yields (the batch, the rejected and the changed items), the errors that refuse a
request whole, the markers of changed items, and how clamps and cuts are counted and logged."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from evalsi.model.encoded import EncodedBatch
from evalsi.model.log_record import LogBatch
from evalsi.model.span import SpanBatch
from evalsi.receivers.otlp.config import Limits
from evalsi.runtime.telemetry import SelfMetrics

# The latest time the store holds: ClickHouse's DateTime64(9) and Arrow's timestamp[ns] are signed 64-bit
# nanoseconds since the epoch (2262-04-11T23:47:16.854775807Z); OTLP's fixed64 times go up to 2^64 - 1.
MAX_TIME_NS = (1 << 63) - 1
MAX_LOG_TIME_NS = 0xFFFFFFFF * 1_000_000_000
"""The last log record time the logs table orders by (`toUnixTimestamp`: UInt32 seconds, 2106-02-07T06:28:15Z)."""
# The marker attribute of a span or log record whose out-of-range fields the receiver clamped: the fields' names.
CLAMPED = "evalsi.clamped"
# The marker attributes of a span or log record cut to the receiver's `limits`: the keys of the attribute values
# truncated (`gen_ai.prompt`, `events[0].gen_ai.prompt`, `resource.x`), and what was dropped past a count limit with
# how many (`attributes:12`, `events:3`, `links:1`, `events[0].attributes:2`, `resource.attributes:7`).
TRUNCATED = "evalsi.truncated"
DROPPED = "evalsi.dropped"

LIMITS = Limits()  # the defaults


class DecodeFailed(ValueError):
    """The request body is not an OTLP message at all (answered 400 / INVALID_ARGUMENT, with a `BadRequest` naming
    `reason` and, where known, the `field` that could not be decoded)."""

    def __init__(self, message: str, reason: str, field: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.field = field


class OverLimit(DecodeFailed):
    """A request holding more spans or log records than the receiver's limit: refused whole (400 /
    INVALID_ARGUMENT, which senders do not retry), its message naming the limit's key; the sender should send smaller
    batches."""

    def __init__(self, message: str, reason: str, limit: str, signal: str, count: int) -> None:
        super().__init__(message, reason)
        self.limit = limit  # the key, e.g. max_spans_per_request
        self.signal = signal
        self.count = count  # the items the request held


@dataclass(slots=True)
class Cuts:
    """What a decoding cut to the receiver's `limits` (each item cut is marked with `evalsi.truncated` /
    `evalsi.dropped`)."""

    items: int = 0  # spans or log records cut
    truncated: int = 0  # attribute values truncated
    dropped_attributes: int = 0
    dropped_events: int = 0
    dropped_links: int = 0
    note: str = ""  # the first item cut, for the log


@dataclass(slots=True)
class Decoded:
    """What a request held: the valid items as a batch, and how many were rejected and why."""

    batch: SpanBatch | LogBatch | EncodedBatch
    rejected: int = 0
    message: str = ""
    # items kept changed: out-of-range fields clamped (marked with `evalsi.clamped`) or cut to the receiver's limits
    # (`evalsi.truncated`, `evalsi.dropped`); where this is non-zero, `count_clamped` counts and logs them all
    clamped: int = 0
    clamp_note: str = ""  # the first item with fields clamped, for the log
    out_of_range: int = 0  # the items with fields clamped
    cuts: Cuts | None = None  # what was cut to the limits, when anything was


def count_clamped(metrics: Any, receiver: str, signal: str, decoded: Decoded, log: logging.Logger) -> None:
    """Count and log the items a decoding kept changed (fields clamped, or cut to the limits), where it decoded them
    (the receiver, or a pipeline worker)."""
    if decoded.out_of_range:
        metrics.counter(
            "evalsi_receiver_clamped_items",
            "Spans and log records accepted with out-of-range fields clamped (marked with the evalsi.clamped "
            "attribute).",
            ["receiver", "signal"],
        ).labels(receiver, signal).inc(decoded.out_of_range)
        log.warning("clamped %s: %s", signal, decoded.clamp_note)
    cuts = decoded.cuts
    if cuts is not None and cuts.items:
        count_cuts(metrics, receiver, signal, cuts)
        what = "span" if signal == "traces" else "log record"
        log.warning(
            "cut %s to the receiver's limits: %d %s(s) kept with attributes, events or links cut (%s, %s); first: %s",
            signal, cuts.items, what, TRUNCATED, DROPPED, cuts.note,
        )  # fmt: skip


def count_cuts(metrics: SelfMetrics, receiver: str, signal: str, cuts: Cuts) -> None:
    if cuts.truncated:
        metrics.receiver_truncated_attributes.labels(receiver, signal).inc(cuts.truncated)
    if cuts.dropped_attributes:
        metrics.receiver_dropped_attributes.labels(receiver, signal).inc(cuts.dropped_attributes)
    if cuts.dropped_events:
        metrics.receiver_dropped_events.labels(receiver).inc(cuts.dropped_events)
    if cuts.dropped_links:
        metrics.receiver_dropped_links.labels(receiver).inc(cuts.dropped_links)
