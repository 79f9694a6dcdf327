"""The `prometheus` exporter: scores as Prometheus metrics on an endpoint of their own, with trace exemplars."""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram, make_asgi_app
from prometheus_client.core import Exemplar, GaugeMetricFamily, Metric
from prometheus_client.validation import _validate_exemplar
from prometheus_client.values import MutexValue
from pydantic import Field, field_validator

from evalsi.auth.asgi_gate import gate
from evalsi.component import ComponentConfig, Refused, Settings, exporter
from evalsi.duration import Duration
from evalsi.model.score import Outcome, Score, ScoreBatch
from evalsi.policies.intervals import mean_interval, wilson_interval
from evalsi.runtime.ports import PROMETHEUS_ENDPOINT, parse_endpoint

if TYPE_CHECKING:
    from evalsi.runtime.serving import AsgiServer

CONFIDENCE = 0.95
SERIES = ["policy", "evaluator", "name"]
OUTCOMES = get_args(Outcome)
_GROUPED_FROM = 4
"""A batch, and a label set within one, of fewer scores is recorded a score at a time (`PrometheusExporter.record`):
a group's fixed cost is that of three or four scores."""
# scores are mostly 0..1; the wide buckets keep counts and latencies in ms from landing all in +Inf
DEFAULT_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 10.0, 100.0, 1_000.0, 10_000.0)


