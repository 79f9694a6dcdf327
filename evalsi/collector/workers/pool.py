"""The collector side of the pipeline workers: spawns them, shards encoded requests to them, queues their rows for
the store, and restarts one that dies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric

from evalsi.capabilities import EvaluationHub
from evalsi.collector.config import Config
from evalsi.collector.workers.pipe import local_pair, receive_message, send_message, widen_pipe
from evalsi.collector.workers.worker import PipelineFactory, ShardThread, worker_main
from evalsi.component import Refused
from evalsi.evaluators.judge_client import JudgeLedger, LocalLedger
from evalsi.model.encoded import EncodedBatch
from evalsi.model.log_record import LogBatch
from evalsi.model.score import Score, scores_from_rows
from evalsi.model.span import SpanBatch, trace_shard
from evalsi.policies.window import WindowRecord
from evalsi.runtime.held import earliest
from evalsi.runtime.telemetry import SelfMetrics
from evalsi.store import RowKind, StoreExporter

log = logging.getLogger("evalsi.workers")

START_TIMEOUT = 120.0
ANSWER_MARGIN = 0.1
"""Seconds before a sender's deadline that a request stops waiting for room: time to send the refusal."""


def _evaluated(rows: list[tuple[Any, ...]], records: list[tuple[Any, ...]]) -> tuple[list[Score], list[WindowRecord]]:
    """A worker's evaluated scores and window records, as `WorkerPeers.hand_evaluated` sent them."""
    scores = scores_from_rows(rows)
    windows = [WindowRecord(policy, trace, new, [scores[i] for i in picked], shed)
               for policy, trace, new, picked, shed in records]  # fmt: skip
    return scores, windows


LOCAL_SHARE, WORKER_SHARE = 1, 3
"""With `service.collector_shard`, the collector's shard owns one slot for each three a worker process owns: the
collector process also takes the intake and the store, so with two workers each process then takes about half the
CPU (`pipeline.py`: 124-137 against 127-134 µs a span; at one slot for two, 140-142 against 115-116, with a higher
collector peak; benchmarks/README.md)."""


def slot_owners(workers: int, collector_shard: bool) -> tuple[int, ...]:
    """Which worker owns each slot the receivers shard traces over: one slot a worker, or with the collector's own
    shard (worker 0), its `LOCAL_SHARE` and each worker process's `WORKER_SHARE`."""
    if not collector_shard:
        return tuple(range(workers))
    return (0,) * LOCAL_SHARE + tuple(i for i in range(1, workers) for _ in range(WORKER_SHARE))


@dataclass
class _Worker:
    index: int
    local: bool = False  # the shard the collector process runs in a thread (`service.collector_shard`)
    process: Any = None
    conn: Any = None
    outbox: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    # requests sent that the worker's pipelines have not taken, and when each reached a receiver
    in_flight: dict[int, float] = field(default_factory=dict)
    held: float | None = None  # what the worker last said it holds (see `WorkerPool.held_since`)
    ready: asyncio.Future[int] | None = None
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    metrics: list[Metric] = field(default_factory=list)
    stopping: bool = False


