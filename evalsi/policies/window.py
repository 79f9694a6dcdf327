"""Tumbling windows of scores per policy, evaluator and score name, and the alerts checked over them (the alert
conditions themselves are in `conditions.py`); in a pipeline worker, a window that only records what it is given.

Only `scored` scores count toward n, means, intervals and percentiles (skipped and error scores are counted
beside them). A window closes when time passes its end; an alert fires at most once per window per condition, and
stays firing until a window closes in which it did not fire (then it resolves).

A window's intervals are `fixed` (valid for one look: Wilson, t) or, with `interval: anytime`, confidence sequences
(valid however often the alerts look: `sequences.BoundedMeanSequence`) for pass rates and values within [0, 1].
`regressed(...)` compares the window with a baseline read through `baseline.Baselines`.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from evalsi.model.score import Score
from evalsi.policies.baseline import Baselines, Regression
from evalsi.policies.compare import Comparison, Sample, compare
from evalsi.policies.conditions import AlertRule, spelled_values, window_variable
from evalsi.policies.intervals import mean_interval, percentile, wilson_interval
from evalsi.policies.notify import AlertEvent
from evalsi.policies.sequences import BoundedMeanSequence

__all__ = ["PolicyWindow", "RecordingWindow", "Series", "WindowRecord", "WindowStats"]

RESERVOIR = 10_000
"""Values kept per series and window for percentiles; past it, a uniform sample of this size (reservoir)."""
EXAMPLES = 5
CONFIDENCE = 0.95
ANYTIME = "eb-cs"
"""The `method` of an anytime-valid interval: the empirical-Bernstein confidence sequence."""


@dataclass(slots=True)
class WindowStats:
    """The aggregate of one score series over one window.

    `mean`/`low`/`high` are the headline: the mean value with an interval within the values' bounds when the score
    has values (`method`: see `intervals.mean_interval`), else the pass rate with a Wilson interval (`kind` says
    which). `pass_*` is the pass rate whenever the score has a verdict; `p50`/`p95` are over values. Intervals are
    None below the observations they need.
    """

    policy: str
    evaluator: str
    name: str
    start: float
    end: float
    kind: str  # "numeric" or "pass_fail"
    n: int
    mean: float | None
    low: float | None
    high: float | None
    pass_n: int
    passed: int
    pass_rate: float | None
    pass_low: float | None
    pass_high: float | None
    p50: float | None
    p95: float | None
    skipped: int
    errors: int
    example_trace_ids: list[str] = field(default_factory=list)
    shed: int = 0
    """Traces the policy would have looked at in this window but evaluation shed (`overload: shed`)."""
    method: str = ""
    """How `low`/`high` were found: `wilson`, `t[0,1]`, `log-t` or `t` (`intervals.mean_interval`)."""
    project: str = ""
    """The project of a window read from the store (`store_window`); a process's windows hold every project's."""

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


class Series:
    """Running aggregates of one (evaluator, score name) in one window: Welford mean/variance, pass counts, a
    reservoir of values for percentiles and a few example trace ids (failures first)."""

    __slots__ = (
        "_rng", "_sorted", "errors", "evaluator", "examples", "failures", "m2", "n", "name", "pass_n", "passed",
        "seen_values", "sequences", "skipped", "value_binary", "value_max", "value_mean", "value_min", "value_n",
        "values",
    )  # fmt: skip

    def __init__(self, evaluator: str, name: str, *, anytime: bool = False) -> None:
        self.evaluator = evaluator
        self.name = name
        self.n = self.value_n = self.pass_n = self.passed = self.skipped = self.errors = self.seen_values = 0
        self.value_binary = 0  # values that are 0 or 1
        self.value_mean = self.m2 = 0.0
        self.value_min = math.inf
        self.value_max = -math.inf
        self.values: list[float] = []
        self._sorted: list[float] | None = None
        self._rng: random.Random | None = None
        self.examples: deque[str] = deque(maxlen=EXAMPLES)
        self.failures: deque[str] = deque(maxlen=EXAMPLES)
        self.sequences: dict[str, BoundedMeanSequence] | None = None
        """With `interval: anytime`: confidence sequences of the values (while all lie in [0, 1]) and of the verdicts,
        at the window's level and at half its alpha (for `regressed`)."""
        if anytime:
            alpha = 1 - CONFIDENCE
            self.sequences = {
                "value": BoundedMeanSequence(alpha), "value/2": BoundedMeanSequence(alpha / 2),
                "pass": BoundedMeanSequence(alpha), "pass/2": BoundedMeanSequence(alpha / 2),
            }  # fmt: skip

    def add(self, score: Score) -> None:
        if score.outcome != "scored":
            if score.outcome == "skipped":
                self.skipped += 1
            else:
                self.errors += 1
            return
        self.n += 1
        value = score.value
        if value is not None and math.isfinite(value):
            self.value_n += 1
            delta = value - self.value_mean
            self.value_mean += delta / self.value_n
            self.m2 += delta * (value - self.value_mean)
            self.value_min = min(self.value_min, value)
            self.value_max = max(self.value_max, value)
            self.value_binary += value in (0, 1)
            self._keep(float(value))
            if self.sequences is not None and self.value_min >= 0 and self.value_max <= 1:
                self.sequences["value"].add(value)
                self.sequences["value/2"].add(value)
        if score.passed is not None:
            if self.sequences is not None:
                self.sequences["pass"].add(1.0 if score.passed else 0.0)
                self.sequences["pass/2"].add(1.0 if score.passed else 0.0)
            self.pass_n += 1
            if score.passed:
                self.passed += 1
            elif score.trace_id:
                self.failures.append(score.trace_id)
        if score.trace_id:
            self.examples.append(score.trace_id)

    def _keep(self, value: float) -> None:
        self.seen_values += 1
        self._sorted = None
        if len(self.values) < RESERVOIR:
            self.values.append(value)
            return
        if self._rng is None:
            self._rng = random.Random(0)  # deterministic: the same scores give the same percentiles
        j = self._rng.randrange(self.seen_values)
        if j < RESERVOIR:
            self.values[j] = value

    @property
    def ordered(self) -> list[float]:
        if self._sorted is None:
            self._sorted = sorted(self.values)
        return self._sorted

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.pass_n if self.pass_n else None

    @property
    def mean(self) -> float | None:
        """The mean value; for a score with verdicts only, the pass rate."""
        if self.value_n:
            return self.value_mean
        return self.pass_rate

    def percentile(self, q: float) -> float | None:
        return percentile(self.ordered, q)

    def _anytime(self, kind: str, half: bool = False) -> tuple[float, float] | None:
        """The confidence sequence's interval of the values (`value`) or verdicts (`pass`); None without one (a fixed
        window, no observation, or values outside [0, 1])."""
        if self.sequences is None:
            return None
        if kind == "value" and (self.value_min < 0 or self.value_max > 1):
            return None
        found = self.sequences[f"{kind}/2" if half else kind]
        return (float(found.low), float(found.high)) if found.n else None

    def interval(self) -> tuple[tuple[float, float] | None, str]:
        """The headline's interval and its method: the mean value's when the score has values, else the pass
        rate's; a confidence sequence's (`eb-cs`) in an anytime window, where it applies."""
        if self.value_n:
            anytime = self._anytime("value")
            if anytime is not None:
                return anytime, ANYTIME
            sd = math.sqrt(max(self.m2, 0.0) / (self.value_n - 1)) if self.value_n > 1 else 0.0
            return mean_interval(
                self.value_n, self.value_mean, sd, minimum=self.value_min, maximum=self.value_max,
                binary=self.value_binary, confidence=CONFIDENCE,
            )  # fmt: skip
        return self.pass_interval()

    def pass_interval(self) -> tuple[tuple[float, float] | None, str]:
        anytime = self._anytime("pass")
        if anytime is not None:
            return anytime, ANYTIME
        return wilson_interval(self.passed, self.pass_n, CONFIDENCE), "wilson"

    def sample(self) -> Sample:
        """What `compare` needs of this series."""
        sd = math.sqrt(max(self.m2, 0.0) / (self.value_n - 1)) if self.value_n > 1 else 0.0
        return Sample(
            value_n=self.value_n, value_mean=self.value_mean, value_sd=sd, value_binary=self.value_binary,
            value_min=self.value_min if self.value_n else None, value_max=self.value_max if self.value_n else None,
            pass_n=self.pass_n, passed=self.passed,
        )  # fmt: skip

    def anytime_half(self) -> tuple[float, float] | None:
        """The headline's confidence sequence at half the window's alpha (for `regressed` in an anytime window)."""
        return self._anytime("value" if self.value_n else "pass", half=True)

    def example_ids(self) -> list[str]:
        return list(dict.fromkeys([*self.failures, *self.examples]))[:EXAMPLES]

    def stats(self, policy: str, start: float, end: float) -> WindowStats:
        rate = self.pass_rate
        wilson, _ = self.pass_interval()
        interval, method = self.interval()
        kind, mean = ("numeric", self.value_mean) if self.value_n else ("pass_fail", rate)
        return WindowStats(
            policy=policy, evaluator=self.evaluator, name=self.name, start=start, end=end, kind=kind, n=self.n,
            mean=mean, low=interval[0] if interval else None, high=interval[1] if interval else None,
            pass_n=self.pass_n, passed=self.passed, pass_rate=rate,
            pass_low=wilson[0] if wilson else None, pass_high=wilson[1] if wilson else None,
            p50=self.percentile(50), p95=self.percentile(95), skipped=self.skipped, errors=self.errors,
            example_trace_ids=self.example_ids(), method=method,
        )  # fmt: skip


