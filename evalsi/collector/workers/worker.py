"""A pipeline worker process: decodes the requests of the traces it owns, runs the traces and logs pipelines on
them, and sends what the store takes to the collector process through its store link."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import signal
import threading
from typing import Any, Protocol

from evalsi.capabilities import DuplicateCallJoiner, FeedbackTaker, GarbageCollector
from evalsi.collector.config import Config, type_of
from evalsi.collector.heap import tune_arrow_pool, tune_gc, tune_malloc
from evalsi.collector.logs import configure
from evalsi.collector.workers.link import LINK_TABLES_IN_FLIGHT, StoreLink, WorkerPeers
from evalsi.collector.workers.pipe import receive_message, send_message
from evalsi.component import REGISTRY, Refused
from evalsi.model.encoded import Decoder, EncodedBatch
from evalsi.runtime.held import stamp, stamp_project
from evalsi.runtime.supervise import supervise
from evalsi.runtime.telemetry import SelfMetrics
from evalsi.store import RowEncoder

log = logging.getLogger("evalsi.workers")

METRICS_INTERVAL = 1.0
HELD_INTERVAL = 0.25


class Pipelines(Protocol):
    """What a worker runs: the service of the traces and logs pipelines, with the store link for the store."""

    metrics: SelfMetrics
    heads: dict[str, dict[Any, Any]]
    """Where each receiver's items enter, by receiver id and signal."""
    processors: list[tuple[str, Any]]
    """Its processors by id (feedback the collector routes here goes to the one it names)."""

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def held_since(self) -> float | None: ...

    @property
    def unstored(self) -> dict[str, int]: ...

    async def reload(self, lists: dict[str, Any] | None = None) -> None: ...


class PipelineFactory(Protocol):
    def __call__(self, config: Config, *, worker_store: StoreLink) -> Pipelines: ...


