"""Trace assembly: spans buffered by trace id until the trace is complete, and sessions of completed traces."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from evalsi.cel import trace_activation
from evalsi.model.span import (
    DEFAULT_PROJECT,
    SessionKey,
    Span,
    TraceKey,
    compact_content,
    project_of,
    trace_key,
)

# reasons a trace or session is complete: the label values of the completion metrics
QUIET = "quiet"
MAX_TRACE_DURATION = "max_trace_duration"
EVICTED = "evicted"
SHUTDOWN = "shutdown"


def span_size(span: Span) -> int:
    """Bytes a span holds in memory, roughly: calibrated against tracemalloc on decoded, normalized GenAI spans
    (benchmarks/assemble.py prints both); string attributes count three times (the value, the parsed content
    that normalize derives from it, and its share of the request)."""
    attributes = span.attributes
    text = 0
    for value in attributes.values():
        if type(value) is str:
            text += len(value)
    return 1000 + 160 * len(attributes) + 3 * text + 200 * len(span.events)


@dataclass(slots=True, eq=False)
class Trace:
    """The spans of one trace buffered so far."""

    trace_id: str
    spans: list[Span]
    first_arrival: float
    last_arrival: float
    has_root: bool = False
    size: int = 0
    _activations: dict[frozenset[str], dict[str, Any]] | None = None
    key: TraceKey | None = None  # `span.trace_key`: the trace id within its project (the default when it has none)

    def __post_init__(self) -> None:
        if self.key is None:
            self.key = TraceKey(project_of(self.spans[0]) if self.spans else DEFAULT_PROJECT, self.trace_id)

    def activation(self, fields: frozenset[str]) -> dict[str, Any]:
        """The CEL activation of this trace with span maps cut to `fields` (built once per field set)."""
        if self._activations is None:
            self._activations = {}
        found = self._activations.get(fields)
        if found is None:
            found = self._activations[fields] = trace_activation(self.spans, self.trace_id, fields)
        return found


class TraceBuffer:
    """Undecided traces, and the rule for when one is complete.

    A trace is complete when its root span (empty parent span id) has arrived and no span of it arrived for
    `decision_wait`, or `max_trace_duration` after its first span at the latest. Past `num_traces` or `max_bytes`
    (an estimate), the oldest traces are taken out early (evicted), never dropped.

    `traces` keeps first-arrival order (the oldest is evicted first); `_quiet` holds the traces whose root has
    arrived in last-arrival order, so finding complete traces costs only the ones due.
    """

    def __init__(self, decision_wait: float, max_trace_duration: float, num_traces: int, max_bytes: int) -> None:
        self.decision_wait = decision_wait
        self.max_trace_duration = max_trace_duration
        self.num_traces = num_traces
        self.max_bytes = max_bytes
        self.traces: dict[str, Trace] = {}
        self._quiet: dict[str, Trace] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.traces)

    def get(self, key: TraceKey) -> Trace | None:
        return self.traces.get(key)

    def add(self, span: Span, now: float, trace: Trace | None = None) -> None:
        """Buffer a span; `trace` is its buffered trace when the caller already looked it up."""
        size = span_size(span)
        self.bytes += size
        compact_content(span)  # its messages as JSON while it waits: ~1 KB less a span
        if trace is None:
            key = trace_key(span)
            trace = self.traces[key] = Trace(span.trace_id, [span], now, now, size=size, key=key)
        else:
            trace.spans.append(span)
            trace.size += size
            trace.last_arrival = now
        if not span.parent_span_id:
            trace.has_root = True
        if trace.has_root:
            # keep `_quiet` in last-arrival order
            quiet = self._quiet
            quiet.pop(trace.key, None)
            quiet[trace.key] = trace

    def replace(self, trace: Trace, span: Span) -> None:
        """A revision of a buffered span (same span id) takes its place; an unknown span id is added."""
        for i, held in enumerate(trace.spans):
            if held.span_id == span.span_id:
                size = span_size(span)
                self.bytes += size - span_size(held)
                trace.size += size - span_size(held)
                compact_content(span)
                trace.spans[i] = span
                trace._activations = None
                return
        self.add(span, trace.last_arrival, trace)

    def due(self, now: float) -> list[tuple[Trace, str]]:
        """Take out the traces complete at `now`, with the reason: quiet after their root, or too old."""
        out: list[tuple[Trace, str]] = []
        quiet = self._quiet
        wait = self.decision_wait
        while quiet:
            trace = next(iter(quiet.values()))
            if trace.last_arrival + wait > now:
                break
            self._take(trace)
            out.append((trace, QUIET))
        oldest_allowed = now - self.max_trace_duration
        while self.traces:
            trace = next(iter(self.traces.values()))
            if trace.first_arrival > oldest_allowed:
                break
            self._take(trace)
            out.append((trace, MAX_TRACE_DURATION))
        return out

    def evict(self) -> list[tuple[Trace, str]]:
        """Take out the oldest traces while over `num_traces` or `max_bytes`, with the limit that was passed."""
        out: list[tuple[Trace, str]] = []
        while len(self.traces) > self.num_traces or (self.bytes > self.max_bytes and self.traces):
            reason = "num_traces" if len(self.traces) > self.num_traces else "max_buffered_bytes"
            trace = next(iter(self.traces.values()))
            self._take(trace)
            out.append((trace, reason))
        return out

    def drain(self) -> list[Trace]:
        """Take out every buffered trace (shutdown)."""
        out = list(self.traces.values())
        self.traces.clear()
        self._quiet.clear()
        self.bytes = 0
        return out

    def _take(self, trace: Trace) -> None:
        del self.traces[trace.key]
        self._quiet.pop(trace.key, None)
        self.bytes -= trace.size


def session_of(spans: Sequence[Span]) -> SessionKey | None:
    """The session a trace belongs to, within the trace's project: its root's session id, else the first span's
    that has one."""
    found = None
    for span in spans:
        if span.session_id:
            if not span.parent_span_id:
                found = span.session_id
                break
            found = found or span.session_id
    return SessionKey(project_of(spans[0]), found) if found else None


@dataclass(slots=True, eq=False)
class Session:
    key: SessionKey
    spans: list[Span] = field(default_factory=list)
    last_activity: float = 0.0

    @property
    def session_id(self) -> str:
        return self.key.session_id


class SessionBuffer:
    """Spans of completed traces grouped by session id until the session has been quiet for `timeout`.

    Bounded by `max_sessions` and `max_spans` (all open sessions together): past either, the quietest sessions
    complete early. `max_sessions` 0 turns sessions off.
    """

    def __init__(self, timeout: float, max_sessions: int, max_spans: int) -> None:
        self.timeout = timeout
        self.max_sessions = max_sessions
        self.max_spans = max_spans
        self.sessions: dict[SessionKey, Session] = {}  # in last-activity order
        self.spans = 0

    def __len__(self) -> int:
        return len(self.sessions)

    @property
    def enabled(self) -> bool:
        return self.max_sessions > 0 and self.max_spans > 0

    def add(self, key: SessionKey, spans: list[Span], now: float) -> None:
        session = self.sessions.pop(key, None)
        if session is None:
            session = Session(key)
        self.sessions[key] = session
        session.spans.extend(spans)
        session.last_activity = now
        self.spans += len(spans)

    def add_late(self, span: Span, now: float) -> None:
        """A late span joins its session if that is still open."""
        if span.session_id:
            key = SessionKey(project_of(span), span.session_id)
            if key in self.sessions:
                self.add(key, [span], now)

    def due(self, now: float) -> list[Session]:
        out = []
        while self.sessions:
            session = next(iter(self.sessions.values()))
            if session.last_activity + self.timeout > now:
                break
            out.append(self._take(session))
        return out

    def evict(self) -> list[tuple[Session, str]]:
        out = []
        while len(self.sessions) > self.max_sessions or (self.spans > self.max_spans and self.sessions):
            reason = "max_sessions" if len(self.sessions) > self.max_sessions else "max_session_spans"
            out.append((self._take(next(iter(self.sessions.values()))), reason))
        return out

    def drain(self) -> list[Session]:
        out = list(self.sessions.values())
        self.sessions.clear()
        self.spans = 0
        return out

    def _take(self, session: Session) -> Session:
        del self.sessions[session.key]
        self.spans -= len(session.spans)
        return session
