"""Running the online policies over a completed trace or session: select, sample, cascade, window, alert, promote.

For each policy, in file order: the CEL `selector` over the trace; sampling by a hash of the trace id (so every
replica decides alike), unless an `always` condition holds; then the cascade in order, each stage's `when` seeing
the earlier stages' `scores`. A stage whose `when` does not hold emits no score; it is counted in
`PolicyStats.when_not_met`. Scores go into the policy's window, alerts are checked over it, and traces matching
`promote.when` are appended to a dataset.

Late feedback (human and external scores that arrive after a trace was evaluated) goes through `evaluate_late`: the
policies whose conditions name `feedback` get a second look at the trace, with what they decided the first time
(`PolicyDecision`) so that nothing runs or counts twice.

`SCHEMA` is what the conditions' variables hold, made from the views that build them; a condition that reads a field
they do not have is refused as it compiles (`Condition`), never at evaluation.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from evalsi import cel
from evalsi.evaluators import Evaluator, Params, Target, run
from evalsi.evaluators.base import FROM_SPANS
from evalsi.evaluators.judge_client import Judges
from evalsi.ids import SOURCE_SPAN_ID, SOURCE_TRACE_ID
from evalsi.policies.feedback import NEGATIVE_BELOW, feedback_variable
from evalsi.policies.intervals import percentile
from evalsi.policies.notify import AlertEvent
from evalsi.policies.promote import Datasets, record
from evalsi.policies.window import AlertRule, PolicyWindow, WindowStats
from evalsi.score import Score
from evalsi.span import Span, project_of
from evalsi.trajectory import build_trajectory, counted_once

__all__ = [
    "ALWAYS_VARIABLES", "SCHEMA", "SCORE_SHAPE", "TRACE_VARIABLES", "WHEN_VARIABLES", "Condition", "LatencyAbove",
    "Policy", "PolicyDecision", "PolicySet", "PolicyStats", "Stage", "TraceView", "sampling_hash",
]  # fmt: skip

TRACE_VARIABLES = ("trace", "span", "resource", "session")
"""What selectors see."""
ALWAYS_VARIABLES = (*TRACE_VARIABLES, "feedback")
"""What `always` conditions see: the trace and its late feedback."""
WHEN_VARIABLES = (*ALWAYS_VARIABLES, "scores")
"""What cascade `when` and `promote.when` see."""
SPAN_VARIABLES = ("span",)

_SALT = b"evalsi.policy"
_TWO_64 = 2**64
_LATENCY_MIN_TRACES = 20
_LATENCY_RECENT = 1000


def sampling_hash(key: str) -> int:
    """A 64-bit hash of a trace (or session) id, the same in every process: BLAKE2b keyed apart from the
    tail sampler's FNV hash, so a policy's sample is independent of what tail sampling kept."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8, person=_SALT).digest(), "big")


def _uses(source: str, variables: Iterable[str]) -> tuple[str, ...]:
    return tuple(v for v in variables if re.search(rf"(?<![\w.]){v}\b", source))


class Condition:
    """A compiled CEL condition; only the variables it names are built and handed to CEL. A field its variables do
    not have (`SCHEMA`) is refused here, at load, with a did-you-mean (`cel.FieldError`)."""

    __slots__ = ("program", "source", "uses")

    def __init__(self, source: str, variables: Iterable[str]) -> None:
        variables = tuple(variables)
        self.source = source
        self.program = cel.compile(source, variables, SCHEMA)  # ValueError with CEL's message, or FieldError
        self.uses = _uses(source, variables)

    @property
    def fields(self) -> frozenset[str]:
        return self.program.fields

    @property
    def reads_feedback(self) -> bool:
        return "feedback" in self.uses

    def matches(self, view: TraceView, scores: dict[str, Any] | None = None) -> bool:
        data = {v: (scores if scores is not None else {}) if v == "scores" else view.variable(v) for v in self.uses}
        return self.program.matches(data)

    def matches_span(self, span: Span) -> bool:
        return self.program.matches(cel.span_activation(span, self.program.fields))

    def __repr__(self) -> str:
        return f"Condition({self.source!r})"


