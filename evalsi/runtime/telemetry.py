"""The collector's own metrics, named like the OpenTelemetry Collector's `otelcol_*` self-telemetry."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

# `*_created` series add nothing a dashboard uses
disable_created_metrics()


class SelfMetrics:
    """One registry per service, so tests and several services in one process never collide.

    The pipeline's shared metrics are attributes; a component with metrics of its own gets them with
    `counter()` / `gauge()` / `histogram()`, which return the one metric of that name however many
    instances ask (label them by component id).
    """

    def counter(self, name: str, doc: str, labels: list[str]) -> Counter:
        return self._get(Counter, name, doc, labels)

    def gauge(self, name: str, doc: str, labels: list[str]) -> Gauge:
        return self._get(Gauge, name, doc, labels)

    def histogram(self, name: str, doc: str, labels: list[str], buckets: tuple[float, ...] | None = None) -> Histogram:
        extra = {"buckets": buckets} if buckets else {}
        return self._get(Histogram, name, doc, labels, **extra)

    def _get(self, kind: type, name: str, doc: str, labels: list[str], **extra: Any) -> Any:
        found = self._own.get(name)
        if found is None:
            found = self._own[name] = kind(name, doc, labels, registry=self.registry, **extra)
        return found

    def __init__(self) -> None:
        self._own: dict[str, Any] = {}
        self.registry = CollectorRegistry()
        r = self.registry
        self.receiver_accepted_spans = Counter(
            "otelcol_receiver_accepted_spans",
            "Spans successfully pushed into the pipeline.",
            ["receiver", "transport"],
            registry=r,
        )
        self.receiver_refused_spans = Counter(
            "otelcol_receiver_refused_spans",
            "Spans that could not be pushed into the pipeline (invalid, or refused by it).",
            ["receiver", "transport"],
            registry=r,
        )
        self.receiver_accepted_log_records = Counter(
            "otelcol_receiver_accepted_log_records",
            "Log records successfully pushed into the pipeline.",
            ["receiver", "transport"],
            registry=r,
        )
        self.receiver_refused_log_records = Counter(
            "otelcol_receiver_refused_log_records",
            "Log records that could not be pushed into the pipeline (invalid, or refused by it).",
            ["receiver", "transport"],
            registry=r,
        )
        # what the otlp receiver's `limits` cut or refused (docs/receivers/otlp.md#limits)
        self.receiver_truncated_attributes = Counter(
            "evalsi_receiver_truncated_attributes",
            "Attribute values truncated to the receiver's limits.max_attribute_value_length (each named in the "
            "item's evalsi.truncated attribute; a resource's once for each item stored with it).",
            ["receiver", "signal"],
            registry=r,
        )
        self.receiver_dropped_attributes = Counter(
            "evalsi_receiver_dropped_attributes",
            "Attributes dropped past the receiver's limits.max_attributes_per_span / max_attributes_per_log_record "
            "(counted in the item's evalsi.dropped attribute; a resource's once for each item stored with it).",
            ["receiver", "signal"],
            registry=r,
        )
        self.receiver_dropped_events = Counter(
            "evalsi_receiver_dropped_events",
            "Span events dropped past the receiver's limits.max_events_per_span.",
            ["receiver"],
            registry=r,
        )
        self.receiver_dropped_links = Counter(
            "evalsi_receiver_dropped_links",
            "Span links dropped past the receiver's limits.max_links_per_span.",
            ["receiver"],
            registry=r,
        )
        self.receiver_refused_requests = Counter(
            "evalsi_receiver_refused_requests",
            "Requests refused whole (400 / INVALID_ARGUMENT) for holding more spans or log records than the "
            "receiver's limits allow.",
            ["receiver", "signal", "limit"],
            registry=r,
        )
        self.exporter_sent_log_records = Counter(
            "otelcol_exporter_sent_log_records",
            "Log records successfully sent to the destination.",
            ["exporter"],
            registry=r,
        )
        self.exporter_send_failed_log_records = Counter(
            "otelcol_exporter_send_failed_log_records",
            "Log records the exporter failed to send and gave up on.",
            ["exporter"],
            registry=r,
        )
        self.exporter_sent_spans = Counter(
            "otelcol_exporter_sent_spans",
            "Spans successfully sent to the destination.",
            ["exporter"],
            registry=r,
        )
        self.exporter_send_failed_spans = Counter(
            "otelcol_exporter_send_failed_spans",
            "Spans the exporter failed to send and gave up on.",
            ["exporter"],
            registry=r,
        )
        self.exporter_queue_size = Gauge(
            "otelcol_exporter_queue_size",
            "Spans currently held in the exporter's queue.",
            ["exporter"],
            registry=r,
        )
        self.exporter_queue_capacity = Gauge(
            "otelcol_exporter_queue_capacity",
            "Capacity of the exporter's queue, in spans.",
            ["exporter"],
            registry=r,
        )


def items_refused_counter(metrics: Any) -> Any:
    """`evalsi_exporter_items_refused_total{exporter, kind, reason}`: the items an exporter dropped alone."""
    return metrics.counter(
        "evalsi_exporter_items_refused",
        "Scores or spans dropped alone because the backend refused them for their data or they could not be "
        "encoded; the other items of their batch went on. Also counted in otelcol_exporter_send_failed_*.",
        ["exporter", "kind", "reason"],
    )
