"""The span as it moves through the pipeline: OTLP fields, raw attributes and the canonical GenAI fields."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, NamedTuple, get_args

import orjson

# OTLP enum values, spelled as the canonical shape shows them (`span.kind == "CLIENT"`).
SPAN_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
STATUS_CODES = ("UNSET", "OK", "ERROR")

StepType = Literal["llm", "tool", "agent", "retriever", "embedding", "chain", "user", "other"]
"""What a span is as a GenAI step, set by mappers from their convention's own names; `user` is a (simulated) user's
turn in a conversation the harness drives."""
STEP_TYPES: tuple[StepType, ...] = get_args(StepType)
TRAJECTORY_STEP_TYPES = frozenset(STEP_TYPES) - {"other"}
"""The steps a trajectory lists; `other` spans (HTTP, database, ...) stay in the span tree only."""


VENDOR_SDK = "vendor_sdk"
"""`details["vendor_sdk"]`: the span is a vendor SDK's own record of an API call (the Anthropic SDK's
`com.anthropic.sdk.python` spans), which an instrumentation of that SDK may record too: the trajectory then counts the
call once (`trajectory.py`)."""
VENDOR_SDK_SCOPES: dict[str, str] = {"com.anthropic.sdk.python": "anthropic"}
"""Instrumentation scopes of vendor SDKs' own spans -> the provider (`details["vendor_sdk"]`)."""
WORKFLOW = "workflow"
"""`details["workflow"]`: the span runs a workflow (`invoke_workflow`): a `chain` step that carries the workflow's
name, input and output, so a workflow around agents is a step of the hierarchy and its output the run's answer."""
PLUMBING = "plumbing"
"""`details["plumbing"]`: the GenAI operation of a span that is no step of a run (`create_agent`, building an agent):
the trajectory does not list it, and a trace of nothing else is no trajectory."""


@dataclass(slots=True)
class SpanEvent:
    time_unix_nano: int
    name: str
    attributes: dict[str, Any]


@dataclass(slots=True)
class SpanLink:
    trace_id: str
    span_id: str
    trace_state: str
    attributes: dict[str, Any]


PROJECT_ATTRIBUTE = "evalsi.project"
"""The resource attribute naming a span's project: set by the receiver from the sender's credential (`auth`)."""


DEFAULT_PROJECT = "default"
"""The project of what carries none (a sender without a project-bound credential)."""


def project_of(item: Any, default: str = DEFAULT_PROJECT) -> str:
    """The project of a span or log record: its `evalsi.project` resource attribute, else `default`."""
    value = item.resource_attributes.get(PROJECT_ATTRIBUTE)
    return value if isinstance(value, str) and value else default


class TraceKey(NamedTuple):
    """A trace's identity: its trace id within its project. Every index of traces (assembly, decisions, late
    feedback, duplicate-call twins, the WAL's replay) is keyed by it, so a second project sending the same trace id
    neither joins, completes, answers nor moves another project's trace."""

    project: str
    trace_id: str

    def __str__(self) -> str:
        return f"{self.project}/{self.trace_id}"


class SessionKey(NamedTuple):
    """A session's identity: its session id within its project (two teams' `session-1` are two sessions)."""

    project: str
    session_id: str

    def __str__(self) -> str:
        return f"{self.project}/{self.session_id}"


_new_key = tuple.__new__  # a NamedTuple's own constructor costs ~0.3 µs more, and this runs per span


def trace_key(span: Any, default: str = DEFAULT_PROJECT) -> TraceKey:
    """The key of a span's trace: its project (`default` when it has none, as `project_of`) and trace id."""
    project = span.resource_attributes.get(PROJECT_ATTRIBUTE)
    if project.__class__ is not str or not project:
        project = default
    return _new_key(TraceKey, (project, span.trace_id))


