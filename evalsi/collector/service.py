"""The service: builds the component graph from config, starts it, and on stop drains it in pipeline order."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import make_asgi_app

from evalsi import __version__
from evalsi.auth.asgi_gate import gate
from evalsi.auth.authenticator import Authenticator
from evalsi.capabilities import (
    Admitter,
    BodyAdmitter,
    EndpointServer,
    EvaluationHub,
    Holder,
    JudgeUser,
    LossCounter,
    PolicyReloader,
    ReadinessReporter,
    Replayer,
    SessionAssembler,
    SessionEvaluator,
    SessionSettings,
    Settler,
    WorkerWatcher,
)
from evalsi.collector.config import Config, ConfigError, is_store, listeners, load_config, type_of
from evalsi.collector.fanout import FanOut, LogFanOut, ScoreFanOut, fan
from evalsi.collector.heap import tune_arrow_pool, tune_gc, tune_malloc
from evalsi.collector.workers.link import StoreLink
from evalsi.collector.workers.metrics import merged_registry
from evalsi.collector.workers.pool import WorkerPool
from evalsi.component import REGISTRY, Kind, Next, ScoreConsumer, Settings, Signal
from evalsi.evaluators.judge_client import Judges
from evalsi.model.encoded import EncodedBatch
from evalsi.model.log_record import LogBatch
from evalsi.model.span import SpanBatch
from evalsi.runtime.held import InFlight, earliest
from evalsi.runtime.ports import taken
from evalsi.runtime.supervise import supervise
from evalsi.runtime.telemetry import SelfMetrics
from evalsi.store import StoreExporter, TraceQueries
from evalsi.wal import WriteAheadLog, without_stored_spans

if TYPE_CHECKING:
    from evalsi.runtime.serving import AsgiServer

log = logging.getLogger("evalsi.service")

RETIRE_INTERVAL = 0.25  # how often the write-ahead log deletes the segments nothing depends on
SETTLE_TIMEOUT_S = 10.0  # how long a clean stop waits for the exporters to store what a pull watermark covers


def _skip_unwanted_sessions(chains: list[list[Any]]) -> None:
    """A processor that assembles sessions holds none when nothing after it in any traces pipeline evaluates them
    (each session would only cost memory until it went quiet)."""
    wanted: dict[int, bool] = {}
    assemblers: dict[int, SessionAssembler] = {}
    for chain in chains:
        for i, proc in enumerate(chain):
            if isinstance(proc, SessionAssembler):
                assemblers[id(proc)] = proc
                after = any(isinstance(p, SessionEvaluator) and p.wants_sessions for p in chain[i + 1 :])
                wanted[id(proc)] = wanted.get(id(proc), False) or after
    for key, proc in assemblers.items():
        if not wanted[key]:
            proc.no_session_consumers()


def _meet_sessions(hub: Any, config: Config, upstream: list[str]) -> None:
    """Sessions assembled where the workers' traces meet, with the session settings of the tail_sampling before
    the processor in its pipeline (when the processor evaluates sessions)."""
    if not isinstance(hub, EvaluationHub):
        return
    for pid in reversed(upstream):
        cfg = config.component("processor", pid)
        if isinstance(cfg, SessionSettings):
            hub.meet_sessions(cfg.session_timeout, cfg.max_sessions, cfg.max_session_spans)
            return


def _upstream_first(edges: dict[str, set[str]]) -> list[str]:
    """Processor ids ordered so each comes before every processor it feeds, in any pipeline (Kahn's algorithm)."""
    incoming = {n: 0 for n in edges}
    for targets in edges.values():
        for t in targets:
            incoming[t] += 1
    ready = [n for n in edges if incoming[n] == 0]
    order = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for t in sorted(edges[n]):
            incoming[t] -= 1
            if incoming[t] == 0:
                ready.append(t)
    return order + [n for n in edges if n not in order]  # a cycle (rejected by config) keeps the rest


class _Admitted:
    """With pipeline workers: a receiver's request passes the admission check (`admit`) of the processors that head
    its pipelines (memory_limiter) here, in the collector process, before the pool hands it to the workers; those
    pipelines run past the hand-off, where a refusal could no longer reach the sender."""

    def __init__(self, pool: WorkerPool, admitting: dict[str, list[Admitter]]) -> None:
        self.pool = pool
        self.admitting = admitting  # by signal
        self.shards = pool.shards

    async def consume_encoded(self, batch: EncodedBatch) -> None:
        for head in self.admitting.get(batch.signal, ()):
            head.admit(batch.signal, len(batch))
        await self.pool.consume_encoded(batch)

    async def consume(self, batch: SpanBatch) -> None:
        await self.pool.consume(batch)

    async def consume_logs(self, batch: LogBatch) -> None:
        await self.pool.consume_logs(batch)


class StartError(Exception):
    """The service could not start; the message says why and what to do."""


class Service:
    """The component graph of one process.

    With `service.workers` > 1 the collector process runs the receivers, the store and the scores pipeline, and a
    `WorkerPool` runs the traces and logs pipelines' processors and other exporters in worker processes; each
    worker builds its own `Service` with `worker_store` standing in for the store exporter (see workers.py).
    """

    def __init__(self, config: Config, *, worker_store: StoreLink | None = None, role: str = "serve") -> None:
        self.config = config
        self.role = role  # `serve`, or `run` for the collector an offline run starts in its own process
        self.metrics = SelfMetrics()
        self.worker_store = worker_store  # set in a worker process
        self.auth = (
            Authenticator(config.auth, self.metrics) if config.auth is not None and worker_store is None else None
        )
        # the judge runtime of /v1/evaluate (its metrics are this service's); judges never run in pipeline workers
        self.judges = Judges(self.metrics) if worker_store is None else None
        self.pool: WorkerPool | None = None  # set in the collector process when pipelines run in workers
        durable = config.service.durability.mode == "wal"
        self.wal = WriteAheadLog(config.service.durability, self.metrics) if durable and worker_store is None else None
        self.in_flight = InFlight() if durable else None
        """With a write-ahead log: batches inside a consume call (every `Next` reports them)."""
        self._retiring: asyncio.Task[None] | None = None
        self.heads: dict[str, dict[Signal, Any]] = {}  # what each receiver feeds, by signal
        self.hubs: dict[str, Any] = {}
        """With workers, in the collector process: the instances where workers' processors meet (`meets`)."""
        self.receivers: dict[str, Any] = {}
        self.processors: list[tuple[str, Any]] = []  # upstream before downstream
        self.exporters: dict[str, Any] = {}
        self.api: AsgiServer | None = None
        self.telemetry: AsgiServer | None = None
        self.scores: ScoreConsumer | None = None
        """Where scores enter the `scores` pipelines: their first processor, else their exporters."""
        self._started: list[tuple[str, Any]] = []
        self._fans: list[FanOut | LogFanOut | ScoreFanOut] = []
        self._stop = asyncio.Event()
        self._stopping = False
        self._build()

    def _fan(self, data: Signal, consumers: list[Any]) -> Any:
        consumer = fan(data, consumers)
        if isinstance(consumer, FanOut | LogFanOut | ScoreFanOut):
            self._fans.append(consumer)
        return consumer

    def _settings(self, kind: Kind, cid: str) -> Settings:
        worker = self.worker_store.peers if self.worker_store is not None else None
        in_workers = self.config.service.workers > 1 and self.worker_store is None
        return Settings(
            id=cid, metrics=self.metrics, logger=logging.getLogger(f"evalsi.{kind}.{cid}"), worker=worker,
            collector=self if in_workers else None, auth=self.auth, wal=self.wal, host=self,
        )  # fmt: skip

    def arm_twins(self, processor: str, service: str) -> None:
        """`CollectorPeers`: every worker learns that `service` sends lone vendor SDK calls."""
        if self.pool is not None:
            self.pool.arm_twins(processor, service)

    def route_feedback(self, processor: str, scores: list[Any]) -> None:
        """`CollectorPeers`: feedback to the pipeline workers holding its traces."""
        if self.pool is not None:
            self.pool.route_feedback(processor, scores)

    def _next(self) -> Next:
        nxt = Next()
        nxt.in_flight = self.in_flight
        return nxt

    def _create(self, kind: Kind, cid: str, *args: Any) -> Any:
        factory = REGISTRY[(kind, type_of(cid))]
        return factory.cls(self.config.component(kind, cid), self._settings(kind, cid), *args)

    def _build(self) -> None:
        """One instance per component id; each pipeline wires the instances it lists for its signal."""
        pipelines = self.config.service.pipelines
        if self.config.service.workers > 1:
            # the traces and logs pipelines run in the workers, the scores pipeline here (with the store)
            worker = self.worker_store is not None
            pipelines = {n: p for n, p in pipelines.items() if (type_of(n) != "scores") == worker}
            for pipe in self.config.service.pipelines.values():
                for eid in pipe.exporters:
                    if is_store(eid) and eid not in self.exporters:
                        self.exporters[eid] = self.worker_store if worker else self._create("exporter", eid)
        processor_next: dict[str, Next] = {}
        processors: dict[str, Any] = {}
        receiver_heads: dict[str, dict[Signal, list[Any]]] = {}
        score_heads: list[Any] = []
        edges: dict[str, set[str]] = {}
        for pipe in pipelines.values():
            for eid in pipe.exporters:
                if eid not in self.exporters:
                    self.exporters[eid] = self._create("exporter", eid)
            for pid in pipe.processors:
                if pid not in processors:
                    processor_next[pid] = self._next()
                    processors[pid] = self._create("processor", pid, processor_next[pid])
                    edges[pid] = set()
        for name, pipe in pipelines.items():
            data: Signal = type_of(name)  # type: ignore[assignment]
            downstream = self._fan(data, [self.exporters[eid] for eid in pipe.exporters])
            for pid in reversed(pipe.processors):
                setattr(processor_next[pid], data, downstream)
                downstream = processors[pid]
            for a, b in zip(pipe.processors, pipe.processors[1:], strict=False):
                edges[a].add(b)
            for rid in pipe.receivers:
                receiver_heads.setdefault(rid, {}).setdefault(data, []).append(downstream)
            if data == "scores":
                # a processorless pipeline's exporters one by one, so two pipelines sharing one get each score once
                score_heads += [downstream] if pipe.processors else [self.exporters[eid] for eid in pipe.exporters]
        if self.config.service.workers > 1 and self.worker_store is None:
            # processors whose worker instances meet here (evaluate): an instance in this process too
            for name, pipe in self.config.service.pipelines.items():
                if type_of(name) == "scores":
                    continue
                for i, pid in enumerate(pipe.processors):
                    factory = REGISTRY[("processor", type_of(pid))]
                    if not factory.meets:
                        continue
                    if pid not in processors:
                        processor_next[pid] = self._next()
                        processors[pid] = self._create("processor", pid, processor_next[pid])
                        edges[pid] = set()
                    self.hubs[pid] = processors[pid]
                    _meet_sessions(processors[pid], self.config, pipe.processors[:i])
        _skip_unwanted_sessions(
            [[processors[pid] for pid in p.processors] for n, p in pipelines.items() if type_of(n) == "traces"]
        )
        self.processors = [(pid, processors[pid]) for pid in _upstream_first(edges)]
        if score_heads:
            self.scores = self._fan("scores", list(dict.fromkeys(score_heads)))
            # a processor in a scores pipeline hands its own scores to what follows it there, never to itself
            in_scores = {pid for name, p in pipelines.items() if type_of(name) == "scores" for pid in p.processors}
            for pid, nxt in processor_next.items():
                if pid not in in_scores:
                    nxt.scores = self.scores
        for rid, by_signal in receiver_heads.items():
            nxt = self._next()
            self.heads[rid] = {data: self._fan(data, heads) for data, heads in by_signal.items()}
            for data, head in self.heads[rid].items():
                setattr(nxt, data, head)
            if self.worker_store is None:
                self.receivers[rid] = self._create("receiver", rid, nxt)
        if self.config.service.workers > 1 and self.worker_store is None:
            self._build_receivers_for_workers()

    def _build_receivers_for_workers(self) -> None:
        """The receivers hand requests still encoded to the pool, which shards them over the worker processes."""
        evaluating = {pid: hub for pid, hub in self.hubs.items() if isinstance(hub, EvaluationHub)}
        self.pool = WorkerPool(self.config, self.store_exporter, self.metrics, pipeline=type(self), hubs=evaluating)
        for hub in self.hubs.values():
            if isinstance(hub, JudgeUser):  # one judge budget for the workers and the sessions evaluated here
                if hub.shared_ledger is not None:  # shared with other replicas too
                    self.pool.ledger = hub.shared_ledger
                else:
                    hub.judges.ledger = self.pool.ledger
            if isinstance(hub, WorkerWatcher):  # the memory of the workers counts with this process's
                hub.watch(self.pool)
        pipelines = self.config.service.pipelines
        for rid in dict.fromkeys(r for n, p in pipelines.items() if type_of(n) != "scores" for r in p.receivers):
            nxt = self._next()
            admitting: dict[str, list[Admitter]] = {}
            for name, pipe in pipelines.items():
                if rid in pipe.receivers:
                    head = self.hubs.get(pipe.processors[0]) if pipe.processors else None
                    if isinstance(head, Admitter):
                        admitting.setdefault(type_of(name), []).append(head)
            consumer = _Admitted(self.pool, admitting) if admitting else self.pool
            for name, pipe in pipelines.items():
                if rid in pipe.receivers:
                    setattr(nxt, type_of(name), consumer)
            nxt.encoded = consumer
            self.receivers[rid] = self._create("receiver", rid, nxt)

    @property
    def store_exporter(self) -> StoreExporter | None:
        """The exporter that owns the store (config validation allows one), or None."""
        return next((e for eid, e in self.exporters.items() if is_store(eid) and isinstance(e, StoreExporter)), None)

    @property
    def store(self) -> TraceQueries | None:
        """The store, for the API to read, once its exporter started."""
        exporter = self.store_exporter
        return exporter.store if exporter is not None else None

    def status(self) -> dict[str, Any]:
        return {
            "version": __version__,
            "pid": os.getpid(),
            "workers": self.pool.pids if self.pool else [],
            "workers_chosen": self.config.workers_note or None,
            "receivers": self._endpoints(),
            "api": self.api.endpoint if self.api else None,
            "metrics": self.telemetry.endpoint if self.telemetry else None,
            "store": self.store.description if self.store else None,
        }

    def _endpoints(self) -> dict[str, dict[str, str]]:
        """Where each receiver listens, by protocol (empty for one that does not listen)."""
        return {rid: r.endpoints if isinstance(r, EndpointServer) else {} for rid, r in self.receivers.items()}

    def not_ready(self) -> list[str]:
        """Why components cannot take data now, each saying which (empty when all can)."""
        reasons = ["the collector is shutting down: send elsewhere or retry later"] if self._stopping else []
        for eid, exp in self.exporters.items():
            why = exp.not_ready() if isinstance(exp, ReadinessReporter) else None
            if why:
                reasons.append(f"exporters.{eid}: {why}")
        return reasons

    @property
    def unstored(self) -> dict[str, int]:
        """What exporters (and processors) were handed (acknowledged to senders) but could not write (or hand on)
        before they stopped, by kind."""
        lost: dict[str, int] = {}
        for exp in [*self.exporters.values(), self.pool, *(p for _, p in self.processors)]:
            if not isinstance(exp, LossCounter):
                continue
            for kind, n in exp.unstored.items():
                lost[kind] = lost.get(kind, 0) + n
        fanned = sum(f.lost for f in self._fans)
        if fanned:
            lost["items a pipeline branch refused"] = fanned
        return lost

    def held_since(self) -> float | None:
        """When the oldest span or log record that a component of this process (or a worker) holds, not yet stored,
        reached a receiver; None when nothing is held. The write-ahead log deletes what came before."""
        holders = [c for _, c in self.processors] + list(self.exporters.values()) + list(self._fans)
        found = earliest(c.held_since() for c in holders if isinstance(c, Holder))
        in_flight = self.in_flight.held_since() if self.in_flight is not None else None
        pool = self.pool.held_since() if self.pool is not None else None
        return earliest((found, in_flight, pool))

    async def _replay(self) -> None:
        """Hand what a previous run's write-ahead log holds to the pipelines again, leaving out the spans the store
        holds already (so a span is stored once, and a trace stored whole is not evaluated again)."""
        assert self.wal is not None
        segments = list(self.wal.replayable)
        if not segments:
            return
        t0, requests, spans_skipped = time.monotonic(), 0, 0
        log.info("replaying the write-ahead log", extra={"segments": len(segments)})
        for path in segments:
            for record in self.wal.records(path):
                receiver = self.receivers.get(record.receiver)
                if not isinstance(receiver, Replayer):
                    log.error(
                        "write-ahead log: a request for a receiver no longer configured is left out",
                        extra={"receiver": record.receiver},
                    )
                    continue
                body = receiver.protobuf_of(record.signal, record.format, record.body)
                if record.signal == "traces":  # a sender may send it again: dropped, not stored twice
                    self.wal.replayed_spans.add(body, record.project)
                body, skipped = await self._unstored(record.signal, body, record.project)
                spans_skipped += skipped
                if body is not None:
                    await receiver.replay(record.signal, body, record.project)
                    requests += 1
            self.wal.replayed(path, time.monotonic())
        log.info(
            "write-ahead log replayed",
            extra={"requests": requests, "stored_spans_left_out": spans_skipped,
                   "replay_s": round(time.monotonic() - t0, 2)},
        )  # fmt: skip

    async def _unstored(self, signal: str, body: bytes, project: str) -> tuple[bytes | None, int]:
        """A logged request (protobuf) without the spans its project's store holds (None when nothing is left)."""
        if signal != "traces" or self.store_exporter is None or self.store_exporter.store is None:
            return body, 0
        store = self.store_exporter.store
        return await asyncio.to_thread(without_stored_spans, body, store.stored_span_keys, project)

    async def _retire_loop(self) -> None:
        assert self.wal is not None
        while True:
            await asyncio.sleep(RETIRE_INTERVAL)
            self.wal.retire(earliest((self.held_since(), time.monotonic())) or time.monotonic())

    def policy_lists(self) -> dict[str, tuple[list[str], Path]]:
        """The policy files each `evaluate` processor lists in the config file as it is now (for a reload), by
        processor id; empty when the config is not a file or no longer parses (the lists in use stay)."""
        source = Path(self.config.source)
        if not self.config.source or not source.is_file():
            return {}
        try:
            now = load_config(source)
        except ConfigError as e:
            log.error("reload: the config no longer loads; the policy lists in use stay", extra={"error": str(e)})
            return {}
        found = {}
        for (kind, cid), cfg in now.components.items():
            if kind == "processor" and type_of(cid) == "evaluate":
                found[cid] = (list(cfg.policies), cfg._base_dir)  # type: ignore[attr-defined]
        return found

    async def reload(self, lists: dict[str, tuple[list[str], Path]] | None = None) -> None:
        """SIGHUP: every `evaluate` processor loads its policy files again (with the config's policy list as it is
        now); a file that fails keeps the policies in use, and the log says why. Pipeline workers do the same."""
        lists = self.policy_lists() if lists is None else lists
        for pid, proc in self.processors:
            if not isinstance(proc, PolicyReloader):
                continue
            policies, base_dir = lists.get(pid, (None, None))
            try:
                changed = await proc.reload(policies, base_dir)
            except ValueError as e:
                log.error("policy reload failed; the policies in use stay", extra={"processor": pid, "error": str(e)})
                continue
            log.info("policies reloaded", extra={"processor": pid, "policies": changed})
        if self.pool is not None:
            self.pool.reload(lists)

    async def start(self) -> None:
        """Exporters first (the store opens), then processors, then receivers, as the Collector does."""
        if self.worker_store is None:
            busy = taken(listeners(self.config.service, self.config.components))
            if busy:
                raise StartError("\n  ".join(busy))
        try:
            if self.wal is not None:
                self.wal.open()
            for eid, exp in self.exporters.items():
                await self._start_one(f"exporters.{eid}", exp)
            for pid, proc in self.processors:
                await self._start_one(f"processors.{pid}", proc)
            if self.worker_store is not None:
                return  # a worker serves nothing: the collector process answers for it
            if self.pool is not None:
                await self._start_one("service.workers", self.pool)
            if self.wal is not None:
                await self._replay()
                self._retiring = supervise("write-ahead log retire", self._retire_loop, log=log, metrics=self.metrics)
            # here: uvicorn is ~11 MB, and a pipeline worker serves nothing
            from evalsi.runtime.serving import AsgiServer

            telemetry = self.config.service.telemetry.metrics
            if telemetry.level != "none":
                registry = self.metrics.registry
                if self.pool is not None:  # the workers' counts too
                    registry = merged_registry(registry, self.pool)
                metrics_app: Any = make_asgi_app(registry)
                if self.auth is not None and self.auth.needs_key("metrics", telemetry.address):
                    metrics_app = gate(metrics_app, self.auth, surface="metrics")
                self.telemetry = AsgiServer(metrics_app, telemetry.address)
                await self.telemetry.start()
            from evalsi.collector.api import OPEN_PATHS, build_api  # here: FastAPI is ~11 MB a worker never serves

            api = build_api(
                self.store, self.status, self.scores, self.not_ready, judges=self.judges, auth=self.auth,
                config=self.config.service.api, memory=[p for _, p in self.processors if isinstance(p, BodyAdmitter)],
            )  # fmt: skip
            self.api = AsgiServer(
                gate(api, self.auth, surface="api", open_paths=OPEN_PATHS), self.config.service.api.endpoint
            )
            await self.api.start()
            self._announce()
            for rid, rec in self.receivers.items():
                await self._start_one(f"receivers.{rid}", rec)
        except BaseException:
            await self.shutdown()
            raise
        if self.config.auth is not None and self.config.auth.mode == "none":
            log.warning(
                "auth mode none: anyone who reaches a listener may send, read and score everything; "
                "add api_keys (`evalsi keys new`) to require a key"
            )
        log.info("ready", extra=self.status())

    def _announce(self) -> None:
        """Record in an embedded store's directory that this collector serves it and where its API answers, so a
        reading command (`evalsi runs list`, `traces list`) asks this API rather than find the store locked."""
        announce = getattr(getattr(self.store, "backend", None), "announce", None)
        if announce is None or self.api is None:
            return
        host, _, port = self.api.endpoint.rpartition(":")
        if host in ("", "0.0.0.0", "[::]", "::"):
            host = "127.0.0.1"
        announce(f"http://{host}:{port}", self.role)

    async def _start_one(self, where: str, component: Any) -> None:
        try:
            await component.start()
        except Exception as e:
            raise StartError(f"{where}: {e}") from e
        self._started.append((where, component))

    async def shutdown(self) -> None:
        """Receivers stop taking data, then each stage drains into the next, then the servers stop."""
        t0 = time.monotonic()
        self._stopping = True  # /readyz answers 503 from now on, so load balancers stop sending here
        started = dict(self._started)
        # every receiver drains at once: none keeps taking data while another drains
        await asyncio.gather(*(comp.shutdown() for where, comp in self._started if where.startswith("receivers.")))
        await self._drain_fans()
        # the workers drain first: what they hand on last still reaches the processors here (evaluate's windows)
        for where, comp in self._started:
            if where == "service.workers":
                await comp.shutdown()
        for where, comp in self._started:
            if where.startswith("processors."):
                await comp.shutdown()
        await self._drain_fans()
        # pull receivers keep their watermark once the exporters (still running) have stored what it covers
        pulls = [c for w, c in self._started if w.startswith("receivers.") and isinstance(c, Settler)]
        await asyncio.gather(*(c.settle(SETTLE_TIMEOUT_S) for c in pulls))
        for where, comp in self._started:
            if where.startswith("exporters."):
                await comp.shutdown()
        self._started.clear()
        if self._retiring is not None:
            self._retiring.cancel()
            self._retiring = None
        if self.wal is not None:
            # what the exporters could not store stays in the log (their queues report it held) for the next start
            self.wal.retire(earliest((self.held_since(), time.monotonic())) or time.monotonic(), closing=True)
            self.wal.close()
        for server in (self.api, self.telemetry):
            if server is not None:
                await server.stop()
        self.api = self.telemetry = None
        if started:
            log.info("stopped", extra={"drain_s": round(time.monotonic() - t0, 3)})

    async def _drain_fans(self, timeout: float = 30.0) -> None:
        """Pending parts of fanned-out batches go to the consumers that refused them while those still run."""
        if any(f.pending for f in self._fans):
            await asyncio.gather(*(f.drain(timeout) for f in self._fans))

    def stop(self) -> None:
        self._stop.set()

    async def stopped(self) -> None:
        """Returns once `stop()` is called (or SIGTERM/SIGINT under `run()`)."""
        await self._stop.wait()

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT (or `stop()`), then drain and stop."""
        tune_malloc()
        tune_arrow_pool()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._stop.set)
            except (NotImplementedError, RuntimeError):  # not the main thread
                pass
        reloading: set[asyncio.Task[None]] = set()

        def on_hangup() -> None:
            task = loop.create_task(self.reload())
            reloading.add(task)
            task.add_done_callback(reloading.discard)

        try:
            loop.add_signal_handler(signal.SIGHUP, on_hangup)
        except (NotImplementedError, RuntimeError, AttributeError):
            pass
        await self.start()
        tune_gc()
        try:
            await self._stop.wait()
            log.info("stopping: draining buffers to the exporters")
        finally:
            await self.shutdown()
