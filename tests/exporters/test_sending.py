"""The exporter helper (`evalsi.exporters.sending`) on its own: no backend, a `send` that records."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from evalsi.component import Refused, Settings
from evalsi.exporters.sending import FullPolicy, Lane, SendQueue
from evalsi.runtime.telemetry import SelfMetrics

LOGGER = "test.sending"


class Counts:
    """The counters of one lane, read back."""

    def __init__(self, metrics: SelfMetrics, kind: str) -> None:
        self.metrics = metrics
        self.kind = kind

    def counter(self, what: str) -> Any:
        return self.metrics.counter(f"test_{what}", f"{what} items", ["kind"]).labels(self.kind)

    def __getitem__(self, what: str) -> float:
        return self.metrics.registry.get_sample_value(f"test_{what}_total", {"kind": self.kind}) or 0.0


class Backend:
    """Records the chunks sent, per lane, in order; `send` may be replaced to fail or wait."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, list[Any]]] = []

    def sender(self, kind: str, counts: Counts, before: Callable[[list[Any]], Awaitable[None]] | None = None) -> Any:
        async def send(chunk: list[Any]) -> None:
            if before is not None:
                await before(chunk)
            self.chunks.append((kind, chunk))
            counts.counter("sent").inc(len(chunk))

        return send

    def items(self, kind: str | None = None) -> list[Any]:
        return [i for k, chunk in self.chunks if kind in (None, k) for i in chunk]


def lane(
    metrics: SelfMetrics,
    backend: Backend,
    kind: str = "scores",
    *,
    batch_size: int = 10,
    before: Callable[[list[Any]], Awaitable[None]] | None = None,
    **options: Any,
) -> tuple[Lane[Any], Counts]:
    counts = Counts(metrics, kind)
    made: Lane[Any] = Lane(
        kind,
        batch_size,
        backend.sender(kind, counts, before),
        sent=counts.counter("sent"),
        failed=counts.counter("failed"),
        dropped=counts.counter("dropped"),
        **options,
    )
    return made, counts


def queue(
    metrics: SelfMetrics,
    lanes: list[Lane[Any]],
    *,
    full: FullPolicy = "drop_oldest",
    flush_interval: float = 0.02,
    shutdown_timeout: float = 2.0,
    attempt_timeout: float = 1.0,
    **options: Any,
) -> SendQueue:
    settings = Settings("test", metrics, logging.getLogger(LOGGER))
    return SendQueue(
        settings,
        lanes,
        full=full,
        flush_interval=flush_interval,
        shutdown_timeout=shutdown_timeout,
        attempt_timeout=attempt_timeout,
        what="test",
        **options,
    )


def gauge(metrics: SelfMetrics, name: str = "otelcol_exporter_queue_size") -> float:
    return metrics.registry.get_sample_value(name, {"exporter": "test"}) or 0.0


def sender_errors(metrics: SelfMetrics) -> float:
    return metrics.registry.get_sample_value("evalsi_exporter_sender_errors_total", {"exporter": "test"}) or 0.0


