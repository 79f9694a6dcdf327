"""The evaluation queue: completed traces, quiet sessions and late feedback wait here for the one engine thread that
evaluates them (the policy engine keeps windows and budgets, so it runs single-threaded), and their scores are
handed on: to the scores pipeline, or from a pipeline worker to the collector process with the window records.

It owns the policy set in use (swapped on the engine thread by `use`) and the engine thread; everything that runs
there (the late path, closing windows, sending alerts) is called from here. Its metrics: `evalsi_evaluate_traces`,
`_scores`, `_scores_dropped`, `_traces_shed`, `_queue_size`, `_seconds`, `_freshness_seconds`."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from evalsi.component import Next, Refused, Settings
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import Span, project_of
from evalsi.policies import PolicySet, StoreWindows
from evalsi.policies.promote import StoreDatasets
from evalsi.policies.window import WindowRecord
from evalsi.processors.evaluate.alerts import Alerts
from evalsi.processors.evaluate.config import EvaluateConfig
from evalsi.processors.evaluate.late_feedback import LateFeedback

T = TypeVar("T")

ENGINE_CHUNK = 256
"""Works the engine thread takes per hand-off from the event loop."""

WorkUnit = Literal["trace", "session", "feedback"]
"""What the engine thread evaluates: a whole trace, a quiet session, or late feedback."""


@dataclass
class Work:
    """One item of the queue."""

    unit: WorkUnit
    spans: list[Span]
    completed: float  # monotonic time the trace (or session) was complete upstream, or the feedback handed to us
    feedback: list[Score] | None = None
    done: Callable[[], None] | None = None
    """Called once the work's scores are handed on (a session owned across replicas is then recorded evaluated)."""


