"""One trace or session as the policies see it: the variables their conditions read (`trace`, `span`, `resource`,
`session`, `feedback`), each built at most once and only when asked for, and the `Target` evaluators receive."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Generic, TypeVar

from evalsi import cel
from evalsi.evaluators import Target
from evalsi.evaluators.base import FROM_SPANS
from evalsi.evaluators.judge_client import Judges
from evalsi.model.ids import SOURCE_SPAN_ID, SOURCE_TRACE_ID
from evalsi.model.score import Score
from evalsi.model.span import Span, project_of
from evalsi.model.trajectory import build_trajectory, counted_once
from evalsi.policies.feedback import NEGATIVE_BELOW, feedback_variable

__all__ = ["SessionView", "TraceView"]

T = TypeVar("T")


class lazy_property(Generic[T]):
    """`functools.cached_property` without its lock (Python 3.11 takes one on every first read): worked out on first
    read into the instance's `__dict__`, which later reads find first. A view belongs to one thread."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> T:
        if instance is None:
            return self  # type: ignore[return-value]
        value = instance.__dict__[self.name] = self.fn(instance)
        return value


class TraceView:
    """One trace (or session) as the policies see it, each part built at most once and only when asked for."""

    is_session = False

    def __init__(
        self,
        spans: list[Span],
        *,
        trace_fields: frozenset[str] | None = None,
        span_fields: frozenset[str] | None = None,
        trajectory: dict[str, Any] | None = None,
        trace_span_maps: bool = True,
        trace_keys: frozenset[str] | None = None,
        feedback: Sequence[Score] = (),
        negative_below: float = NEGATIVE_BELOW,
        judges: Judges | None = None,
    ) -> None:
        """`feedback` holds the trace's human and external scores known so far (the `feedback` variable);
        `span_fields` limits the `span` map, `trace_fields` the maps in `trace.spans` / `trace.root` (None: every
        canonical field); `trace_span_maps=False` leaves `trace.spans` and `trace.root` out and `trace_keys` keeps
        only those keys of `trace` (no condition uses them, or `trace` as a whole: see `cel.Program.trace_spans`).
        `judges` is the judge runtime the view's Targets carry."""
        self.spans = sorted(spans, key=lambda s: s.start_time_unix_nano)
        self.root = next((s for s in self.spans if not s.parent_span_id), self.spans[0])
        self.trace_id = self.root.trace_id
        self.project = project_of(self.root)
        self._trace_fields = trace_fields
        self._span_fields = span_fields
        self._trace_span_maps = trace_span_maps
        self._trace_keys = trace_keys
        self._trajectory = trajectory
        self._feedback = feedback
        self._negative_below = negative_below
        self.judges = judges
        self._variables: dict[str, Any] = {}

    @lazy_property
    def folded(self) -> set[str]:
        """Vendor SDK spans recording a call an instrumentation span of the trace records too: the trajectory, the
        trace's sums and span-scope evaluators count the call once, on the instrumentation's span."""
        return counted_once(self.spans)[0]

    @lazy_property
    def source_ids(self) -> dict[str, tuple[str, str]]:
        """For traces a pull receiver imported from a tool whose ids are not OTel ids (`evalsi.source.trace_id`,
        `evalsi.source.span_id`): span id -> the trace's and the span's ids there. Empty for every other trace."""
        out: dict[str, tuple[str, str]] = {}
        for s in self.spans:
            trace = s.attributes.get(SOURCE_TRACE_ID)
            if trace is not None:
                out[s.span_id] = (str(trace), str(s.attributes.get(SOURCE_SPAN_ID, "")))
        return out

    @lazy_property
    def session_id(self) -> str:
        if self.root.session_id:
            return self.root.session_id
        return next((s.session_id for s in self.spans if s.session_id), None) or ""

    @lazy_property
    def duration_ns(self) -> int:
        start = self.spans[0].start_time_unix_nano
        return max(0, max(s.end_time_unix_nano for s in self.spans) - start)

    @lazy_property
    def run_ids(self) -> tuple[str, int, str]:
        """(run id, trial, task id) from harness spans' `evalsi.*` attributes; empty for production traces."""
        for span in (self.root, *self.spans):
            a = span.attributes
            if "evalsi.run_id" in a:
                try:
                    trial = int(a.get("evalsi.trial", 0))
                except (TypeError, ValueError):
                    trial = 0
                return str(a["evalsi.run_id"]), trial, str(a.get("evalsi.task_id", ""))
        return "", 0, ""

    def variable(self, name: str) -> Any:
        value = self._variables.get(name)
        if value is None:
            value = self._variables[name] = getattr(self, f"_build_{name}")()
        return value

    def _build_trace(self) -> dict[str, Any]:
        keys = self._trace_keys
        trace = cel.trace_activation(
            self.spans, self.trace_id, self._trace_fields, span_maps=self._trace_span_maps, keys=keys
        )["trace"]
        if keys is None or "error" in keys:
            trace["error"] = any(s.status_code == "ERROR" for s in self.spans)
        if keys is None or "steps" in keys:
            trace["steps"] = dict(Counter(s.step_type for s in self.spans))
        return trace

    def _build_span(self) -> dict[str, Any]:
        return cel.span_activation(self.root, self._span_fields)["span"]

    def _build_resource(self) -> dict[str, Any]:
        return self.root.resource_attributes

    def _build_session(self) -> dict[str, Any]:
        return {"id": self.session_id or None}

    def _build_feedback(self) -> dict[str, Any]:
        return feedback_variable(self._feedback, self._negative_below)

    @property
    def trajectory(self) -> dict[str, Any]:
        if self._trajectory is None:
            self._trajectory = build_trajectory(self.spans)
        return self._trajectory

    @lazy_property
    def context(self) -> list[str]:
        """Retrieved documents' text, from retriever spans, for evaluators that require `context`."""
        return documents_text(self.spans)

    @lazy_property
    def target(self) -> Target:
        # the trajectory is built only if an evaluator reads it (Target.trajectory is lazy)
        trajectory = self._trajectory if self._trajectory is not None else FROM_SPANS
        # the documents' texts are gathered only if an evaluator reads them. Not `lambda: self.context`: the view
        # holds its target, so that would be a reference cycle, and every evaluated trace's spans would wait for
        # the garbage collector (10% of a busy worker's CPU, and their memory meanwhile)
        return Target(self.spans, span=self.root, trajectory=trajectory, context=partial(documents_text, self.spans),
                      judges=self.judges)  # fmt: skip


