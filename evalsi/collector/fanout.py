"""Fan-out: one batch handed to every consumer a pipeline branches to, all or nothing.

The consumer contract says a refused batch was not taken, so the sender sends it again. A fan-out whose second
consumer refuses after the first took the batch cannot say that; so it keeps that consumer's part itself and hands
it on in the background, and refuses every new batch, before any consumer sees it, until nothing is pending. A retry
therefore never gives a consumer the same data twice, and at most one batch per consumer waits here.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from evalsi.capabilities import MutatesData
from evalsi.component import Consumer, LogConsumer, Refused, ScoreConsumer, Signal
from evalsi.model.log_record import LogBatch
from evalsi.model.score import ScoreBatch
from evalsi.model.span import SpanBatch
from evalsi.runtime.held import arrived_of, earliest

log = logging.getLogger("evalsi.service")

B = TypeVar("B")


@dataclass
class _Pending(Generic[B]):
    deliver: Callable[[], Awaitable[None]]
    refusal: Refused
    size: int
    arrived: float | None = None  # when its oldest item reached a receiver (see `held_since`)


class _FanOut(Generic[B]):
    def __init__(self, consumers: list[Any]) -> None:
        self.consumers = consumers
        self._pending: list[_Pending[B]] = []
        self._task: asyncio.Task[None] | None = None
        self.lost = 0  # items pending when the service stopped for good

    @property
    def pending(self) -> int:
        """Consumers' parts not yet taken."""
        return len(self._pending)

    def held_since(self) -> float | None:
        """When the oldest item of a part not yet taken reached a receiver (see `wal.py`)."""
        return earliest(p.arrived for p in self._pending)

    def _parts(self, batch: B) -> list[Callable[[], Awaitable[None]]]:
        """One delivery per consumer, each of the batch it may own."""
        raise NotImplementedError

    @staticmethod
    def _size(batch: B) -> int:
        return len(batch)  # type: ignore[arg-type]

    async def _fan(self, batch: B) -> None:
        if self._pending:
            waiting = self._pending[0].refusal
            raise Refused(
                f"a consumer of this pipeline has not taken an earlier batch yet ({waiting}); retry later",
                retry_after=waiting.retry_after,
                unavailable=waiting.unavailable,
            )
        taken = 0
        for deliver in self._parts(batch):
            try:
                await deliver()
                taken += 1
            except Refused as r:
                if taken == 0:
                    raise  # nothing of it was taken: the sender keeps it
                items = getattr(batch, "spans", None) or getattr(batch, "records", None) or ()
                self._pending.append(_Pending(deliver, r, self._size(batch), arrived_of(items)))
        if self._pending and self._task is None:
            self._task = asyncio.create_task(self._retry())

    async def _retry(self) -> None:
        """Hand the pending parts on, each after its consumer's retry_after, until all are taken."""
        try:
            while self._pending:
                part = self._pending[0]
                await asyncio.sleep(min(max(part.refusal.retry_after, 0.01), 5.0))
                try:
                    await part.deliver()
                    self._pending.pop(0)
                except Refused as r:
                    part.refusal = r
                except Exception:
                    log.exception("a consumer failed taking a pending batch; retrying")
        finally:
            self._task = None

    async def drain(self, timeout: float) -> None:
        """At shutdown: wait up to `timeout` for pending parts to be taken, then count and log what is left."""
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._pending:
            self.lost += sum(p.size for p in self._pending)
            log.error(
                "shutdown: a consumer never took a batch the others took; dropped",
                extra={"count": sum(p.size for p in self._pending), "error": str(self._pending[0].refusal)},
            )
            self._pending.clear()


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
