"""One online policy over a completed trace or session: its selector, sampling, the cascade of stages (each
stage's `when` seeing the earlier stages' `scores`), its window and what it promotes; and what it decided, so late
feedback (`evaluate_late`) runs nothing twice.

For each trace: the CEL `selector`; sampling by a hash of the trace id (so every replica decides alike), unless an
`always` condition holds; then the cascade in order. A stage whose `when` does not hold emits no score; it is
counted in `PolicyStats.when_not_met`. The set of policies a processor runs is `engine.PolicySet`.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalsi.evaluators import Evaluator, Params, Target, run
from evalsi.model.score import Score
from evalsi.model.span import Span, project_of
from evalsi.policies.conditions import AlertRule, Condition, LatencyAbove, score_summary
from evalsi.policies.notify import AlertEvent
from evalsi.policies.promote import Datasets, StoreDatasets, record
from evalsi.policies.trace_view import TraceView
from evalsi.policies.window import PolicyWindow

__all__ = ["Policy", "PolicyDecision", "PolicyStats", "Promotion", "Stage", "sampling_hash"]

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
        self._reads_scores = promote is not None or any(s.when is not None for s in stages)
        """Whether a `when` (a stage's, or `promote.when`) may read `scores`: else the cascade keeps no summaries."""

    def conditions(self) -> list[Condition]:
        found = [c for c in (self.selector, *self.always) if isinstance(c, Condition)]
        found += [s.when for s in self.stages if s.when is not None]
        if self.promote is not None:
            found.append(self.promote.when)
        return found

    def sampled(self, key: str) -> bool:
        # every 64-bit hash is below 2**64: at rate 1 the hash is not worked out
        return self.threshold >= _TWO_64 or sampling_hash(key) < self.threshold

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
            if not self._reads_scores:
                continue
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
