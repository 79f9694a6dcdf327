"""The `evaluate` processor class (the package docstring says what it does)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from evalsi.component import Next, Refused, Settings, processor
from evalsi.evaluators.judge_client import Judges
from evalsi.log_record import LogBatch
from evalsi.policies import AlertEvent, AlertRecorder, Notifier
from evalsi.policies.engine import PolicyDecision, WindowRecord
from evalsi.policies.feedback import is_feedback
from evalsi.policies.twins import TwinBuffer
from evalsi.processors.evaluate.config import EvaluateConfig, load_policy_set
from evalsi.processors.evaluate.events import score_from_event
from evalsi.processors.tail_sampling.buffer import SessionBuffer, session_of
from evalsi.score import Score, ScoreBatch
from evalsi.span import VENDOR_SDK_SCOPES, BatchKind, Span, SpanBatch, TraceKey, project_of, trace_key
from evalsi.supervise import supervise
from evalsi.trajectory import lone_sdk_call

# traces (or feedback items) the engine thread takes per hand-off from the event loop
ENGINE_CHUNK = 256
TWINS_TICK_S = 0.1  # how often traces whose twin did not come in `duplicate_calls.wait` go to evaluation


WorkUnit = Literal["trace", "session", "feedback"]
"""What the engine thread evaluates: a whole trace, a quiet session, or late feedback."""


@dataclass
class _Work:
    unit: WorkUnit
    spans: list[Span]
    completed: float  # monotonic time the trace (or session) was complete upstream, or the feedback handed to us
    feedback: list[Score] | None = None


_GONE_PER_TRACE = 10
"""Ids of traces that left the buffer are remembered (to count feedback for them as `expired`, not `unknown_trace`)
for the last 10 x `max_traces` of them: about 170 bytes each, against kilobytes per buffered trace."""


@dataclass
class _Recent:
    """A completed trace kept for late feedback: its spans, what each feedback-reading policy did with it, and the
    feedback so far."""

    spans: list[Span]
    decisions: dict[str, PolicyDecision]
    feedback: list[Score]
    expires: float  # monotonic


@processor("evaluate", config=EvaluateConfig, signals=("traces", "logs", "scores"), needs=BatchKind.TRACE, meets=True)
class Evaluate:
    """Spans go on at once; whole traces queue for evaluation on one worker thread (the policy engine keeps
    windows and budgets, so it runs single-threaded), and their scores follow into the scores pipeline. A slow
    judge therefore never holds up ingest; a full queue is counted, never silent.

    Late feedback (human and external scores) queues behind the traces already waiting, so it finds a trace that
    completed before it. The buffer of recent traces belongs to the engine thread: only it reads and writes it.

    With pipeline workers (`service.workers` > 1) one instance runs in each worker and one in the collector process.
    A worker evaluates the traces it assembled; its policies' windows only record what they would add, and the
    records go with the scores to the collector (`Settings.worker`), whose instance puts them in the real windows,
    fires the alerts (once, over every worker's traces), and hands the scores to the scores pipeline. Sessions are
    assembled there too, from every worker's traces that carry a session id; feedback goes from there to the
    worker holding its trace (`Settings.collector`); judge budgets are kept there for all workers."""

    def __init__(self, config: EvaluateConfig, settings: Settings, next: Next) -> None:
        self.config = config
        self.settings = settings
        self.next = next
        self.worker = settings.worker
        self.collector = settings.collector
        self.judges = Judges(settings.metrics, ledger=self.worker.ledger if self.worker is not None else None)
        """The judge runtime of this processor's policies: verdict cache, budget spend, HTTP clients, metrics."""
        self.policies = load_policy_set(config, self.judges)
        self.policies.negative_below = config.late_signals.negative_below
        if self.worker is not None:
            self.policies.record_windows()  # the collector process's windows aggregate every worker's
        self._session_stages = any(p.session_stages for p in self.policies.policies)
        twins = config.duplicate_calls
        self.twins = (
            TwinBuffer(twins.wait, frozenset(VENDOR_SDK_SCOPES.values()), twins.max_traces) if twins.wait > 0 else None
        )
        """Lone vendor SDK calls and root-level instrumentation calls waiting for their twin; with workers, in the
        collector process, where every worker's such traces meet (a worker hands them there)."""
        self._evaluated_here: OrderedDict[TraceKey, None] = OrderedDict()
        """With workers, in the collector process: ids of the traces evaluated here (twins), whose late feedback
        stays here rather than going to a worker."""
        self.sessions: SessionBuffer | None = None
        """In the collector process with workers: every worker's traces of a session, until it is quiet (the
        service sets it from the pipeline's tail_sampling settings)."""
        self._is_feedback = is_feedback
        self._late = bool(self.policies.late) and config.late_signals.max_traces > 0
        # keyed by (project, trace id): feedback reaches only its own project's traces
        self._recent: OrderedDict[TraceKey, _Recent] = OrderedDict()  # by completion: the oldest first
        self._gone: OrderedDict[TraceKey, None] = OrderedDict()  # traces that left the buffer, to tell `expired`
        self._early: OrderedDict[TraceKey, tuple[float, list[Score]]] = OrderedDict()  # feedback before its trace
        self._notifier: Notifier | None = None
        self._recorder: AlertRecorder | None = None
        self._no_store_said = False
        self._queue: deque[_Work] = deque()
        self._in_engine = 0  # works handed to the engine thread and not yet done
        self._wake = asyncio.Event()
        self._stopping = False
        self._engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"evalsi-{settings.id}")
        self._tasks: list[asyncio.Task[None]] = []
        m = settings.metrics
        sid = settings.id
        self._traces = m.counter(
            "evalsi_evaluate_traces", "Completed traces the policies looked at.", ["processor"]
        ).labels(sid)
        self._scores = m.counter(
            "evalsi_evaluate_scores", "Scores the policies produced, by outcome.", ["processor", "outcome"]
        )
        self._dropped_scores = m.counter(
            "evalsi_evaluate_scores_dropped", "Scores no scores pipeline would take.", ["processor"]
        ).labels(sid)
        self._shed_traces = m.counter(
            "evalsi_evaluate_traces_shed",
            "Completed traces left out of evaluation because the queue was full (`overload: shed`).",
            ["processor"],
        ).labels(sid)
        self._queue_size = m.gauge(
            "evalsi_evaluate_queue_size", "Traces waiting for evaluation.", ["processor"]
        ).labels(sid)
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
        self._late_matched = m.counter(
            "evalsi_late_signals_matched",
            "Feedback scores that found their trace: buffered (`late`) or completing after them (`early`).",
            ["processor", "when"],
        )
        self._late_unmatched = m.counter(
            "evalsi_late_signals_unmatched",
            "Feedback scores whose trace was not at hand: `unknown_trace` (never seen, or not complete yet), "
            "`expired` (left the buffer), `queue_full`.",
            ["processor", "reason"],
        )
        self._twins_joined = m.counter(
            "evalsi_evaluate_duplicate_call_traces",
            "Traces that recorded a call another trace recorded too (a vendor SDK's lone span and an instrumentation's "
            "root span), evaluated with it as one trace.",
            ["processor"],
        ).labels(sid)
        self._twins_waiting = m.gauge(
            "evalsi_evaluate_duplicate_call_waiting",
            "Traces waiting for a twin in another trace that records the same call (`duplicate_calls.wait`).",
            ["processor"],
        ).labels(sid)
        self._twins_armed = m.gauge(
            "evalsi_evaluate_duplicate_call_services",
            "Services that sent a vendor SDK's lone call in the last hour, whose root-level instrumentation calls "
            "therefore wait for a twin (summed over the collector process and its workers).",
            ["processor"],
        ).labels(sid)
        self._late_buffered = m.gauge(
            "evalsi_late_signals_buffered_traces", "Completed traces kept for late feedback.", ["processor"]
        ).labels(sid)
        self._reloads = m.counter(
            "evalsi_policy_reloads",
            "Policy reloads (SIGHUP), by result: ok, or failed (the old policies stay).",
            ["processor", "result"],
        )
        self._alerts_fired = m.counter(
            "evalsi_alerts_fired",
            "Policy alerts fired (once per window that breaks the alert's condition, whatever the worker count).",
            ["processor", "policy", "alert"],
        )
        self._alert_firing = m.gauge(
            "evalsi_alert_firing",
            "1 while a policy alert fires (from its firing until a window closes without its condition holding), "
            "then 0.",
            ["processor", "policy", "alert"],
        )
        self._alerts_unrecorded = m.counter(
            "evalsi_alerts_unrecorded",
            "Alert events (fired or resolved) not written to the store: `store_error`, `no_store` (no store exporter "
            "in the scores pipeline), `queue_full`.",
            ["processor", "reason"],
        )

    async def reload(self, policies: list[str] | None = None, base_dir: Path | None = None) -> str:
        """Load the policy files again (`policies`: a new list from the config, else the same files); on any error
        the policies in use stay and the error is raised (`ValueError`, naming the file). Policies whose window is
        unchanged keep it. Swapped on the evaluation thread, between two traces. Returns what changed, for the log."""
        config = self.config
        if policies is not None:
            config = config.model_copy(update={"policies": policies})
            config._base_dir = base_dir if base_dir is not None else self.config._base_dir
        try:
            fresh = await asyncio.get_running_loop().run_in_executor(None, load_policy_set, config, self.judges)
        except ValueError:
            self._reloads.labels(self.settings.id, "failed").inc()
            raise
        fresh.negative_below = config.late_signals.negative_below
        if self.worker is not None:
            fresh.record_windows()

        def swap() -> list[str]:
            kept = fresh.carry_over(self.policies)
            self.policies = fresh
            self._session_stages = any(p.session_stages for p in fresh.policies)
            self._late = bool(fresh.late) and config.late_signals.max_traces > 0
            return kept

        old = {p.name for p in self.policies.policies}
        kept = await asyncio.get_running_loop().run_in_executor(self._engine, swap)
        self.config = config
        new = {p.name for p in fresh.policies}
        self._reloads.labels(self.settings.id, "ok").inc()
        return (
            f"{len(new)} policies ({', '.join(sorted(new)) or 'none'}); added {sorted(new - old)}, removed "
            f"{sorted(old - new)}, windows kept {sorted(kept)}"
        )

    async def start(self) -> None:
        if self.next.scores is None and self.worker is None:
            self.settings.logger.warning(
                "evaluate: no scores pipeline in service.pipelines; scores are counted and dropped "
                "(add `scores: {exporters: [clickhouse]}`)"
            )
        self._notifier = Notifier()
        if self.worker is None:  # (a worker's windows only record: alerts fire in the collector process)
            self._recorder = AlertRecorder(self._record_alerts, lost=self._alerts_lost)
        log, metrics, cid = self.settings.logger, self.settings.metrics, self.settings.id
        self._tasks = [
            supervise(f"{cid} evaluation", self._work_loop, log=log, metrics=metrics),
            supervise(f"{cid} windows", self._close_windows_loop, log=log, metrics=metrics),
        ]
        if self.sessions is not None:
            self._tasks.append(supervise(f"{cid} sessions", self._sessions_loop, log=log, metrics=metrics))
        if self.twins is not None and self.worker is None:
            self._tasks.append(supervise(f"{cid} duplicate calls", self._twins_loop, log=log, metrics=metrics))

    def _send_alerts(self) -> None:
        # in time order: an alert that resolved as its window closed may fire again in the next one
        events = sorted(self.policies.drain_alerts() + self.policies.drain_resolved(), key=lambda e: e.fired_at)
        for event in events:
            if event.state == "resolved":
                self.settings.logger.info("alert resolved", extra={"policy": event.policy, "alert": event.alert})
                self._alert_firing.labels(self.settings.id, event.policy, event.alert).set(0)
                continue
            self.settings.logger.warning(
                "alert fired", extra={"policy": event.policy, "alert": event.alert, "notify": bool(event.notify)}
            )
            self._alerts_fired.labels(self.settings.id, event.policy, event.alert).inc()
            self._alert_firing.labels(self.settings.id, event.policy, event.alert).set(1)
            if self._notifier is not None:
                self._notifier.send(event)
        if events and self._recorder is not None:
            self._recorder.record(events)

    def _alert_store(self) -> Any:
        """Where alerts are recorded: the store of the service this instance runs in (the collector process, where
        alerts fire with pipeline workers too); None when the config has no store."""
        host = self.settings.host
        return host.store if host is not None else None

    def _record_alerts(self, events: list[AlertEvent]) -> None:
        """On the recorder's thread: the events into the store (raises the store's error)."""
        store = self._alert_store()
        if store is None:
            self._alerts_lost("no_store", len(events))
            if not self._no_store_said:
                self._no_store_said = True
                self.settings.logger.warning(
                    "evaluate: alerts are not recorded: no store exporter (clickhouse) in the scores pipeline "
                    "(add `scores: {exporters: [clickhouse]}`); they are still logged and counted"
                )
            return
        store.write_alerts(events, project=self.config.project)

    def _alerts_lost(self, reason: str, n: int) -> None:
        self._alerts_unrecorded.labels(self.settings.id, reason).inc(n)

    def _close_windows(self, now: float | None = None) -> None:
        self.policies.close_windows(now)
        self._send_alerts()
        if self._late:
            self._expire(time.monotonic())

    async def _close_windows_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            await loop.run_in_executor(self._engine, self._close_windows)

    # --- the buffer of recent traces (engine thread only) ----------------------------------------------------

    def _expire(self, now: float) -> None:
        """Drop buffered traces and held feedback past the window, and the oldest traces past `max_traces`."""
        late = self.config.late_signals
        while self._recent:
            key, recent = next(iter(self._recent.items()))
            if recent.expires > now and len(self._recent) <= late.max_traces:
                break
            del self._recent[key]
            self._gone[key] = None
        while len(self._gone) > _GONE_PER_TRACE * late.max_traces:
            self._gone.popitem(last=False)
        while self._early:
            arrived, _ = next(iter(self._early.values()))
            if arrived + late.window > now and len(self._early) <= late.max_traces:
                break
            self._early.popitem(last=False)
        self._late_buffered.set(len(self._recent))

    def _evaluate_trace(self, spans: list[Span]) -> list[Score]:
        if not self._late:
            return self.policies.evaluate_trace(spans)
        key = trace_key(spans[0], self.config.project)
        held = self._early.pop(key, None)
        early = held[1] if held else []
        if early:
            self._late_matched.labels(self.settings.id, "early").inc(len(early))
        # completed again (spans after tail sampling's decision): its feedback so far still holds
        previous = self._recent.pop(key, None)
        feedback = [*(previous.feedback if previous else ()), *early]
        decisions: dict[str, PolicyDecision] = {}
        scores = self.policies.evaluate_trace(spans, feedback=feedback, decisions=decisions)
        if decisions:  # some policy that reads feedback selected the trace
            now = time.monotonic()
            self._gone.pop(key, None)
            self._recent[key] = _Recent(spans, decisions, feedback, now + self.config.late_signals.window)
            self._expire(now)
        elif previous is not None:
            self._gone[key] = None
        return scores

    def _evaluate_feedback(self, feedback: list[Score]) -> list[Score]:
        """The late path: each trace the feedback is about gets a second look from the policies that read it. The
        feedback's project (its sender's) is part of the trace it names: another project's feedback on a trace id
        matches nothing of this one."""
        now = time.monotonic()
        self._expire(now)
        by_trace: dict[TraceKey, list[Score]] = {}
        for s in feedback:
            by_trace.setdefault(TraceKey(s.project, s.trace_id), []).append(s)
        out: list[Score] = []
        sid = self.settings.id
        for key, scores in by_trace.items():
            recent = self._recent.get(key)
            if recent is None:
                reason = "expired" if key in self._gone else "unknown_trace"
                self._late_unmatched.labels(sid, reason).inc(len(scores))
                self.settings.logger.debug(
                    "late feedback for trace %s not matched (%s)", key, reason, extra={"reason": reason}
                )
                if reason == "unknown_trace":  # maybe not complete yet: the online evaluation will see it
                    arrived, held = self._early.pop(key, (now, []))
                    self._early[key] = (arrived, held + scores)
                continue
            self._late_matched.labels(sid, "late").inc(len(scores))
            recent.feedback.extend(scores)
            out += self.policies.evaluate_late(recent.spans, recent.feedback, recent.decisions)
        self._expire(now)
        return out

    def _evaluate(self, work: _Work) -> list[Score]:
        """On the engine thread: every policy over one trace or session, or the late path for feedback."""
        t0 = time.perf_counter()
        if work.unit == "feedback":
            scores: list[Score] = self._evaluate_feedback(work.feedback or [])
        else:
            if work.unit == "trace":
                scores = self._evaluate_trace(work.spans)
                self._traces.inc()
            else:
                scores = self.policies.evaluate_session(work.spans)
            self._latency.observe(time.perf_counter() - t0)
        self._send_alerts()
        # a trace's (or session's) scores carry its project, stamped at the receiver; `project` names only traces
        # with none. The late path's scores keep the project of the feedback they came with.
        project = project_of(work.spans[0], self.config.project) if work.unit != "feedback" and work.spans else None
        for s in scores:
            if project is not None:
                s.project = project
            self._scores.labels(self.settings.id, s.outcome).inc()
        return scores

    async def _hand_on(self, scores: list[Score]) -> None:
        if self.worker is not None:  # to the collector process, with what the policies' windows would hold
            windows = self.policies.drain_window_records()
            if not scores and not windows:
                return
            while True:
                try:
                    self.worker.hand_evaluated(self.settings.id, scores, windows)
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
                if self._stopping and e.unavailable:
                    self._dropped_scores.inc(len(scores))
                    return
                await asyncio.sleep(e.retry_after)

    def _evaluate_all(self, works: list[_Work]) -> list[Score]:
        return [s for work in works for s in self._evaluate(work)]

    async def _work_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
            # everything waiting goes to the engine in one hand-off: under heavy ingest each event loop turn is
            # long (a big request decodes in it), and one trace per turn would cap evaluation at a few dozen/s
            works = [self._queue.popleft() for _ in range(min(len(self._queue), ENGINE_CHUNK))]
            self._queue_size.set(len(self._queue))
            self._in_engine = len(works)
            try:
                scores = await loop.run_in_executor(self._engine, self._evaluate_all, works)
            finally:
                self._in_engine = 0
            await self._hand_on(scores)
            now = time.monotonic()
            for work in works:
                if work.unit != "feedback":
                    self._freshness.observe(now - work.completed)

    def _full(self) -> bool:
        """Traces waiting or being evaluated reach `queue_size`."""
        return len(self._queue) + self._in_engine >= self.config.queue_size

    def _shed(self, spans: list[Span]) -> None:
        """`overload: shed`: the trace is not evaluated; counted, and recorded in each policy's window."""
        self._shed_traces.inc()
        self.policies.shed(spans[0].trace_id)
        self.settings.logger.debug("evaluate: queue full; trace %s shed", spans[0].trace_id)

    def _enqueue(self, unit: WorkUnit, spans: list[Span], completed: float = 0.0) -> None:
        """Queue work; `completed` is when the trace was complete upstream (its wait here and before counts in
        freshness), else now."""
        self._queue.append(_Work(unit, spans, completed or time.monotonic()))
        self._queue_size.set(len(self._queue))
        self._wake.set()

    def _enqueue_feedback(self, scores: list[Score]) -> None:
        """Queue the late path for human and external scores (only when a policy reads `feedback`)."""
        feedback = [s for s in scores if self._is_feedback(s)] if self._late else []
        if not feedback:
            return
        if len(self._queue) >= self.config.queue_size:
            self._late_unmatched.labels(self.settings.id, "queue_full").inc(len(feedback))
            self.settings.logger.debug("late feedback not matched: the evaluation queue is full")
            return
        self._queue.append(_Work("feedback", [], time.monotonic(), feedback))
        self._queue_size.set(len(self._queue))
        self._wake.set()

    async def consume(self, batch: SpanBatch) -> None:
        if batch.kind is BatchKind.TRACE:
            traces: dict[TraceKey, list[Span]] = {}
            for span in batch.spans:
                traces.setdefault(trace_key(span, self.config.project), []).append(span)  # within its project
            if self._full() and self.config.overload == "backpressure":
                raise Refused(
                    f"evaluate: {len(self._queue) + self._in_engine} traces wait for evaluation (queue_size); "
                    "retry later",
                    retry_after=0.5,
                )
            # lone SDK calls first: each arms its service before the batch's other traces are looked at
            order = sorted(traces.values(), key=lambda t: lone_sdk_call(t) is None) if self.twins else traces.values()
            for spans in order:
                if self.config.overload == "shed" and self._full():
                    self._shed(spans)
                    continue
                if self.twins is not None and self._twin_wanted(spans):
                    if self.worker is not None:  # every worker's meet in the collector process
                        self.worker.hand_twin_trace(self.settings.id, spans)
                    else:
                        self._take_twin(spans, batch.completed)
                else:
                    self._enqueue("trace", spans, batch.completed)
                if self.worker is not None and self._session_stages:
                    if any(s.session_id for s in spans):  # whole sessions meet in the collector process
                        self.worker.hand_session_trace(self.settings.id, spans)
        elif batch.kind is BatchKind.SESSION and batch.spans and self.worker is None:
            # (a worker's sessions hold its own traces only: they are evaluated in the collector process)
            self._enqueue("session", batch.spans, batch.completed)
        await self.next.consume(batch)

    # --- the collector process's side, with pipeline workers ---------------------------------------------------

    async def take_evaluated(self, scores: list[Score], windows: list[WindowRecord]) -> None:
        """A worker's scores and window records: the windows and alerts here, the scores to the scores pipeline."""
        if windows:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._engine, self._observe, windows)
        if scores:
            await self._hand_on(scores)

    def _observe(self, windows: list[WindowRecord]) -> None:
        self.policies.observe(windows)
        self._send_alerts()

    @property
    def wants_sessions(self) -> bool:
        """Whether it evaluates the session batches tail sampling hands on (a worker's are assembled in the
        collector process instead)."""
        return self._session_stages and self.worker is None

    def meet_sessions(self, timeout: float, max_sessions: int, max_spans: int) -> None:
        """Assemble sessions here from every worker's traces (the pipeline's tail_sampling session settings), when
        some policy evaluates sessions."""
        if self._session_stages:
            self.sessions = SessionBuffer(timeout, max_sessions, max_spans)

    def take_session_trace(self, spans: list[Span]) -> None:
        """A worker's completed trace of a session: held until the session is quiet, then evaluated here."""
        if self.sessions is None:
            return
        session = session_of(spans)
        if session is not None:
            self.sessions.add(session, spans, time.monotonic())
            for session, _why in self.sessions.evict():
                self._enqueue("session", session.spans)

    async def _sessions_loop(self) -> None:
        assert self.sessions is not None
        while True:
            await asyncio.sleep(0.25)
            for session in self.sessions.due(time.monotonic()):
                self._enqueue("session", session.spans)

    def _twin_wanted(self, spans: list[Span]) -> bool:
        assert self.twins is not None
        now = time.monotonic()
        wanted = self.twins.wants(spans, now)
        if wanted and lone_sdk_call(spans) is not None:
            self._twins_armed.set(self.twins.armed_services(now))
        return wanted

    def _take_twin(self, spans: list[Span], completed: float) -> None:
        assert self.twins is not None
        joined_before = self.twins.joined
        for ready, at in self.twins.add(spans, completed or time.monotonic(), time.monotonic()):
            self._enqueue_here(ready, at)
        self._twins_joined.inc(2 * (self.twins.joined - joined_before))
        self._twins_waiting.set(len(self.twins))

    def take_twin_trace(self, spans: list[Span]) -> None:
        """A worker's trace that may record a call another worker's trace records too: met and evaluated here. A
        lone SDK call arms its service in every worker (so their root-level instrumentation calls come here too)."""
        if self.twins is None:
            self._enqueue_here(spans, time.monotonic())
            return
        service, now = spans[0].service_name, time.monotonic()
        if lone_sdk_call(spans) is not None:
            if self.twins.arm(service, now) and self.collector is not None:
                self.collector.arm_twins(self.settings.id, service)
            self._twins_armed.set(self.twins.armed_services(now))
        self._take_twin(spans, 0.0)

    def arm_twins(self, service: str) -> None:
        """In a worker: `service` sent a lone SDK call (seen in some worker): hand its root-level instrumentation
        calls to the collector process from now on."""
        if self.twins is not None:
            now = time.monotonic()
            self.twins.arm(service, now)
            self._twins_armed.set(self.twins.armed_services(now))

    def _enqueue_here(self, spans: list[Span], completed: float) -> None:
        if self.collector is not None:  # its late feedback is matched here, not in a worker
            for key in dict.fromkeys(trace_key(s, self.config.project) for s in spans):
                self._evaluated_here[key] = None
                self._evaluated_here.move_to_end(key)
            while len(self._evaluated_here) > max(self.config.late_signals.max_traces, 1):
                self._evaluated_here.popitem(last=False)
        self._enqueue("trace", spans, completed)

    async def _twins_loop(self) -> None:
        assert self.twins is not None
        while True:
            await asyncio.sleep(TWINS_TICK_S)
            for ready, at in self.twins.due(time.monotonic()):
                self._enqueue_here(ready, at)
            self._twins_waiting.set(len(self.twins))

    def take_feedback(self, scores: list[Score]) -> None:
        """In a worker: feedback for traces of this worker, routed here by the collector process."""
        self._enqueue_feedback(scores)

    async def consume_logs(self, batch: LogBatch) -> None:
        """Evaluation results other tools sent as `gen_ai.evaluation.result` events are stored as external scores."""
        scores: list[Score] = []
        for record in batch.records:
            score = score_from_event(record)
            if score is not None:
                score.project = project_of(record, self.config.project)  # the sender's, as for a trace's scores
                scores.append(score)
        if scores:
            for s in scores:
                self._scores.labels(self.settings.id, s.outcome).inc()
            await self._hand_on(scores)
            self._enqueue_feedback(scores)
        if self.next.logs is not None:
            await self.next.consume_logs(batch)

    async def consume_scores(self, batch: ScoreBatch) -> None:
        """In the `scores` pipeline: scores go on; the human and external ones (`POST /v1/feedback`) also take the
        late path (in the worker holding the trace, with workers). Handed on first, so a refused batch (which the
        sender sends again) never runs it twice."""
        await self.next.consume_scores(batch)
        if self.collector is not None:
            feedback = [s for s in batch.scores if self._is_feedback(s)] if self._late else []
            here = [s for s in feedback if TraceKey(s.project, s.trace_id) in self._evaluated_here]
            if here:
                self._enqueue_feedback(here)
            routed = [s for s in feedback if TraceKey(s.project, s.trace_id) not in self._evaluated_here]
            if routed:
                self.collector.route_feedback(self.settings.id, routed)
            return
        self._enqueue_feedback(batch.scores)

    async def shutdown(self) -> None:
        """Evaluate everything queued, close the open windows (their alerts still go out), then stop."""
        if self.twins is not None:  # traces still waiting for a twin are evaluated alone
            for ready, at in self.twins.drain():
                self._enqueue_here(ready, at)
        if self.sessions is not None:  # every open session is evaluated before the work loop ends
            for session in self.sessions.drain():
                self._enqueue("session", session.spans)
        self._stopping = True
        self._wake.set()
        work, *timers = self._tasks or [None]
        if work is not None:
            await work
        for timer in timers:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        await asyncio.get_running_loop().run_in_executor(self._engine, self._close_windows, math.inf)
        self._engine.shutdown(wait=True)
        self.judges.close()
        if self._notifier is not None:
            await asyncio.to_thread(self._notifier.close)
        if self._recorder is not None:
            await asyncio.to_thread(self._recorder.close)