class SessionView(TraceView):
    """A session's spans: `trace` aggregates every span of the session, `span` is its first trace's root, and
    `session` has `id`, `trace_ids`, `trace_count`, `span_count`, `duration_ns`, `error`, `llm_calls`,
    `tool_calls`. Its scores belong to the first trace's root span (a stable key when a session is re-evaluated)."""

    is_session = True

    def _build_session(self) -> dict[str, Any]:
        trace_ids = list(dict.fromkeys(s.trace_id for s in self.spans))
        return {
            "id": self.session_id or None,
            "trace_ids": trace_ids,
            "trace_count": len(trace_ids),
            "span_count": len(self.spans),
            "duration_ns": self.duration_ns,
            "error": any(s.status_code == "ERROR" for s in self.spans),
            "llm_calls": sum(1 for s in self.spans if s.step_type == "llm" and s.span_id not in self.folded),
            "tool_calls": sum(1 for s in self.spans if s.step_type == "tool"),
        }


def documents_text(spans: Sequence[Span]) -> list[str]:
    """The text of every document in the spans' `details["documents"]`, in span order (`TraceView.context`)."""
    return [
        d["content"]
        for s in spans
        for d in s.details.get("documents") or ()
        if isinstance(d, dict) and isinstance(d.get("content"), str)
    ]
