"""Running the online policies over completed traces and sessions, in file order (`PolicySet`): each policy's
decision (`policy.Policy`), the scores, windows and alerts they raise, the datasets they promote, the late feedback
that gives a policy a second look, and what a policy reload carries over.

The conditions (`conditions.py`) and the view of a trace they read (`trace_view.py`) live beside this module; one
policy in `policy.py`; the windows and alerts in `window.py`.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from evalsi.evaluators.judge_client import Judges
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.policies.baseline import Baselines
from evalsi.policies.conditions import AlertRule
from evalsi.policies.feedback import NEGATIVE_BELOW
from evalsi.policies.notify import AlertEvent
from evalsi.policies.policy import Policy, PolicyDecision, PolicyStats
from evalsi.policies.promote import Datasets, StoreDatasets
from evalsi.policies.trace_view import SessionView, TraceView
from evalsi.policies.window import PolicyWindow, RecordingWindow, WindowRecord, WindowStats

__all__ = ["PolicySet"]


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
