"""Windows evaluated from the store (`windows.scope: store`): each policy's window per project, read from every
replica's scores (`evalsi_scores FINAL`), with the alerts checked over it by the same rules and interval math as a
process's own windows (`window.py`)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from evalsi.policies.conditions import AlertRule
from evalsi.policies.notify import AlertEvent
from evalsi.policies.window import PolicyWindow, Series, WindowStats

__all__ = ["StoreWindows", "StoredSeries", "WindowQuery"]

WindowQuery = Callable[[str, int, int], list[dict[str, Any]]]
"""`(policy, start_ns, end_ns)` -> the store's rows of that policy's window (`TraceStore.policy_window`)."""


class StoredSeries(Series):
    """A series whose aggregates the store computed over every replica's scores: the same fields a process's
    `Series` accumulates (n, value count, mean, sum of squared deviations, bounds, pass counts), so `stats()` gives the
    same intervals; percentiles are the store's exact ones."""

    __slots__ = ("quantiles", "stored_examples")

    def __init__(self, row: dict[str, Any]) -> None:
        super().__init__(row["evaluator"], row["name"])
        self.n = row["n"]
        self.value_n = row["value_n"]
        self.pass_n, self.passed = row["pass_n"], row["passed"]
        self.skipped, self.errors = row["skipped"], row["errors"]
        self.value_binary = row["value_binary"]
        if self.value_n:
            self.value_mean = row["value_mean"]
            sd = row["value_sd"] if row["value_sd"] is not None and math.isfinite(row["value_sd"]) else 0.0
            self.m2 = sd * sd * (self.value_n - 1)
            self.value_min, self.value_max = row["value_min"], row["value_max"]
        self.quantiles: dict[float, float] = row["quantiles"]
        self.stored_examples = list(dict.fromkeys([*row["failures"], *row["examples"]]))

    def percentile(self, q: float) -> float | None:
        return self.quantiles.get(float(q)) if self.value_n else None

    def example_ids(self) -> list[str]:
        return self.stored_examples[:5]


class StoreWindow(PolicyWindow):
    """One policy's window in one project, loaded from the store at each poll rather than added to trace by trace;
    checking, firing once per window and resolving are `PolicyWindow`'s."""

    def __init__(self, project: str, policy: str, seconds: float, alerts: list[AlertRule], labels: dict[str, str]):
        super().__init__(policy, seconds, alerts, labels, check_interval=0.0)
        self.project = project

    def load(self, traces: int, rows: Iterable[dict[str, Any]]) -> None:
        """The window's aggregates as the store has them now (replacing what an earlier poll read)."""
        self.count = traces
        self.series = {}
        self.by_name = {}
        for row in rows:
            series = StoredSeries(row)
            self.series[(series.evaluator, series.name)] = series
            self.by_name.setdefault(series.name, series)
        self.trace_ids.clear()
        for series in self.series.values():
            self.trace_ids.extend(series.example_ids())
        self.dirty = True

    def _event(self, rule: AlertRule, now: float) -> AlertEvent:
        event = super()._event(rule, now)
        event.project = self.project
        return event

    def _resolution(self, fired: AlertEvent) -> AlertEvent:
        event = super()._resolution(fired)
        event.project = self.project
        return event


@dataclass
class _PolicyRules:
    seconds: float
    alerts: list[AlertRule]
    labels: dict[str, str]


