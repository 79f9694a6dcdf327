"""Work a component finished that its next consumer refused: kept, handed on again in order in the background, while
the component refuses new batches. A sender's retry so never redoes the work, counts it twice, or duplicates data.

The consumer contract says a refused batch was not taken. A component that has already changed shared state for a
batch (counted it, held some spans of it, handed part of it to another consumer) cannot say that any more: it takes
the batch, keeps the part still owed here, and refuses what comes next until the part is taken (the Collector's
fan-out keeps a part the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from evalsi.component import Refused
from evalsi.runtime.held import arrived_of, earliest

Delivery = Callable[[], Awaitable[None]]

SHUTDOWN_WAIT_S = 5.0
"""How long a processor's shutdown waits for its next consumer to take what it owes (the exporters still run)."""


@dataclass
class _Part:
    deliver: Delivery
    refusal: Refused
    size: int
    arrived: float | None  # when its oldest item reached a receiver (see `held_since`)


class Backlog:
    """Parts owed to a next consumer that refused them, oldest first."""

    def __init__(self, waiting_for: str, log: logging.Logger) -> None:
        self.waiting_for = waiting_for
        """Who has not taken a part, for the refusal's message ("the consumer after normalize")."""
        self.log = log
        self._parts: list[_Part] = []
        self._task: asyncio.Task[None] | None = None
        self.lost = 0
        """Items still owed when the component stopped for good."""

    @property
    def pending(self) -> int:
        """Parts not yet taken."""
        return len(self._parts)

    @property
    def items(self) -> int:
        """Spans, log records or scores not yet taken."""
        return sum(p.size for p in self._parts)

    def held_since(self) -> float | None:
        """When the oldest item of a part not yet taken reached a receiver (see `wal.py`)."""
        return earliest(p.arrived for p in self._parts)

    def refuse_while_owed(self) -> None:
        """Raise `Refused`, with the next consumer's reason and delay, while a part is owed: call before taking a
        batch."""
        if self._parts:
            waiting = self._parts[0].refusal
            raise Refused(
                f"{self.waiting_for} has not taken an earlier batch yet ({waiting}); retry later",
                retry_after=waiting.retry_after,
                unavailable=waiting.unavailable,
            )

    async def hand_on(self, deliver: Delivery, items: list[Any]) -> None:
        """Deliver a part now, after the parts owed before it; one refused is kept (taken either way)."""
        if not self._parts:
            try:
                await deliver()
                return
            except Refused as r:
                refusal = r.with_traceback(None)  # see `keep`
        else:
            refusal = self._parts[-1].refusal
        self.keep(deliver, refusal, items)

    def keep(self, deliver: Delivery, refusal: Refused, items: Iterable[Any], size: int | None = None) -> None:
        """Owe a part its consumer refused; it is handed on again after `retry_after`."""
        # a refusal is kept without its traceback: its frames hold the batch and the frame that caught it, which
        # would keep every span of the part alive, in a reference cycle, until the garbage collector ran
        refusal = refusal.with_traceback(None)
        items = list(items)
        self._parts.append(_Part(deliver, refusal, len(items) if size is None else size, arrived_of(items)))
        if self._task is None:
            self._task = asyncio.create_task(self._retry())

    async def _retry(self) -> None:
        """Hand the owed parts on, each after its consumer's retry_after, until all are taken."""
        try:
            while self._parts:
                part = self._parts[0]
                await asyncio.sleep(min(max(part.refusal.retry_after, 0.01), 5.0))
                try:
                    await part.deliver()
                    self._parts.pop(0)
                except Refused as r:
                    part.refusal = r.with_traceback(None)
                except Exception:
                    self.log.exception("%s failed taking an owed batch; retrying", self.waiting_for)
        finally:
            self._task = None

    async def drain(self, timeout: float) -> int:
        """At shutdown: wait up to `timeout` for the owed parts to be taken; returns (and counts in `lost`) the
        items left, which are logged."""
        deadline = time.monotonic() + timeout
        while self._parts and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        left = self.items
        if left:
            self.lost += left
            self.log.error(
                "shutdown: %s never took %d items this component had taken; dropped",
                self.waiting_for,
                left,
                extra={"count": left, "error": str(self._parts[0].refusal)},
            )
            self._parts.clear()
        return left


def unhanded(spans: Backlog, logs: Backlog) -> dict[str, int]:
    """What a processor's span and log backlogs dropped at shutdown, by kind, as `LossCounter.unstored` says it."""
    return {kind: b.lost for kind, b in (("spans", spans), ("logs", logs)) if b.lost}