class LatencyAbove:
    """`always: [latency > p95]`: the trace took longer than the given percentile of the policy's last 1,000
    selected traces (false until 20 have been seen)."""

    __slots__ = ("_ordered", "_recent", "q", "source")
    uses = ()

    def __init__(self, source: str, q: float) -> None:
        self.source = source
        self.q = q
        self._recent: deque[int] = deque()
        self._ordered: list[int] = []

    def matches(self, view: TraceView, scores: dict[str, Any] | None = None) -> bool:
        if len(self._ordered) < _LATENCY_MIN_TRACES:
            return False
        threshold = percentile(self._ordered, self.q)  # type: ignore[arg-type]
        return threshold is not None and view.duration_ns > threshold

    def observe(self, duration_ns: int) -> None:
        if len(self._recent) >= _LATENCY_RECENT:
            old = self._recent.popleft()
            del self._ordered[bisect.bisect_left(self._ordered, old)]
        self._recent.append(duration_ns)
        bisect.insort(self._ordered, duration_ns)


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

    @cached_property
    def folded(self) -> set[str]:
        """Vendor SDK spans recording a call an instrumentation span of the trace records too: the trajectory, the
        trace's sums and span-scope evaluators count the call once, on the instrumentation's span."""
        return counted_once(self.spans)[0]

    @cached_property
    def source_ids(self) -> dict[str, tuple[str, str]]:
        """For traces a pull receiver imported from a tool whose ids are not OTel ids (`evalsi.source.trace_id`,
        `evalsi.source.span_id`): span id -> the trace's and the span's ids there. Empty for every other trace."""
        out: dict[str, tuple[str, str]] = {}
        for s in self.spans:
            trace = s.attributes.get(SOURCE_TRACE_ID)
            if trace is not None:
                out[s.span_id] = (str(trace), str(s.attributes.get(SOURCE_SPAN_ID, "")))
        return out

    @cached_property
    def session_id(self) -> str:
        if self.root.session_id:
            return self.root.session_id
        return next((s.session_id for s in self.spans if s.session_id), None) or ""

    @cached_property
    def duration_ns(self) -> int:
        start = self.spans[0].start_time_unix_nano
        return max(0, max(s.end_time_unix_nano for s in self.spans) - start)

    @cached_property
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

    @cached_property
    def context(self) -> list[str]:
        """Retrieved documents' text, from retriever spans, for evaluators that require `context`."""
        return [
            d["content"]
            for s in self.spans
            for d in s.details.get("documents") or ()
            if isinstance(d, dict) and isinstance(d.get("content"), str)
        ]

    @cached_property
    def target(self) -> Target:
        # the trajectory is built only if an evaluator reads it (Target.trajectory is lazy)
        trajectory = self._trajectory if self._trajectory is not None else FROM_SPANS
        return Target(self.spans, span=self.root, trajectory=trajectory, context=self.context, judges=self.judges)


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


@dataclass
class Stage:
    """One cascade stage: an evaluator with validated params, its `when`, and (span scope) its span filter."""

    ref: str
    key: str
    evaluator: Evaluator
    params: Params
    when: Condition | None = None
    spans: Callable[[Span], bool] | None = None

    @property
    def scope(self) -> str:
        return self.evaluator.scope

    def run(self, view: TraceView) -> list[Score]:
        ev = self.evaluator
        if ev.scope != "span":
            scores = run(ev, view.target, self.params)
            for s in scores:
                s.span_id = s.span_id or view.root.span_id
            return scores
        chosen = self.spans or _is_llm
        out: list[Score] = []
        for span in view.spans:
            if not chosen(span) or span.span_id in view.folded:
                continue
            target = Target([span], span=span, context=view.context, judges=view.judges)
            for s in run(ev, target, self.params):
                s.span_id = span.span_id
                out.append(s)
        if not out:
            skipped = Score.skipped(ev.name.rsplit("/", 1)[-1], "no matching spans")
            skipped.evaluator, skipped.evaluator_version = ev.name, ev.version
            skipped.span_id = view.root.span_id
            out.append(skipped)
        return out