class StoreWindows:
    """Every policy's store windows, by project: `poll(now, query)` reads the current window of each policy from the
    store and checks its alerts; once a window has ended and `settle` seconds passed (for the replicas' last writes to
    land), it reads it a last time, checks it finally and closes it. Windows align to multiples of their length since
    the epoch, so every replica reads the same bounds and reaches the same verdict from the same rows."""

    def __init__(self, settle: float = 2.0) -> None:
        self.settle = settle
        self._rules: dict[str, _PolicyRules] = {}
        self._windows: dict[tuple[str, str], StoreWindow] = {}  # (project, policy)
        self._start: dict[str, float] = {}  # each policy's current window start
        self._lock = threading.Lock()
        self.queries = 0
        """Store queries made (two per policy and poll at a window's close, else one)."""

    def use(self, rules: dict[str, tuple[float, list[AlertRule], dict[str, str]]]) -> list[AlertEvent]:
        """Evaluate these policies from now on (`policy -> (window seconds, alert rules, labels)`). A policy whose
        window length and alerts are unchanged keeps its windows' state; the others' firing alerts resolve."""
        resolved: list[AlertEvent] = []
        with self._lock:
            fresh = {name: _PolicyRules(s, list(a), dict(labels)) for name, (s, a, labels) in rules.items()}
            for key, window in list(self._windows.items()):
                before, after = self._rules.get(key[1]), fresh.get(key[1])
                same = (
                    before is not None and after is not None and before.seconds == after.seconds
                    and [(a.name, a.condition) for a in before.alerts] == [(a.name, a.condition) for a in after.alerts]
                )  # fmt: skip
                if same:
                    assert after is not None
                    window.alerts, window.labels = after.alerts, after.labels
                    continue
                resolved += window.resolve_all()
                del self._windows[key]
            for name in list(self._start):
                if name not in fresh or fresh[name].seconds != self._rules[name].seconds:
                    del self._start[name]
            self._rules = fresh
        return resolved

    def rules_of(self, policy: str) -> list[AlertRule]:
        """The alert rules of `policy` checked here."""
        with self._lock:
            found = self._rules.get(policy)
            return list(found.alerts) if found is not None else []

    def poll(self, now: float, query: WindowQuery) -> tuple[list[AlertEvent], list[WindowStats]]:
        """The alerts that fired or resolved (each with its `project`), and the windows that closed (their final
        figures, each with its `project`). A query's error is raised; the next poll reads again."""
        events: list[AlertEvent] = []
        closed: list[WindowStats] = []
        with self._lock:
            at = now - self.settle  # windows are evaluated `settle` behind, so a closing one has its last writes
            for name, rules in self._rules.items():
                start = math.floor(at / rules.seconds) * rules.seconds
                before = self._start.get(name)
                if before is not None and before != start:
                    self._load(name, rules, before, query)  # the ended window, a last time
                    for key in [k for k in self._windows if k[1] == name]:
                        window = self._windows[key]
                        quiet = not (window.count or window.series)
                        ended, fired = window.roll(at)
                        closed += [_in_project(s, window.project) for s in ended]
                        events += fired + window.take_resolved()
                        if quiet and not window.firing:
                            del self._windows[key]  # a quiet project's window: made again when it has scores
                self._start[name] = start
                for window in self._load(name, rules, start, query):
                    events += window.check(now, final=False)
        return events, closed

    def _load(self, name: str, rules: _PolicyRules, start: float, query: WindowQuery) -> list[StoreWindow]:
        """Read one window of policy `name` from the store into each project's window; returns them."""
        rows = query(name, int(start * 1e9), int((start + rules.seconds) * 1e9))
        self.queries += 1
        by_project: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        for row in rows:
            traces, series = by_project.setdefault(row["project"], (0, []))
            if row["evaluator"] == "" and row["name"] == "":
                by_project[row["project"]] = (row["traces"], series)
            else:
                series.append(row)
        loaded = []
        for key in [k for k in self._windows if k[1] == name and k[0] not in by_project]:
            by_project[key[0]] = (0, [])  # no scores (any more) in this window
        for project, (traces, series) in by_project.items():
            window = self._windows.get((project, name))
            if window is None:
                window = self._windows[(project, name)] = StoreWindow(
                    project, name, rules.seconds, rules.alerts, rules.labels
                )
            if window.start != start:
                window.roll(start)  # opens it (a window first seen, or a replica started mid-window)
            window.load(traces, series)
            loaded.append(window)
        return loaded

    def snapshot(self, project: str | None = None) -> list[WindowStats]:
        """The open windows' aggregates (of one project; None: of every project)."""
        with self._lock:
            return [
                _in_project(s, w.project)
                for (p, _), w in sorted(self._windows.items())
                if project is None or p == project
                for s in w.snapshot()
            ]


def _in_project(stats: WindowStats, project: str) -> WindowStats:
    stats.project = project
    return stats
