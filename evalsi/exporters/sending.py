"""The exporter helper, like the Collector's exporterhelper: it owns the bounded queue, the background senders, the
full policy, the shutdown deadline and the queue's self-metrics of an exporter that delivers to a backend."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from evalsi.component import Refused, Settings
from evalsi.exporters.delivery import ExporterCounters, sender_errors_counter
from evalsi.runtime.supervise import supervise

T = TypeVar("T")

FullPolicy = Literal["drop_oldest", "refuse"]
"""What `SendQueue.offer` does when the queue is full. `drop_oldest`: take the items and drop the oldest held,
counted in their lane's `dropped` and logged, so ingest never waits for a backend. `refuse`: raise `Refused` and take
nothing, for a caller that must not lose data (it answers 429 and the client sends again)."""

SHUTDOWN_RETRY_AFTER = 5.0  # the Retry-After of a `refuse` queue that is shutting down


class Count(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _NotCounted:
    """The `dropped` of a lane whose queue drops nothing (`refuse`)."""

    def inc(self, amount: float = 1) -> None:
        pass


@dataclass(eq=False)
class Lane(Generic[T]):
    """One kind of item ("scores", "spans"): its queue, and how a chunk of it is sent.

    `send(chunk)` sends one chunk and counts its own outcome in `sent` and `failed` (an exception out of it is a bug:
    the queue logs it, counts the chunk in `failed` and goes on). `dropped` counts what the queue did not take (full,
    or shutting down; a `refuse` queue drops nothing and needs none). `capacity` bounds this lane alone, unless the
    queue's capacity is shared. The sender is woken once `wake_at` items (default `batch_size`) are queued, else every
    flush interval. `select(items, n)` takes up to n items ready to go (default: the n oldest); what it leaves waits
    for a later round, and `send` may put items back with `requeue`. `done(items)` is called with each chunk after its
    send and with every item dropped unsent. With `held_in_flight`, the chunk being sent counts in `held` (for a lane
    whose send may put items back, or whose queue's capacity bounds what is being sent too).

    `keeps_order` (for a queue `partial_once_per_flush` whose sender is `ordered`): a chunk of the lane takes along
    what the lanes before it hold, so it never goes ahead of them; False for a lane whose items do not depend on
    theirs (scores behind spans), so its chunk goes alone.

    `weight(item)` is what an item counts for (default 1; e.g. the rows of a table): capacity, `held` and the gauge,
    `batch_size` and `wake_at` (a chunk takes the oldest items until their weight reaches the batch size), and what
    the queue counts in `dropped` and `failed` are in weight, not items."""

    kind: str
    batch_size: int
    send: Callable[[list[T]], Awaitable[None]]
    sent: Count
    failed: Count
    dropped: Count = field(default_factory=_NotCounted)
    capacity: int | None = None
    wake_at: int | None = None
    select: Callable[[deque[T], int], list[T]] | None = None
    done: Callable[[list[T]], None] | None = None
    held_in_flight: bool = False
    keeps_order: bool = True
    weight: Callable[[T], int] | None = None
    items: deque[T] = field(default_factory=deque)
    queued: int = 0  # the weight of `items`
    in_flight: int = 0  # the weight taken by the sender and neither sent, dropped nor put back yet
    visited_at: float = float("-inf")  # when the sender last took a chunk of it (monotonic); never: -inf

    @property
    def held(self) -> int:
        return self.queued + (self.in_flight if self.held_in_flight else 0)

    def weigh(self, items: Sequence[T]) -> int:
        return len(items) if self.weight is None else sum(map(self.weight, items))

    def add(self, items: Sequence[T]) -> None:
        self.items.extend(items)
        self.queued += self.weigh(items)

    def take(self) -> list[T]:
        if self.select is not None:
            chunk = self.select(self.items, self.batch_size)
        elif self.weight is None:
            chunk = [self.items.popleft() for _ in range(min(self.batch_size, len(self.items)))]
        else:
            chunk, n = [], 0
            while self.items and n < self.batch_size:
                chunk.append(item := self.items.popleft())
                n += self.weight(item)
        self.in_flight = self.weigh(chunk)
        self.queued -= self.in_flight
        return chunk

    def requeue(self, items: list[T]) -> None:
        """Put items of the chunk being sent back at the end of the queue, to go again later (over capacity)."""
        n = self.weigh(items)
        self.in_flight -= n
        self.queued += n
        self.items.extend(items)

    def drop_oldest(self, over: int) -> list[T]:
        """Take the oldest items out until `over` weight is gone (or none is left)."""
        gone: list[T] = []
        while over > 0 and self.items:
            gone.append(item := self.items.popleft())
            over -= 1 if self.weight is None else self.weight(item)
        self.queued -= self.weigh(gone)
        return gone

    def clear(self) -> list[T]:
        gone = list(self.items)
        self.items.clear()
        self.queued = 0
        return gone


@dataclass(eq=False)
class _Sender:
    lanes: tuple[Lane[Any], ...]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class SendQueue:
    """The queue of an exporter: `offer` queues items under the `full` policy, never waiting; background senders
    send chunks of up to a lane's batch size, one sender per lane or, `ordered`, one that visits the lanes in order.
    `capacity` is shared by all lanes (the oldest dropped from the first lane on), else each lane has its own; a
    `refuse` queue counts in it what it holds (`held`, so the chunks in flight of `held_in_flight` lanes too).
    `refusal()`, when given, makes the `Refused` a `refuse` queue raises when it takes nothing (full, or `stopping`),
    for a refusal that depends on the exporter's state (a backend outage is a 503, a full queue a 429).
    `deadline()` is when shutdown stops sending (a monotonic time, infinite until then): pass it to `deliver`.
    `shutdown()` stops taking, sends what is queued for at most `shutdown_timeout`, then drops (counted in `failed`)
    and logs the rest, or hands each lane's count to `on_unsent(lane, n)` in place of that log. It waits for the
    senders `attempt_timeout` past the deadline (plus a second) before it cancels them; with `attempt_timeout` None
    (a send that cannot be cancelled, e.g. a thread), without bound: then `send` must stop by `deadline()` itself.
    `partial_once_per_flush`, for a backend that pays a fixed cost per write: a lane's chunk short of its batch size
    (`wake_at`) goes a flush interval after the sender last took a chunk of that lane, not before (a lane's first
    chunk, or one after a quiet interval, goes at once); a full chunk goes at once (with what the lanes before it
    hold when it `keeps_order`). Without it, what came in while a chunk was being sent goes at once after it, in
    small chunks. Either way a partial chunk waits at most the flush interval, and shutdown sends everything at once.
    Keeps `otelcol_exporter_queue_size` (`held`) and `otelcol_exporter_queue_capacity`."""

    def __init__(
        self,
        settings: Settings,
        lanes: Sequence[Lane[Any]],
        *,
        full: FullPolicy,
        flush_interval: float,
        shutdown_timeout: float,
        attempt_timeout: float | None,
        what: str,
        capacity: int | None = None,
        ordered: bool = False,
        retry_after: float = 1.0,
        refusal: Callable[[], Refused] | None = None,
        on_unsent: Callable[[Lane[Any], int], None] | None = None,
        log_extra: dict[str, Any] | None = None,
        partial_once_per_flush: bool = False,
    ) -> None:
        if capacity is None and any(lane.capacity is None for lane in lanes):
            raise ValueError("give the queue a capacity, or each lane its own")
        if capacity is not None and any(lane.capacity is not None for lane in lanes):
            raise ValueError("a shared capacity and a lane's own: give one or the other")
        self._lanes = tuple(lanes)
        self._capacity = capacity
        self._full = full
        self._flush_interval = flush_interval
        self._partial_once = partial_once_per_flush
        self._shutdown_timeout = shutdown_timeout
        self._attempt_timeout = attempt_timeout
        self._what = what
        self._retry_after = retry_after
        self._refusal = refusal
        self._on_unsent = on_unsent
        self._log_extra = log_extra or {}
        self._log = settings.logger
        self._id = settings.id
        m = settings.metrics
        self._gauge = m.exporter_queue_size.labels(settings.id)
        total = capacity if capacity is not None else sum(lane.capacity or 0 for lane in lanes)
        m.exporter_queue_capacity.labels(settings.id).set(total)
        self._sender_errors = sender_errors_counter(m).labels(settings.id)
        groups = [self._lanes] if ordered else [(lane,) for lane in self._lanes]
        self._senders = [_Sender(group) for group in groups]
        self._sender_of = {lane: sender for sender in self._senders for lane in sender.lanes}
        self._stopping = False
        self._deadline = float("inf")

    @property
    def held(self) -> int:
        return sum(lane.held for lane in self._lanes)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def deadline(self) -> float:
        """When shutdown stops sending: a monotonic time, infinite until shutdown starts."""
        return self._deadline

    def start(self) -> None:
        """Start the senders (in a running event loop); each is restarted if it fails, counted in sender errors."""
        for sender in self._senders:
            kinds = "" if len(self._senders) == 1 else f" {sender.lanes[0].kind}"
            sender.task = supervise(
                f"{self._id}{kinds} sender",
                lambda sender=sender: self._run(sender),
                log=self._log,
                on_failure=self._sender_errors.inc,
            )

    def wake(self, lane: Lane[Any]) -> None:
        """Have the lane's sender look at its queue now."""
        self._sender_of[lane].wake.set()

    def offer(self, lane: Lane[T], items: Sequence[T]) -> None:
        """Queue `items` under the full policy; never waits. Once stopping: counted as dropped (`drop_oldest`) or
        refused as unavailable (`refuse`)."""
        if not items:
            return
        if self._stopping:
            if self._full == "refuse":
                if self._refusal is not None:
                    raise self._refusal()
                raise Refused(
                    f"the {self._what} exporter is shutting down", unavailable=True, retry_after=SHUTDOWN_RETRY_AFTER
                )
            lane.dropped.inc(lane.weigh(items))
            if lane.done is not None:
                lane.done(list(items))
            return
        if self._full == "refuse":
            if lane.weigh(items) > self._room(lane):
                if self._refusal is not None:
                    raise self._refusal()
                raise Refused(
                    f"the {self._what} exporter's queue is full ({self.held} items wait for the backend); retry later",
                    retry_after=self._retry_after,
                )
            lane.add(items)
        else:
            lane.add(items)
            self._drop_oldest(lane)
        self._gauge.set(self.held)
        if lane.queued >= (lane.wake_at or lane.batch_size):
            self._sender_of[lane].wake.set()

    def _room(self, lane: Lane[Any]) -> int:
        """What a `refuse` queue still takes for `lane`: its capacity less what it holds."""
        if self._capacity is not None:
            return self._capacity - self.held
        return (lane.capacity or 0) - lane.held

    def _queued(self) -> int:
        return sum(lane.queued for lane in self._lanes)

    def _drop_oldest(self, lane: Lane[Any]) -> None:
        if self._capacity is not None:
            over, victims = self._queued() - self._capacity, self._lanes
        else:
            over, victims = lane.queued - (lane.capacity or 0), (lane,)
        if over <= 0:
            return
        dropped: dict[str, int] = {}
        for victim in victims:
            gone = victim.drop_oldest(over)
            if not gone:
                continue
            n = victim.weigh(gone)
            victim.dropped.inc(n)
            if victim.done is not None:
                victim.done(gone)
            dropped[victim.kind] = dropped.get(victim.kind, 0) + n
            over -= n
            if over <= 0:
                break
        self._log.warning(
            f"{self._what} export queue full; dropped the oldest {' and '.join(dropped)}",
            extra={"dropped": sum(dropped.values()), "queue": self._queued(), **self._log_extra},
        )

    async def _run(self, sender: _Sender) -> None:
        while True:
            if not self._stopping:
                try:
                    await asyncio.wait_for(sender.wake.wait(), timeout=self._next_round_in(sender.lanes))
                except TimeoutError:
                    pass
            sender.wake.clear()
            while await self._round(sender.lanes):
                pass
            if self._stopping:
                if not any(lane.items for lane in sender.lanes):
                    return
                # only items not ready yet are left (a lane's `select`): look again soon, until the deadline
                await asyncio.sleep(min(self._flush_interval, max(0.0, self._deadline - time.monotonic())))

    def _next_round_in(self, lanes: tuple[Lane[Any], ...]) -> float:
        """How long a sender waits for a wake-up before its next round: the flush interval, or with
        `partial_once_per_flush` until the first of its lanes holding items is due (at most the flush interval)."""
        if not self._partial_once:
            return self._flush_interval
        due = min((lane.visited_at for lane in lanes if lane.items), default=float("inf")) + self._flush_interval
        return max(0.0, min(self._flush_interval, due - time.monotonic()))

    def _due(self, lanes: tuple[Lane[Any], ...]) -> list[Lane[Any]] | tuple[Lane[Any], ...]:
        """The lanes a round visits: all of them, but with `partial_once_per_flush` (and not stopping) those holding
        a full batch or not visited for the flush interval, and the lanes before such a lane that `keeps_order`;
        none when no lane is due."""
        if not self._partial_once or self._stopping:
            return lanes
        since = time.monotonic() - self._flush_interval
        due = [
            bool(lane.items) and (lane.queued >= (lane.wake_at or lane.batch_size) or lane.visited_at <= since)
            for lane in lanes
        ]
        last = max((i for i, lane in enumerate(lanes) if due[i] and lane.keeps_order), default=-1)
        return [lane for i, lane in enumerate(lanes) if due[i] or i < last]

    async def _round(self, lanes: tuple[Lane[Any], ...]) -> bool:
        """Send a chunk of each lane due in turn; False when none had one ready. Past the deadline, drop what is
        left."""
        sent = False
        for lane in self._due(lanes):
            if not lane.items:
                continue
            if time.monotonic() >= self._deadline:
                self._drop_left(lanes, "shutdown timeout: dropping {kind} not yet sent")
                return False
            lane.visited_at = time.monotonic()
            chunk = lane.take()
            if chunk:
                sent = True
                await self._send(lane, chunk)
        return sent

    async def _send(self, lane: Lane[Any], chunk: list[Any]) -> None:
        try:
            await lane.send(chunk)
        except Exception:  # a bug, not the backend: say so at once, count the chunk, go on
            self._sender_errors.inc()
            n = lane.weigh(chunk)
            lane.failed.inc(n)
            self._log.exception(
                f"sending {lane.kind} failed unexpectedly; dropped", extra={"count": n, **self._log_extra}
            )
        finally:
            lane.in_flight = 0
            if lane.done is not None:
                lane.done(chunk)
            self._gauge.set(self.held)

    def _drop_left(self, lanes: Sequence[Lane[Any]], message: str) -> None:
        for lane in lanes:
            if not lane.items:
                continue
            n = lane.queued
            gone = lane.clear()
            lane.failed.inc(n)
            if self._on_unsent is not None:
                self._on_unsent(lane, n)
            else:
                self._log.error(message.format(kind=lane.kind), extra={"count": n, **self._log_extra})
            if lane.done is not None:
                lane.done(gone)
        self._gauge.set(self.held)

    async def shutdown(self) -> None:
        """Stop taking work and send what is queued, for at most `shutdown_timeout`; then drop and count the rest."""
        self._stopping = True
        self._deadline = time.monotonic() + self._shutdown_timeout
        for sender in self._senders:
            sender.wake.set()
        tasks = [sender.task for sender in self._senders if sender.task is not None]
        if tasks:
            # each attempt ends within `attempt_timeout`, and none starts after the deadline
            bound = None if self._attempt_timeout is None else self._shutdown_timeout + self._attempt_timeout + 1
            _, running = await asyncio.wait(tasks, timeout=bound)
            if running:
                in_flight = sum(lane.in_flight for lane in self._lanes)
                for task in running:
                    task.cancel()
                await asyncio.gather(*running, return_exceptions=True)
                self._log.error(
                    f"{self._what} exporter did not drain in time", extra={"in_flight": in_flight, **self._log_extra}
                )
        self._drop_left(self._lanes, "shutdown: dropping {kind} the senders left")


def score_lane(counters: ExporterCounters, batch_size: int, send: Callable[[list[T]], Awaitable[None]],
               **options: Any) -> Lane[T]:  # fmt: skip
    """A lane of scores counted in an exporter's score counters (sent, send failed, enqueue failed)."""
    return Lane("scores", batch_size, send, sent=counters.scores_sent, failed=counters.scores_failed,
                dropped=counters.scores_dropped, **options)  # fmt: skip


def span_lane(counters: ExporterCounters, batch_size: int, send: Callable[[list[T]], Awaitable[None]],
              **options: Any) -> Lane[T]:  # fmt: skip
    """A lane of spans counted in an exporter's span counters (sent, send failed, enqueue failed)."""
    return Lane("spans", batch_size, send, sent=counters.spans_sent, failed=counters.spans_failed,
                dropped=counters.spans_dropped, **options)  # fmt: skip
