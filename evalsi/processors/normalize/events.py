"""GenAI content events sent as OTLP log records, joined to their spans by trace and span id, whichever comes first.

A span that may still get events (a GenAI step with no content, from a service seen logging GenAI events) waits up
to `wait` for them; events for a span already handed on produce a revision of it; events for a span not yet seen
wait up to `event_ttl` for it.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from evalsi.model.log_record import LogRecord
from evalsi.model.span import Span
from evalsi.processors.normalize.messages import (
    CHOICE_EVENT,
    MESSAGE_EVENT_ROLES,
    Message,
    messages_from_events,
    semconv_messages,
    system_message,
)
from evalsi.runtime.held import arrived_of, earliest

# The current semconv event: one record per call, with the messages as attributes (OpenLIT emits it).
OPERATION_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
CONTENT_EVENT_NAMES = frozenset((*MESSAGE_EVENT_ROLES, OPERATION_DETAILS_EVENT))
_FINAL_EVENTS = frozenset((CHOICE_EVENT, OPERATION_DETAILS_EVENT))

Key = tuple[str, str]


def is_content_event(record: LogRecord) -> bool:
    return record.event_name in CONTENT_EVENT_NAMES and bool(record.span_id)


def _record_body(record: LogRecord) -> Any:
    # per-message events carry their fields in the body (a map); some emitters use attributes
    if isinstance(record.body, dict) and record.body:
        return record.body
    return record.attributes if record.body in (None, "", {}) else record.body


def content_from_records(records: list[LogRecord]) -> tuple[list[Message] | None, list[Message] | None]:
    """(input, output) canonical messages from one span's content event records, in time order."""
    records = sorted(records, key=lambda r: r.timestamp)
    per_message = [(r.event_name, _record_body(r)) for r in records if r.event_name in MESSAGE_EVENT_ROLES]
    inputs, outputs = messages_from_events(per_message) if per_message else (None, None)
    for r in records:
        if r.event_name != OPERATION_DETAILS_EVENT:
            continue
        a = r.attributes
        details_in = semconv_messages(a.get("gen_ai.input.messages"), "user")
        system = system_message(a.get("gen_ai.system_instructions"))
        if system is not None:
            details_in = [system, *(details_in or [])]
        details_out = semconv_messages(a.get("gen_ai.output.messages"), "assistant")
        inputs = (inputs or []) + details_in if details_in else inputs
        outputs = (outputs or []) + details_out if details_out else outputs
    return inputs, outputs


def apply_records(span: Span, records: list[LogRecord]) -> bool:
    """Fill the span's content from its event records; True when content was found."""
    inputs, outputs = content_from_records(records)
    if not inputs and not outputs:
        return False
    if inputs and not span.input:
        span.input = inputs
    if outputs and not span.output:
        span.output = outputs
    span.content_captured = True
    for name, messages in (("input", span.input), ("output", span.output)):
        if messages and any(m.get("unparsed") for m in messages) and name not in span.unparsed:
            span.unparsed.append(name)
    return True


JOINED_STEPS = frozenset(("llm", "embedding", "agent", "tool"))
"""Step types whose content may come as events after the span."""


def may_get_events(span: Span) -> bool:
    return not span.content_captured and span.step_type in JOINED_STEPS


@dataclass
class _Waiting:
    span: Span
    deadline: float


@dataclass
class EventJoin:
    """The join state. Bounded: past `max_spans` / `max_events`, the oldest entries go first."""

    wait: float
    event_ttl: float
    max_spans: int = 50_000
    max_events: int = 200_000
    # events whose span has not come yet: key -> (records, expiry)
    _events: OrderedDict[Key, tuple[list[LogRecord], float]] = field(default_factory=OrderedDict)
    _n_events: int = 0
    # spans held for their events
    _held: OrderedDict[Key, _Waiting] = field(default_factory=OrderedDict)
    # spans handed on without content that events may still revise
    _passed: OrderedDict[Key, Span] = field(default_factory=OrderedDict)
    # services seen logging GenAI content events: only their spans are worth holding
    _event_services: set[str] = field(default_factory=set)

    def held_since(self) -> float | None:
        """When the oldest span held for its events, or event held for its span, reached a receiver."""
        spans = arrived_of(w.span for w in self._held.values())
        records = arrived_of(r for recs, _ in self._events.values() for r in recs)
        return earliest((spans, records))

    def on_span(self, span: Span, now: float | None = None) -> bool:
        """Join a normalized span; False means hold it (it is released by `due` or `on_records`)."""
        if not may_get_events(span):
            return True
        key = (span.trace_id, span.span_id)
        pending = self._events.pop(key, None)
        if pending is not None:
            records, _ = pending
            self._n_events -= len(records)
            apply_records(span, records)
            if any(r.event_name in _FINAL_EVENTS for r in records):
                return True
        if span.service_name in self._event_services:
            now = time.monotonic() if now is None else now
            self._held[key] = _Waiting(span, now + self.wait)
            self._trim(self._held, self.max_spans)
            return False
        self._passed[key] = span
        self._trim(self._passed, self.max_spans)
        return True

    def on_records(self, records: list[LogRecord], now: float | None = None) -> tuple[list[Span], list[Span]]:
        """Take content event records; returns (held spans now complete, passed spans revised)."""
        now = time.monotonic() if now is None else now
        by_key: dict[Key, list[LogRecord]] = {}
        for r in records:
            if is_content_event(r):
                by_key.setdefault((r.trace_id, r.span_id), []).append(r)
                self._event_services.add(r.service_name)
        released: list[Span] = []
        revised: list[Span] = []
        for key, recs in by_key.items():
            waiting = self._held.get(key)
            if waiting is not None:
                apply_records(waiting.span, recs)
                if any(r.event_name in _FINAL_EVENTS for r in recs):
                    del self._held[key]
                    released.append(waiting.span)
                continue
            passed = self._passed.get(key)
            if passed is not None:
                # the span handed on may still sit in an exporter's queue: revise a copy, never it
                revision = copy.copy(passed)
                revision.unparsed = list(passed.unparsed)
                if apply_records(revision, recs):
                    revised.append(revision)
                    self._passed[key] = revision
                    if any(r.event_name in _FINAL_EVENTS for r in recs):
                        del self._passed[key]
                continue
            earlier, _ = self._events.pop(key, ([], 0.0))
            self._events[key] = (earlier + recs, now + self.event_ttl)
            self._n_events += len(recs)
        while self._n_events > self.max_events and self._events:
            _, (dropped, _) = self._events.popitem(last=False)
            self._n_events -= len(dropped)
        return released, revised

    def due(self, now: float | None = None, *, everything: bool = False) -> list[Span]:
        """Held spans whose wait is over (all of them at shutdown); expired orphan events are dropped."""
        now = time.monotonic() if now is None else now
        out = []
        while self._held:
            key, waiting = next(iter(self._held.items()))
            if not everything and waiting.deadline > now and len(self._held) <= self.max_spans:
                break
            del self._held[key]
            out.append(waiting.span)
            self._passed[key] = waiting.span  # late events can still revise it
        self._trim(self._passed, self.max_spans)
        while self._events:
            key, (recs, expiry) = next(iter(self._events.items()))
            if expiry > now:
                break
            del self._events[key]
            self._n_events -= len(recs)
        return out

    @property
    def held(self) -> int:
        return len(self._held)

    def _trim(self, table: OrderedDict[Key, Any], limit: int) -> None:
        # held spans are never trimmed (`due` releases the oldest early past the bound): only memos are
        while len(table) > limit and table is not self._held:
            table.popitem(last=False)