class ShardThread:
    """The pipeline shard the collector process runs itself (`service.collector_shard`), in a thread with its own
    event loop, behind the handle the pool keeps of a worker process: one process fewer, and its requests and rows
    pass to and from it without a pipe."""

    def __init__(
        self, index: int, shard: tuple[int, int], config: Config, pipeline: PipelineFactory, conn: Any
    ) -> None:
        self.pid = os.getpid()
        self.exitcode: int | None = None
        self._runtime = _WorkerRuntime(index, shard, config, pipeline, conn, in_collector=True)
        self._conn = conn
        self._thread = threading.Thread(target=self._run, name=f"evalsi-shard-{index}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(self._runtime.run())
            self.exitcode = 0
        except BaseException:
            log.exception("the collector's pipeline shard failed")
            self.exitcode = 1
        finally:
            self._conn.close()  # the pool reads the end of the channel, as it reads a worker process's exit

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def kill(self) -> None:
        """A thread cannot be killed: the process ends with it."""


def worker_main(
    index: int,
    shard: tuple[int, int],
    config: Config,
    pipeline: PipelineFactory,
    conn: Any,
    log_level: str,
    log_encoding: str,
) -> None:
    """A worker process: runs the traces and logs pipelines on the traces it owns until told to drain."""
    tune_malloc()
    tune_arrow_pool()
    configure(log_level, log_encoding)
    try:
        asyncio.run(_WorkerRuntime(index, shard, config, pipeline, conn).run())
    except KeyboardInterrupt:  # the collector handles SIGINT; the worker waits for its drain message
        pass


class _WorkerRuntime:
    def __init__(
        self,
        index: int,
        shard: tuple[int, int],
        config: Config,
        pipeline: PipelineFactory,
        conn: Any,
        in_collector: bool = False,
    ) -> None:
        self.index, self.config, self.conn = index, config, conn
        self.shard = shard  # the slots it owns (bits) and how many there are: what it decodes of each request
        self.in_collector = in_collector  # a thread of the collector process, which tunes its own heap
        self.pipeline = pipeline
        self.outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.room = threading.Semaphore(LINK_TABLES_IN_FLIGHT)
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.peers = WorkerPeers(self.outbox)
        self.stamped = False
        """Whether a request came with the time it reached a receiver (a write-ahead log, a pull receiver). Until
        one does, nothing the pipelines hold has an arrival time, so what they hold is not asked after each request
        (`held_since` walks every span tail sampling buffers: ~3% of a worker's time)."""

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
            if msg[0] == "evaluated_taken":
                self.peers.evaluated_taken()
                continue
            if msg[0] == "ledger_answer":
                self.peers.ledger.answered(msg[1], msg[2])
                continue
            loop.call_soon_threadsafe(self.inbox.put_nowait, msg)
            if msg[0] == "drain" and len(msg) == 2:
                return  # the collector is gone

    async def run(self) -> None:
        with contextlib.suppress(ValueError):  # SIGINT goes to the whole process group; the collector leads
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        loop = asyncio.get_running_loop()
        sender = threading.Thread(target=self._send_loop, daemon=True)
        sender.start()
        threading.Thread(target=self._receive_loop, args=(loop,), daemon=True).start()
        link = StoreLink(_row_encoder(self.config), self.outbox, self.room)
        link.peers = self.peers  # how the worker's processors reach the collector process
        try:
            service = self.pipeline(self.config, worker_store=link)
            link.metrics = service.metrics
            await service.start()
        except Exception as e:
            self.outbox.put(("failed", f"{type(e).__name__}: {e}"))
            self.outbox.put(None)
            await asyncio.to_thread(sender.join)
            return
        if not self.in_collector:
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
        held_task = supervise("worker held", lambda: self._held_loop(service), log=log, metrics=service.metrics)
        decoders = {rid: _decoder(rid) for rid in service.heads}
        while True:
            msg = await self.inbox.get()
            if msg[0] == "drain":
                break
            if msg[0] == "feedback":  # for traces this worker holds: the processor's late path
                _, processor, scores = msg
                target = dict(service.processors).get(processor)
                if isinstance(target, FeedbackTaker):
                    target.take_feedback(scores)
                continue
            if msg[0] == "arm_twins":  # a service that sends lone SDK calls, seen by some worker
                _, processor, service_name = msg
                target = dict(service.processors).get(processor)
                if isinstance(target, DuplicateCallJoiner):
                    target.arm_twins(service_name)
                continue
            if msg[0] == "reload":  # SIGHUP in the collector process: the policies again
                await service.reload(msg[1])
                continue
            if msg[0] == "collect_garbage":  # the collector's memory_limiter, above a limit
                target = dict(service.processors).get(msg[1])
                if isinstance(target, GarbageCollector):
                    target.collect_garbage()
                continue
            _, seq, signal_name, receiver, arrived, project, body = msg
            head = service.heads.get(receiver, {}).get(signal_name)
            if head is not None:
                encoded = EncodedBatch(signal_name, body, 0, frozenset(), receiver)
                decode = decoders[receiver]
                batch = decode(encoded, self.shard, metrics=service.metrics, log=log)
                if arrived:
                    stamp(batch, arrived)
                    self.stamped = True
                if project:
                    stamp_project(batch, project)
                if len(batch):
                    decoded[signal_name].inc(len(batch))
                    await _hand_on(head.consume if signal_name == "traces" else head.consume_logs, batch)
            self.outbox.put(("ack", seq, self._held(service)))
            # a turn of the event loop between requests: while the inbox holds requests, `get` and the pipelines
            # never suspend, so tail_sampling's ticks and evaluate's hand-offs waited for the inbox to empty, then
            # released their backlog at once. Interleaved, the worker's peak RSS under a burst fell 40-60 MB and
            # freshness p95 ~0.3 s (benchmarks/README.md, fifth pass)
            await asyncio.sleep(0)
        metrics_task.cancel()
        held_task.cancel()
        await service.shutdown()
        self.outbox.put(("metrics", list(service.metrics.registry.collect())))
        self.outbox.put(("held", service.held_since()))  # after its last rows: nothing, unless the store refused
        self.outbox.put(("drained", dict(service.unstored)))  # what its processors took and dropped at the end
        self.outbox.put(None)
        await asyncio.to_thread(sender.join)  # every table sent before the process ends

    async def _metrics_loop(self, metrics: SelfMetrics) -> None:
        while True:
            await asyncio.sleep(METRICS_INTERVAL)
            self.outbox.put(("metrics", list(metrics.registry.collect())))

    def _held(self, service: Pipelines) -> float | None:
        """When the oldest item this worker holds reached a receiver (None: none has an arrival time)."""
        return service.held_since() if self.stamped else None

    async def _held_loop(self, service: Pipelines) -> None:
        """What this worker holds, for the collector's write-ahead log (after the rows sent before it)."""
        while True:
            await asyncio.sleep(HELD_INTERVAL)
            self.outbox.put(("held", self._held(service)))


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


def _decoder(receiver: str) -> Decoder:
    decode = REGISTRY[("receiver", type_of(receiver))].decode
    if decode is None:  # config validation refuses such a receiver with service.workers > 1
        raise RuntimeError(f"receiver {receiver!r} cannot hand requests to pipeline workers")
    return decode


def _row_encoder(config: Config) -> RowEncoder | None:
    """The row encoder of the store the pipelines write, if any (config validation allows one with workers)."""
    for pipe in config.service.pipelines.values():
        for eid in pipe.exporters:
            store = REGISTRY[("exporter", type_of(eid))].store
            if store is not None:
                return store.rows()
    return None