def _source_ids(score: Score, view: TraceView) -> None:
    """`source_trace_id` / `source_span_id` in the score's metadata: the ids of its trace and span in the tool a
    pull receiver imported them from, for the exporter that writes the score back there."""
    ids = view.source_ids
    trace, span = ids.get(score.span_id) or next(iter(ids.values()))
    score.metadata["source_trace_id"] = trace
    if score.span_id in ids and span:
        score.metadata["source_span_id"] = span


def _is_llm(span: Span) -> bool:
    return span.step_type == "llm"


def _summary(scores: list[Score]) -> dict[str, Any]:
    """What a later `when` sees of one score name: the score itself, or for several (span scope) their summary:
    scored if any is, passed only if every scored verdict passed, the mean scored value."""
    if len(scores) == 1:
        s = scores[0]
        return {"passed": s.passed, "value": s.value, "label": s.label, "outcome": s.outcome, "reason": s.reason,
                "n": 1}  # fmt: skip
    scored = [s for s in scores if s.outcome == "scored"]
    if not scored:
        first = scores[0]
        return {"passed": None, "value": None, "label": None, "outcome": first.outcome, "reason": first.reason,
                "n": len(scores)}  # fmt: skip
    verdicts = [s.passed for s in scored if s.passed is not None]
    values = [s.value for s in scored if s.value is not None]
    return {
        "passed": all(verdicts) if verdicts else None,
        "value": sum(values) / len(values) if values else None,
        "label": next((s.label for s in scored if s.label is not None), None),
        "outcome": "scored",
        "reason": None,
        "n": len(scores),
    }


def _schema() -> dict[str, cel.Shape]:
    """The shapes of what conditions see, from the views and summaries built over a one-span trace (so they are
    what the code builds): `trace` (with `error` and `steps`), `session` (a trace's and a session's keys), `feedback`
    and each `scores` entry are closed; `resource`, attribute maps, `trace.steps` and `feedback.scores` are open."""
    span = Span("", "", "", "", "", 0, 0)
    trace, session = TraceView([span]), SessionView([span])
    return {
        "trace": cel.closed("trace", trace.variable("trace"), cel.TRACE_SHAPE.fields),
        "span": cel.SPAN_SHAPE,
        "resource": None,
        "session": cel.closed("session", {**trace.variable("session"), **session.variable("session")}),
        "feedback": cel.closed("feedback", trace.variable("feedback")),
        "scores": cel.Entries(SCORE_SHAPE),
    }


SCORE_SHAPE = cel.closed("a score", _summary([Score("", 0.0)]))
"""What `scores[name]` holds in a `when` (`_summary`)."""
SCHEMA = _schema()
"""The shapes of the variables policy conditions (and `--where`) see, checked when a condition compiles."""


@dataclass
class PolicyStats:
    """Counters of one policy (traces and sessions alike), for tests, metrics and `evalsi policies stats`."""

    seen: int = 0
    """Traces (sessions) the policy looked at."""
    selected: int = 0
    """...whose selector held."""
    sampled: int = 0
    """...that were then evaluated (by the rate or an `always` condition)."""
    sampled_always: int = 0
    """...of which an `always` condition brought in."""
    sampled_late: int = 0
    """...of which late feedback brought in (`evaluate_late`): counted in `sampled` and `sampled_always`, and no
    longer in `not_sampled`."""
    not_sampled: int = 0
    when_not_met: Counter[str] = field(default_factory=Counter)
    """Per stage key: traces where the stage's `when` did not hold, so it did not run and emitted nothing."""
    stage_runs: Counter[str] = field(default_factory=Counter)
    scores: Counter[str] = field(default_factory=Counter)
    """Scores produced, by outcome."""
    promoted: int = 0
    promote_duplicates: int = 0
    promote_no_content: int = 0
    alerts: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {f: (dict(v) if isinstance(v, Counter) else v) for f, v in self.__dict__.items()}


