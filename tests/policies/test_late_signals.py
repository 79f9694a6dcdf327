"""The `evaluate` processor's late path, in-process: feedback arriving through `consume_scores` (the scores
pipeline) or as `gen_ai.evaluation.result` log records finds its trace in the buffer of recent traces, or is
counted as unmatched by reason; feedback before its trace completes is used when it does."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from policy_helpers import policy_doc, span, write

from evalsi.component import Next, Settings
from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import BatchKind, Span, SpanBatch
from evalsi.processors.evaluate import Evaluate, EvaluateConfig
from evalsi.runtime.telemetry import SelfMetrics

LATE = policy_doc(
    "late", sampling={"rate": 0, "always": ["feedback.negative"]}, cascade=[{"ref": "test/echo"}]
)  # fmt: skip


class Collected:
    """The processor's next consumers: spans and scores it hands on."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.scores: list[Score] = []

    async def consume(self, batch: SpanBatch) -> None:
        self.spans.extend(batch.spans)

    async def consume_scores(self, batch: ScoreBatch) -> None:
        self.scores.extend(batch.scores)


def processor(tmp_path: Path, *docs: dict, **late_signals: Any) -> tuple[Evaluate, Collected, SelfMetrics]:
    write(tmp_path / "policies.yaml", *docs)
    raw = {"policies": ["policies.yaml"], "datasets_dir": str(tmp_path / "datasets"), "late_signals": late_signals}
    config = EvaluateConfig.model_validate(raw, context={"base_dir": tmp_path})
    metrics = SelfMetrics()
    out = Collected()
    nxt = Next()
    nxt.traces, nxt.scores = out, out
    return Evaluate(config, Settings("evaluate", metrics, logging.getLogger("test.evaluate")), nxt), out, metrics


def feedback(trace_id: str, name: str = "thumbs", **verdict: Any) -> Score:
    return Score(name, trace_id=trace_id, policy="feedback", evaluator="feedback", source="human", **verdict)


def trace(trace_id: str) -> SpanBatch:
    return SpanBatch([span(trace_id)], kind=BatchKind.TRACE)


def metric(metrics: SelfMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, {"processor": "evaluate", **labels}) or 0.0


def run(proc: Evaluate, *steps: Any) -> None:
    """Start, feed each step in order (a span batch, a score batch, a log batch, or seconds to wait), drain."""

    async def main() -> None:
        await proc.start()
        for step in steps:
            if isinstance(step, SpanBatch):
                await proc.consume(step)
            elif isinstance(step, ScoreBatch):
                await proc.consume_scores(step)
            elif isinstance(step, LogBatch):
                await proc.consume_logs(step)
            else:
                await asyncio.sleep(step)
        await proc.shutdown()

    asyncio.run(main())


def policy_scores(out: Collected) -> list[Score]:
    return [s for s in out.scores if s.source not in ("human", "external")]


def test_negative_feedback_through_the_scores_pipeline_evaluates_a_buffered_trace(tmp_path: Path) -> None:
    proc, out, metrics = processor(tmp_path, LATE)
    bad, good = "0a" * 16, "0b" * 16
    fb = [feedback(bad, passed=False), feedback(good, passed=True)]
    run(proc, trace(bad), trace(good), 0.2, ScoreBatch(fb))
    # the feedback itself goes on to the exporters; the late path adds the policy's score for the bad trace only
    assert [s for s in out.scores if s.source == "human"] == fb
    assert [(s.trace_id, s.policy, s.name) for s in policy_scores(out)] == [(bad, "late", "echo")]
    assert metric(metrics, "evalsi_late_signals_matched_total", when="late") == 2
    assert metric(metrics, "evalsi_late_signals_buffered_traces") == 2
    assert proc.policies.stats["late"].sampled_late == 1


def test_feedback_sent_as_otlp_evaluation_events_takes_the_late_path(tmp_path: Path) -> None:
    proc, out, _ = processor(tmp_path, LATE)
    tid = "0c" * 16
    verdict = {"gen_ai.evaluation.name": "correctness", "gen_ai.evaluation.score.label": "incorrect"}
    record = LogRecord(
        time_unix_nano=1, observed_time_unix_nano=1, event_name="gen_ai.evaluation.result", trace_id=tid,
        span_id="a1", attributes=verdict,
    )  # fmt: skip
    run(proc, trace(tid), 0.2, LogBatch([record]))
    assert [(s.source, s.label) for s in out.scores if s.source == "external"] == [("external", "incorrect")]
    assert [s.name for s in policy_scores(out)] == ["echo"]


def test_unmatched_feedback_is_counted_by_reason_never_an_error(tmp_path: Path, caplog: Any) -> None:
    proc, out, metrics = processor(tmp_path, LATE, window="300ms", max_traces=1)
    old, evicted, kept, unknown = "01" * 16, "02" * 16, "03" * 16, "04" * 16
    with caplog.at_level(logging.DEBUG, logger="test.evaluate"):
        run(
            proc,
            trace(old), 0.5,  # old leaves by the window
            trace(evicted), trace(kept), 0.1,  # evicted leaves by max_traces
            ScoreBatch([feedback(t, passed=False) for t in (old, evicted, kept, unknown)]),
        )  # fmt: skip
    assert metric(metrics, "evalsi_late_signals_unmatched_total", reason="expired") == 2
    assert metric(metrics, "evalsi_late_signals_unmatched_total", reason="unknown_trace") == 1
    assert metric(metrics, "evalsi_late_signals_matched_total", when="late") == 1
    assert [s.trace_id for s in policy_scores(out)] == [kept]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("not matched (expired)" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


def test_feedback_before_its_trace_completes_is_seen_online(tmp_path: Path) -> None:
    proc, out, metrics = processor(tmp_path, LATE)
    tid = "05" * 16
    run(proc, ScoreBatch([feedback(tid, label="thumbs_down")]), 0.1, trace(tid))
    assert [s.name for s in policy_scores(out)] == ["echo"]
    assert metric(metrics, "evalsi_late_signals_matched_total", when="early") == 1
    assert proc.policies.stats["late"].sampled_late == 0  # brought in online, by `always`
    assert proc.policies.stats["late"].sampled_always == 1


def test_without_a_policy_reading_feedback_nothing_is_buffered_or_counted(tmp_path: Path) -> None:
    proc, out, metrics = processor(tmp_path, policy_doc("plain", sampling={"rate": 0}))
    tid = "06" * 16
    run(proc, trace(tid), 0.1, ScoreBatch([feedback(tid, passed=False)]))
    assert policy_scores(out) == []
    assert metric(metrics, "evalsi_late_signals_buffered_traces") == 0
    assert metric(metrics, "evalsi_late_signals_unmatched_total", reason="unknown_trace") == 0