class WorkerPool:
    """The collector side of the workers: starts them, shards requests to them, and queues their store tables."""

    def __init__(
        self,
        config: Config,
        store: StoreExporter | None,
        metrics: SelfMetrics,
        pipeline: PipelineFactory,
        hubs: dict[str, EvaluationHub] | None = None,
    ) -> None:
        local = config.service.collector_shard
        self._owner = slot_owners(config.service.workers, local)
        self.shards = len(self._owner)
        """How many slots the receivers shard traces over (`shard_of`); `_owner` says which worker owns each."""
        self._config = config
        self._pipeline = pipeline  # what each worker runs: a service of the traces and logs pipelines
        self._store = store  # the exporter owning the store, or None when no pipeline writes a store
        self._max_in_flight = config.service.worker_max_in_flight
        self._wait = config.service.worker_wait
        self._room = asyncio.Event()  # set when a worker took a request (or was replaced): waiting requests look again
        self._waited = metrics.counter(
            "evalsi_worker_wait_seconds",
            "Time requests waited for room in their workers (service.worker_wait) before being taken or refused.",
            [],
        )
        self._workers = [_Worker(i, local=local and i == 0) for i in range(config.service.workers)]
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._restarts = metrics.counter(
            "evalsi_worker_restarts", "Pipeline worker processes restarted after they died.", ["worker"]
        )
        self._lost = metrics.counter(
            "evalsi_worker_lost_requests",
            "Accepted requests a worker died holding (some of their spans or log records may be lost).",
            ["worker"],
        )
        self.unstored: dict[str, int] = {}
        """Accepted requests workers died holding or did not drain in time, and what their pipelines could not
        hand on before they stopped (a processor's refused part), by kind."""
        self.hubs = hubs if hubs is not None else {}
        """The collector process's side of each processor that runs in the workers and meets here (`evaluate`):
        it takes the workers' evaluated scores, session traces and possible duplicate calls, by processor id."""
        self.lost_since: float | None = None
        """With a write-ahead log: when the oldest item a dead worker held reached a receiver (kept in the log)."""
        self.ledger: JudgeLedger = LocalLedger()
        """The judges' budgets and rate limits of every worker, kept here: one budget, not one per worker."""

    # the pipeline's consumer interface: receivers hand encoded requests; nothing else reaches the pool

    async def consume_encoded(self, batch: EncodedBatch) -> None:
        if self._stopping:
            raise Refused("the collector is shutting down", unavailable=True, retry_after=5)
        owner = self._owner
        targets = [self._workers[i] for i in sorted({owner[s] for s in batch.shards})]
        full = self._full(targets)
        if full is not None:
            why = self._store.not_ready() if self._store is not None else None
            if why:  # the workers wait for the store: say so, as the store's own queue would
                raise Refused(f"{why}; retry later", unavailable=True, retry_after=5.0)
            full = await self._wait_for_room(targets, batch.answer_by)
            if self._stopping:
                raise Refused("the collector is shutting down", unavailable=True, retry_after=5)
            if full is not None:
                raise Refused(
                    f"pipeline worker {full.index} has {len(full.in_flight)} requests not yet taken; retry later",
                    retry_after=1.0,
                )
        self._seq += 1
        # each owner gets the whole body and decodes only its traces' items: re-encoding a request per worker
        # costs the collector ~18 µs a span, a second parse costs each worker ~1.5 µs
        for w in targets:
            w.in_flight[self._seq] = batch.arrived
            w.outbox.put(("batch", self._seq, batch.signal, batch.receiver, batch.arrived, batch.project, batch.body))

    async def consume(self, batch: SpanBatch) -> None:
        raise Refused("spans reach pipeline workers encoded", unavailable=True)

    async def consume_logs(self, batch: LogBatch) -> None:
        raise Refused("log records reach pipeline workers encoded", unavailable=True)

    # lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for w in self._workers:
            self._spawn(w)
        for w in self._workers:
            assert w.ready is not None
            try:
                await asyncio.wait_for(w.ready, START_TIMEOUT)
            except TimeoutError:
                raise RuntimeError(f"pipeline worker {w.index} did not start in {START_TIMEOUT:.0f}s") from None

    def _spawn(self, w: _Worker) -> None:
        assert self._loop is not None
        shard = (sum(1 << s for s, owner in enumerate(self._owner) if owner == w.index), self.shards)
        if w.local:
            parent, child = local_pair()
            w.process = ShardThread(w.index, shard, self._config, self._pipeline, child)
            w.process.start()
            self._connect(w, parent)
            return
        ctx = multiprocessing.get_context("spawn")  # never fork a process holding threads, gRPC and the store
        parent, child = ctx.Pipe(duplex=True)
        for end in (parent, child):
            widen_pipe(end)
        logs = self._config.service.telemetry.logs
        w.process = ctx.Process(
            target=worker_main,
            args=(w.index, shard, self._config, self._pipeline, child, logs.level, logs.encoding),
            name=f"evalsi-worker-{w.index}",
            daemon=True,
        )
        w.process.start()
        child.close()
        self._connect(w, parent)

    def _connect(self, w: _Worker, parent: Any) -> None:
        assert self._loop is not None
        w.conn, w.outbox, w.in_flight, w.held = parent, queue.SimpleQueue(), {}, None
        w.ready, w.stopping = self._loop.create_future(), False
        w.drained = asyncio.Event()
        threading.Thread(target=self._send_loop, args=(w, parent, w.outbox), daemon=True).start()
        threading.Thread(target=self._receive_loop, args=(w, parent), daemon=True).start()

    @staticmethod
    def _send_loop(w: _Worker, conn: Any, outbox: queue.SimpleQueue[Any]) -> None:
        while True:
            msg = outbox.get()
            if msg is None:
                return
            try:
                send_message(conn, msg)
            except (OSError, ValueError):
                return  # the worker is gone; the receive loop reports it

    def _full(self, targets: list[_Worker]) -> _Worker | None:
        """A worker of `targets` holding `worker_max_in_flight` requests not yet taken, if any."""
        return next((w for w in targets if len(w.in_flight) >= self._max_in_flight), None)

    async def _wait_for_room(self, targets: list[_Worker], answer_by: float) -> _Worker | None:
        """Wait up to `worker_wait` (and until `ANSWER_MARGIN` before the sender's deadline) for every worker of
        `targets` to have room; the one still full, if any. The sender gets its answer as soon as there is room,
        instead of a 429 and a retry a second later: the pipeline stays busy and the body is not sent again."""
        start = time.monotonic()
        deadline = start + self._wait
        if answer_by:
            deadline = min(deadline, answer_by - ANSWER_MARGIN)
        try:
            while (full := self._full(targets)) is not None and not self._stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return full
                self._room.clear()  # no await between the look and here: an ack in between cannot be missed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), left)
            return full
        finally:
            self._waited.inc(time.monotonic() - start)

    def _receive_loop(self, w: _Worker, conn: Any) -> None:
        assert self._loop is not None
        loop = self._loop
        while True:
            try:
                msg = receive_message(conn)
            except (EOFError, OSError):
                break
            kind = msg[0]
            if kind == "table":
                # blocks this thread while the store queue is full: the worker's link fills and it stops taking
                # requests, so the receivers answer 429 (backpressure, not loss)
                with contextlib.suppress(RuntimeError):
                    asyncio.run_coroutine_threadsafe(self._write_rows(msg[1], msg[3], msg[2]), loop).result()
                w.outbox.put(("table_taken",))
            elif kind == "evaluated":  # likewise: the worker waits while the scores pipeline is behind
                hub = self.hubs.get(msg[1])
                if hub is not None:
                    scores, windows = _evaluated(msg[2], msg[3])
                    with contextlib.suppress(RuntimeError):
                        asyncio.run_coroutine_threadsafe(hub.take_evaluated(scores, windows), loop).result()
                w.outbox.put(("evaluated_taken",))
            elif kind == "ledger":  # answered on this thread: the ledger is thread-safe
                _, seq, op, args = msg
                try:
                    answer = getattr(self.ledger, op)(*args)
                except Exception as e:  # e.g. a shared ledger's store is down: raised in the worker
                    answer = e
                w.outbox.put(("ledger_answer", seq, answer))
            else:
                loop.call_soon_threadsafe(self._on_message, w, msg)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._on_exit, w)

    async def _write_rows(self, kind: RowKind, body: memoryview, arrived: float | None) -> None:
        assert self._store is not None, "a worker sent rows, but no pipeline writes a store"
        while True:
            try:
                self._store.write_rows(kind, body, arrived)
                return
            except Refused as r:
                await asyncio.sleep(min(r.retry_after, 0.5))

    def _on_message(self, w: _Worker, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "ack":  # with what the worker holds once it took the request
            w.in_flight.pop(msg[1], None)
            self._room.set()
            w.held = msg[2]
        elif kind == "held":
            w.held = msg[1]
        elif kind == "metrics":
            w.metrics = msg[1]
        elif kind == "ready":
            if w.ready is not None and not w.ready.done():
                w.ready.set_result(msg[1])
            log.info("pipeline worker ready", extra={"worker": w.index, "pid": msg[1]})
        elif kind == "failed":
            if w.ready is not None and not w.ready.done():
                w.ready.set_exception(RuntimeError(f"pipeline worker {w.index}: {msg[1]}"))
        elif kind == "drained":  # with what its pipelines took and could not hand on (their `unstored`)
            for lost_kind, n in msg[1].items():
                self.unstored[lost_kind] = self.unstored.get(lost_kind, 0) + n
            w.drained.set()
        elif kind == "session_trace":
            hub = self.hubs.get(msg[1])
            if hub is not None:
                hub.take_session_trace(msg[2])
        elif kind == "twin_trace":
            hub = self.hubs.get(msg[1])
            if hub is not None:
                hub.take_twin_trace(msg[2])
        elif kind == "promoted":
            hub = self.hubs.get(msg[1])
            if hub is not None:
                hub.take_promoted(msg[2])

    def _on_exit(self, w: _Worker) -> None:
        w.drained.set()  # a worker that died drains nothing more
        if w.ready is not None and not w.ready.done():
            w.ready.set_exception(RuntimeError(f"pipeline worker {w.index} exited while starting"))
            return
        if self._stopping or w.stopping:
            return
        lost = len(w.in_flight)
        code = w.process.exitcode if w.process is not None else None
        floor = earliest((w.held, *(a for a in w.in_flight.values() if a)))
        if floor is not None:  # what it held is in the write-ahead log: keep it there until a restart replays it
            self.lost_since = earliest((self.lost_since, floor))
            log.error(
                "the write-ahead log keeps what the dead worker held; restart evalsi to replay it (until then the "
                "log keeps every segment from then on)"
            )
        log.error(
            "pipeline worker died; restarting it (what it held is lost)",
            extra={"worker": w.index, "exitcode": code, "requests_in_flight": len(w.in_flight)},
        )
        self._restarts.labels(str(w.index)).inc()
        self._lost.labels(str(w.index)).inc(lost)
        if lost:
            self.unstored["requests"] = self.unstored.get("requests", 0) + lost
        w.outbox.put(None)
        self._spawn(w)
        self._room.set()  # the new worker holds nothing yet

    def arm_twins(self, processor: str, service: str) -> None:
        """`CollectorPeers`: every worker hands `service`'s root-level instrumentation calls to the collector."""
        for w in self._workers:
            w.outbox.put(("arm_twins", processor, service))

    def route_feedback(self, processor: str, scores: list[Any]) -> None:
        """Feedback scores to the workers holding their traces, for `processor`'s late path (`CollectorPeers`)."""
        by_worker: dict[int, list[Any]] = {}
        for s in scores:
            by_worker.setdefault(self._owner[trace_shard(s.trace_id, self.shards)], []).append(s)
        for index, group in by_worker.items():
            self._workers[index].outbox.put(("feedback", processor, group))

    def reload(self, lists: dict[str, Any]) -> None:
        """Have every worker load its policy files again (`Service.reload`), with these policy lists by processor."""
        for w in self._workers:
            w.outbox.put(("reload", lists))

    def collect_garbage(self, processor: str) -> None:
        """Have `processor`'s instance in every worker collect garbage (memory_limiter, above its limits)."""
        for w in self._workers:
            w.outbox.put(("collect_garbage", processor))

    def held_since(self) -> float | None:
        """When the oldest item sent to a worker and not yet stored reached a receiver: requests not yet taken, and
        what each worker last said it holds (a worker's report comes after the rows it sent, on the same pipe)."""
        return earliest(
            (self.lost_since, *(earliest((w.held, *(a for a in w.in_flight.values() if a))) for w in self._workers))
        )

    @property
    def pids(self) -> list[int]:
        """The worker processes' (not the collector's own shard's)."""
        return [w.process.pid for w in self._workers if w.process is not None and not w.local]

    async def shutdown(self, timeout: float = 60.0) -> None:
        """Stop taking requests; each worker drains its processors into the store link, sends the rest, exits."""
        self._stopping = True
        self._room.set()  # requests waiting for room are refused now
        for w in self._workers:
            w.stopping = True
            w.outbox.put(("drain",))
        deadline = time.monotonic() + timeout
        for w in self._workers:
            try:
                await asyncio.wait_for(w.drained.wait(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                log.error(
                    "pipeline worker did not drain in time",
                    extra={"worker": w.index, "requests_in_flight": len(w.in_flight)},
                )
                if w.in_flight:
                    self.unstored["requests"] = self.unstored.get("requests", 0) + len(w.in_flight)
        for w in self._workers:
            w.outbox.put(None)
            if w.process is not None:
                await asyncio.to_thread(w.process.join, 10)
                if w.process.is_alive():
                    w.process.kill()

    def collect(self) -> Iterable[Metric]:
        for w in self._workers:
            yield from w.metrics