@dataclass
class Promotion:
    when: Condition
    path: Path


@dataclass
class PolicyDecision:
    """What one policy did with one selected trace, kept for the late path: whether it evaluated the trace, the
    scores of each cascade stage that ran (by stage index), the stages whose `when` did not hold, and whether
    promotion was tried. Late feedback runs only what has not run, so scores and counters never double."""

    admitted: bool
    ran: dict[int, list[Score]] = field(default_factory=dict)
    gated: set[int] = field(default_factory=set)
    promoted: bool = False


class Policy:
    """One loaded OnlineEvalPolicy, compiled."""

    def __init__(
        self,
        name: str,
        *,
        stages: list[Stage],
        selector: Condition | None = None,
        rate: float = 1.0,
        always: list[Condition | LatencyAbove] | None = None,
        window: float = 300.0,
        alerts: list[AlertRule] | None = None,
        promote: Promotion | None = None,
        labels: dict[str, str] | None = None,
        source: str = "",
        alert_check_interval: float = 1.0,
    ) -> None:
        self.name = name
        self.labels = dict(labels or {})
        self.source = source
        self.selector = selector
        self.rate = rate
        self.threshold = _TWO_64 if rate >= 1 else math.floor(rate * _TWO_64)
        self.always = list(always or [])
        self.latency = [a for a in self.always if isinstance(a, LatencyAbove)]
        self.trace_stages = [s for s in stages if s.scope != "session"]
        self.session_stages = [s for s in stages if s.scope == "session"]
        self.stages = stages
        self.promote = promote
        self.window = PolicyWindow(name, window, list(alerts or []), self.labels, alert_check_interval)
        self.stats = PolicyStats()
        self.feedback_always = [a for a in self.always if isinstance(a, Condition) and a.reads_feedback]
        self.late = any(c.reads_feedback for c in self.conditions())
        """Whether late feedback can change what this policy does with a trace (some condition names `feedback`)."""

    def conditions(self) -> list[Condition]:
        found = [c for c in (self.selector, *self.always) if isinstance(c, Condition)]
        found += [s.when for s in self.stages if s.when is not None]
        if self.promote is not None:
            found.append(self.promote.when)
        return found

    def sampled(self, key: str) -> bool:
        return sampling_hash(key) < self.threshold

    def _admit(self, view: TraceView, key: str) -> bool | None:
        """Whether to evaluate the trace; None when the selector leaves it out."""
        st = self.stats
        st.seen += 1
        if self.selector is not None and not self.selector.matches(view):
            return None
        st.selected += 1
        admitted = self.sampled(key)
        if not admitted:
            for condition in self.always:
                if condition.matches(view):
                    admitted = True
                    st.sampled_always += 1
                    break
        if not view.is_session:  # a session's length says nothing of its traces' latency
            for rule in self.latency:
                rule.observe(view.duration_ns)
        if admitted:
            st.sampled += 1
        else:
            st.not_sampled += 1
        return admitted

    def _cascade(
        self, view: TraceView, stages: list[Stage], now: float, decision: PolicyDecision
    ) -> tuple[list[Score], dict[str, Any]]:
        """Run the stages not in `decision.ran` whose `when` holds; stages that ran before only feed `scores`."""
        st = self.stats
        out: list[Score] = []
        seen: dict[str, Any] = {}
        keys: set[str] = set()
        run_id, trial, task_id = view.run_ids
        stamp = int(now * 1e9)
        for i, stage in enumerate(stages):
            produced = decision.ran.get(i)
            if produced is None:
                if stage.when is not None and not stage.when.matches(view, seen):
                    if i not in decision.gated:  # a trace is counted once, however often feedback re-checks it
                        decision.gated.add(i)
                        st.when_not_met[stage.key] += 1
                    continue
                if i in decision.gated:
                    decision.gated.discard(i)
                    st.when_not_met[stage.key] -= 1
                st.stage_runs[stage.key] += 1
                produced = decision.ran[i] = stage.run(view)
                for s in produced:
                    s.trace_id = view.trace_id
                    s.project = view.project
                    if view.source_ids:  # where the score goes back to in the tool the trace came from
                        _source_ids(s, view)
                    s.session_id = s.session_id or view.session_id
                    s.policy = self.name
                    if run_id and not s.run_id:
                        s.run_id, s.trial, s.task_id = run_id, trial, task_id
                    s.timestamp_unix_nano = stamp
                    st.scores[s.outcome] += 1
                out.extend(produced)
            by_name: dict[str, list[Score]] = {}
            for s in produced:
                by_name.setdefault(s.name, []).append(s)
            # a stage's key (its `name:`, else the ref's last part) always names its own scores; a score name
            # names its scores unless an earlier stage already goes by it
            for name, group in by_name.items():
                if name not in keys:
                    seen[name] = _summary(group)
            if produced:
                seen[stage.key] = _summary(by_name.get(stage.key) or by_name[produced[0].name])
            keys.add(stage.key)
        return out, seen

    def evaluate(
        self,
        view: TraceView,
        now: float,
        stages: list[Stage],
        datasets: Datasets | None,
        key: str,
        decisions: dict[str, PolicyDecision] | None = None,
    ) -> tuple[list[Score], list[AlertEvent]]:
        """Select, sample, run the cascade. With `decisions`, a policy that reads `feedback` records what it did
        with a trace it selected, for `evaluate_late`."""
        if not stages:
            return [], []
        admitted = self._admit(view, key)
        decision = PolicyDecision(bool(admitted))
        if decisions is not None and self.late and admitted is not None:
            decisions[self.name] = decision
        if not admitted:
            return [], []
        return self._run(view, now, stages, datasets, decision, new_trace=True)

    def evaluate_late(
        self, view: TraceView, now: float, datasets: Datasets | None, decision: PolicyDecision
    ) -> tuple[list[Score], list[AlertEvent]]:
        """A second look at a trace this policy selected, now that `view` carries feedback: an `always` condition
        on `feedback` may bring it in (the cascade then runs), stages whose `when` did not hold may now run, and
        `promote.when` is checked again. Only what has not run before runs; only new scores are returned."""
        new_trace = False
        if not decision.admitted:
            if not any(c.matches(view) for c in self.feedback_always):
                return [], []
            decision.admitted = new_trace = True
            st = self.stats
            st.not_sampled -= 1
            st.sampled += 1
            st.sampled_always += 1
            st.sampled_late += 1
        return self._run(view, now, self.trace_stages, datasets, decision, new_trace=new_trace)

    def _run(
        self,
        view: TraceView,
        now: float,
        stages: list[Stage],
        datasets: Datasets | None,
        decision: PolicyDecision,
        *,
        new_trace: bool,
    ) -> tuple[list[Score], list[AlertEvent]]:
        scores, seen = self._cascade(view, stages, now, decision)
        fired: list[AlertEvent] = []
        if new_trace or scores:
            # a trace counts once in `count`; late scores land in the window open when they are produced
            self.window.add(view.trace_id, scores, new_trace=new_trace)
            fired = self.window.check(now)
            self.stats.alerts += len(fired)
        if (
            datasets is not None
            and self.promote is not None
            and not decision.promoted
            and self.promote.when.matches(view, seen)
        ):
            decision.promoted = True
            self._promote(view, [s for group in decision.ran.values() for s in group], datasets, now)
        return scores, fired

    def _promote(self, view: TraceView, scores: list[Score], datasets: Datasets, now: float) -> None:
        assert self.promote is not None
        target = view.target
        if target.input_text is None and target.output_text is None:
            self.stats.promote_no_content += 1
            return
        trace = view.root
        metadata = {
            "project": project_of(trace),
            "service_name": trace.service_name or None,
            "session_id": view.session_id or None,
            "models": list(dict.fromkeys(s.model for s in view.spans if s.model)),
            "labels": self.labels,
        }
        row = record(
            trace_id=view.trace_id, input=target.input_text, output=target.output_text, policy=self.name,
            scores=scores, metadata=metadata, reference=target.reference or None, now=now,
        )  # fmt: skip
        if datasets.append(self.promote.path, row):
            self.stats.promoted += 1
        else:
            self.stats.promote_duplicates += 1


