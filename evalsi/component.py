"""The component model: the consumer interface components meet through, and the registry of component types."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationInfo

from evalsi.model.encoded import Decoder, EncodedConsumer
from evalsi.model.log_record import LogBatch
from evalsi.model.score import ScoreBatch
from evalsi.model.span import BatchKind, SpanBatch
from evalsi.runtime.telemetry import SelfMetrics
from evalsi.store import StoreType

if TYPE_CHECKING:
    from evalsi.auth.authenticator import Authenticator

Kind = Literal["receiver", "processor", "exporter"]
Signal = Literal["traces", "logs", "scores"]
SIGNALS: tuple[Signal, ...] = ("traces", "logs", "scores")


class ComponentConfig(BaseModel):
    """Base of every component's typed config: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def server_url(value: str, info: ValidationInfo) -> str:
    """A field validator for the base URL of a server a component talks to (`http://host:port`, `https://host`):
    the key's name in the message, the trailing slash dropped."""
    if not value.startswith(("http://", "https://")) or value.endswith("://"):
        raise ValueError(f"unsupported {info.field_name} {value!r}: use http://host:port or https://host (a server)")
    return value.rstrip("/")


class Refused(Exception):
    """A consumer refuses a batch; nothing of it was taken.

    `retryable` work is answered 429 (queue full) or 503 (`unavailable`, e.g. shutting down)
    with `retry_after` seconds; the sender keeps the data and tries again.
    """

    def __init__(self, message: str, *, retry_after: float = 1.0, unavailable: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.unavailable = unavailable


@runtime_checkable
class Consumer(Protocol):
    async def consume(self, batch: SpanBatch) -> None:
        """Take the batch or raise `Refused`. Returning means the batch is owned downstream."""
        ...


@runtime_checkable
class LogConsumer(Protocol):
    async def consume_logs(self, batch: LogBatch) -> None:
        """Take the log records or raise `Refused`, as `Consumer.consume` does for spans."""
        ...


@runtime_checkable
class ScoreConsumer(Protocol):
    async def consume_scores(self, batch: ScoreBatch) -> None:
        """Take the scores or raise `Refused`."""
        ...


class Next:
    """Where a component hands its output: one consumer per signal it is wired for in `service.pipelines`.

    `scores` is the `scores` pipeline's exporters, wired for every processor when that pipeline exists:
    a processor that evaluates hands its scores there.
    """

    def __init__(self) -> None:
        self.traces: Consumer | None = None
        self.logs: LogConsumer | None = None
        self.scores: ScoreConsumer | None = None
        # set for receivers when pipelines run in worker processes: requests go there still encoded
        self.encoded: EncodedConsumer | None = None
        # with a write-ahead log: the batches inside a consume call, which no holder reports while they are there
        self.in_flight: Any = None

    @property
    def signals(self) -> set[Signal]:
        wired: set[Signal] = set()
        if self.traces is not None:
            wired.add("traces")
        if self.logs is not None:
            wired.add("logs")
        if self.scores is not None:
            wired.add("scores")
        return wired

    async def consume(self, batch: SpanBatch) -> None:
        if self.traces is None:
            raise Refused("no traces pipeline takes this component's output", unavailable=True)
        if self.in_flight is None:
            await self.traces.consume(batch)
            return
        token = self.in_flight.enter(batch.spans)
        try:
            await self.traces.consume(batch)
        finally:
            self.in_flight.leave(token)

    async def consume_logs(self, batch: LogBatch) -> None:
        if self.logs is None:
            raise Refused("no logs pipeline takes this component's output", unavailable=True)
        if self.in_flight is None:
            await self.logs.consume_logs(batch)
            return
        token = self.in_flight.enter(batch.records)
        try:
            await self.logs.consume_logs(batch)
        finally:
            self.in_flight.leave(token)

    async def consume_scores(self, batch: ScoreBatch) -> None:
        if self.scores is None:
            raise Refused("no scores pipeline takes this component's scores", unavailable=True)
        await self.scores.consume_scores(batch)


class Component(Protocol):
    async def start(self) -> None: ...

    async def shutdown(self) -> None:
        """Stop taking work and hand on or flush everything held."""
        ...


class WorkerPeers(Protocol):
    """In a pipeline worker: how a processor reaches the collector process (see `collector/workers`)."""

    ledger: Any
    """The judges' budget ledger, kept in the collector process for every worker (`JudgeLedger`)."""

    def hand_evaluated(self, processor: str, scores: list[Any], windows: list[Any]) -> None:
        """Scores and window records of `processor`'s policies, for the collector's scores pipeline and windows;
        raises `Refused` while the collector has not taken the previous ones."""
        ...

    def hand_promoted(self, processor: str, rows: list[Any]) -> None:
        """Rows `processor`'s policies promoted (`promote_to: store`), for the collector, which writes the store."""
        ...

    def hand_session_trace(self, processor: str, spans: list[Any]) -> None:
        """A completed trace that belongs to a session, for the collector, where every worker's traces of a
        session meet."""
        ...

    def hand_twin_trace(self, processor: str, spans: list[Any]) -> None:
        """A completed trace that may record a model call another trace records too (a vendor SDK's lone call, an
        instrumentation's root-level call), for the collector, where every worker's such traces meet and are
        evaluated."""
        ...


class CollectorPeers(Protocol):
    """In the collector process, with pipeline workers: how a processor reaches the workers."""

    def route_feedback(self, processor: str, scores: list[Any]) -> None:
        """Hand feedback scores to the workers holding their traces (sharded by trace id, as spans are)."""
        ...

    def arm_twins(self, processor: str, service: str) -> None:
        """Tell every worker that `service` sends lone vendor SDK calls (`policies/twins.py`)."""
        ...


class Host(Protocol):
    """What a component may ask of the service that runs it (the Collector's `component.Host`)."""

    store: Any
    """The store's queries (`evalsi.store.TraceQueries`), once the exporter that owns it started; else None."""

    def held_since(self) -> float | None:
        """When the oldest item any component holds (not yet stored or evaluated) arrived; None when none is."""
        ...


@dataclass(frozen=True)
class Settings:
    """What the service gives every component besides its config."""

    id: str  # "type" or "type/name", as written in the config
    metrics: SelfMetrics
    logger: logging.Logger
    worker: WorkerPeers | None = None
    """Set in a pipeline worker process (`service.workers` > 1)."""
    collector: CollectorPeers | None = None
    """Set in the collector process when pipelines run in workers."""
    auth: Authenticator | None = None
    """The `auth` section's key check, for components that listen (None: the config has no `auth` section)."""
    wal: Any = None
    """The write-ahead log receivers write a request to before they answer it (`service.durability: {mode: wal}`)."""
    host: Host | None = None
    """The service, for a component that reads the store or waits until what it handed on is settled."""


@dataclass(frozen=True)
class Factory:
    kind: Kind
    type: str
    config: type[ComponentConfig]
    cls: Callable[..., Any]
    signals: tuple[Signal, ...] = ("traces",)
    store: StoreType | None = None
    """Set for an exporter type that owns a store: its row encoder for workers and its reader for the CLI."""
    decode: Decoder | None = None
    """Set for a receiver whose requests can go to pipeline workers still encoded: how a worker decodes them."""
    needs: BatchKind | None = None
    """The span batches a processor acts on (others pass through): a processor that hands them on must precede it."""
    makes: tuple[BatchKind, ...] = ()
    """The span batches a processor hands on beyond what it takes (e.g. whole traces from spans)."""
    first: str | None = None
    """Set for a processor that must be listed first in its pipelines: why (config validation quotes it)."""
    meets: bool = False
    """With pipeline workers, a processor whose worker instances meet in the collector process: it has an instance
    there too (`Settings.collector`), which combines what every worker's instance hands it (`Settings.worker`)."""


REGISTRY: dict[tuple[Kind, str], Factory] = {}

T = TypeVar("T")


def _register(
    kind: Kind, type_name: str, config: type[ComponentConfig], signals: tuple[Signal, ...], **hooks: Any
) -> Callable[[T], T]:
    def decorate(cls: T) -> T:
        key = (kind, type_name)
        if key in REGISTRY and REGISTRY[key].cls is not cls:
            raise ValueError(f"{kind} type {type_name!r} is registered twice")
        REGISTRY[key] = Factory(kind, type_name, config, cls, signals, **hooks)  # type: ignore[arg-type]
        return cls

    return decorate


def receiver(
    type_name: str,
    *,
    config: type[ComponentConfig],
    signals: tuple[Signal, ...] = ("traces",),
    decode: Decoder | None = None,
) -> Callable[[T], T]:
    """Register a receiver: `cls(config, settings, next: Next)`. `decode` lets its requests reach pipeline workers
    still encoded (`Next.encoded`); without it, the receiver cannot run with `service.workers` > 1."""
    return _register("receiver", type_name, config, signals, decode=decode)


def processor(
    type_name: str,
    *,
    config: type[ComponentConfig],
    signals: tuple[Signal, ...] = ("traces",),
    needs: BatchKind | None = None,
    makes: tuple[BatchKind, ...] = (),
    meets: bool = False,
    first: str | None = None,
) -> Callable[[T], T]:
    """Register a processor: `cls(config, settings, next: Next)`. It is a Consumer (and a LogConsumer when it
    takes logs); one instance serves every pipeline that lists its id. `needs` is the kind of span batch it acts on
    (it passes the others on), and `makes` the kinds it hands on beyond what it takes: config validation checks that
    what a processor needs is made before it in its traces pipeline. `meets`: with workers, it has an instance in the
    collector process too. `first`: it must be listed first in a pipeline, and why."""
    return _register(
        "processor", type_name, config, signals, needs=needs, makes=makes, meets=meets, first=first,
    )  # fmt: skip


def exporter(
    type_name: str,
    *,
    config: type[ComponentConfig],
    signals: tuple[Signal, ...] = ("traces",),
    store: StoreType | None = None,
) -> Callable[[T], T]:
    """Register an exporter: `cls(config, settings)`; a Consumer (and LogConsumer) at the end of pipelines. With
    `store`, it owns a store and implements `evalsi.store.StoreExporter`."""
    return _register("exporter", type_name, config, signals, store=store)