_BODY_FIELDS = (
    "evaluator", "kind", "n", "mean", "low", "high", "method", "pass_rate", "pass_low", "pass_high", "p50", "p95"
)  # fmt: skip


class PolicyWindow:
    """The current tumbling window of one policy: its series, trace count and alert state.

    Windows are aligned to multiples of their length since the epoch, so replicas agree on their bounds.
    """

    def __init__(
        self,
        policy: str,
        seconds: float,
        alerts: list[AlertRule],
        labels: dict[str, str] | None = None,
        check_interval: float = 1.0,
        interval: str = "fixed",
    ) -> None:
        self.policy = policy
        self.seconds = seconds
        self.interval = interval
        """`fixed` or `anytime` (confidence sequences, valid however often the alerts look)."""
        self.baselines: Baselines | None = None
        """Where `regressed(...)` reads its baselines (None: no store, so it never holds)."""
        self.comparisons: dict[str, tuple[Regression, Comparison]] = {}
        """The latest comparison of each `regressed(...)` term, by its key (for metrics)."""
        self.alerts = alerts
        self.labels = dict(labels or {})
        self.check_interval = check_interval
        self.start: float | None = None
        self.firing: dict[int, AlertEvent] = {}
        """The rules firing (by index), each with its latest event: they fired in this window or the last."""
        self.resolved: list[AlertEvent] = []
        """Resolutions not yet taken (`take_resolved`)."""
        self._reset()

    def _reset(self) -> None:
        self.count = 0
        self.shed = 0
        self.trace_ids: deque[str] = deque(maxlen=EXAMPLES)
        self.series: dict[tuple[str, str], Series] = {}
        self.by_name: dict[str, Series] = {}
        self.fired: set[int] = set()
        self.last_check = -math.inf
        self.dirty = False

    @property
    def end(self) -> float:
        return (self.start or 0.0) + self.seconds

    def roll(self, now: float) -> tuple[list[WindowStats], list[AlertEvent]]:
        """Close the window if `now` is past its end (a last alert check first); open the one `now` is in."""
        if self.start is None and not math.isfinite(now):
            return [], []
        if self.start is not None and now < self.end:
            return [], []
        closed: list[WindowStats] = []
        fired: list[AlertEvent] = []
        if self.start is not None and (self.count or self.series):  # series alone: late scores
            fired = self.check(self.end, final=True)
            closed = self.snapshot()
        if self.start is not None and math.isfinite(now):  # (at shutdown the window did not run its course)
            for i in [i for i in self.firing if i not in self.fired]:
                self.resolved.append(self._resolution(self.firing.pop(i)))
        # now = inf (shutdown) closes the window without opening another
        self.start = math.floor(now / self.seconds) * self.seconds if math.isfinite(now) else None
        self._reset()
        return closed, fired

    def add(self, trace_id: str, scores: Iterable[Score], *, new_trace: bool = True) -> None:
        """Count one evaluated trace (or session) and its scores in the current window; `new_trace=False` adds
        more scores of a trace already counted (late feedback ran a stage that had not run)."""
        self.dirty = True
        if new_trace:
            self.count += 1
            if trace_id:
                self.trace_ids.append(trace_id)
        for s in scores:
            key = (s.evaluator, s.name)
            series = self.series.get(key)
            if series is None:
                series = self.series[key] = Series(s.evaluator, s.name, anytime=self.interval == "anytime")
                self.by_name.setdefault(s.name, series)
            series.add(s)

    def _aggregate(self, key: str, name: str) -> float | int | None:
        series = self.by_name.get(name)
        if series is None or not series.n:
            return None  # no data: the key is missing, so the condition cannot hold
        if key == "mean":
            return series.mean
        if key == "rate":
            return series.pass_rate
        if key == "n":
            return series.n
        if key in ("low", "high"):
            found, _ = series.interval()
            return None if found is None else found[key == "high"]
        return series.percentile(float(key[1:]))

    def compare(self, regression: Regression) -> Comparison | None:
        """The current window against `regression`'s baseline; None without both (no scores yet, or the baseline
        not read yet)."""
        series = self.by_name.get(regression.name)
        if series is None or not series.n or self.baselines is None or self.start is None:
            return None
        baseline = self.baselines.sample(self.policy, regression, self.start)
        if baseline is None:
            return None
        anytime = series.anytime_half() if self.interval == "anytime" else None
        found = compare(
            series.sample(), baseline, margin=regression.margin, worse=regression.worse, confidence=CONFIDENCE,
            current_interval=anytime, method=ANYTIME if anytime is not None else None,
        )  # fmt: skip
        if found is not None:
            self.comparisons[regression.key] = (regression, found)
        return found

    def _activation(self, rule: AlertRule) -> dict[str, Any]:
        window = window_variable(rule, self.count, self.shed, self.by_name, self._aggregate)
        for regression in rule.regressions:
            found = self.compare(regression)
            if found is not None:  # not known: the key is missing, so the condition cannot hold
                window["regressed"][regression.key] = found.regressed
        return {"window": window}

    def check(self, now: float, final: bool = False) -> list[AlertEvent]:
        """Evaluate the alerts not yet fired in this window; at most once per `check_interval` unless final."""
        if not self.alerts or not self.dirty or (not final and now - self.last_check < self.check_interval):
            return []
        self.last_check = now
        self.dirty = False
        fired: list[AlertEvent] = []
        for i, rule in enumerate(self.alerts):
            if i in self.fired or not rule.program.matches(self._activation(rule)):
                continue
            self.fired.add(i)
            fired.append(self._event(rule, now))
            self.firing[i] = fired[-1]
        return fired

    def take_resolved(self) -> list[AlertEvent]:
        out, self.resolved = self.resolved, []
        return out

    def resolve_all(self) -> list[AlertEvent]:
        """The window is dropped (a reload removed or changed its policy's alerts): whatever fires resolves."""
        self.resolved += [self._resolution(self.firing.pop(i)) for i in list(self.firing)]
        return self.take_resolved()

    def _values(self, rule: AlertRule) -> dict[str, Any]:
        """The aggregates `rule` reads, as its condition spells them; a `regressed(...)` as its comparison: the
        difference (current - baseline), its interval, the test, the margin and whether it regressed."""
        window = self._activation(rule)["window"]
        out: dict[str, Any] = dict(spelled_values(window))
        for regression in rule.regressions:
            found = self.comparisons.get(regression.key)
            if regression.key in window["regressed"] and found is not None:
                out[regression.text] = {"score": regression.name, "baseline": regression.baseline,
                                        **found[1].as_dict()}  # fmt: skip
        return out

    def _resolution(self, fired: AlertEvent) -> AlertEvent:
        """A window closed without `fired`'s condition holding: what it read then."""
        rule = next((r for r in self.alerts if r.name == fired.alert and r.condition == fired.condition), None)
        return AlertEvent(
            policy=self.policy, alert=fired.alert, condition=fired.condition, notify=None,
            window_start=self.start or 0.0, window_end=self.end, count=self.count, aggregates={},
            example_trace_ids=[], labels=self.labels, fired_at=self.end,
            values=self._values(rule) if rule is not None else {"count": self.count}, state="resolved",
        )  # fmt: skip

    def _event(self, rule: AlertRule, now: float) -> AlertEvent:
        aggregates: dict[str, dict[str, Any]] = {}
        for key, series in self.series.items():
            # a score name two evaluators share is told apart by its evaluator after the first
            shown = series.name if self.by_name.get(series.name) is series else f"{key[0]}:{key[1]}"
            stats = series.stats(self.policy, self.start or 0.0, self.end)
            aggregates[shown] = {f: getattr(stats, f) for f in _BODY_FIELDS}
        examples: list[str] = []
        for _, name in rule.uses:
            series = self.by_name.get(name)
            if series is not None:
                examples.extend(series.example_ids())
        examples.extend(self.trace_ids)
        return AlertEvent(
            policy=self.policy, alert=rule.name, condition=rule.condition, notify=rule.notify,
            window_start=self.start or 0.0, window_end=self.end, count=self.count, aggregates=aggregates,
            example_trace_ids=list(dict.fromkeys(examples))[:EXAMPLES], labels=self.labels, fired_at=now,
            values=self._values(rule),
        )  # fmt: skip

    def snapshot(self) -> list[WindowStats]:
        if self.start is None:
            return []
        out = [s.stats(self.policy, self.start, self.end) for s in self.series.values()]
        for stats in out:
            stats.shed = self.shed
        return out

    def add_shed(self, trace_id: str) -> None:
        """A trace evaluation shed: counted in the window (`window.shed`), so its aggregates say what they miss."""
        self.shed += 1


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