@dataclass(slots=True)
class WindowRecord:
    """What a pipeline worker's policy put in its window for one trace: sent to the collector process, whose windows
    see every worker's traces (so alerts fire once, over all of them)."""

    policy: str
    trace_id: str
    new_trace: bool
    scores: list[Score]
    shed: bool = False


class RecordingWindow:
    """Stands for a policy's window in a pipeline worker: records what would be added, aggregates nothing."""

    def __init__(self, policy: str, sink: list[WindowRecord]) -> None:
        self.policy = policy
        self.sink = sink

    def add(self, trace_id: str, scores: Iterable[Score], *, new_trace: bool = True) -> None:
        self.sink.append(WindowRecord(self.policy, trace_id, new_trace, list(scores)))

    def add_shed(self, trace_id: str) -> None:
        self.sink.append(WindowRecord(self.policy, trace_id, False, [], shed=True))

    def check(self, now: float, final: bool = False) -> list[AlertEvent]:
        return []

    def roll(self, now: float) -> tuple[list[WindowStats], list[AlertEvent]]:
        return [], []

    def take_resolved(self) -> list[AlertEvent]:
        return []

    def snapshot(self) -> list[WindowStats]:
        return []


class PolicySet:
    """The loaded policies. `evaluate_trace` / `evaluate_session` return scores; alerts that fired, alerts that
    resolved and windows that closed wait in `drain_alerts()` / `drain_resolved()` / `drain_windows()` for the
    caller to send or store."""

    def __init__(
        self,
        policies: list[Policy],
        *,
        datasets_dir: Path | None = None,
        sources: list[str] | None = None,
        judges: Judges | None = None,
    ) -> None:
        self.policies = policies
        self.judges = judges
        """The judge runtime every Target the policies evaluate carries (None: judge-based evaluators skip)."""
        self.by_name = {p.name: p for p in policies}
        self.datasets_dir = datasets_dir
        self.sources = list(sources or [])
        self.datasets = Datasets()
        self._alerts: deque[AlertEvent] = deque(maxlen=10_000)
        self._resolved: deque[AlertEvent] = deque(maxlen=10_000)
        self._windows: deque[WindowStats] = deque(maxlen=100_000)
        conditions = [c for p in policies for c in p.conditions()]
        # `span` maps carry the fields of the conditions that use `span`; `trace.spans` / `trace.root` are built
        # only for conditions that read them, with those conditions' fields
        trace_users = [c for c in conditions if "trace" in c.uses]
        trace_span_users = [c for c in trace_users if c.program.trace_spans]
        self._trace_span_maps = bool(trace_span_users)
        self._trace_fields = frozenset().union(*(c.fields for c in trace_span_users))
        # when no condition uses `trace` as a whole, `trace` carries only the keys the conditions name
        self._trace_keys = None if trace_span_users else frozenset().union(*(c.program.names for c in trace_users))
        self._span_fields = frozenset().union(*(c.fields for c in conditions if "span" in c.uses))
        self._has_trace_stages = any(p.trace_stages for p in policies)
        self._has_session_stages = any(p.session_stages for p in policies)
        self.late = [p for p in policies if p.late and p.trace_stages]
        """The policies late feedback can change (some condition names `feedback`)."""
        self.negative_below = NEGATIVE_BELOW
        """Numeric feedback below this is negative (`feedback.negative`), at or above it positive."""

    def __len__(self) -> int:
        return len(self.policies)

    @property
    def stats(self) -> dict[str, PolicyStats]:
        return {p.name: p.stats for p in self.policies}

    def _roll(self, now: float) -> list[WindowStats]:
        closed_all: list[WindowStats] = []
        for p in self.policies:
            closed, fired = p.window.roll(now)
            closed_all.extend(closed)
            self._alerts.extend(fired)
            p.stats.alerts += len(fired)
            self._resolved.extend(p.window.take_resolved())
        self._windows.extend(closed_all)
        return closed_all

    def _view(
        self,
        cls: type[TraceView],
        spans: list[Span],
        trajectory: dict[str, Any] | None,
        feedback: Sequence[Score] = (),
    ) -> TraceView:
        return cls(
            spans,
            trace_fields=self._trace_fields,
            span_fields=self._span_fields,
            trajectory=trajectory,
            trace_span_maps=self._trace_span_maps,
            trace_keys=self._trace_keys,
            feedback=feedback,
            negative_below=self.negative_below,
            judges=self.judges,
        )

    def evaluate_trace(
        self,
        spans: list[Span],
        *,
        trajectory: dict[str, Any] | None = None,
        now: float | None = None,
        feedback: Sequence[Score] = (),
        decisions: dict[str, PolicyDecision] | None = None,
    ) -> list[Score]:
        """Every policy's trace- and span-scope stages over one completed trace; `now` (epoch seconds) places the
        scores in their windows. `feedback` is what is already known of the trace's human and external scores
        (usually nothing yet). A `decisions` dict is filled, for each policy in `late` that selected the trace,
        with what it did: keep it with the spans and hand both to `evaluate_late` when feedback arrives."""
        now = time.time() if now is None else now
        self._roll(now)
        if not spans or not self._has_trace_stages:
            return []
        view = self._view(TraceView, spans, trajectory, feedback)
        out: list[Score] = []
        datasets = self.datasets if self.datasets_dir is not None else None
        for p in self.policies:
            scores, fired = p.evaluate(view, now, p.trace_stages, datasets, view.trace_id, decisions)
            out.extend(scores)
            self._alerts.extend(fired)
        return out

    def evaluate_late(
        self,
        spans: list[Span],
        feedback: Sequence[Score],
        decisions: dict[str, PolicyDecision],
        *,
        now: float | None = None,
    ) -> list[Score]:
        """The late path: feedback (every human and external score known for the trace, in arrival order) arrived
        for a trace `evaluate_trace` saw, with the `decisions` it filled. Each policy in `decisions` looks again
        (`Policy.evaluate_late`); returns only scores that did not exist before, with the keys they would have
        had online. `decisions` is updated, so calling again with more feedback never repeats work."""
        now = time.time() if now is None else now
        self._roll(now)
        if not spans or not decisions:
            return []
        view = self._view(TraceView, spans, None, feedback)
        out: list[Score] = []
        datasets = self.datasets if self.datasets_dir is not None else None
        for p in self.late:
            decision = decisions.get(p.name)
            if decision is None:
                continue
            scores, fired = p.evaluate_late(view, now, datasets, decision)
            out.extend(scores)
            self._alerts.extend(fired)
        return out

    def evaluate_session(self, spans: list[Span], *, now: float | None = None) -> list[Score]:
        """Every policy's session-scope stages over the spans of one completed session; sampled by session id."""
        now = time.time() if now is None else now
        self._roll(now)
        if not spans or not self._has_session_stages:
            return []
        view = self._view(SessionView, spans, None)
        key = view.session_id or view.trace_id
        out: list[Score] = []
        for p in self.policies:
            scores, fired = p.evaluate(view, now, p.session_stages, None, key)
            out.extend(scores)
            self._alerts.extend(fired)
        return out

    def close_windows(self, now: float | None = None) -> list[WindowStats]:
        """Close the windows that ended by `now` (a timer calls this when traffic is quiet), and check the alerts
        of open windows that changed since their last check (a check skipped within `check_interval` happens
        here); returns what closed, which is also left for `drain_windows()`. `now=math.inf` closes every window
        (shutdown)."""
        now = time.time() if now is None else now
        closed = self._roll(now)
        if math.isfinite(now):
            for p in self.policies:
                fired = p.window.check(now)
                p.stats.alerts += len(fired)
                self._alerts.extend(fired)
        return closed

    def windows(self) -> list[WindowStats]:
        """The open windows' aggregates, every policy, evaluator and score name."""
        return [w for p in self.policies for w in p.window.snapshot()]

    def record_windows(self) -> None:
        """In a pipeline worker: windows record what they would aggregate (`drain_window_records`) for the
        collector process's windows (`observe`)."""
        self._records: list[WindowRecord] = []
        for p in self.policies:
            p.window = RecordingWindow(p.name, self._records)  # type: ignore[assignment]

    def drain_window_records(self) -> list[WindowRecord]:
        records = getattr(self, "_records", None)
        if not records:
            return []
        n = len(records)  # records appended meanwhile (another thread) stay for the next drain
        out = records[:n]
        del records[:n]
        return out

    def shed(self, trace_id: str) -> None:
        """Evaluation shed a trace: every policy's window counts it (`window.shed`)."""
        for p in self.policies:
            p.window.add_shed(trace_id)

    def observe(self, records: Iterable[WindowRecord], now: float | None = None) -> None:
        """In the collector process: put what the workers' policies did in the windows, check the alerts."""
        now = time.time() if now is None else now
        self._roll(now)
        touched: dict[str, Policy] = {}
        for r in records:
            p = self.by_name.get(r.policy)
            if p is None:
                continue
            if r.shed:
                p.window.add_shed(r.trace_id)
                continue
            p.window.add(r.trace_id, r.scores, new_trace=r.new_trace)
            touched[p.name] = p
        for p in touched.values():
            fired = p.window.check(now)
            p.stats.alerts += len(fired)
            self._alerts.extend(fired)

    def drain_alerts(self) -> list[AlertEvent]:
        out = list(self._alerts)
        self._alerts.clear()
        return out

    def drain_resolved(self) -> list[AlertEvent]:
        """Alerts that stopped firing: a window closed in which their condition did not hold (`state: resolved`)."""
        out = list(self._resolved)
        self._resolved.clear()
        return out

    def carry_over(self, old: PolicySet) -> list[str]:
        """After a reload: each policy with the same name, window length and alerts as one of `old` keeps its open
        window (and counts), so a reload does not reset what alerts see; what `old` has not handed out yet (alerts
        fired, windows closed) is handed out from here. Returns the names of the policies that kept their window."""
        kept = []
        for p in self.policies:
            before = old.by_name.get(p.name)
            if before is None or isinstance(p.window, RecordingWindow) or isinstance(before.window, RecordingWindow):
                continue  # (a pipeline worker's windows only record: the collector process's hold the counts)
            if before.window.seconds != p.window.seconds:
                continue
            rules = [(a.name, a.condition, a.notify) for a in p.window.alerts]
            if rules != [(a.name, a.condition, a.notify) for a in before.window.alerts]:
                continue
            before.window.alerts = p.window.alerts  # the same rules, compiled afresh
            p.window = before.window
            p.stats = before.stats
            kept.append(p.name)
        taken = {id(p.window) for p in self.policies}
        for before in old.policies:  # a window left behind: its firing alerts can no longer resolve
            if isinstance(before.window, PolicyWindow) and id(before.window) not in taken:
                self._resolved.extend(before.window.resolve_all())
        self._alerts.extend(old._alerts)
        self._resolved.extend(old._resolved)
        self._windows.extend(old._windows)
        if hasattr(self, "_records"):
            self._records.extend(getattr(old, "_records", []))
        return kept

    def drain_windows(self) -> list[WindowStats]:
        out = list(self._windows)
        self._windows.clear()
        return out