@dataclass(slots=True)
class Span:
    """One span. Ids are lowercase hex; attribute values keep their OTLP types.

    `resource_attributes` is shared by every span of one OTLP resource: treat it as read-only.
    The fields from `step_type` on are the canonical GenAI shape that mappers fill.
    """

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    start_time_unix_nano: int
    end_time_unix_nano: int
    status_code: str = "UNSET"
    status_message: str = ""
    trace_state: str = ""
    service_name: str = ""
    scope_name: str = ""
    scope_version: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)
    resource_attributes: dict[str, Any] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    links: list[SpanLink] = field(default_factory=list)
    flags: int = 0
    # canonical GenAI fields
    step_type: StepType = "other"
    model: str | None = None
    provider: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    tool_name: str | None = None
    session_id: str | None = None
    agent_name: str | None = None
    user_id: str | None = None
    cost_usd: float | None = None
    error_type: str | None = None
    input: list[dict[str, Any]] | None = None
    output: list[dict[str, Any]] | None = None
    content_captured: bool = False
    convention: str = ""
    unparsed: list[str] = field(default_factory=list)  # canonical fields kept raw because they would not parse
    sampled: bool = True  # the storage decision: exporters skip (and count) spans sampled out
    # convention-specific extras with canonical key names: cache_read_input_tokens, cache_creation_input_tokens,
    # reasoning_tokens, documents (retrieval), mcp_target, a2a_method, request_type, ...
    details: dict[str, Any] = field(default_factory=dict)
    arrived: float = 0.0
    """When (monotonic) the request holding it reached a receiver, stamped when a write-ahead log is kept (else 0):
    what lets the log delete a segment once nothing of it is held (`wal.py`)."""

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_time_unix_nano - self.start_time_unix_nano)

    def canonical(self) -> dict[str, Any]:
        """The canonical shape as JSON-ready data (what `evalsi traces show --json` prints)."""
        return {
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "name": self.name,
            "kind": self.kind,
            "service_name": self.service_name,
            "start_time_unix_nano": self.start_time_unix_nano,
            "duration_ns": self.duration_ns,
            "status_code": self.status_code,
            "status_message": self.status_message,
            "step_type": self.step_type,
            "model": self.model,
            "provider": self.provider,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "tool_name": self.tool_name,
            "session_id": self.session_id,
            "agent_name": self.agent_name,
            "user_id": self.user_id,
            "cost_usd": self.cost_usd,
            "error_type": self.error_type,
            "input": self.input,
            "output": self.output,
            "content_captured": self.content_captured,
            "convention": self.convention,
            "unparsed": self.unparsed,
            "details": self.details,
            "attributes": self.attributes,
            "resource_attributes": self.resource_attributes,
        }


def span_from_canonical(c: dict[str, Any]) -> Span:
    """A span from its canonical shape (`Span.canonical()`, or a stored row read back): what evaluators read of
    stored traces. The end time comes from `duration_ns`."""
    start = int(c.get("start_time_unix_nano", 0))
    return Span(
        trace_id=c["trace_id"],
        span_id=c["span_id"],
        parent_span_id=c.get("parent_span_id", ""),
        name=c.get("name", ""),
        kind=c.get("kind", "INTERNAL"),
        start_time_unix_nano=start,
        end_time_unix_nano=start + int(c.get("duration_ns", 0)),
        status_code=c.get("status_code", "UNSET"),
        status_message=c.get("status_message", ""),
        trace_state=c.get("trace_state", ""),
        service_name=c.get("service_name", ""),
        scope_name=c.get("scope_name", ""),
        scope_version=c.get("scope_version", ""),
        attributes=dict(c.get("attributes") or {}),
        resource_attributes=dict(c.get("resource_attributes") or {}),
        events=[
            SpanEvent(int(e["time_unix_nano"]), e["name"], dict(e.get("attributes") or {}))
            for e in c.get("events") or []
        ],
        links=[
            SpanLink(k["trace_id"], k["span_id"], k.get("trace_state", ""), dict(k.get("attributes") or {}))
            for k in c.get("links") or []
        ],
        step_type=c.get("step_type", "other"),
        model=c.get("model"),
        provider=c.get("provider"),
        input_tokens=c.get("input_tokens"),
        output_tokens=c.get("output_tokens"),
        tool_name=c.get("tool_name"),
        session_id=c.get("session_id"),
        agent_name=c.get("agent_name"),
        user_id=c.get("user_id"),
        cost_usd=c.get("cost_usd"),
        error_type=c.get("error_type"),
        input=c.get("input"),
        output=c.get("output"),
        content_captured=bool(c.get("content_captured", False)),
        convention=c.get("convention", ""),
        unparsed=list(c.get("unparsed") or []),
        details=dict(c.get("details") or {}),
    )