class EvaluationQueue:
    """Bounded by `queue_size` (what waits plus what the engine thread holds); `run` is the loop that feeds the
    engine thread and hands the scores on."""

    def __init__(
        self,
        config: EvaluateConfig,
        settings: Settings,
        next: Next,
        policies: PolicySet,
        late: LateFeedback,
        alerts: Alerts,
        store_windows: StoreWindows | None = None,
        promoted: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store_windows = store_windows
        """With `windows.scope: store`: the windows read from the store, which take the policies' alerts."""
        self.store_datasets = StoreDatasets() if promoted is not None else None
        """With `promote_to: store`: promoted rows, handed to `promoted` after each evaluation."""
        self.promoted = promoted
        self.next = next
        self.queue_size = config.queue_size
        self.project = config.project
        """The project of traces that carry none."""
        self.late = late
        self.alerts = alerts
        self.policies = policies
        self.session_stages = False
        """Whether some policy evaluates whole sessions."""
        self.use(policies)
        self.stopping = False
        self._queue: deque[Work] = deque()
        self._in_engine = 0  # works handed to the engine thread and not yet done
        self._wake = asyncio.Event()
        self._engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"evalsi-{settings.id}")
        m, sid = settings.metrics, settings.id
        self._traces = m.counter(
            "evalsi_evaluate_traces", "Completed traces the policies looked at.", ["processor"]
        ).labels(sid)
        self._scores = m.counter(
            "evalsi_evaluate_scores", "Scores the policies produced, by outcome.", ["processor", "outcome"]
        )
        self._scores_by_outcome: dict[str, Any] = {}
        self._dropped_scores = m.counter(
            "evalsi_evaluate_scores_dropped", "Scores no scores pipeline would take.", ["processor"]
        ).labels(sid)
        self._shed_traces = m.counter(
            "evalsi_evaluate_traces_shed",
            "Completed traces left out of evaluation because the queue was full (`overload: shed`).",
            ["processor"],
        ).labels(sid)
        self._queue_gauge = m.gauge(
            "evalsi_evaluate_queue_size", "Traces waiting for evaluation.", ["processor"]
        ).labels(sid)
        queue = self._queue
        self._queue_gauge.set_function(lambda: len(queue))  # read when collected: no lock taken a trace
        self._latency = m.histogram(
            "evalsi_evaluate_seconds",
            "Time to evaluate one completed trace with every policy.",
            ["processor"],
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
        ).labels(sid)
        self._freshness = m.histogram(
            "evalsi_evaluate_freshness_seconds",
            "From a trace's completion (tail sampling's decision) to its scores handed to the scores pipeline.",
            ["processor"],
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        ).labels(sid)

    def use(self, policies: PolicySet) -> None:
        """Evaluate with `policies` from now on (on the engine thread once it runs: between two works)."""
        self.policies = policies
        self.session_stages = any(p.session_stages for p in policies.policies)
        self.late.use(policies)
        if self.store_datasets is not None:
            policies.datasets = self.store_datasets
        if self.store_windows is not None:
            self.alerts.send_events(self.store_windows.use(policies.detach_alerts()))

    async def on_engine(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the engine thread, between two works."""
        return await asyncio.get_running_loop().run_in_executor(self._engine, fn, *args)

    # --- the event loop's side ---------------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Works waiting or being evaluated."""
        return len(self._queue) + self._in_engine

    def full(self) -> bool:
        """Traces waiting or being evaluated reach `queue_size`."""
        return self.waiting >= self.queue_size

    def shed(self, spans: list[Span]) -> None:
        """`overload: shed`: the trace is not evaluated; counted, and recorded in each policy's window."""
        self._shed_traces.inc()
        self.policies.shed(spans[0].trace_id)
        self.settings.logger.debug("evaluate: queue full; trace %s shed", spans[0].trace_id)

    def enqueue(
        self, unit: WorkUnit, spans: list[Span], completed: float = 0.0, done: Callable[[], None] | None = None
    ) -> None:
        """Queue work; `completed` is when the trace was complete upstream (its wait here and before counts in
        freshness), else now; `done` is called once its scores are handed on."""
        self._queue.append(Work(unit, spans, completed or time.monotonic(), done=done))
        self._wake.set()

    def enqueue_feedback(self, scores: list[Score]) -> None:
        """Queue the late path for human and external scores (only when a policy reads `feedback`)."""
        feedback = self.late.pick(scores)
        if not feedback:
            return
        if len(self._queue) >= self.queue_size:
            self.late.queue_full(len(feedback))
            return
        self._queue.append(Work("feedback", [], time.monotonic(), feedback))
        self._wake.set()

    async def hand_on(self, scores: list[Score]) -> None:
        """Scores to the scores pipeline (retried while refused), or from a worker to the collector process with
        what the policies' windows would hold."""
        worker = self.settings.worker
        if worker is not None:
            windows = self.policies.drain_window_records()
            if not scores and not windows:
                return
            while True:
                try:
                    worker.hand_evaluated(self.settings.id, scores, windows)
                    return
                except Refused as e:
                    await asyncio.sleep(min(e.retry_after, 0.2))
        if not scores:
            return
        if self.next.scores is None:
            self._dropped_scores.inc(len(scores))
            return
        while True:
            try:
                await self.next.consume_scores(ScoreBatch(scores))
                return
            except Refused as e:
                if self.stopping and e.unavailable:
                    self._dropped_scores.inc(len(scores))
                    return
                await asyncio.sleep(e.retry_after)

    async def run(self) -> None:
        """Until `stop`: what waits to the engine thread, its scores on."""
        while True:
            while not self._queue:
                if self.stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
            # everything waiting goes to the engine in one hand-off: under heavy ingest each event loop turn is
            # long (a big request decodes in it), and one trace per turn would cap evaluation at a few dozen/s
            works = [self._queue.popleft() for _ in range(min(len(self._queue), ENGINE_CHUNK))]
            self._in_engine = len(works)
            try:
                scores = await self.on_engine(self.evaluate_all, works)
            finally:
                self._in_engine = 0
            await self.hand_on(scores)
            now = time.monotonic()
            for work in works:
                if work.unit != "feedback":
                    self._freshness.observe(now - work.completed)
                if work.done is not None:
                    work.done()

    async def close_windows_loop(self) -> None:
        """Every second, on the engine thread: the policies' windows that are due close."""
        while True:
            await asyncio.sleep(1.0)
            await self.on_engine(self.close_windows)

    def stop(self) -> None:
        """`run` returns once the queue is empty."""
        self.stopping = True
        self._wake.set()

    def close(self) -> None:
        """Stop the engine thread (after what it holds)."""
        self._engine.shutdown(wait=True)

    # --- the engine thread's side ------------------------------------------------------------------------------

    def evaluate(self, work: Work) -> list[Score]:
        """Every policy over one trace or session, or the late path for feedback."""
        return self.evaluate_all([work])

    def evaluate_all(self, works: list[Work]) -> list[Score]:
        """`evaluate` over each work, in order; the counters and the latency histogram are updated once a call."""
        out: list[Score] = []
        latencies: list[float] = []
        traces = 0
        late, policies, alerts = self.late, self.policies, self.alerts
        promoted = self.promoted if self.store_datasets is not None else None
        try:
            for work in works:
                t0 = time.perf_counter()
                unit = work.unit
                if unit == "feedback":
                    scores = late.evaluate_feedback(policies, work.feedback or [])
                else:
                    if unit == "trace":
                        scores = late.evaluate_trace(policies, work.spans)
                        traces += 1
                    else:
                        scores = policies.evaluate_session(work.spans)
                    latencies.append(time.perf_counter() - t0)
                alerts.send(policies)
                if promoted is not None:
                    rows = self.store_datasets.drain()  # type: ignore[union-attr]
                    if rows:
                        promoted(rows)
                # a trace's (or session's) scores carry its project, stamped at the receiver; `project` names only
                # traces with none. The late path's scores keep the project of the feedback they came with.
                if unit != "feedback" and work.spans and scores:
                    project = project_of(work.spans[0], self.project)
                    for s in scores:
                        s.project = project
                out += scores
        finally:
            if traces:
                self._traces.inc(traces)
            observe = self._latency.observe
            for seconds in latencies:
                observe(seconds)
            self.count_scores(out)
        return out

    def count_scores(self, scores: list[Score]) -> None:
        """`evalsi_evaluate_scores` by outcome, one increment an outcome."""
        counts: dict[str, int] = {}
        for s in scores:
            counts[s.outcome] = counts.get(s.outcome, 0) + 1
        for outcome, n in counts.items():
            child = self._scores_by_outcome.get(outcome)
            if child is None:
                child = self._scores_by_outcome[outcome] = self._scores.labels(self.settings.id, outcome)
            child.inc(n)

    def close_windows(self, now: float | None = None) -> None:
        """Close the windows due (all of them with `now=inf`), send their alerts, expire the late buffers."""
        self.policies.close_windows(now)
        self.alerts.send(self.policies)
        if self.late.enabled:
            self.late.expire(time.monotonic())

    def observe(self, windows: list[WindowRecord]) -> None:
        """A worker's window records into the windows here, and the alerts they fire."""
        self.policies.observe(windows)
        self.alerts.send(self.policies)