class PrometheusConfig(ComponentConfig):
    endpoint: str = PROMETHEUS_ENDPOINT
    window: Duration = 300.0
    max_series: int = Field(default=10_000, gt=0)
    buckets: tuple[float, ...] = DEFAULT_BUCKETS

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        parse_endpoint(v)  # raises naming the endpoint
        return v

    def listeners(self) -> dict[str, str]:
        """The scrape endpoint (for the `auth` rule on reachable listeners)."""
        return {"endpoint": self.endpoint}

    @field_validator("window")
    @classmethod
    def _window(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("window must be longer than 0s, e.g. 5m")
        return v

    @field_validator("buckets")
    @classmethod
    def _buckets(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or list(v) != sorted(set(v)):
            raise ValueError("buckets must be a non-empty list of increasing upper bounds")
        return v


@dataclass(slots=True)
class _Window:
    """One series' scored outcomes in one tumbling window: Welford mean and variance of values, pass counts."""

    start: float
    value_n: int = 0
    value_mean: float = 0.0
    m2: float = 0.0
    value_min: float = math.inf
    value_max: float = -math.inf
    value_binary: int = 0  # values that are 0 or 1
    pass_n: int = 0
    passed: int = 0

    def add(self, score: Score) -> None:
        value = score.value
        if value is not None and math.isfinite(value):
            self.value_min = min(self.value_min, value)
            self.value_max = max(self.value_max, value)
            self.value_binary += value in (0.0, 1.0)
            self.value_n += 1
            delta = value - self.value_mean
            self.value_mean += delta / self.value_n
            self.m2 += delta * (value - self.value_mean)
        if score.passed is not None:
            self.pass_n += 1
            self.passed += bool(score.passed)

    def summary(self) -> tuple[int, float | None, tuple[float, float] | None]:
        """n, mean and interval: the mean value with an interval within what the values can be when the score has
        values (`intervals.mean_interval`: Wilson, t clamped to [0, 1], log-t or t), else the pass rate with a
        Wilson interval (as the policy windows do)."""
        if self.value_n:
            sd = math.sqrt(self.m2 / (self.value_n - 1)) if self.value_n > 1 else 0.0
            interval, _ = mean_interval(
                self.value_n, self.value_mean, sd, minimum=self.value_min, maximum=self.value_max,
                binary=self.value_binary, confidence=CONFIDENCE,
            )  # fmt: skip
            return self.value_n, self.value_mean, interval
        if self.pass_n:
            return self.pass_n, self.passed / self.pass_n, wilson_interval(self.passed, self.pass_n, CONFIDENCE)
        return 0, None, None


class _WindowCollector:
    """Exposes every series' current window at scrape time; a series whose window has closed reports n=0."""

    def __init__(self, owner: PrometheusExporter) -> None:
        self._owner = owner

    def collect(self) -> Iterator[Metric]:
        mean = GaugeMetricFamily(
            "evalsi_policy_window_mean", "Mean score value (or pass rate) in the current window.", labels=SERIES
        )
        lower = GaugeMetricFamily(
            "evalsi_policy_window_lower",
            "Lower bound of the 95% interval of the window mean (within the values' bounds: Wilson, t in [0, 1], "
            "log-t or t, as the policy windows; Wilson for pass rates).",
            labels=SERIES,
        )
        upper = GaugeMetricFamily(
            "evalsi_policy_window_upper",
            "Upper bound of the 95% interval of the window mean (within the values' bounds: Wilson, t in [0, 1], "
            "log-t or t, as the policy windows; Wilson for pass rates).",
            labels=SERIES,
        )
        count = GaugeMetricFamily(
            "evalsi_policy_window_n", "Scored outcomes counted in the current window.", labels=SERIES
        )
        owner = self._owner
        current = owner.window_start(owner.clock())
        with owner.lock:
            windows = list(owner.windows.items())
        for key, window in windows:
            labels = list(key)
            if window.start != current:
                count.add_metric(labels, 0)
                continue
            n, m, interval = window.summary()
            count.add_metric(labels, n)
            if m is not None:
                mean.add_metric(labels, m)
            if interval is not None:
                lower.add_metric(labels, interval[0])
                upper.add_metric(labels, interval[1])
        yield from (mean, lower, upper, count)


@exporter("prometheus", config=PrometheusConfig, signals=("scores",))
class PrometheusExporter:
    """Each batch of scores updates in-memory metrics as it arrives (no I/O, so no queue: ingest never waits on a
    scrape);
    Prometheus scrapes them from `endpoint`. Label sets are (policy, evaluator, name), at most `max_series`."""

    def __init__(self, config: PrometheusConfig, settings: Settings) -> None:
        self._config = config
        self._log = settings.logger
        self._settings = settings
        m, cid = settings.metrics, settings.id
        self._sent = m.counter("evalsi_exporter_sent_scores", "Scores the exporter delivered.", ["exporter"]).labels(
            cid
        )
        self._failed = m.counter(
            "evalsi_exporter_send_failed_scores", "Scores the exporter gave up on.", ["exporter"]
        ).labels(cid)
        self.clock: Callable[[], float] = time.time
        self.lock = threading.Lock()
        self.windows: dict[tuple[str, str, str], _Window] = {}
        self._series: set[tuple[str, str, str]] = set()
        self._children: dict[tuple[str, str, str], _Children] = {}
        # label sets whose verdict and judge counters exist at 0 (see _start_at_zero); at most max_series
        self._verdicts: set[tuple[str, str, str]] = set()
        self._judges: set[tuple[str, str]] = set()
        self._stopping = False
        self._server: AsgiServer | None = None
        self.endpoint = config.endpoint

        r = self.registry = CollectorRegistry()
        outcome_labels = [*SERIES, "outcome"]
        self._scores = Counter(
            "evalsi_scores", "Scores by outcome (scored, skipped, error).", outcome_labels, registry=r
        )
        self._value = Histogram(
            "evalsi_score_value", "Values of scored outcomes; exemplars carry the trace.", SERIES,
            buckets=config.buckets, registry=r,
        )  # fmt: skip
        self._passed = Counter("evalsi_score_passed", "Scored outcomes that passed.", SERIES, registry=r)
        self._failed_scores = Counter("evalsi_score_failed", "Scored outcomes that failed.", SERIES, registry=r)
        judge = ["policy", "evaluator"]
        self._judge_tokens = Counter("evalsi_judge_tokens", "Tokens judges used (input + output).", judge, registry=r)
        self._judge_cost = Counter("evalsi_judge_cost_usd", "USD spent on judges.", judge, registry=r)
        self._budget = Counter(
            "evalsi_judge_budget_exhausted", "Judgments skipped because a judge budget was spent.", judge, registry=r
        )
        self._dropped = Counter(
            "evalsi_prometheus_series_dropped",
            "Scores not recorded because their (policy, evaluator, name) would pass max_series.",
            registry=r,
        )
        r.register(_WindowCollector(self))  # type: ignore[arg-type]

    def window_start(self, now: float) -> float:
        w = self._config.window
        return math.floor(now / w) * w

    async def start(self) -> None:
        app = make_asgi_app(self.registry)

        async def metrics_only(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope.get("type") == "http" and scope.get("path") == "/metrics":
                await app(scope, receive, send)
                return
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"scrape /metrics\n"})

        auth = self._settings.auth
        needs_key = auth is not None and auth.needs_key("metrics", self._config.endpoint)
        from evalsi.runtime.serving import AsgiServer  # here: uvicorn is ~11 MB, and a pipeline worker serves nothing

        self._server = AsgiServer(
            gate(metrics_only, auth, surface="prometheus") if needs_key else metrics_only, self._config.endpoint
        )
        self.endpoint = self._server.endpoint
        await self._server.start()
        self._log.info("prometheus exporter listening", extra={"endpoint": self.endpoint})

    async def consume_scores(self, batch: ScoreBatch) -> None:
        if self._stopping:
            raise Refused("the collector is shutting down", unavailable=True, retry_after=5)
        recorded, dropped = self.record(batch.scores, self.clock())
        if recorded:
            self._sent.inc(recorded)
        if dropped:
            self._failed.inc(dropped)
            self._dropped.inc(dropped)

    def record(self, scores: list[Score], now: float) -> tuple[int, int]:
        """The metrics of a batch of scores: (recorded, dropped past `max_series`). The same metrics, exemplars
        and windows as `_record` one score at a time, in order (tests/exporters/test_prometheus_batched.py), with
        one update a label set and metric instead of one a score: a label set whose metric children all exist
        already is recorded as a group (`_record_group`); the others (new label sets, a first verdict or value, an
        unknown outcome) one score at a time, in batch order, so children are created in the same order."""
        if len(scores) < _GROUPED_FROM:
            recorded = sum(1 for score in scores if self._record(score, now))
            return recorded, len(scores) - recorded
        groups: dict[tuple[str, str, str], list[Score]] = {}
        for key, score in zip(map(_series_key, scores), scores, strict=True):
            group = groups.get(key)
            if group is None:
                groups[key] = [score]
            else:
                group.append(score)
        ready: list[tuple[_Children, list[Score]]] = []
        slow: set[tuple[str, str, str]] = set()
        for key, group in groups.items():
            children = self._children.get(key)
            if children is None or len(group) < _GROUPED_FROM or not children.takes(group, self.windows):
                slow.add(key)
            else:
                ready.append((children, group))
        recorded = dropped = 0
        if slow:
            for score in scores:
                key = _series_key(score)
                if key not in slow:
                    continue
                if self._record_series(score, key, now):
                    recorded += 1
                else:
                    dropped += 1
        start = self.window_start(now)
        for children, group in ready:
            self._record_group(children, group, start)
            recorded += len(group)
        # judge counters, in batch order: their sums add floats, and several names share a (policy, evaluator)
        children_of = self._children
        for score in scores:
            if (score.source == "llm_judge" or score.reason == "budget exhausted") and (
                _series_key(score) in children_of
            ):
                self._record_judge(score)
        return recorded, dropped

    def _record(self, score: Score, now: float) -> bool:
        """One score's metrics (what `record` does for a batch); False when its label set passes `max_series`."""
        key = _series_key(score)
        if not self._record_series(score, key, now):
            return False
        self._record_judge(score)
        return True

    def _record_judge(self, score: Score) -> None:
        judge = (score.policy, score.evaluator)
        if score.source == "llm_judge":
            if judge not in self._judges:  # at 0 first (see _start_at_zero)
                self._judges.add(judge)
                for counter in (self._judge_tokens, self._judge_cost, self._budget):
                    counter.labels(*judge)
            if score.judge_cost_usd:
                self._judge_cost.labels(*judge).inc(score.judge_cost_usd)
            tokens = _tokens(score.metadata)
            if tokens:
                self._judge_tokens.labels(*judge).inc(tokens)
        if score.outcome == "skipped" and score.reason == "budget exhausted":
            self._budget.labels(*judge).inc()

    def _record_series(self, score: Score, key: tuple[str, str, str], now: float) -> bool:
        children = self._children.get(key)
        if children is None:
            if len(self._series) >= self._config.max_series:
                return False
            self._series.add(key)
            # every outcome at 0 (see _start_at_zero); each series' children looked up once, not per score
            children = self._children[key] = _Children(
                key, {outcome: self._scores.labels(*key, outcome) for outcome in OUTCOMES}
            )
        self._start_at_zero(score, key)
        outcome = children.outcomes.get(score.outcome)
        (outcome if outcome is not None else self._scores.labels(*key, score.outcome)).inc()
        if score.outcome != "scored":
            return True  # only scored outcomes count in values, verdicts and windows
        if score.value is not None and math.isfinite(score.value):
            if children.value is None:
                children.value = self._value.labels(*key)
            children.value.observe(score.value, exemplar=_exemplar(score))
        if score.passed is not None:
            if children.passed is None:  # created together (see _start_at_zero)
                children.passed, children.failed = self._passed.labels(*key), self._failed_scores.labels(*key)
            (children.passed if score.passed else children.failed).inc()
        self._add_to_window(key, self.window_start(now), (score,))
        return True

    def _record_group(self, children: _Children, group: list[Score], start: float) -> None:
        """Scores of one label set whose metric children all exist (`_Children.takes`), in batch order."""
        scored = [s for s in group if s.outcome == "scored"]
        outcomes = children.outcomes
        if len(scored) == len(group):
            outcomes["scored"].inc(len(group))
        else:
            counts: dict[str, int] = {}
            for s in group:
                counts[s.outcome] = counts.get(s.outcome, 0) + 1
            for outcome, n in counts.items():
                outcomes[outcome].inc(n)
        if not scored:
            return
        finite = [s for s in scored if s.value is not None and math.isfinite(s.value)]
        if finite:
            _observe_all(children.value, finite)
        verdicts = [s.passed for s in scored if s.passed is not None]
        if verdicts:
            passed = sum(1 for v in verdicts if v)
            if passed:
                children.passed.inc(passed)
            if passed < len(verdicts):
                children.failed.inc(len(verdicts) - passed)
        self._add_to_window(children.key, start, scored)

    def _add_to_window(self, key: tuple[str, str, str], start: float, scored: Iterable[Score]) -> None:
        """Scored outcomes into the label set's window starting at `start` (a new one when it has moved on)."""
        with self.lock:
            window = self.windows.get(key)
            if window is None or window.start != start:
                window = self.windows[key] = _Window(start)
            for s in scored:
                window.add(s)

    def _start_at_zero(self, score: Score, key: tuple[str, str, str]) -> None:
        """Exposes at 0 the counters a label set may move (outcomes from its first score, passed/failed from its first
        verdict, judge counters from its first judge score). A series that first appears at 1 shows no increase, so
        Prometheus' rate() and increase() would miss, e.g., a policy's first failure."""
        if score.passed is not None and key not in self._verdicts:
            self._verdicts.add(key)
            self._passed.labels(*key)
            self._failed_scores.labels(*key)

    async def shutdown(self) -> None:
        """Nothing is held between scores; stop serving the endpoint."""
        self._stopping = True
        if self._server is not None:
            await self._server.stop()
            self._server = None


@dataclass(slots=True)
class _Children:
    """One (policy, evaluator, name) series' metric children."""

    key: tuple[str, str, str]
    outcomes: dict[str, Any]
    value: Any = None
    passed: Any = None
    failed: Any = None

    def takes(self, group: list[Score], windows: dict[tuple[str, str, str], _Window]) -> bool:
        """Whether `group` (scores of this series) moves only children and a window that exist: it creates no
        child, so recording it as a group keeps the order in which children (and windows) appear."""
        if not {s.outcome for s in group} <= self.outcomes.keys():
            return False  # an outcome outside `Outcome`: its child is made on the spot
        if self.passed is None and any(s.passed is not None for s in group):
            return False
        if self.key not in windows or self.value is None:
            scored = [s for s in group if s.outcome == "scored"]
            if scored and self.key not in windows:
                return False
            if self.value is None and any(s.value is not None and math.isfinite(s.value) for s in scored):
                return False
        return True


_series_key: Callable[[Score], tuple[str, str, str]] = attrgetter("policy", "evaluator", "name")


def _observe_all(histogram: Any, scores: list[Score]) -> None:
    """`histogram.observe(s.value, exemplar=_exemplar(s))` for each score, in order, with one update a bucket: the
    same counts, the same sum (added in the same order) and, per bucket, the exemplar of its last observation that
    has one (its timestamp: now). Through prometheus_client's private fields (`_upper_bounds`, `_buckets`, `_sum`
    and `MutexValue`'s `_value` and `_lock`; tests/exporters/test_prometheus_batched.py checks they are there);
    one at a time where they are not as expected (multiprocess mode)."""
    total = getattr(histogram, "_sum", None)
    if type(total) is not MutexValue:
        for s in scores:
            histogram.observe(s.value, exemplar=_exemplar(s))
        return
    bounds, buckets = histogram._upper_bounds, histogram._buckets
    counts: dict[int, int] = {}
    last: dict[int, int] = {}
    at = [bisect_left(bounds, s.value) for s in scores]
    for n, i in enumerate(at):
        counts[i] = counts.get(i, 0) + 1
        last[i] = n
    with total._lock:
        value = total._value
        for s in scores:
            value += s.value  # type: ignore[operator]
        total._value = value
    for i, count in counts.items():
        buckets[i].inc(count)
    stamp = time.time()
    for i, n in last.items():
        exemplar = _exemplar(scores[n])
        while exemplar is None and n > 0:  # the bucket's latest observation that has one
            n -= 1
            if at[n] == i:
                exemplar = _exemplar(scores[n])
        if exemplar:
            _validate_exemplar(exemplar)
            buckets[i].set_exemplar(Exemplar(exemplar, scores[n].value, stamp))


def _tokens(metadata: dict[str, Any]) -> int:
    total = 0
    for key in ("input_tokens", "output_tokens"):
        value = metadata.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            total += int(value)
    return total


def _exemplar(score: Score) -> dict[str, str] | None:
    """The trace (and span) a value came from; OpenMetrics caps an exemplar's labels at 128 characters."""
    exemplar = {"trace_id": score.trace_id}
    if score.span_id:
        exemplar["span_id"] = score.span_id
    if not score.trace_id or sum(len(k) + len(v) for k, v in exemplar.items()) > 128:
        return None
    return exemplar