def _messages(slot: Any) -> property:
    """A span's `input` or `output`: its canonical messages, which a holder may keep as their JSON
    (`compact_content`) while the span waits; the first read parses them back and keeps what it parsed. Setting it
    is the slot's own (C) setter: spans are made and normalized by the thousands."""
    get, put = slot.__get__, slot.__set__

    def read(span: Any) -> Any:
        value = get(span)
        if value.__class__ is bytes:
            value = orjson.loads(value)
            put(span, value)
        return value

    return property(read, put)


_INPUT_SLOT, _OUTPUT_SLOT = Span.__dict__["input"], Span.__dict__["output"]
Span.input = _messages(_INPUT_SLOT)  # type: ignore[assignment]
Span.output = _messages(_OUTPUT_SLOT)  # type: ignore[assignment]
held_input = _INPUT_SLOT.__get__
"""A span's `input` as it is held: the parsed messages, None, or their JSON (bytes) after `compact_content`."""
held_output = _OUTPUT_SLOT.__get__
"""A span's `output` as it is held (see `held_input`)."""


def compact_content(span: Span) -> None:
    """Keep the span's canonical messages as their JSON while it waits (tail sampling's buffer): a held span of
    `benchmarks/span_memory.py` takes 5.4 KB in 45 blocks instead of 6.4 KB in 62. Reading `input` or `output`
    parses them back; the store writes the JSON as it is. Messages JSON cannot hold as they are (bytes, a key that
    is not text, an integer past 64 bits, a lone surrogate) stay parsed; a float NaN or infinity becomes null, as in
    the stored column."""
    for slot in (_INPUT_SLOT, _OUTPUT_SLOT):
        value = slot.__get__(span)
        if value.__class__ is list and value:
            try:
                text = orjson.dumps(value)
            except TypeError:
                continue
            # a copy of the exact size: the bytes orjson returns keep the whole buffer it wrote them in (4-8 KB)
            slot.__set__(span, bytes(memoryview(text)))


class BatchKind(StrEnum):
    """What a span batch holds, and so what each stage does with it."""

    SPANS = "spans"
    """Any spans, as they arrive: stored (when sampled), never evaluated as a whole."""
    TRACE = "trace"
    """Whole traces that trace assembly judged complete: evaluated per trace, whatever each span's `sampled`."""
    SESSION = "session"
    """Every span of a session that went quiet, already handed on as traces: evaluated per session, never stored
    or forwarded again."""


def trace_shard(trace_id: str, n: int) -> int:
    """Which of `n` slots of the pipeline workers a trace (hex id) falls in: the low 64 bits (random in W3C ids)
    modulo `n`, as the receivers shard encoded requests (`receivers/otlp/sharding.shard_of`)."""
    try:
        return int(trace_id[16:], 16) % n if n > 1 else 0
    except ValueError:
        return 0


@dataclass(slots=True)
class SpanBatch:
    """The unit that moves between components: spans from one or more OTLP requests.

    A `revision` batch carries spans already handed on once, now with more canonical content (e.g. GenAI
    events that arrived after their span): consumers replace what they hold for those span ids.

    `kind` says what the batch holds (`BatchKind`); a stage that rebuilds a batch keeps its kind and revision.
    """

    spans: list[Span] = field(default_factory=list)
    revision: bool = False
    kind: BatchKind = BatchKind.SPANS
    completed: float = 0.0
    """For trace and session batches: when (monotonic) the first of its traces was complete (tail sampling's
    decision), so that time spent waiting downstream counts in score freshness; 0 when unknown."""

    def __len__(self) -> int:
        return len(self.spans)

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans)

    def shard(self, n: int) -> list[SpanBatch]:
        """Split by trace id into `n` batches so one trace always lands in the same shard."""
        if n <= 1:
            return [self]
        shards: list[list[Span]] = [[] for _ in range(n)]
        for span in self.spans:
            shards[trace_shard(span.trace_id, n)].append(span)
        return [SpanBatch(s, self.revision, self.kind) for s in shards]
