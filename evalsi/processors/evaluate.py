"""The `evaluate` processor: runs the online policies over every completed trace and session, hands on the scores.

It needs whole traces, so it sits after `tail_sampling` (which hands on `unit="trace"` batches whatever its storage
decision); spans pass through unchanged to the exporters, scores go to the `scores` pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from evalsi.component import ComponentConfig, Next, Refused, Settings, processor
from evalsi.log_record import LogBatch, LogRecord
from evalsi.score import Score, ScoreBatch
from evalsi.span import Span, SpanBatch

if TYPE_CHECKING:
    from evalsi.policies import Notifier, PolicySet


class EvaluateConfig(ComponentConfig):
    policies: list[str] = Field(default_factory=list)
    """Globs of OnlineEvalPolicy files, relative to the config file's directory (the working directory when
    there is no file)."""
    project: str = "default"
    datasets_dir: str = ".evalsi/datasets"
    """Where `promote` appends its JSONL datasets."""
    queue_size: int = Field(default=10_000, gt=0)
    """Completed traces waiting for evaluation at most; past it a trace is counted and not evaluated."""

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @model_validator(mode="after")
    def _policies_load(self, info: ValidationInfo) -> EvaluateConfig:
        base_dir = (info.context or {}).get("base_dir")
        if base_dir is not None:
            self._base_dir = Path(base_dir)
        # `evalsi validate` checks policy files too: CEL compiles, refs exist, params are valid
        _load(self)
        return self


def _load(config: EvaluateConfig) -> PolicySet:
    # imported here: the policy engine imports the normalize package, so a module-level import would be a cycle
    from evalsi.policies import PolicyError, load_policies

    try:
        return load_policies(config.policies, config._base_dir, datasets_dir=Path(config.datasets_dir))
    except PolicyError as e:
        raise ValueError(str(e)) from None


@dataclass
class _Work:
    unit: str  # "trace" | "session"
    spans: list[Span]
    completed: float  # monotonic time the trace (or session) was handed to us


EVALUATION_EVENT = "gen_ai.evaluation.result"


def score_from_event(record: LogRecord) -> Score | None:
    """A `gen_ai.evaluation.result` log record (GenAI semantic conventions) as an external score."""
    a = record.attributes
    name = a.get("gen_ai.evaluation.name")
    if record.event_name != EVALUATION_EVENT or not isinstance(name, str) or not name or not record.trace_id:
        return None
    value = a.get("gen_ai.evaluation.score.value")
    label = a.get("gen_ai.evaluation.score.label")
    explanation = a.get("gen_ai.evaluation.explanation")
    error = a.get("error.type")
    score = Score(
        name,
        value=float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None,
        passed=value if isinstance(value, bool) else None,
        label=label if isinstance(label, str) else None,
        explanation=explanation if isinstance(explanation, str) else None,
        outcome="error" if error else "scored",
        reason=str(error) if error else None,
        trace_id=record.trace_id,
        span_id=record.span_id,
        policy=str(a.get("evalsi.policy") or "external"),
        evaluator=str(a.get("evalsi.evaluator") or record.scope_name or "external"),
        source="external",
        timestamp_unix_nano=record.timestamp or time.time_ns(),
    )
    response_id = a.get("gen_ai.response.id")
    if response_id:
        score.metadata["gen_ai.response.id"] = response_id
    return score


@processor("evaluate", config=EvaluateConfig, signals=("traces", "logs"))
class Evaluate:
    """Spans go on at once; whole traces queue for evaluation on one worker thread (the policy engine keeps
    windows and budgets, so it runs single-threaded), and their scores follow into the scores pipeline. A slow
    judge therefore never holds up ingest; a full queue is counted, never silent."""

    def __init__(self, config: EvaluateConfig, settings: Settings, next: Next) -> None:
        self.config = config
        self.settings = settings
        self.next = next
        self.policies = _load(config)
        self._notifier: Notifier | None = None
        self._queue: deque[_Work] = deque()
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
        self._dropped_traces = m.counter(
            "evalsi_evaluate_traces_dropped",
            "Completed traces not evaluated because the evaluation queue was full.",
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
            "From a trace's completion to its scores handed to the scores pipeline.",
            ["processor"],
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        ).labels(sid)

    async def start(self) -> None:
        if self.next.scores is None:
            self.settings.logger.warning(
                "evaluate: no scores pipeline in service.pipelines; scores are counted and dropped "
                "(add `scores: {exporters: [clickhouse]}`)"
            )
        from evalsi.policies import Notifier

        self._notifier = Notifier()
        self._tasks = [asyncio.create_task(self._work_loop()), asyncio.create_task(self._close_windows_loop())]

    def _send_alerts(self) -> None:
        for event in self.policies.drain_alerts():
            self.settings.logger.warning(
                "alert fired", extra={"policy": event.policy, "alert": event.alert, "notify": bool(event.notify)}
            )
            if self._notifier is not None:
                self._notifier.send(event)

    def _close_windows(self, now: float | None = None) -> None:
        self.policies.close_windows(now)
        self._send_alerts()

    async def _close_windows_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            await loop.run_in_executor(self._engine, self._close_windows)

    def _evaluate(self, work: _Work) -> list[Score]:
        """On the engine thread: every policy over one trace or session."""
        t0 = time.perf_counter()
        if work.unit == "trace":
            scores: list[Score] = self.policies.evaluate_trace(work.spans)
            self._traces.inc()
        else:
            scores = self.policies.evaluate_session(work.spans)
        self._latency.observe(time.perf_counter() - t0)
        self._send_alerts()
        for s in scores:
            s.project = self.config.project
            self._scores.labels(self.settings.id, s.outcome).inc()
        return scores

    async def _hand_on(self, scores: list[Score]) -> None:
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

    async def _work_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
            work = self._queue.popleft()
            self._queue_size.set(len(self._queue))
            scores = await loop.run_in_executor(self._engine, self._evaluate, work)
            if scores:
                await self._hand_on(scores)
            self._freshness.observe(time.monotonic() - work.completed)

    def _enqueue(self, unit: str, spans: list[Span]) -> None:
        if len(self._queue) >= self.config.queue_size:
            self._dropped_traces.inc()
            self.settings.logger.warning(
                "evaluate: queue full (%d traces); trace %s not evaluated", len(self._queue), spans[0].trace_id
            )
            return
        self._queue.append(_Work(unit, spans, time.monotonic()))
        self._queue_size.set(len(self._queue))
        self._wake.set()

    async def consume(self, batch: SpanBatch) -> None:
        if batch.unit == "trace":
            traces: dict[str, list[Span]] = {}
            for span in batch.spans:
                traces.setdefault(span.trace_id, []).append(span)
            for spans in traces.values():
                self._enqueue("trace", spans)
        elif batch.unit == "session" and batch.spans:
            self._enqueue("session", batch.spans)
        await self.next.consume(batch)

    async def consume_logs(self, batch: LogBatch) -> None:
        """Evaluation results other tools sent as `gen_ai.evaluation.result` events are stored as external scores."""
        scores = [s for s in map(score_from_event, batch.records) if s is not None]
        if scores:
            for s in scores:
                s.project = self.config.project
                self._scores.labels(self.settings.id, s.outcome).inc()
            await self._hand_on(scores)
        if self.next.logs is not None:
            await self.next.consume_logs(batch)

    async def shutdown(self) -> None:
        """Evaluate everything queued, close the open windows (their alerts still go out), then stop."""
        self._stopping = True
        self._wake.set()
        work, ticker = self._tasks or (None, None)
        if work is not None:
            await work
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
        await asyncio.get_running_loop().run_in_executor(self._engine, self._close_windows, math.inf)
        self._engine.shutdown(wait=True)
        if self._notifier is not None:
            await asyncio.to_thread(self._notifier.close)
