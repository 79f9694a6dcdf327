"""Running the online policies over a completed trace or session: select, sample, cascade, window, alert, promote.

For each policy, in file order: the CEL `selector` over the trace; sampling by a hash of the trace id (so every
replica decides alike), unless an `always` condition holds; then the cascade in order, each stage's `when` seeing
the earlier stages' `scores`. A stage whose `when` does not hold emits no score; it is counted in
`PolicyStats.when_not_met`. Scores go into the policy's window, alerts are checked over it, and traces matching
`promote.when` are appended to a dataset.

Late feedback (human and external scores that arrive after a trace was evaluated) goes through `evaluate_late`: the
policies whose conditions name `feedback` get a second look at the trace, with what they decided the first time
(`PolicyDecision`) so that nothing runs or counts twice.

The conditions (`conditions.py`) and the view of a trace they read (`trace_view.py`) live beside this module; the
windows and alerts in `window.py`.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalsi.evaluators import Evaluator, Params, Target, run
from evalsi.evaluators.judge_client import Judges
from evalsi.model.score import Score
from evalsi.model.span import Span, project_of
from evalsi.policies.baseline import Baselines
from evalsi.policies.conditions import AlertRule, Condition, LatencyAbove, score_summary
from evalsi.policies.feedback import NEGATIVE_BELOW
from evalsi.policies.notify import AlertEvent
from evalsi.policies.promote import Datasets, StoreDatasets, record
from evalsi.policies.trace_view import SessionView, TraceView
from evalsi.policies.window import PolicyWindow, RecordingWindow, WindowRecord, WindowStats

__all__ = ["Policy", "PolicyDecision", "PolicySet", "PolicyStats", "Promotion", "Stage", "sampling_hash"]

_SALT = b"evalsi.policy"
_TWO_64 = 2**64


def sampling_hash(key: str) -> int:
    """A 64-bit hash of a trace (or session) id, the same in every process: BLAKE2b keyed apart from the
    tail sampler's FNV hash, so a policy's sample is independent of what tail sampling kept."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8, person=_SALT).digest(), "big")


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
    dataset: str = ""
    """The dataset as the policy names it (`promote.dataset`): its name in the store (`promote_to: store`)."""


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
        interval: str = "fixed",
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
        self.window = PolicyWindow(name, window, list(alerts or []), self.labels, alert_check_interval, interval)
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
                    seen[name] = score_summary(group)
            if produced:
                seen[stage.key] = score_summary(by_name.get(stage.key) or by_name[produced[0].name])
            keys.add(stage.key)
        return out, seen

    def evaluate(
        self,
        view: TraceView,
        now: float,
        stages: list[Stage],
        datasets: Datasets | StoreDatasets | None,
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
        self, view: TraceView, now: float, datasets: Datasets | StoreDatasets | None, decision: PolicyDecision
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
        datasets: Datasets | StoreDatasets | None,
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

    def _promote(self, view: TraceView, scores: list[Score], datasets: Datasets | StoreDatasets, now: float) -> None:
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
        if datasets.append(self.promote.path, row, dataset=self.promote.dataset):
            self.stats.promoted += 1
        else:
            self.stats.promote_duplicates += 1


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
        self.datasets: Datasets | StoreDatasets = Datasets()
        """Where promoted rows go: JSONL files, or (`promote_to: store`) the store, through `StoreDatasets`."""
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

    def detach_alerts(self) -> dict[str, tuple[float, list[AlertRule], dict[str, str]]]:
        """For windows read from the store (`store_window`): each policy's window length, alert rules and labels;
        this process's windows keep their aggregates but check no alert from now on."""
        out = {}
        for p in self.policies:
            if isinstance(p.window, PolicyWindow):
                out[p.name] = (p.window.seconds, p.window.alerts, p.labels)
                p.window.alerts = []
        return out

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
            if before.window.seconds != p.window.seconds or before.window.interval != p.window.interval:
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

    # --- baselines of `regressed(...)` ----------------------------------------------------------------------------

    def use_baselines(self, baselines: Baselines | None) -> None:
        """Where every policy's window reads the baselines of its `regressed(...)` alerts."""
        for p in self.policies:
            if isinstance(p.window, PolicyWindow):
                p.window.baselines = baselines

    def drain_windows(self) -> list[WindowStats]:
        out = list(self._windows)
        self._windows.clear()
        return out
