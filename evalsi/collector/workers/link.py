"""In a pipeline worker, the store link: stands where the store exporter stands and sends its rows to the collector."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from typing import Any

from evalsi.component import Refused
from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.score import ScoreBatch, score_rows
from evalsi.model.span import BatchKind, Span, SpanBatch
from evalsi.runtime.held import arrived_of, earliest
from evalsi.runtime.supervise import supervise
from evalsi.runtime.telemetry import SelfMetrics, items_refused_counter
from evalsi.store import RowEncoder, RowKind, Rows

log = logging.getLogger("evalsi.workers")

# the store link sends rows once it holds this many, or after LINK_FLUSH seconds, in tables of this many at most
LINK_ROWS = 4_000
LINK_FLUSH = 0.2
# row tables a worker may have sent and the collector not yet queued for the store
LINK_TABLES_IN_FLIGHT = 16
STORE_LINK = "store_link"  # the exporter label of what a worker's store link counts


class StoreLink:
    """In a worker, stands where the store exporter stands in the pipelines: puts spans and log records in the
    store's Arrow columns and sends them to the collector process, which writes them."""

    mutates_data = False
    """`MutatesData`: it only reads the spans it is handed, so a fan-out hands it the batch itself."""

    def __init__(
        self,
        rows: RowEncoder,
        outbox: queue.SimpleQueue[Any],
        tables_taken: threading.Semaphore,
        metrics: SelfMetrics | None = None,
    ) -> None:
        self._rows = rows
        self._outbox = outbox
        self.metrics = metrics or SelfMetrics()  # the worker's service metrics, once it has them
        self._room = tables_taken  # one permit per table the collector may not have queued yet
        self._spans: list[Span] = []
        self._logs: list[LogRecord] = []
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self.peers: WorkerPeers | None = None
        """How the worker's processors reach the collector process (set by the worker runtime)."""

    def _send(self, kind: RowKind, rows: Rows, arrived: float | None) -> None:
        if not self._room.acquire(blocking=False):
            raise Refused("the store is behind; retry later", retry_after=0.5)
        self._outbox.put(("table", kind, arrived, rows))  # the body goes last (see pipe.py)

    def held_since(self) -> float | None:
        """When the oldest span or log record not yet sent to the collector reached a receiver."""
        return earliest((arrived_of(self._spans), arrived_of(self._logs)))

    async def consume(self, batch: SpanBatch) -> None:
        if batch.kind is BatchKind.SESSION:
            return  # a session's spans were stored as their traces completed
        spans = [s for s in batch.spans if s.sampled]
        if not spans:
            return
        if batch.revision:
            self._flush_spans()  # a revision goes after the spans it revises
            rows = self._encode("revisions", spans)
            if rows is not None:
                self._send("revisions", rows, arrived_of(spans))
            return
        if not self._room_left():
            raise Refused("the store is behind; retry later", retry_after=0.5)
        self._spans.extend(spans)  # taken: from here a refusal only delays them (a retry would add them twice)
        if len(self._spans) >= LINK_ROWS:
            with contextlib.suppress(Refused):
                self._flush_spans()

    async def consume_logs(self, batch: LogBatch) -> None:
        if not self._room_left():
            raise Refused("the store is behind; retry later", retry_after=0.5)
        self._logs.extend(batch.records)
        if len(self._logs) >= LINK_ROWS:
            with contextlib.suppress(Refused):
                self._flush_logs()

    async def consume_scores(self, batch: ScoreBatch) -> None:
        raise Refused("scores are not written from pipeline workers", unavailable=True)

    def _room_left(self) -> bool:
        # a Semaphore has no public count; try and give back
        if self._room.acquire(blocking=False):
            self._room.release()
            return True
        return False

    def _encode(self, kind: RowKind, items: list[Any]) -> Rows | None:
        """The items as the store's rows; an item whose values no column can hold is dropped alone, counted and
        logged, as the store exporter does."""
        rows, bad = self._rows.encode(kind, items)
        what = {"spans": "spans", "revisions": "span revisions", "logs": "log records"}[kind]
        if bad:
            dropped = items_refused_counter(self.metrics)
            for item, error in bad:
                dropped.labels(STORE_LINK, what, type(error).__name__).inc()
                log.error(
                    f"dropping {what} the store refuses for their data; the others are stored",
                    extra={"reason": type(error).__name__, "error": str(error)[:500],
                           "ids": f"{item.trace_id}/{item.span_id}"},
                )  # fmt: skip
        return rows

    def _flush_spans(self) -> None:
        self._flush("spans", self._spans)

    def _flush_logs(self) -> None:
        self._flush("logs", self._logs)

    def _flush(self, kind: RowKind, held: list[Any]) -> None:
        """Send what `held` holds in tables of `LINK_ROWS` rows at most, each taken out of `held` once sent (a
        refusal or a failure leaves the rest for the next flush). What the link holds can pass `LINK_ROWS` by a whole
        hand-off: one table of it all would hold its columns and their IPC copy alive together."""
        while held:
            items = held[:LINK_ROWS]
            rows = self._encode(kind, items)
            if rows is not None:
                self._send(kind, rows, arrived_of(items))
            del held[: len(items)]

    async def start(self) -> None:
        self._rows.prepare()  # before the worker reports ready
        self._task = supervise("store link flush", self._flush_loop, log=log, metrics=self.metrics)

    async def _flush_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(LINK_FLUSH)
            with contextlib.suppress(Refused):
                self._flush_spans()
                self._flush_logs()

    async def shutdown(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._spans or self._logs:
            try:
                self._flush_spans()
                self._flush_logs()
            except Refused:
                await asyncio.sleep(0.05)


# evaluated results a worker may have sent and the collector not yet handed to its scores pipeline
EVALUATED_IN_FLIGHT = 8
LEDGER_TIMEOUT_S = 30.0


class RemoteLedger:
    """In a worker, the judges' ledger: every reservation, charge and rate-limit slot is asked of the collector
    process, which keeps one ledger for all workers (`JudgeLedger`). Called from the evaluation thread; each call
    waits for its answer (a judge call takes far longer than the round trip)."""

    def __init__(self, outbox: queue.SimpleQueue[Any]) -> None:
        self._outbox = outbox
        self._lock = threading.Lock()
        self._seq = 0
        self._waiting: dict[int, tuple[threading.Event, list[Any]]] = {}

    def _ask(self, op: str, *args: Any) -> Any:
        event, answer = threading.Event(), []
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._waiting[seq] = (event, answer)
        self._outbox.put(("ledger", seq, op, args))
        if not event.wait(LEDGER_TIMEOUT_S):
            with self._lock:
                self._waiting.pop(seq, None)
            raise TimeoutError(f"the collector process did not answer the judge ledger's {op} in {LEDGER_TIMEOUT_S}s")
        if isinstance(answer[0], Exception):  # what the collector's ledger raised (`LedgerUnavailable`)
            raise answer[0]
        return answer[0]

    def answered(self, seq: int, value: Any) -> None:
        """The collector's answer (the worker's receive thread)."""
        with self._lock:
            waiting = self._waiting.pop(seq, None)
        if waiting is not None:
            waiting[1].append(value)
            waiting[0].set()

    def reserve(self, slot: tuple[str, int], max_calls: int | None, max_tokens: int | None,
                max_usd: float | None) -> bool:  # fmt: skip
        return bool(self._ask("reserve", slot, max_calls, max_tokens, max_usd))

    def charge(self, slot: tuple[str, int], tokens: int, usd: float) -> None:
        self._ask("charge", slot, tokens, usd)

    def next_call(self, judge: str, interval_s: float) -> float:
        return float(self._ask("next_call", judge, interval_s))


class WorkerPeers:
    """In a worker, how processors reach the collector process (`component.WorkerPeers`): evaluated scores with
    their window records, traces of sessions, and the judges' ledger, over the worker's pipe."""

    def __init__(self, outbox: queue.SimpleQueue[Any]) -> None:
        self._outbox = outbox
        self._room = threading.Semaphore(EVALUATED_IN_FLIGHT)
        self.ledger = RemoteLedger(outbox)

    def hand_evaluated(self, processor: str, scores: list[Any], windows: list[Any]) -> None:
        if not self._room.acquire(blocking=False):
            raise Refused("the collector process has not taken the last scores yet", retry_after=0.05)
        # plain tuples pickle far cheaper than objects; a window record names its scores by their index
        index = {id(s): i for i, s in enumerate(scores)}
        records = [(w.policy, w.trace_id, w.new_trace, [index[id(s)] for s in w.scores], w.shed) for w in windows]
        self._outbox.put(("evaluated", processor, score_rows(scores), records))

    def evaluated_taken(self) -> None:
        self._room.release()

    def hand_session_trace(self, processor: str, spans: list[Any]) -> None:
        self._outbox.put(("session_trace", processor, spans))

    def hand_promoted(self, processor: str, rows: list[Any]) -> None:
        self._outbox.put(("promoted", processor, rows))

    def hand_twin_trace(self, processor: str, spans: list[Any]) -> None:
        self._outbox.put(("twin_trace", processor, spans))
