"""Pipeline workers (`service.workers` > 1): the traces and logs pipelines run in N processes, sharded by trace id;
the receivers, the store and the scores pipeline stay in the collector process, which owns the store.

The receivers only parse and check a request, answer it, and hand its encoded body to every worker owning one of its
traces (`EncodedBatch`). Each worker decodes its own traces' spans and log records, runs the pipelines' processors,
and sends what the store takes back as Arrow tables (`rows.to_arrow`): the Python work per span is spread over the
cores, and one process still writes the store. A request is acknowledged (counted in flight) until each worker's
pipeline took it; a worker with `max_in_flight` requests not yet taken makes the receivers answer 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from evalsi.collector.config import Config
from evalsi.collector.logs import configure
from evalsi.component import Refused
from evalsi.encoded import EncodedBatch
from evalsi.exporters.clickhouse.rows import convert_good, load_arrow, logs_to_arrow, to_arrow
from evalsi.exporters.delivery import items_refused_counter
from evalsi.log_record import LogBatch, LogRecord as _LogRecord
from evalsi.receivers.otlp.decode import count_clamped, logs_from_request, spans_from_request
from evalsi.score import ScoreBatch
from evalsi.span import Span, SpanBatch
from evalsi.supervise import supervise
from evalsi.telemetry import SelfMetrics

log = logging.getLogger("evalsi.workers")

# the worker-side store link sends a table once it holds this many rows, or after LINK_FLUSH seconds
LINK_ROWS = 4_000
LINK_FLUSH = 0.2
# tables a worker may have sent and the collector not yet queued for the store
LINK_TABLES_IN_FLIGHT = 16
STORE_LINK = "store_link"  # the exporter label of what a worker's store link counts
METRICS_INTERVAL = 1.0
PIPE_BUFFER = 4 << 20
START_TIMEOUT = 120.0


# ---------------------------------------------------------------------------------------------------------------
# the collector side


@dataclass
class _Worker:
    index: int
    process: Any = None
    conn: Any = None
    outbox: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    in_flight: set[int] = field(default_factory=set)  # requests sent that the worker's pipelines have not taken
    ready: asyncio.Future[int] | None = None
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    metrics: list[Metric] = field(default_factory=list)
    stopping: bool = False


class WorkerPool:
    """The collector side of the workers: starts them, shards requests to them, and queues their store tables."""

    def __init__(self, config: Config, store: Any, metrics: SelfMetrics) -> None:
        self.shards = config.service.workers
        self._config = config
        self._store = store  # the clickhouse exporter, or None when no pipeline writes a store
        self._max_in_flight = config.service.worker_max_in_flight
        self._workers = [_Worker(i) for i in range(self.shards)]
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
        self.unstored: dict[str, int] = {}  # accepted requests workers died holding or did not drain in time

    # the pipeline's consumer interface: receivers hand encoded requests; nothing else reaches the pool

    async def consume_encoded(self, batch: EncodedBatch) -> None:
        if self._stopping:
            raise Refused("the collector is shutting down", unavailable=True, retry_after=5)
        targets = [self._workers[i] for i in sorted(batch.shards)]
        for w in targets:
            if len(w.in_flight) >= self._max_in_flight:
                why = self._store.not_ready() if self._store is not None else None
                if why:  # the workers wait for the store: say so, as the store's own queue would
                    raise Refused(f"{why}; retry later", unavailable=True, retry_after=5.0)
                raise Refused(
                    f"pipeline worker {w.index} has {len(w.in_flight)} requests not yet taken; retry later",
                    retry_after=1.0,
                )
        self._seq += 1
        # each owner gets the whole body and decodes only its traces' items: re-encoding a request per worker
        # costs the collector ~18 µs a span, a second parse costs each worker ~1.5 µs
        for w in targets:
            w.in_flight.add(self._seq)
            w.outbox.put(("batch", self._seq, batch.signal, batch.receiver, batch.body))

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
        ctx = multiprocessing.get_context("spawn")  # never fork a process holding threads, gRPC and the store
        parent, child = ctx.Pipe(duplex=True)
        for end in (parent, child):
            widen_pipe(end)
        logs = self._config.service.telemetry.logs
        w.process = ctx.Process(
            target=worker_main,
            args=(w.index, self.shards, self._config, child, logs.level, logs.encoding),
            name=f"evalsi-worker-{w.index}",
            daemon=True,
        )
        w.process.start()
        child.close()
        w.conn, w.outbox, w.in_flight = parent, queue.SimpleQueue(), set()
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
                    asyncio.run_coroutine_threadsafe(self._queue_table(msg[1], msg[2]), loop).result()
                w.outbox.put(("table_taken",))
            else:
                loop.call_soon_threadsafe(self._on_message, w, msg)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._on_exit, w)

    async def _queue_table(self, kind: str, body: bytearray) -> None:
        table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
        while True:
            try:
                self._store.consume_table(kind, table)
                return
            except Refused as r:
                await asyncio.sleep(min(r.retry_after, 0.5))

    def _on_message(self, w: _Worker, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "ack":
            w.in_flight.discard(msg[1])
        elif kind == "metrics":
            w.metrics = msg[1]
        elif kind == "ready":
            if w.ready is not None and not w.ready.done():
                w.ready.set_result(msg[1])
            log.info("pipeline worker ready", extra={"worker": w.index, "pid": msg[1]})
        elif kind == "failed":
            if w.ready is not None and not w.ready.done():
                w.ready.set_exception(RuntimeError(f"pipeline worker {w.index}: {msg[1]}"))
        elif kind == "drained":
            w.drained.set()

    def _on_exit(self, w: _Worker) -> None:
        w.drained.set()  # a worker that died drains nothing more
        if w.ready is not None and not w.ready.done():
            w.ready.set_exception(RuntimeError(f"pipeline worker {w.index} exited while starting"))
            return
        if self._stopping or w.stopping:
            return
        lost = len(w.in_flight)
        code = w.process.exitcode if w.process is not None else None
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

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process is not None]

    async def shutdown(self, timeout: float = 60.0) -> None:
        """Stop taking requests; each worker drains its processors into the store link, sends the rest, exits."""
        self._stopping = True
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


def widen_pipe(conn: Any) -> None:
    """Give a Pipe's socket 4 MiB buffers: a request body (~1 MB) or a table then moves in a few system calls
    instead of dozens, each of which costs a GIL hand-off in a busy process."""
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(conn.fileno()))
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, PIPE_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, PIPE_BUFFER)
        finally:
            sock.close()


# messages whose last item is a body: a request (~1 MB) to a worker, a table (~10 MB) back
_WITH_BODY = frozenset({"batch", "table"})


def send_message(conn: Any, msg: tuple[Any, ...]) -> None:
    """Send a message; a body goes as raw bytes after its header, since pickling it would copy it twice more on
    each side (a 10 MB table: ~14 ms of the collector's CPU to receive pickled, ~3.5 ms raw)."""
    if msg[0] in _WITH_BODY:
        conn.send(msg[:-1])
        conn.send_bytes(msg[-1])
    else:
        conn.send(msg)


def receive_message(conn: Any) -> tuple[Any, ...]:
    """The next message `send_message` sent, its body (if any) as a bytearray the kernel wrote into directly:
    `Connection.recv_bytes` would copy it twice more while holding the GIL."""
    msg = conn.recv()
    if msg[0] in _WITH_BODY:
        fd = conn.fileno()
        (size,) = struct.unpack("!i", _read(fd, 4))  # `send_bytes` framing: a 4-byte length, then the bytes
        if size == -1:  # 2 GiB or more: an 8-byte length follows
            (size,) = struct.unpack("!Q", _read(fd, 8))
        return (*msg, _read(fd, size))
    return msg


def _read(fd: int, size: int) -> bytearray:
    out = bytearray(size)
    view = memoryview(out)
    got = 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError if got == 0 else OSError("the pipe closed in the middle of a message")
        got += n
    return out


class MergedMetrics:
    """Self-metrics of the collector process and its workers as one exposition: series of the same name and labels
    are summed (each process counts only what it did)."""

    def __init__(self, *sources: Any) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        index: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        for source in self._sources:
            for fam in source.collect():
                merged = families.get(fam.name)
                if merged is None:
                    merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                for sample in fam.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    at = index.get(key)
                    if at is None:
                        index[key] = len(merged.samples)
                        merged.samples.append(sample)
                    else:
                        old = merged.samples[at]
                        merged.samples[at] = old._replace(
                            value=old.value + sample.value, exemplar=sample.exemplar or old.exemplar
                        )
        return list(families.values())


def merged_registry(*sources: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MergedMetrics(*sources))  # type: ignore[arg-type]
    return registry


# ---------------------------------------------------------------------------------------------------------------
# the worker side


class StoreLink:
    """In a worker, stands where the store exporter stands in the pipelines: puts spans and log records in the
    store's Arrow columns and sends them to the collector process, which writes them."""

    def __init__(
        self, outbox: queue.SimpleQueue[Any], tables_taken: threading.Semaphore, metrics: SelfMetrics | None = None
    ) -> None:
        self._outbox = outbox
        self.metrics = metrics or SelfMetrics()  # the worker's service metrics, once it has them
        self._room = tables_taken  # one permit per table the collector may not have queued yet
        self._spans: list[Span] = []
        self._logs: list[_LogRecord] = []
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping = False

    def _send(self, kind: str, table: pa.Table) -> None:
        if not self._room.acquire(blocking=False):
            raise Refused("the store is behind; retry later", retry_after=0.5)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        self._outbox.put(("table", kind, sink.getvalue()))

    async def consume(self, batch: SpanBatch) -> None:
        if batch.unit == "session":
            return  # a session's spans were stored as their traces completed
        spans = [s for s in batch.spans if s.sampled]
        if not spans:
            return
        if batch.revision:
            self._flush_spans()  # a revision goes after the spans it revises
            table = self._table("span revisions", spans, to_arrow)
            if table is not None:
                self._send("revisions", table)
            return
        if not self._room_left():
            raise Refused("the store is behind; retry later", retry_after=0.5)
        self._spans.extend(spans)
        if len(self._spans) >= LINK_ROWS:
            self._flush_spans()

    async def consume_logs(self, batch: LogBatch) -> None:
        if not self._room_left():
            raise Refused("the store is behind; retry later", retry_after=0.5)
        self._logs.extend(batch.records)
        if len(self._logs) >= LINK_ROWS:
            self._flush_logs()

    async def consume_scores(self, batch: ScoreBatch) -> None:
        raise Refused("scores are not written from pipeline workers", unavailable=True)

    def _room_left(self) -> bool:
        # a Semaphore has no public count; try and give back
        if self._room.acquire(blocking=False):
            self._room.release()
            return True
        return False

    def _table(self, kind: str, items: list[Any], convert: Any) -> pa.Table | None:
        """The items in the store's columns; an item whose values no column can hold is dropped alone, counted
        and logged, as the store exporter does."""
        table, bad = convert_good(items, convert)
        if bad:
            dropped = items_refused_counter(self.metrics)
            for item, error in bad:
                dropped.labels(STORE_LINK, kind, type(error).__name__).inc()
                log.error(
                    f"dropping {kind} the store refuses for their data; the others are stored",
                    extra={"reason": type(error).__name__, "error": str(error)[:500],
                           "ids": f"{item.trace_id}/{item.span_id}"},
                )  # fmt: skip
        return table

    def _flush_spans(self) -> None:
        if self._spans:
            spans, self._spans = self._spans, []
            try:
                table = self._table("spans", spans, to_arrow)
                if table is not None:
                    self._send("spans", table)
            except BaseException:  # kept for the next flush: Refused, or a failure the supervisor logs
                self._spans = spans + self._spans
                raise

    def _flush_logs(self) -> None:
        if self._logs:
            records, self._logs = self._logs, []
            try:
                table = self._table("log records", records, logs_to_arrow)
                if table is not None:
                    self._send("logs", table)
            except BaseException:
                self._logs = records + self._logs
                raise

    async def start(self) -> None:
        load_arrow()  # before the worker reports ready
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


def worker_main(index: int, shards: int, config: Config, conn: Any, log_level: str, log_encoding: str) -> None:
    """A worker process: runs the traces and logs pipelines on the traces it owns until told to drain."""
    configure(log_level, log_encoding)
    try:
        asyncio.run(_WorkerRuntime(index, shards, config, conn).run())
    except KeyboardInterrupt:  # the collector handles SIGINT; the worker waits for its drain message
        pass


class _WorkerRuntime:
    def __init__(self, index: int, shards: int, config: Config, conn: Any) -> None:
        self.index, self.shards, self.config, self.conn = index, shards, config, conn
        self.outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.room = threading.Semaphore(LINK_TABLES_IN_FLIGHT)
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()

    def _send_loop(self) -> None:
        while True:
            msg = self.outbox.get()
            if msg is None:
                return
            try:
                send_message(self.conn, msg)
            except (OSError, ValueError):
                os._exit(1)  # the collector is gone: nothing here can be delivered any more

    def _receive_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            try:
                msg = receive_message(self.conn)
            except (EOFError, OSError):
                msg = ("drain", "collector gone")  # drain what can be drained, then exit
            if msg[0] == "table_taken":
                self.room.release()
                continue
            loop.call_soon_threadsafe(self.inbox.put_nowait, msg)
            if msg[0] == "drain" and len(msg) == 2:
                return  # the collector is gone

    async def run(self) -> None:
        from evalsi.collector.service import Service, tune_gc  # service imports this module

        with contextlib.suppress(ValueError):  # SIGINT goes to the whole process group; the collector leads
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        loop = asyncio.get_running_loop()
        sender = threading.Thread(target=self._send_loop, daemon=True)
        sender.start()
        threading.Thread(target=self._receive_loop, args=(loop,), daemon=True).start()
        link = StoreLink(self.outbox, self.room)
        try:
            service = Service(self.config, worker_store=link)
            link.metrics = service.metrics
            await service.start()
        except Exception as e:
            self.outbox.put(("failed", f"{type(e).__name__}: {e}"))
            self.outbox.put(None)
            await asyncio.to_thread(sender.join)
            return
        tune_gc()
        worker = str(self.index)
        decoded = {
            "traces": service.metrics.counter(
                "evalsi_worker_spans", "Spans a pipeline worker decoded: those of the traces it owns.", ["worker"]
            ).labels(worker),
            "logs": service.metrics.counter(
                "evalsi_worker_log_records", "Log records a pipeline worker decoded.", ["worker"]
            ).labels(worker),
        }
        self.outbox.put(("ready", os.getpid()))
        metrics_task = supervise(
            "worker metrics", lambda: self._metrics_loop(service.metrics), log=log, metrics=service.metrics
        )
        shard = (self.index, self.shards)
        while True:
            msg = await self.inbox.get()
            if msg[0] == "drain":
                break
            _, seq, signal_name, receiver, body = msg
            head = service.heads.get(receiver, {}).get(signal_name)
            if head is not None:
                if signal_name == "traces":
                    result = spans_from_request(ExportTraceServiceRequest.FromString(body), shard)
                    if result.clamped:
                        count_clamped(service.metrics, receiver, "traces", result, log)
                    if len(result.batch):
                        decoded["traces"].inc(len(result.batch))
                        await _hand_on(head.consume, result.batch)
                else:
                    result = logs_from_request(ExportLogsServiceRequest.FromString(body), shard)
                    if result.clamped:
                        count_clamped(service.metrics, receiver, "logs", result, log)
                    if len(result.batch):
                        decoded["logs"].inc(len(result.batch))
                        await _hand_on(head.consume_logs, result.batch)
            self.outbox.put(("ack", seq))
        metrics_task.cancel()
        await service.shutdown()
        self.outbox.put(("metrics", list(service.metrics.registry.collect())))
        self.outbox.put(("drained",))
        self.outbox.put(None)
        await asyncio.to_thread(sender.join)  # every table sent before the process ends

    async def _metrics_loop(self, metrics: SelfMetrics) -> None:
        while True:
            await asyncio.sleep(METRICS_INTERVAL)
            self.outbox.put(("metrics", list(metrics.registry.collect())))


async def _hand_on(consume: Any, batch: Any) -> None:
    """Hand a batch to the pipeline, waiting while it refuses: the collector already answered for it."""
    delay = 0.01
    while True:
        try:
            await consume(batch)
            return
        except Refused as r:
            await asyncio.sleep(min(delay, r.retry_after))
            delay = min(delay * 2, 0.5)
