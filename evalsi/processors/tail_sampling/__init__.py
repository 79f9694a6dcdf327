"""The tail_sampling processor: assembles whole traces, decides which to store, and hands every trace on."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from evalsi.component import Next, Refused, Settings, processor
from evalsi.model.span import BatchKind, Span, SpanBatch, trace_key
from evalsi.processors.tail_sampling.buffer import (
    EVICTED,
    MAX_TRACE_DURATION,
    QUIET,
    SHUTDOWN,
    Session,
    SessionBuffer,
    Trace,
    TraceBuffer,
    session_of,
)
from evalsi.processors.tail_sampling.config import PolicyConfig, TailSamplingConfig
from evalsi.processors.tail_sampling.decisions import DecidedTraces, DecisionCache
from evalsi.processors.tail_sampling.policies import Decision, PolicySet
from evalsi.runtime.held import arrived_of, earliest

__all__ = ["PolicyConfig", "TailSampling", "TailSamplingConfig"]

MAX_BATCH_SPANS = 2_000
"""Whole traces are batched together up to this many spans. evaluate takes a batch whenever its queue has room, so
one batch is how far it goes past `queue_size`: at 10,000 a worker's queue held up to ~2,400 five-span traces
for a `queue_size` of 1,000 (~12,000 spans, ~60 MB of them)."""
_DECISION = {True: "sampled", False: "not_sampled"}


@processor("tail_sampling", config=TailSamplingConfig, makes=(BatchKind.TRACE, BatchKind.SESSION))
class TailSampling:
    """Buffers spans by trace until the trace is complete, decides with the policies, hands the trace on.

    Every complete trace goes on as a `BatchKind.TRACE` batch whatever the decision, each span's `sampled` set to
    it (exporters store only sampled spans; evaluation sees them all). Late spans follow their trace's cached
    decision; traces sharing a session id also go on as `BatchKind.SESSION` once the session is quiet.
    """

    def __init__(
        self, config: TailSamplingConfig, settings: Settings, next: Next, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.settings = settings
        self.next = next
        self._clock = clock
        self._log = settings.logger
        self._buffer = TraceBuffer(
            config.decision_wait, config.max_trace_duration, config.num_traces, config.max_buffered_bytes
        )
        self._sessions = SessionBuffer(config.session_timeout, config.max_sessions, config.max_session_spans)
        cache = config.decision_cache
        self._decisions = DecisionCache(cache.sampled_cache_size, cache.non_sampled_cache_size)
        self._decided = DecidedTraces(cache.trace_cache_size if config.late_span_reevaluation else 0)
        self._policies = PolicySet(list(config.policies), config.sample_on_first_match)
        # decided spans not yet taken by the next consumer, in order; while it refuses, new spans are refused too
        self._outbox: deque[SpanBatch] = deque()
        self._outbox_spans = 0
        self._blocked = False
        self._retry_after = 1.0
        self._refusal: Refused | None = None  # why the next consumer refused the outbox's head
        self._send_lock = asyncio.Lock()
        self._ticker: asyncio.Task[None] | None = None
        self._stopped = False
        self._eviction_logged = float("-inf")
        self._policy_failure_logged = False
        self._metrics(settings)

    def _metrics(self, settings: Settings) -> None:
        m, cid = settings.metrics, settings.id
        traces = m.counter(
            "evalsi_tail_sampling_traces", "Complete traces, by storage decision.", ["processor", "decision"]
        )
        spans = m.counter(
            "evalsi_tail_sampling_spans",
            "Spans of complete traces, by storage decision (not_sampled: handed on, not stored).",
            ["processor", "decision"],
        )
        late = m.counter(
            "evalsi_tail_sampling_late_spans",
            "Spans that arrived after their trace was decided and followed its cached decision.",
            ["processor", "decision"],
        )
        self._traces_by = {s: traces.labels(cid, d) for s, d in _DECISION.items()}
        self._spans_by = {s: spans.labels(cid, d) for s, d in _DECISION.items()}
        self._late_by = {s: late.labels(cid, d) for s, d in _DECISION.items()}
        self._completed = m.counter(
            "evalsi_tail_sampling_traces_completed",
            "Traces taken out of the buffer, by why: quiet (root arrived, then decision_wait without spans), "
            "max_trace_duration, evicted (buffer limits), shutdown.",
            ["processor", "reason"],
        )
        self._completed_by = {r: self._completed.labels(cid, r) for r in (QUIET, MAX_TRACE_DURATION, EVICTED, SHUTDOWN)}
        self._evicted = m.counter(
            "evalsi_traces_evicted",
            "Traces decided early, before they were complete, because a buffer limit was reached.",
            ["processor", "reason"],
        )
        self._votes = m.counter(
            "evalsi_tail_sampling_policy_decisions",
            "Votes of each top-level policy.",
            ["processor", "policy", "decision"],
        )
        self._vote_children: dict[tuple[str, Decision], Any] = {}
        self._policy_errors = m.counter(
            "evalsi_tail_sampling_policy_errors",
            "Traces whose policies failed to evaluate; such a trace is sampled.",
            ["processor"],
        ).labels(cid)
        self._reemitted = m.counter(
            "evalsi_tail_sampling_traces_reemitted",
            "Decided traces handed on again as a revision because a late span arrived (late_span_reevaluation).",
            ["processor"],
        ).labels(cid)
        self._sessions_done = m.counter(
            "evalsi_tail_sampling_sessions",
            "Sessions handed on, by why: quiet, evicted, shutdown.",
            ["processor", "reason"],
        )
        self._sessions_evicted = m.counter(
            "evalsi_sessions_evicted",
            "Sessions handed on early, before session_timeout of quiet, because a session limit was reached.",
            ["processor", "reason"],
        )
        self._lost = m.counter(
            "evalsi_tail_sampling_spans_lost",
            "Decided spans the next consumer failed on (an error other than backpressure) or never took by the "
            "end of shutdown.",
            ["processor"],
        ).labels(cid)
        self._g_traces = m.gauge(
            "evalsi_tail_sampling_traces_buffered", "Traces buffered, undecided.", ["processor"]
        ).labels(cid)
        self._g_bytes = m.gauge(
            "evalsi_tail_sampling_buffered_bytes", "Estimated bytes of buffered spans.", ["processor"]
        ).labels(cid)
        self._g_sessions = m.gauge("evalsi_tail_sampling_sessions_open", "Sessions open.", ["processor"]).labels(cid)
        self._g_outbox = m.gauge(
            "evalsi_tail_sampling_outbox_spans", "Decided spans waiting for the next consumer.", ["processor"]
        ).labels(cid)

    # --- lifecycle ---------------------------------------------------------------------------------------------

    def no_session_consumers(self) -> None:
        """Nothing after this processor acts on sessions (no policy has session-scope stages, or they are
        assembled elsewhere): hold no sessions, hand on no session batches."""
        self._sessions = SessionBuffer(self.config.session_timeout, 0, 0)

    async def start(self) -> None:
        self._ticker = asyncio.create_task(self._tick_loop())

    async def _tick_loop(self) -> None:
        period = min(0.1, max(0.01, self.config.decision_wait / 10))
        while True:
            await asyncio.sleep(period)
            try:
                await self.tick()
            except Exception:
                self._log.exception("tail_sampling: deciding traces failed; retrying on the next tick")

    async def shutdown(self) -> None:
        """Decide every buffered trace, complete every open session, and hand them all on."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        self._stopped = True
        now = self._clock()
        self._complete([(t, SHUTDOWN) for t in self._buffer.drain()], now)
        for session in self._sessions.drain():
            self._hand_on_session(session, SHUTDOWN)
        for _ in range(50):  # the exporters still run: give a full queue a few seconds to drain
            await self._send()
            if not self._outbox:
                break
            await asyncio.sleep(0.1)
        if self._outbox:
            self._lost.inc(self._outbox_spans)
            self._log.error("tail_sampling: %d decided spans could not be handed on at shutdown", self._outbox_spans)
            self._outbox.clear()
            self._outbox_spans = 0
        self._gauges()

    # --- intake ------------------------------------------------------------------------------------------------

    def held_since(self) -> float | None:
        """When the oldest span buffered or waiting in the outbox reached a receiver (see `wal.py`); a
        session's spans are not counted: they were handed on with their traces."""
        buffered = arrived_of(span for trace in self._buffer.traces.values() for span in trace.spans)
        waiting = arrived_of(s for b in self._outbox if b.kind is not BatchKind.SESSION for s in b.spans)
        return earliest((buffered, waiting))

    async def consume(self, batch: SpanBatch) -> None:
        if batch.kind is BatchKind.SESSION:
            self._enqueue(batch.spans, BatchKind.SESSION)
            await self._send()
            return
        if self._stopped:
            raise Refused("tail_sampling is shut down", unavailable=True, retry_after=5)
        if self._blocked:
            # the next consumer's reason: a store outage stays a 503 / UNAVAILABLE, a full queue a 429
            why = self._refusal
            raise Refused(
                f"tail_sampling: {self._outbox_spans} decided spans wait for the next consumer ({why}); retry later",
                unavailable=why.unavailable if why is not None else False,
                retry_after=self._retry_after,
            )
        now = self._clock()
        buffer = self._buffer
        traces = buffer.traces
        decisions = self._decisions
        revision = batch.revision
        late: list[Span] = []
        revised: list[Span] = []
        reemit: dict[str, list[Span]] = {}
        for span in batch.spans:
            key = trace_key(span)
            trace = traces.get(key)
            if trace is not None:
                if revision:
                    buffer.replace(trace, span)
                else:
                    buffer.add(span, now, trace)
                continue
            sampled = decisions.get(key)
            if sampled is None:
                if revision:
                    revised.append(span)  # its trace's decision is forgotten: it goes on as it is
                else:
                    buffer.add(span, now)
                continue
            span.sampled = sampled and span.sampled
            if revision:
                self._decided.revise(span)
                revised.append(span)
            else:
                self._late(span, sampled, now, late, reemit)
        evicted = buffer.evict()
        if evicted:
            self._complete(evicted, now)
        if late:
            self._enqueue(late, BatchKind.SPANS)
        if revised:
            self._enqueue(revised, BatchKind.SPANS, revision=True)
        for spans in reemit.values():
            # the whole trace again, the late span included, as a revision: the store replaces rows by span id,
            # so no span is stored twice, and evaluation sees the trace complete
            self._enqueue(list(spans), BatchKind.TRACE, revision=True)
            self._reemitted.inc()
        if late or reemit:
            self._evict_sessions()  # late spans join open sessions
        if self._outbox:
            await self._send()
        self._gauges()

    def _late(self, span: Span, sampled: bool, now: float, late: list[Span], reemit: dict[str, list[Span]]) -> None:
        self._late_by[sampled].inc()
        self._sessions.add_late(span, now)
        key = trace_key(span)
        spans = self._decided.get(key) if self._decided.size else None
        if spans is None:
            late.append(span)
            return
        spans.append(span)
        reemit[key] = spans

    # --- decisions ---------------------------------------------------------------------------------------------

    async def tick(self) -> None:
        """Decide the traces complete by now, hand on the sessions gone quiet, retry what was refused."""
        now = self._clock()
        done = self._buffer.due(now)
        if done:
            self._complete(done, now)
        for session in self._sessions.due(now):
            self._hand_on_session(session, QUIET)
        if self._outbox:
            await self._send()
        self._gauges()

    def _complete(self, done: list[tuple[Trace, str]], now: float) -> None:
        sessions = self._sessions
        for trace, reason in done:
            sampled = self._decide(trace, now)
            spans = trace.spans
            for span in spans:
                # a span sampled out upstream (head sampling) stays out
                span.sampled = sampled and span.sampled
            self._traces_by[sampled].inc()
            self._spans_by[sampled].inc(len(spans))
            completed = self._completed_by.get(reason)
            if completed is not None:
                completed.inc()
            else:
                self._completed_by[EVICTED].inc()
                self._evicted.labels(self.settings.id, reason).inc()
                self._warn_eviction(reason)
            self._decisions.put(trace.key, sampled)
            if self._decided.size:
                self._decided.put(trace.key, list(spans))
            if sessions.enabled:
                session = session_of(spans)
                if session is not None:
                    sessions.add(session, spans, now)
            self._enqueue(spans, BatchKind.TRACE)
        self._evict_sessions()

    def _evict_sessions(self) -> None:
        if not self._sessions.enabled:
            return
        for session, why in self._sessions.evict():
            self._sessions_evicted.labels(self.settings.id, why).inc()
            self._hand_on_session(session, EVICTED)

    def _decide(self, trace: Trace, now: float) -> bool:
        try:
            return self._policies.decide(trace, now, self._vote)
        except Exception:
            # a policy bug must not cost the trace: it is kept, and the failure counted
            self._policy_errors.inc()
            if not self._policy_failure_logged:
                self._policy_failure_logged = True
                self._log.exception(
                    "tail_sampling: policies failed on trace %s; it is sampled (logged once)", trace.trace_id
                )
            return True

    def _vote(self, policy: str, decision: Decision) -> None:
        child = self._vote_children.get((policy, decision))
        if child is None:
            child = self._vote_children[(policy, decision)] = self._votes.labels(
                self.settings.id, policy, decision.value
            )
        child.inc()

    def _warn_eviction(self, reason: str) -> None:
        now = time.monotonic()
        if now - self._eviction_logged >= 60:
            self._eviction_logged = now
            self._log.warning(
                "tail_sampling: %s reached; the oldest traces are decided before they are complete "
                "(counted in evalsi_traces_evicted_total; raise the limit or lower decision_wait)",
                reason,
            )

    def _hand_on_session(self, session: Session, reason: str) -> None:
        self._sessions_done.labels(self.settings.id, reason).inc()
        self._enqueue(session.spans, BatchKind.SESSION)

    # --- output ------------------------------------------------------------------------------------------------

    def _enqueue(self, spans: list[Span], kind: BatchKind, revision: bool = False) -> None:
        n = len(spans)
        outbox = self._outbox
        self._outbox_spans += n
        if outbox and kind is not BatchKind.SESSION:
            last = outbox[-1]
            if last.kind is kind and last.revision == revision and len(last.spans) + n <= MAX_BATCH_SPANS:
                last.spans.extend(spans)
                return
        outbox.append(SpanBatch(list(spans), revision, kind, completed=self._clock()))

    async def _send(self) -> None:
        """Hand the outbox on in order; a refusal keeps the rest (and refuses new spans) until a later try."""
        async with self._send_lock:
            outbox = self._outbox
            while outbox:
                # taken out while in flight, so nothing is appended to a batch the next consumer already holds
                batch = outbox.popleft()
                try:
                    await self.next.consume(batch)
                except Refused as e:
                    outbox.appendleft(batch)
                    self._blocked = True
                    self._retry_after = e.retry_after
                    # kept without its traceback: its frames hold the batch, and this frame holds `self`, a cycle
                    self._refusal = e.with_traceback(None)
                    return
                except Exception:
                    self._lost.inc(len(batch.spans))
                    self._log.exception(
                        "tail_sampling: the next consumer failed on %d spans (%s); they are lost",
                        len(batch),
                        batch.kind,
                    )
                self._outbox_spans -= len(batch.spans)
            self._blocked = False

    def _gauges(self) -> None:
        self._g_traces.set(len(self._buffer))
        self._g_bytes.set(self._buffer.bytes)
        self._g_sessions.set(len(self._sessions))
        self._g_outbox.set(self._outbox_spans)
