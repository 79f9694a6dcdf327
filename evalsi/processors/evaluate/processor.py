"""The `evaluate` processor itself: a facade that takes the pipeline's batches and the pipeline workers' hand-offs
and passes each to the part that owns it: the evaluation queue (`work_queue`), late feedback (`late_feedback`),
duplicate-call joining (`duplicate_calls`), session meeting (`sessions`), alerts (`alerts`), policy reload
(`reload`)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from evalsi.component import Next, Refused, Settings, processor
from evalsi.evaluators.judge_client import JudgeLedger, Judges
from evalsi.evaluators.shared_ledger import SharedLedger
from evalsi.model.log_record import LogBatch
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import BatchKind, Span, SpanBatch, TraceKey, project_of, trace_key
from evalsi.model.trajectory import lone_sdk_call
from evalsi.policies import PolicySet, StoreWindows
from evalsi.policies.conditions import AlertRule
from evalsi.policies.policy import Policy
from evalsi.policies.window import WindowRecord
from evalsi.processors.evaluate.alerts import Alerts
from evalsi.processors.evaluate.baselines import StoreBaselines
from evalsi.processors.evaluate.config import EvaluateConfig, load_policy_set
from evalsi.processors.evaluate.duplicate_calls import DuplicateCalls
from evalsi.processors.evaluate.events import score_from_event
from evalsi.processors.evaluate.judge_calibration import JudgeCalibration
from evalsi.processors.evaluate.late_feedback import EvaluatedHere, LateFeedback
from evalsi.processors.evaluate.owned_sessions import OwnedSessions
from evalsi.processors.evaluate.reload import PolicyReload
from evalsi.processors.evaluate.sessions import SessionMeeting
from evalsi.processors.evaluate.work_queue import EvaluationQueue
from evalsi.replicas import Membership
from evalsi.runtime.supervise import supervise
from evalsi.store import ReplicaState, WindowStore


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
        replicas = config.replicas
        self.membership = Membership(replicas) if replicas is not None and self.worker is None else None
        """With `replicas`, outside pipeline workers: the replica set this replica sees."""
        self.shared_ledger: SharedLedger | None = None
        """With `replicas`: the judge budgets this replica shares with the others through the store."""
        ledger: JudgeLedger | None = self.worker.ledger if self.worker is not None else None
        if self.membership is not None and replicas is not None:
            membership = self.membership
            ledger = self.shared_ledger = SharedLedger(
                self._replica_state, project=config.project, replica=replicas.self_,
                replicas=lambda: membership.size, budget_slice=replicas.budget_slice,
            )  # fmt: skip
        self.judges = Judges(settings.metrics, ledger=ledger)
        """The judge runtime of this processor's policies: verdict cache, budget spend, HTTP clients, metrics."""
        policies = load_policy_set(config, self.judges)
        policies.negative_below = config.late_signals.negative_below
        if self.worker is not None:
            policies.record_windows()  # the collector process's windows aggregate every worker's
        self.late = LateFeedback(config.late_signals, settings, config.project)
        self.alerts = Alerts(settings, config.project, config.alertmanager, store=config.windows.scope == "store")
        self.baselines = StoreBaselines(
            self.alerts.store, config.project, counter=self.alerts.baseline_reads, processor=settings.id
        )
        """Where `regressed(...)` alerts read their baselines: the store's scores of this processor's project."""
        policies.use_baselines(self.baselines)
        self.calibration = JudgeCalibration(
            settings, self.alerts.store, config.project, every=config.calibration.every,
            over=config.calibration.over, negative_below=config.late_signals.negative_below,
        )  # fmt: skip
        """Judge calibration in the metrics, from the store."""
        self.store_windows = (
            StoreWindows(config.windows.settle) if config.windows.scope == "store" and self.worker is None else None
        )
        """With `windows.scope: store`, in the process where alerts fire: the windows read from the store."""
        promoted = None
        if config.promote_to == "store":
            promoted = self._hand_promoted if self.worker is not None else self.alerts.record_promoted
        self.queue = EvaluationQueue(
            config, settings, next, policies, self.late, self.alerts, self.store_windows, promoted
        )
        self._reload = PolicyReload(settings, self.judges, self.queue, self.baselines)
        self.evaluated_here = EvaluatedHere(config.late_signals, config.project)
        """With workers, in the collector process: the traces evaluated here (duplicate calls joined across
        workers), whose late feedback stays here rather than going to a worker."""
        self.duplicates = DuplicateCalls(config.duplicate_calls, settings, self._evaluate_here)
        """With workers, in the collector process, where every worker's such traces meet (a worker hands them
        there)."""
        self.sessions = SessionMeeting(lambda spans: self.queue.enqueue("session", spans))
        """In the collector process with workers: every worker's traces of a session, until it is quiet."""
        self.owned: OwnedSessions | None = None
        """With `replicas`: sessions evaluated by the replica that owns them, from the store."""
        if self.membership is not None and replicas is not None:
            self.owned = OwnedSessions(
                replicas, self.membership, self._replica_state,
                lambda spans, done: self.queue.enqueue("session", spans, done=done), settings,
            )  # fmt: skip
        self._tasks: list[asyncio.Task[None]] = []

    def _replica_state(self) -> ReplicaState | None:
        """The store, where replicas share budgets and sessions (once its exporter started)."""
        host = self.settings.host
        store = host.store if host is not None else None
        return store if isinstance(store, ReplicaState) else None

    async def _every(self, seconds: float, fn: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(seconds)
            await asyncio.to_thread(fn)

    @property
    def policies(self) -> PolicySet:
        """The policies in use."""
        return self.queue.policies

    async def reload(self, policies: list[str] | None = None, base_dir: Path | None = None) -> str:
        """Load the policy files again (`policies`: a new list from the config, else the same files); on any error
        the policies in use stay and the error is raised (`ValueError`, naming the file). Policies whose window is
        unchanged keep it. Swapped on the evaluation thread, between two traces. Returns what changed, for the log."""
        self.config, changed = await self._reload(self.config, policies, base_dir)
        return changed

    async def start(self) -> None:
        if self.next.scores is None and self.worker is None:
            self.settings.logger.warning(
                "evaluate: no scores pipeline in service.pipelines; scores are counted and dropped "
                "(add `scores: {exporters: [clickhouse]}`)"
            )
        self.alerts.start(record=self.worker is None)  # (a worker's windows only record: alerts fire elsewhere)
        if self.worker is None:
            self.baselines.start()
            self.calibration.start()
        if self.config.alertmanager is not None and self.worker is None:
            hooks = sorted({p.name for p in self.policies.policies for a in self._alert_rules(p) if a.notify})
            if hooks:
                self.settings.logger.warning(
                    "evaluate: alerts go to Alertmanager; the `notify` webhooks of %s are not called (route them "
                    "with an Alertmanager receiver)", ", ".join(hooks),
                )  # fmt: skip
        log, metrics, cid = self.settings.logger, self.settings.metrics, self.settings.id
        self._tasks = [
            supervise(f"{cid} evaluation", self.queue.run, log=log, metrics=metrics),
            supervise(f"{cid} windows", self.queue.close_windows_loop, log=log, metrics=metrics),
        ]
        if self.store_windows is not None:
            self._tasks.append(supervise(f"{cid} store windows", self._poll_store_windows, log=log, metrics=metrics))
        if self.sessions.buffer is not None:
            self._tasks.append(supervise(f"{cid} sessions", self.sessions.run, log=log, metrics=metrics))
        if self.membership is not None:
            if self._replica_state() is None:
                raise ValueError(
                    "replicas: replicas share judge budgets and sessions through the store; add the clickhouse "
                    "exporter to the service, or remove `replicas`"
                )
            replicas = self.membership.config
            if replicas.dns is not None:
                await asyncio.to_thread(self.membership.refresh)
                refresh = partial(self._every, replicas.resolve_interval, self.membership.refresh)
                self._tasks.append(supervise(f"{cid} replicas", refresh, log=log, metrics=metrics))
        if self.shared_ledger is not None:
            flush = partial(self._every, 1.0, self.shared_ledger.flush)
            self._tasks.append(supervise(f"{cid} judge ledger", flush, log=log, metrics=metrics))
        if self.owned is not None:
            self._tasks.append(supervise(f"{cid} owned sessions", self.owned.run, log=log, metrics=metrics))
        if self.duplicates.enabled and self.worker is None:
            self._tasks.append(supervise(f"{cid} duplicate calls", self.duplicates.run, log=log, metrics=metrics))

    def _alert_rules(self, policy: Policy) -> list[AlertRule]:
        """A policy's alert rules, wherever they are checked (its own window, or the store windows)."""
        if self.store_windows is not None:
            return self.store_windows.rules_of(policy.name)
        return list(getattr(policy.window, "alerts", []))

    async def _poll_store_windows(self) -> None:
        """Every `windows.poll_interval`: each policy's window read from the store, its alerts sent, the windows that
        closed logged. A store error is logged and counted; the next poll reads again."""
        assert self.store_windows is not None
        m, sid, log = self.settings.metrics, self.settings.id, self.settings.logger
        queries = m.counter(
            "evalsi_store_window_polls", "Polls of the policies' windows from the store, by result.",
            ["processor", "result"],
        )  # fmt: skip
        seconds = m.histogram(
            "evalsi_store_window_poll_seconds", "Time to read every policy's window from the store once.",
            ["processor"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        ).labels(sid)  # fmt: skip
        said = False
        while True:
            await asyncio.sleep(self.config.windows.poll_interval)
            host = self.settings.host
            store = host.store if host is not None else None
            if not isinstance(store, WindowStore):
                if not said:
                    said = True
                    log.error("evaluate: windows.scope is store, and the store does not compute windows: no alerts")
                continue
            t0 = time.perf_counter()
            try:
                events, closed = await asyncio.to_thread(self.store_windows.poll, time.time(), store.policy_window)
            except Exception as e:  # the store's error, whatever its type: the next poll reads again
                queries.labels(sid, "error").inc()
                log.warning("evaluate: reading the windows from the store failed: %s: %s", type(e).__name__, e)
                continue
            seconds.observe(time.perf_counter() - t0)
            queries.labels(sid, "ok").inc()
            self.alerts.send_events(events)
            self.alerts.log_closed(closed)

    async def consume(self, batch: SpanBatch) -> None:
        queue, overload = self.queue, self.config.overload
        if batch.kind is BatchKind.TRACE:
            traces: dict[TraceKey, list[Span]] = {}
            for span in batch.spans:
                traces.setdefault(trace_key(span, self.config.project), []).append(span)  # within its project
            if queue.full() and overload == "backpressure":
                raise Refused(
                    f"evaluate: {queue.waiting} traces wait for evaluation (queue_size); retry later", retry_after=0.5
                )
            # handed on before the traces are queued: a refusal downstream (the store behind) brings the same batch
            # back, and queued first its traces would be evaluated, and scored, twice
            await self.next.consume(batch)
            duplicates = self.duplicates if self.duplicates.enabled else None
            # lone SDK calls first: each arms its service before the batch's other traces are looked at
            order = sorted(traces.values(), key=lambda t: lone_sdk_call(t) is None) if duplicates else traces.values()
            for spans in order:
                if overload == "shed" and queue.full():
                    queue.shed(spans)
                    continue
                if duplicates is not None and duplicates.wanted(spans):
                    if self.worker is not None:  # every worker's meet in the collector process
                        self.worker.hand_twin_trace(self.settings.id, spans)
                    else:
                        duplicates.take(spans, batch.completed)
                else:
                    queue.enqueue("trace", spans, batch.completed)
                if queue.session_stages and any(s.session_id for s in spans):
                    if self.worker is not None:  # whole sessions meet in the collector process
                        self.worker.hand_session_trace(self.settings.id, spans)
                    elif self.owned is not None and not batch.revision:  # and across replicas in the store
                        self.owned.note(spans)
            return
        await self.next.consume(batch)
        if batch.kind is BatchKind.SESSION and batch.spans and self.worker is None:
            # (a worker's sessions hold its own traces only: they are evaluated in the collector process)
            queue.enqueue("session", batch.spans, batch.completed)

    def _evaluate_here(self, spans: list[Span], completed: float) -> None:
        """A trace ready after its wait for a duplicate call: to evaluation (in the collector process, noted so its
        late feedback is matched here, not in a worker)."""
        if self.collector is not None:
            self.evaluated_here.add(spans)
        self.queue.enqueue("trace", spans, completed)

    # --- the collector process's side, with pipeline workers ---------------------------------------------------

    async def take_evaluated(self, scores: list[Score], windows: list[WindowRecord]) -> None:
        """A worker's scores and window records: the windows and alerts here, the scores to the scores pipeline."""
        if windows:
            await self.queue.on_engine(self.queue.observe, windows)
        if scores:
            await self.queue.hand_on(scores)

    @property
    def wants_sessions(self) -> bool:
        """Whether it evaluates the session batches tail sampling hands on (a worker's are assembled in the
        collector process instead)."""
        return self.queue.session_stages and self.worker is None and self.owned is None

    def meet_sessions(self, timeout: float, max_sessions: int, max_spans: int) -> None:
        """Assemble sessions here from every worker's traces (the pipeline's tail_sampling session settings), when
        some policy evaluates sessions (across replicas they meet in the store instead)."""
        if self.queue.session_stages and self.owned is None:
            self.sessions.meet(timeout, max_sessions, max_spans)

    def take_session_trace(self, spans: list[Span]) -> None:
        """A worker's completed trace of a session: held until the session is quiet, then evaluated here (across
        replicas: noted in the store, for the session's owner)."""
        if self.owned is not None:
            self.owned.note(spans)
        else:
            self.sessions.take(spans)

    def take_twin_trace(self, spans: list[Span]) -> None:
        """A worker's trace that may record a call another worker's trace records too: met and evaluated here."""
        self.duplicates.take_from_worker(spans)

    def arm_twins(self, service: str) -> None:
        """In a worker: `service` sent a lone SDK call (seen in some worker): hand its root-level instrumentation
        calls to the collector process from now on."""
        self.duplicates.arm(service)

    def _hand_promoted(self, rows: list[dict[str, Any]]) -> None:
        """In a worker: promoted rows to the collector process, which writes the store."""
        assert self.worker is not None
        self.worker.hand_promoted(self.settings.id, rows)

    def take_promoted(self, rows: list[Any]) -> None:
        """A worker's promoted rows: to the store from here."""
        self.alerts.record_promoted(rows)

    def take_feedback(self, scores: list[Score]) -> None:
        """In a worker: feedback for traces of this worker, routed here by the collector process."""
        self.queue.enqueue_feedback(scores)

    # --- logs and scores ---------------------------------------------------------------------------------------

    async def consume_logs(self, batch: LogBatch) -> None:
        """Evaluation results other tools sent as `gen_ai.evaluation.result` events are stored as external scores."""
        scores: list[Score] = []
        for record in batch.records:
            score = score_from_event(record)
            if score is not None:
                score.project = project_of(record, self.config.project)  # the sender's, as for a trace's scores
                scores.append(score)
        if scores:
            self.queue.count_scores(scores)
            await self.queue.hand_on(scores)
            self.queue.enqueue_feedback(scores)
        if self.next.logs is not None:
            await self.next.consume_logs(batch)

    async def consume_scores(self, batch: ScoreBatch) -> None:
        """In the `scores` pipeline: scores go on; the human and external ones (`POST /v1/feedback`) also take the
        late path (in the worker holding the trace, with workers). Handed on first, so a refused batch (which the
        sender sends again) never runs it twice."""
        await self.next.consume_scores(batch)
        if self.collector is not None:
            feedback = self.late.pick(batch.scores)
            here = [s for s in feedback if s in self.evaluated_here]
            if here:
                self.queue.enqueue_feedback(here)
            routed = [s for s in feedback if s not in self.evaluated_here]
            if routed:
                self.collector.route_feedback(self.settings.id, routed)
            return
        self.queue.enqueue_feedback(batch.scores)

    async def shutdown(self) -> None:
        """Evaluate everything queued, close the open windows (their alerts still go out), then stop."""
        self.duplicates.drain()  # traces still waiting for a twin are evaluated alone
        self.sessions.drain()  # every open session is evaluated before the work loop ends
        self.queue.stop()
        work, *timers = self._tasks or [None]
        if work is not None:
            await work
        for timer in timers:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        await self.queue.on_engine(self.queue.close_windows, math.inf)
        self.queue.close()
        if self.owned is not None:  # what was seen and evaluated here, for the owners (this one restarted)
            await asyncio.to_thread(self.owned.flush)
        if self.shared_ledger is not None:
            await asyncio.to_thread(self.shared_ledger.flush)
        self.judges.close()
        await self.alerts.close()
        await asyncio.to_thread(self.baselines.close)
        await asyncio.to_thread(self.calibration.close)
