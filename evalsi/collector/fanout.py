"""Fan-out: one batch handed to every consumer a pipeline branches to, all or nothing.

The consumer contract says a refused batch was not taken, so the sender sends it again. A fan-out whose second
consumer refuses after the first took the batch cannot say that; so it keeps that consumer's part itself and hands
it on in the background, and refuses every new batch, before any consumer sees it, until nothing is pending. A retry
therefore never gives a consumer the same data twice, and at most one batch per consumer waits here.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from evalsi.backlog import Backlog
from evalsi.capabilities import MutatesData
from evalsi.component import Consumer, LogConsumer, Refused, ScoreConsumer, Signal
from evalsi.model.log_record import LogBatch
from evalsi.model.score import ScoreBatch
from evalsi.model.span import SpanBatch

log = logging.getLogger("evalsi.service")

B = TypeVar("B")


class _FanOut(Generic[B]):
    def __init__(self, consumers: list[Any]) -> None:
        self.consumers = consumers
        self._owed = Backlog("a consumer of this pipeline", log)

    @property
    def pending(self) -> int:
        """Consumers' parts not yet taken."""
        return self._owed.pending

    @property
    def lost(self) -> int:
        """Items pending when the service stopped for good."""
        return self._owed.lost

    def held_since(self) -> float | None:
        """When the oldest item of a part not yet taken reached a receiver (see `wal.py`)."""
        return self._owed.held_since()

    def _parts(self, batch: B) -> list[Callable[[], Awaitable[None]]]:
        """One delivery per consumer, each of the batch it may own."""
        raise NotImplementedError

    @staticmethod
    def _size(batch: B) -> int:
        return len(batch)  # type: ignore[arg-type]

    async def _fan(self, batch: B) -> None:
        self._owed.refuse_while_owed()
        taken = 0
        for deliver in self._parts(batch):
            try:
                await deliver()
                taken += 1
            except Refused as r:
                if taken == 0:
                    raise  # nothing of it was taken: the sender keeps it
                items = getattr(batch, "spans", None) or getattr(batch, "records", None) or ()
                self._owed.keep(deliver, r, items, size=self._size(batch))

    async def drain(self, timeout: float) -> None:
        """At shutdown: wait up to `timeout` for pending parts to be taken, then count and log what is left."""
        await self._owed.drain(timeout)


def mutates(consumer: Any) -> bool:
    """Whether a consumer may change the spans it is handed: unless it says it does not (`MutatesData`)."""
    return not isinstance(consumer, MutatesData) or consumer.mutates_data


class FanOut(_FanOut[SpanBatch]):
    """Hands one span batch to several consumers, all or nothing, copying only for consumers that mutate spans
    (`MutatesData`: processors do, exporters do not). Consumers that only read share the batch itself; then every
    consumer that mutates gets its own copy, made before any consumer sees the batch, since a reader may hold the
    spans after `consume` returned (an exporter's queue). When every consumer mutates, all but the first get a copy
    (the Collector's fan-out: the last mutating consumer owns the original)."""

    @property
    def mutates_data(self) -> bool:
        """`MutatesData`: whether any of its consumers may change the spans (a fan-out inside a fan-out)."""
        return any(mutates(c) for c in self.consumers)

    def _parts(self, batch: SpanBatch) -> list[Callable[[], Awaitable[None]]]:
        first, *rest = self.consumers
        order = [*rest, first]  # delivery order: the first consumer last
        mutating = [mutates(c) for c in order]
        owner = len(order) - 1 if all(mutating) else -1  # the consumer handed the original among those that mutate
        return [
            _call(c.consume, _copy(batch) if m and i != owner else batch)
            for i, (c, m) in enumerate(zip(order, mutating, strict=True))
        ]

    async def consume(self, batch: SpanBatch) -> None:
        await self._fan(batch)


class LogFanOut(_FanOut[LogBatch]):
    """Hands one log batch to several consumers, all or nothing (log records are not mutated downstream)."""

    def _parts(self, batch: LogBatch) -> list[Callable[[], Awaitable[None]]]:
        return [_call(c.consume_logs, batch) for c in self.consumers]

    async def consume_logs(self, batch: LogBatch) -> None:
        await self._fan(batch)


class ScoreFanOut(_FanOut[ScoreBatch]):
    """Hands one score batch to every scores consumer, all or nothing."""

    def _parts(self, batch: ScoreBatch) -> list[Callable[[], Awaitable[None]]]:
        return [_call(c.consume_scores, batch) for c in self.consumers]

    async def consume_scores(self, batch: ScoreBatch) -> None:
        await self._fan(batch)


def _copy(batch: SpanBatch) -> SpanBatch:
    return SpanBatch([copy.deepcopy(s) for s in batch.spans], batch.revision, batch.kind)


def _call(consume: Callable[[Any], Awaitable[None]], batch: Any) -> Callable[[], Awaitable[None]]:
    return lambda: consume(batch)


_FANS: dict[Signal, type[_FanOut[Any]]] = {"traces": FanOut, "logs": LogFanOut, "scores": ScoreFanOut}


def fan(data: Signal, consumers: list[Consumer] | list[LogConsumer] | list[ScoreConsumer]) -> Any:
    """The one consumer, or a fan-out over several."""
    return consumers[0] if len(consumers) == 1 else _FANS[data](list(consumers))
