"""The log record as it moves through the pipeline: OTLP log fields, with GenAI events named by `event_name`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class LogRecord:
    """One OTLP log record. Ids are lowercase hex ("" when the record is not tied to a span).

    `event_name` is the OTLP `event_name` field, or the older `event.name` attribute when that is all there is.
    """

    time_unix_nano: int
    observed_time_unix_nano: int
    trace_id: str = ""
    span_id: str = ""
    flags: int = 0
    severity_number: int = 0
    severity_text: str = ""
    body: Any = None
    event_name: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    resource_attributes: dict[str, Any] = field(default_factory=dict)
    service_name: str = ""
    scope_name: str = ""
    scope_version: str = ""
    arrived: float = 0.0  # as `Span.arrived`

    @property
    def timestamp(self) -> int:
        return self.time_unix_nano or self.observed_time_unix_nano


@dataclass(slots=True)
class LogBatch:
    records: list[LogRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[LogRecord]:
        return iter(self.records)