async def wait_for(condition: Callable[[], Any], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


# --- the full policies ----------------------------------------------------------------------------


def test_drop_oldest_keeps_the_newest_and_counts_the_dropped(caplog: pytest.LogCaptureFixture) -> None:
    metrics, backend = SelfMetrics(), Backend()
    scores, counts = lane(metrics, backend, capacity=5)
    q = queue(metrics, [scores])
    assert gauge(metrics, "otelcol_exporter_queue_capacity") == 5
    q.offer(scores, [1, 2, 3])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        q.offer(scores, [4, 5, 6, 7])
    assert list(scores.items) == [3, 4, 5, 6, 7]
    assert counts["dropped"] == 2
    assert q.held == gauge(metrics) == 5
    [warning] = caplog.records
    assert "queue full; dropped the oldest scores" in warning.getMessage()
    assert warning.dropped == 2  # type: ignore[attr-defined]
    q.offer(scores, list(range(100, 112)))  # more than it holds at once: the newest 5 stay
    assert list(scores.items) == [107, 108, 109, 110, 111]
    assert counts["dropped"] == 2 + 5 + 7


def test_a_shared_capacity_drops_the_oldest_of_the_first_lanes_first() -> None:
    metrics, backend = SelfMetrics(), Backend()
    scores, score_counts = lane(metrics, backend, "scores")
    spans, span_counts = lane(metrics, backend, "spans")
    q = queue(metrics, [scores, spans], capacity=6, ordered=True)
    assert gauge(metrics, "otelcol_exporter_queue_capacity") == 6
    q.offer(scores, ["s1", "s2", "s3", "s4"])
    q.offer(spans, ["p1", "p2", "p3", "p4"])  # 2 over: the 2 oldest scores go, though spans were offered
    assert (list(scores.items), list(spans.items)) == (["s3", "s4"], ["p1", "p2", "p3", "p4"])
    q.offer(spans, ["p5", "p6", "p7"])  # 3 over: the scores left, then the oldest span
    assert (list(scores.items), list(spans.items)) == ([], ["p2", "p3", "p4", "p5", "p6", "p7"])
    assert (score_counts["dropped"], span_counts["dropped"]) == (4, 1)
    assert q.held == gauge(metrics) == 6


def test_refuse_raises_refused_and_takes_nothing() -> None:
    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, counts = lane(metrics, backend, capacity=5)
        q = queue(metrics, [scores], full="refuse", retry_after=3.0)
        q.offer(scores, [1, 2, 3, 4])
        with pytest.raises(Refused) as refused:
            q.offer(scores, [5, 6])
        assert (refused.value.retry_after, refused.value.unavailable) == (3.0, False)
        assert list(scores.items) == [1, 2, 3, 4]
        assert counts["dropped"] == 0
        q.offer(scores, [5])  # what fits is taken
        assert q.held == gauge(metrics) == 5
        q.start()
        await q.shutdown()
        assert backend.items() == [1, 2, 3, 4, 5]
        with pytest.raises(Refused) as refused:
            q.offer(scores, [6])
        assert refused.value.unavailable
        assert counts["dropped"] == 0

    asyncio.run(run())


def test_what_is_offered_while_stopping_is_counted_as_dropped() -> None:
    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, counts = lane(metrics, backend, capacity=5)
        q = queue(metrics, [scores])
        q.start()
        await q.shutdown()
        q.offer(scores, [1, 2])
        assert counts["dropped"] == 2
        assert q.held == gauge(metrics) == 0

    asyncio.run(run())


def test_a_queue_needs_a_capacity_shared_or_per_lane() -> None:
    metrics, backend = SelfMetrics(), Backend()
    unbounded, _ = lane(metrics, backend)
    with pytest.raises(ValueError):
        queue(metrics, [unbounded])
    bounded, _ = lane(metrics, backend, "spans", capacity=3)
    with pytest.raises(ValueError):
        queue(metrics, [bounded], capacity=3)


# --- the senders ----------------------------------------------------------------------------------


def test_a_send_that_raises_is_counted_and_the_next_chunk_still_goes(caplog: pytest.LogCaptureFixture) -> None:
    async def bug_once(chunk: list[Any]) -> None:
        if chunk[0] == 1:
            raise RuntimeError("a bug in one send")

    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, counts = lane(metrics, backend, batch_size=2, capacity=100, before=bug_once)
        q = queue(metrics, [scores])
        q.start()
        q.offer(scores, [1, 2, 3, 4])
        await wait_for(lambda: backend.items() == [3, 4])
        assert (counts["failed"], counts["sent"], sender_errors(metrics)) == (2, 2, 1)
        await q.shutdown()
        assert q.held == gauge(metrics) == 0

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        asyncio.run(run())
    [logged] = [r for r in caplog.records if r.exc_info]
    assert "sending scores failed unexpectedly" in logged.getMessage()
    assert "a bug in one send" in (logged.exc_text or "")


def test_a_bug_in_the_sender_loop_is_counted_and_the_sender_restarts(caplog: pytest.LogCaptureFixture) -> None:
    class Flaky(asyncio.Event):
        failed = False

        def clear(self) -> None:
            if not self.failed:
                self.failed = True
                raise RuntimeError("a bug in the loop")
            super().clear()

    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, _ = lane(metrics, backend, capacity=100)
        q = queue(metrics, [scores])
        q._senders[0].wake = Flaky()
        q.start()
        q.offer(scores, [1, 2])
        await wait_for(lambda: backend.items() == [1, 2])
        assert sender_errors(metrics) == 1
        await q.shutdown()

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        asyncio.run(run())
    assert any("a bug in the loop" in (r.exc_text or "") for r in caplog.records)


def test_a_full_batch_wakes_the_sender_before_the_flush_interval() -> None:
    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, _ = lane(metrics, backend, batch_size=3, capacity=100)
        q = queue(metrics, [scores], flush_interval=30.0)
        q.start()
        await asyncio.sleep(0.05)  # the sender waits for its wake-up
        q.offer(scores, [1, 2])
        await asyncio.sleep(0.2)
        assert backend.chunks == []  # a partial batch waits for the flush interval
        started = time.monotonic()
        q.offer(scores, [3])
        await wait_for(lambda: backend.items() == [1, 2, 3])
        assert time.monotonic() - started < 1.0
        await q.shutdown()

    asyncio.run(run())


def test_a_partial_batch_goes_after_the_flush_interval() -> None:
    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, _ = lane(metrics, backend, batch_size=100, capacity=1000)
        q = queue(metrics, [scores], flush_interval=0.05)
        q.start()
        q.offer(scores, [1])
        await wait_for(lambda: backend.items() == [1], timeout=2.0)
        await q.shutdown()

    asyncio.run(run())


def test_an_ordered_sender_visits_the_lanes_in_turn() -> None:
    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, _ = lane(metrics, backend, "scores", batch_size=1)
        spans, _ = lane(metrics, backend, "spans", batch_size=1)
        q = queue(metrics, [scores, spans], capacity=10, ordered=True)
        q.offer(spans, ["p1", "p2"])
        q.offer(scores, ["s1", "s2", "s3"])
        q.start()
        await q.shutdown()
        assert [i for _, chunk in backend.chunks for i in chunk] == ["s1", "p1", "s2", "p2", "s3"]

    asyncio.run(run())


# --- partial_once_per_flush: a backend that pays a fixed cost per write -----------------------------


def test_what_comes_in_during_a_send_waits_for_the_flush_interval_with_partial_once_per_flush() -> None:
    def chunks_sent(partial_once: bool) -> list[list[Any]]:
        gate = asyncio.Event()

        async def held(chunk: list[Any]) -> None:
            if chunk[0] == 1:
                await gate.wait()

        async def run() -> list[list[Any]]:
            metrics, backend = SelfMetrics(), Backend()
            spans, _ = lane(metrics, backend, "spans", batch_size=100, capacity=1000, before=held)
            q = queue(metrics, [spans], flush_interval=0.5, partial_once_per_flush=partial_once)
            q.offer(spans, [1])
            q.start()
            await wait_for(lambda: spans.in_flight == 1)
            q.offer(spans, [2])
            q.offer(spans, [3])  # come in while [1] is being sent
            gate.set()
            await wait_for(lambda: backend.items() == [1] or len(backend.chunks) > 1)
            q.offer(spans, [4])  # right after it
            await wait_for(lambda: len(backend.items()) == 4)
            await q.shutdown()
            return [chunk for _, chunk in backend.chunks]

        return asyncio.run(run())

    assert chunks_sent(partial_once=False) == [[1], [2, 3], [4]]  # [2, 3] at once, in a small chunk
    assert chunks_sent(partial_once=True) == [[1], [2, 3, 4]]  # one chunk a flush interval


def test_a_full_batch_goes_at_once_with_partial_once_per_flush() -> None:
    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, _ = lane(metrics, backend, batch_size=3, capacity=100)
        q = queue(metrics, [scores], flush_interval=30.0, partial_once_per_flush=True)
        q.start()
        q.offer(scores, [0])
        await wait_for(lambda: backend.items() == [0])  # the lane's first chunk goes at once
        q.offer(scores, [1, 2])
        await asyncio.sleep(0.2)
        assert backend.items() == [0]  # a partial batch waits for the flush interval
        q.offer(scores, [3, 4, 5, 6])
        await wait_for(lambda: backend.items() == [0, 1, 2, 3, 4, 5, 6])  # two full chunks, at once
        q.offer(scores, [7])
        await asyncio.wait_for(q.shutdown(), 5.0)  # shutdown sends the partial chunk at once
        assert [chunk for _, chunk in backend.chunks] == [[0], [1, 2, 3], [4, 5, 6], [7]]

    asyncio.run(run())


def test_a_due_lane_that_keeps_order_takes_the_lanes_before_it_along_and_another_goes_alone() -> None:
    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        spans, _ = lane(metrics, backend, "spans", batch_size=10)
        scores, _ = lane(metrics, backend, "scores", batch_size=2, keeps_order=False)
        revisions, _ = lane(metrics, backend, "revisions", batch_size=2)
        q = queue(metrics, [spans, scores, revisions], capacity=100, ordered=True, flush_interval=30.0,
                  partial_once_per_flush=True)  # fmt: skip
        q.start()
        q.offer(spans, ["p0"])
        await wait_for(lambda: backend.items() == ["p0"])  # the lane's first chunk goes at once
        q.offer(spans, ["p1"])
        q.offer(scores, ["s1", "s2"])  # full: goes alone, the span waits
        await wait_for(lambda: backend.items() == ["p0", "s1", "s2"])
        q.offer(revisions, ["r1", "r2"])  # full: the span it may revise goes first
        await wait_for(lambda: len(backend.items()) == 6)
        await q.shutdown()
        assert backend.chunks == [
            ("spans", ["p0"]), ("scores", ["s1", "s2"]), ("spans", ["p1"]), ("revisions", ["r1", "r2"])
        ]  # fmt: skip

    asyncio.run(run())


def test_each_lane_has_its_own_sender_unless_ordered() -> None:
    gate = asyncio.Event()

    async def stuck(chunk: list[Any]) -> None:
        await gate.wait()

    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, _ = lane(metrics, backend, "scores", capacity=10, before=stuck)
        spans, _ = lane(metrics, backend, "spans", capacity=10)
        q = queue(metrics, [scores, spans])
        q.start()
        q.offer(scores, ["s1"])
        q.offer(spans, ["p1"])
        await wait_for(lambda: backend.items("spans") == ["p1"])  # the stuck scores hold nothing else up
        assert q.held == 0  # the spans sent; the score is in flight, which is not held (but `held_in_flight`)
        gate.set()
        await q.shutdown()
        assert backend.items("scores") == ["s1"]

    asyncio.run(run())


# --- shutdown -------------------------------------------------------------------------------------


def test_shutdown_sends_what_is_queued_and_the_gauge_returns_to_zero() -> None:
    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, counts = lane(metrics, backend, batch_size=4, capacity=100)
        q = queue(metrics, [scores], flush_interval=30.0)
        q.start()
        q.offer(scores, list(range(10)))
        assert gauge(metrics) == 10
        await q.shutdown()
        assert backend.items() == list(range(10))
        assert (counts["sent"], counts["failed"]) == (10, 0)
        assert q.held == gauge(metrics) == 0

    asyncio.run(run())


def test_shutdown_drains_within_its_deadline_and_counts_what_is_left(caplog: pytest.LogCaptureFixture) -> None:
    async def slow(chunk: list[Any]) -> None:
        await asyncio.sleep(0.2)

    async def run() -> float:
        metrics, backend = SelfMetrics(), Backend()
        scores, counts = lane(metrics, backend, batch_size=1, capacity=100, before=slow)
        q = queue(metrics, [scores], shutdown_timeout=0.5)
        q.start()
        q.offer(scores, list(range(20)))
        started = time.monotonic()
        await q.shutdown()
        took = time.monotonic() - started
        sent = backend.items()
        assert 1 <= len(sent) <= 4
        assert sent == list(range(len(sent)))  # oldest first
        assert counts["sent"] == len(sent)
        assert counts["failed"] == 20 - len(sent)  # every item accounted for
        assert q.held == gauge(metrics) == 0
        return took

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        took = asyncio.run(run())
    assert took < 0.5 + 0.2 + 0.2  # no chunk starts after the deadline
    [logged] = [r for r in caplog.records if "shutdown timeout" in r.getMessage()]
    assert "dropping scores not yet sent" in logged.getMessage()


def test_a_sender_stuck_past_the_bound_is_cancelled_and_the_rest_counted(caplog: pytest.LogCaptureFixture) -> None:
    async def forever(chunk: list[Any]) -> None:
        await asyncio.Event().wait()  # a send that ignores every timeout

    async def run() -> float:
        metrics, backend = SelfMetrics(), Backend()
        scores, counts = lane(metrics, backend, batch_size=1, capacity=100, before=forever)
        spans, span_counts = lane(metrics, Backend(), "spans", capacity=100)
        q = queue(metrics, [scores, spans], shutdown_timeout=0.1, attempt_timeout=0.1, ordered=True)
        q.start()
        q.offer(scores, [1, 2, 3])
        await wait_for(lambda: scores.in_flight == 1)
        q.offer(spans, ["p1"])
        started = time.monotonic()
        await q.shutdown()
        took = time.monotonic() - started
        assert counts["failed"] == 2  # the queued ones; the one in flight is of unknown fate
        assert span_counts["failed"] == 1
        assert q.held == gauge(metrics) == 0
        return took

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        took = asyncio.run(run())
    assert took < 0.1 + 0.1 + 1 + 0.5
    assert any("did not drain in time" in r.getMessage() for r in caplog.records)


# --- lanes whose items wait (MLflow's scores wait for their trace) ----------------------------------


def test_select_and_requeue_hold_items_until_ready_then_the_deadline_drops_them() -> None:
    ready: set[str] = {"a1", "a2"}

    def select(items: deque[str], n: int) -> list[str]:
        chosen = [i for i in items if i in ready][:n]
        for i in chosen:
            items.remove(i)
        return chosen

    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores: Lane[str]
        sent_now: list[str] = []

        async def send(chunk: list[str]) -> None:
            # the first attempt at "a2" finds it not ready after all: it goes back
            back = [i for i in chunk if i == "a2" and i not in sent_now]
            sent_now.extend(chunk)
            assert q.held == 4 - counts["sent"]  # in flight counts as held
            scores.requeue(back)
            assert q.held == 4 - counts["sent"]  # what goes back is not counted twice
            counts.counter("sent").inc(len(chunk) - len(back))

        counts = Counts(metrics, "scores")
        scores = Lane(
            "scores", 10, send, sent=counts.counter("sent"), failed=counts.counter("failed"),
            dropped=counts.counter("dropped"), capacity=10, wake_at=1, select=select, held_in_flight=True,
        )  # fmt: skip
        q = queue(metrics, [scores], shutdown_timeout=0.3)
        q.offer(scores, ["w1", "a1", "w2", "a2"])
        q.start()
        await wait_for(lambda: counts["sent"] == 2)
        assert list(scores.items) == ["w1", "w2"]  # the waiting ones keep their order
        assert q.held == gauge(metrics) == 2
        ready.add("w2")
        q.wake(scores)
        await wait_for(lambda: counts["sent"] == 3)
        started = time.monotonic()
        await q.shutdown()  # "w1" never gets ready: it waits until the deadline, then is counted
        assert 0.25 < time.monotonic() - started < 1.0
        assert (counts["sent"], counts["failed"]) == (3, 1)
        assert q.held == gauge(metrics) == 0
        assert backend.chunks == []

    asyncio.run(run())


def test_done_sees_every_item_that_leaves_once() -> None:
    left: list[int] = []

    async def slow(chunk: list[Any]) -> None:
        await asyncio.sleep(0.1)

    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        scores, _ = lane(metrics, backend, batch_size=2, capacity=4, done=left.extend, before=slow)
        q = queue(metrics, [scores], flush_interval=30.0, shutdown_timeout=0.0)
        q.offer(scores, [1, 2, 3, 4, 5, 6])  # 1 and 2 dropped: full
        q.start()
        q.offer(scores, [7])  # 3 dropped
        await wait_for(lambda: scores.in_flight == 2)
        await q.shutdown()  # no time left once 4 and 5 are sent: 6 and 7 dropped unsent
        assert backend.items() == [4, 5]
        q.offer(scores, [8])  # stopping: dropped
        assert sorted(left) == [1, 2, 3, 4, 5, 6, 7, 8]

    asyncio.run(run())


# --- lanes of weighted items, a refusal of the exporter's own, shutdown bookkeeping (the store's queue) ----------


class Table:
    """An item that counts for its rows, like an Arrow table a pipeline worker sends."""

    def __init__(self, name: str, rows: int) -> None:
        self.name = name
        self.rows = rows

    def __repr__(self) -> str:
        return self.name


def rows(item: Table) -> int:
    return item.rows


def test_a_weighted_lane_counts_rows_for_capacity_gauge_batches_and_wake_up() -> None:
    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        tables, _ = lane(metrics, backend, "tables", batch_size=100, weight=rows)
        q = queue(metrics, [tables], full="refuse", capacity=250, flush_interval=30.0)
        q.offer(tables, [Table("a", 60)])
        q.offer(tables, [Table("b", 30)])
        assert (tables.queued, q.held, gauge(metrics)) == (90, 90, 90)
        assert not q._senders[0].wake.is_set()  # 90 rows: less than a batch
        with pytest.raises(Refused):
            q.offer(tables, [Table("too many", 161)])  # 90 + 161 rows > 250, though only 3 items
        q.offer(tables, [Table("c", 50), Table("d", 110)])  # 250 rows exactly
        assert q._senders[0].wake.is_set()  # a batch's worth of rows is queued
        assert q.held == gauge(metrics) == 250
        q.start()
        await q.shutdown()
        assert [[t.name for t in chunk] for _, chunk in backend.chunks] == [["a", "b", "c"], ["d"]]
        assert q.held == gauge(metrics) == 0

    asyncio.run(run())


def test_a_weighted_drop_oldest_lane_drops_and_counts_rows() -> None:
    metrics, backend = SelfMetrics(), Backend()
    tables, counts = lane(metrics, backend, "tables", capacity=100, weight=rows)
    q = queue(metrics, [tables])
    q.offer(tables, [Table("a", 40), Table("b", 40)])
    q.offer(tables, [Table("c", 30)])  # 10 rows over: the oldest table goes, all its 40 rows
    assert ([t.name for t in tables.items], tables.queued, counts["dropped"]) == (["b", "c"], 70, 40)
    assert q.held == gauge(metrics) == 70


def test_a_weighted_chunk_takes_the_oldest_items_until_the_batch_size_is_reached() -> None:
    metrics, backend = SelfMetrics(), Backend()
    tables, _ = lane(metrics, backend, "tables", batch_size=100, weight=rows)
    q = queue(metrics, [tables], full="refuse", capacity=1000)
    a, b, c, d = Table("a", 60), Table("b", 30), Table("c", 50), Table("d", 5)
    q.offer(tables, [a, b, c, d])
    assert tables.take() == [a, b, c]  # 60 + 30 < 100: one more, which may pass the batch size
    assert (tables.in_flight, tables.queued) == (140, 5)
    tables.requeue([c])
    assert (tables.in_flight, tables.queued, list(tables.items)) == (90, 55, [d, c])


def test_a_refuse_queue_counts_the_chunk_in_flight_of_held_in_flight_lanes_in_its_capacity() -> None:
    gate = asyncio.Event()

    async def stuck(chunk: list[Any]) -> None:
        await gate.wait()

    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        spans, _ = lane(metrics, backend, "spans", batch_size=4, held_in_flight=True, before=stuck)
        q = queue(metrics, [spans], full="refuse", capacity=6)
        q.start()
        q.offer(spans, [1, 2, 3, 4])
        await wait_for(lambda: spans.in_flight == 4)
        assert (spans.queued, q.held, gauge(metrics)) == (0, 4, 4)
        with pytest.raises(Refused):
            q.offer(spans, [5, 6, 7])  # 4 being sent + 3 > 6
        q.offer(spans, [5, 6])
        gate.set()
        await q.shutdown()
        assert backend.items() == [1, 2, 3, 4, 5, 6]
        assert q.held == gauge(metrics) == 0

    asyncio.run(run())


def test_a_refusal_of_the_exporters_own_is_raised_when_full_and_when_stopping() -> None:
    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        outage = {"on": False}

        def refusal() -> Refused:
            if q.stopping:
                return Refused("stopping", unavailable=True, retry_after=5)
            if outage["on"]:
                return Refused(f"backend down; {q.held} wait", unavailable=True, retry_after=10)
            return Refused(f"full; {q.held} wait", retry_after=2)

        spans, counts = lane(metrics, backend, "spans")  # a `refuse` lane needs no `dropped`
        q = queue(metrics, [spans], full="refuse", capacity=2, refusal=refusal)
        q.offer(spans, [1, 2])
        with pytest.raises(Refused) as full:
            q.offer(spans, [3])
        assert (str(full.value), full.value.retry_after, full.value.unavailable) == ("full; 2 wait", 2, False)
        outage["on"] = True
        with pytest.raises(Refused) as down:
            q.offer(spans, [3])
        assert (str(down.value), down.value.retry_after, down.value.unavailable) == ("backend down; 2 wait", 10, True)
        q.start()
        await q.shutdown()
        with pytest.raises(Refused) as stopping:
            q.offer(spans, [3])
        assert (str(stopping.value), stopping.value.unavailable) == ("stopping", True)
        assert backend.items() == [1, 2]
        assert counts["dropped"] == 0

    asyncio.run(run())


def test_on_unsent_takes_the_weight_shutdown_gives_up_in_place_of_the_log(caplog: pytest.LogCaptureFixture) -> None:
    unsent: list[tuple[str, int]] = []

    async def slow(chunk: list[Any]) -> None:
        await asyncio.sleep(0.2)

    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        tables, counts = lane(metrics, backend, "tables", batch_size=1, weight=rows, held_in_flight=True, before=slow)
        q = queue(
            metrics, [tables], full="refuse", capacity=1000, shutdown_timeout=0.1,
            on_unsent=lambda lane, n: unsent.append((lane.kind, n)),
        )  # fmt: skip
        q.offer(tables, [Table("a", 10), Table("b", 20), Table("c", 30)])
        q.start()
        await wait_for(lambda: tables.in_flight == 10)
        await q.shutdown()  # "a" is sent; the deadline passes meanwhile: 50 rows are given up
        assert backend.items("tables")[0].name == "a"
        assert counts["failed"] == 50
        assert q.held == gauge(metrics) == 0

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        asyncio.run(run())
    assert unsent == [("tables", 50)]
    assert not [r for r in caplog.records if "dropping" in r.getMessage()]  # the hook reports it, not the queue


def test_with_no_attempt_timeout_shutdown_waits_for_a_send_past_the_bound_and_cancels_nothing() -> None:
    async def slow(chunk: list[Any]) -> None:
        await asyncio.sleep(1.3)  # e.g. an insert in a thread, which cannot be cancelled: longer than any bound here

    async def run() -> None:
        metrics, backend = SelfMetrics(), Backend()
        spans, counts = lane(metrics, backend, "spans", batch_size=1, before=slow)
        q = queue(metrics, [spans], full="refuse", capacity=10, shutdown_timeout=0.0, attempt_timeout=None)
        q.offer(spans, [1, 2])
        q.start()
        await wait_for(lambda: spans.in_flight == 1)
        started = time.monotonic()
        await q.shutdown()
        assert time.monotonic() - started > 1.1  # with attempt_timeout=0 it would be cancelled after 0 + 0 + 1 s
        assert backend.items() == [1]  # the send in flight ended; the next one never started
        assert (counts["sent"], counts["failed"]) == (1, 1)

    asyncio.run(run())
