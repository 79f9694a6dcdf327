"""Late feedback: human and external scores that arrive after (or before) the trace they are about.

`LateFeedback` owns the buffers, keyed by (project, trace id) so feedback reaches only its own project's traces:
the completed traces kept for a second look (`recent`), the feedback that came before its trace (`early`) and the
ids of traces that left the buffer (`gone`, to count their feedback as `expired`). It belongs to the engine thread:
only that thread reads and writes the buffers. Its metrics: `evalsi_late_signals_matched`, `_unmatched`,
`_buffered_traces`.

`EvaluatedHere` is the collector process's note (with pipeline workers) of the traces evaluated there rather than
in a worker, whose feedback therefore stays there; it belongs to the event loop.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from evalsi.component import Settings
from evalsi.model.score import Score
from evalsi.model.span import Span, TraceKey, trace_key
from evalsi.policies import PolicySet
from evalsi.policies.feedback import is_feedback
from evalsi.policies.policy import PolicyDecision
from evalsi.processors.evaluate.config import LateSignalsConfig

GONE_PER_TRACE = 10
"""Ids of traces that left the buffer are remembered (to count feedback for them as `expired`, not `unknown_trace`)
for the last 10 x `max_traces` of them: about 170 bytes each, against kilobytes per buffered trace."""


@dataclass
class BufferedTrace:
    """A completed trace kept for late feedback: its spans, what each feedback-reading policy did with it, and the
    feedback so far."""

    spans: list[Span]
    decisions: dict[str, PolicyDecision]
    feedback: list[Score]
    expires: float  # monotonic


class LateFeedback:
    """Gives the policies that read `feedback` a second look at a recent trace when its feedback arrives, and hands
    feedback that came first to the trace's evaluation when it completes. On by `use` when some policy reads
    `feedback` and `late_signals.max_traces` > 0."""

    def __init__(self, config: LateSignalsConfig, settings: Settings, project: str) -> None:
        self.config = config
        self.settings = settings
        self.project = project
        """The project of traces that carry none (as the receiver stamps it)."""
        self.enabled = False
        self.recent: OrderedDict[TraceKey, BufferedTrace] = OrderedDict()  # by completion: the oldest first
        self.gone: OrderedDict[TraceKey, None] = OrderedDict()  # traces that left the buffer, to tell `expired`
        self.early: OrderedDict[TraceKey, tuple[float, list[Score]]] = OrderedDict()  # feedback before its trace
        m, sid = settings.metrics, settings.id
        self._matched = m.counter(
            "evalsi_late_signals_matched",
            "Feedback scores that found their trace: buffered (`late`) or completing after them (`early`).",
            ["processor", "when"],
        )
        self._unmatched = m.counter(
            "evalsi_late_signals_unmatched",
            "Feedback scores whose trace was not at hand: `unknown_trace` (never seen, or not complete yet), "
            "`expired` (left the buffer), `queue_full`.",
            ["processor", "reason"],
        )
        self._buffered = m.gauge(
            "evalsi_late_signals_buffered_traces", "Completed traces kept for late feedback.", ["processor"]
        ).labels(sid)

    def use(self, policies: PolicySet) -> None:
        """On when some of `policies` reads `feedback` (and the buffer may hold traces)."""
        self.enabled = bool(policies.late) and self.config.max_traces > 0

    def pick(self, scores: list[Score]) -> list[Score]:
        """The human and external scores among `scores`, when the late path is on; else none."""
        return [s for s in scores if is_feedback(s)] if self.enabled else []

    def queue_full(self, n: int) -> None:
        """`n` feedback scores found the evaluation queue full."""
        self._unmatched.labels(self.settings.id, "queue_full").inc(n)
        self.settings.logger.debug("late feedback not matched: the evaluation queue is full")

    def expire(self, now: float) -> None:
        """Drop buffered traces and held feedback past the window, and the oldest traces past `max_traces`."""
        late = self.config
        while self.recent:
            key, recent = next(iter(self.recent.items()))
            if recent.expires > now and len(self.recent) <= late.max_traces:
                break
            del self.recent[key]
            self.gone[key] = None
        while len(self.gone) > GONE_PER_TRACE * late.max_traces:
            self.gone.popitem(last=False)
        while self.early:
            arrived, _ = next(iter(self.early.values()))
            if arrived + late.window > now and len(self.early) <= late.max_traces:
                break
            self.early.popitem(last=False)
        self._buffered.set(len(self.recent))

    def evaluate_trace(self, policies: PolicySet, spans: list[Span]) -> list[Score]:
        """Every policy over a completed trace, with the feedback it has so far; kept if a feedback-reading policy
        selected it."""
        if not self.enabled:
            return policies.evaluate_trace(spans)
        key = trace_key(spans[0], self.project)
        held = self.early.pop(key, None)
        early = held[1] if held else []
        if early:
            self._matched.labels(self.settings.id, "early").inc(len(early))
        # completed again (spans after tail sampling's decision): its feedback so far still holds
        previous = self.recent.pop(key, None)
        feedback = [*(previous.feedback if previous else ()), *early]
        decisions: dict[str, PolicyDecision] = {}
        scores = policies.evaluate_trace(spans, feedback=feedback, decisions=decisions)
        if decisions:  # some policy that reads feedback selected the trace
            now = time.monotonic()
            self.gone.pop(key, None)
            self.recent[key] = BufferedTrace(spans, decisions, feedback, now + self.config.window)
            self.expire(now)
        elif previous is not None:
            self.gone[key] = None
        return scores

    def evaluate_feedback(self, policies: PolicySet, feedback: list[Score]) -> list[Score]:
        """The late path: each trace the feedback is about gets a second look from the policies that read it. The
        feedback's project (its sender's) is part of the trace it names: another project's feedback on a trace id
        matches nothing of this one."""
        now = time.monotonic()
        self.expire(now)
        by_trace: dict[TraceKey, list[Score]] = {}
        for s in feedback:
            by_trace.setdefault(TraceKey(s.project, s.trace_id), []).append(s)
        out: list[Score] = []
        sid = self.settings.id
        for key, scores in by_trace.items():
            recent = self.recent.get(key)
            if recent is None:
                reason = "expired" if key in self.gone else "unknown_trace"
                self._unmatched.labels(sid, reason).inc(len(scores))
                self.settings.logger.debug(
                    "late feedback for trace %s not matched (%s)", key, reason, extra={"reason": reason}
                )
                if reason == "unknown_trace":  # maybe not complete yet: the online evaluation will see it
                    arrived, held = self.early.pop(key, (now, []))
                    self.early[key] = (arrived, held + scores)
                continue
            self._matched.labels(sid, "late").inc(len(scores))
            recent.feedback.extend(scores)
            out += policies.evaluate_late(recent.spans, recent.feedback, recent.decisions)
        self.expire(now)
        return out


class EvaluatedHere:
    """In the collector process with workers: the (project, trace id) of the traces evaluated here (duplicate calls
    joined across workers), the last `max_traces` of them, whose late feedback stays here rather than going to a
    worker."""

    def __init__(self, config: LateSignalsConfig, project: str) -> None:
        self.config = config
        self.project = project
        self._keys: OrderedDict[TraceKey, None] = OrderedDict()

    def add(self, spans: list[Span]) -> None:
        for key in dict.fromkeys(trace_key(s, self.project) for s in spans):
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > max(self.config.max_traces, 1):
            self._keys.popitem(last=False)

    def __contains__(self, score: Score) -> bool:
        """Whether `score` is about a trace evaluated here."""
        return TraceKey(score.project, score.trace_id) in self._keys
