"""A pipeline worker's store link (what stands for the store in a worker process): a flush that raises is logged
with its traceback, counted and restarted, and the spans it held are sent on the next flush; a span no column can
hold is dropped alone. Before, the flush task died silently and every later span of the worker's shard was lost."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from evalsi.collector.workers.link import LINK_ROWS, StoreLink
from evalsi.component import Refused
from evalsi.exporters.clickhouse.rows import ArrowRows
from evalsi.model.span import Span, SpanBatch
from evalsi.runtime.telemetry import SelfMetrics

T0 = time.time_ns()


def _spans(n: int) -> list[Span]:
    return [Span(f"{7:032x}", f"{i + 1:016x}", "", f"s{i}", "CLIENT", T0 + i, T0 + i + 10) for i in range(n)]


def _sent_rows(outbox: queue.SimpleQueue[Any]) -> list[str]:
    ids = []
    while not outbox.empty():
        msg = outbox.get()
        if msg[0] == "table":
            ids += pa.ipc.open_stream(pa.py_buffer(msg[-1])).read_all()["SpanId"].to_pylist()
    return ids


async def _wait_for(predicate: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_a_flush_that_raises_is_logged_restarted_and_loses_nothing(caplog: pytest.LogCaptureFixture) -> None:
    outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    metrics = SelfMetrics()
    link = StoreLink(ArrowRows(), outbox, threading.Semaphore(16), metrics)
    real_send = link._send
    calls = {"n": 0}

    def flaky_send(kind: str, table: pa.Table, arrived: float | None) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("the link broke once")
        real_send(kind, table, arrived)

    link._send = flaky_send  # type: ignore[method-assign]

    async def main() -> None:
        await link.start()
        await link.consume(SpanBatch(_spans(100)))
        failures = "evalsi_task_failures_total"
        await _wait_for(lambda: metrics.registry.get_sample_value(failures, {"task": "store link flush"}) == 1)
        await _wait_for(lambda: calls["n"] >= 2)
        await link.shutdown()

    with caplog.at_level(logging.ERROR, logger="evalsi.workers"):
        asyncio.run(main())
    assert sorted(_sent_rows(outbox)) == sorted(s.span_id for s in _spans(100))
    failed = [r for r in caplog.records if "store link flush" in r.getMessage()]
    assert failed and failed[0].exc_info is not None, "the failure is logged at once, with its traceback"


def test_a_span_no_column_can_hold_is_dropped_alone_in_the_worker() -> None:
    outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    metrics = SelfMetrics()
    link = StoreLink(ArrowRows(), outbox, threading.Semaphore(16), metrics)
    spans = _spans(20)
    spans[4].output_tokens = 1 << 80

    async def main() -> None:
        await link.start()
        await link.consume(SpanBatch(spans))
        await link.shutdown()

    asyncio.run(main())
    sent = _sent_rows(outbox)
    assert len(sent) == 19 and spans[4].span_id not in sent
    dropped = metrics.registry.get_sample_value(
        "evalsi_exporter_items_refused_total", {"exporter": "store_link", "kind": "spans", "reason": "OverflowError"}
    )
    assert dropped == 1


def _tables(outbox: queue.SimpleQueue[Any]) -> list[list[str]]:
    out = []
    while not outbox.empty():
        msg = outbox.get()
        if msg[0] == "table":
            out.append(pa.ipc.open_stream(pa.py_buffer(msg[-1])).read_all()["SpanId"].to_pylist())
    return out


def test_a_large_hand_off_goes_in_tables_of_link_rows_and_a_refusal_keeps_the_rest() -> None:
    """Tail sampling hands on up to 10,000 spans at once; the link sends them in tables of `LINK_ROWS` at most, in
    order, each span once. When the collector has no room for another table the rest wait for the next flush: the
    batch was taken (refusing it then would have the sender hand the same spans again), and a batch that comes
    while there is no room is refused."""
    outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    room = threading.Semaphore(2)
    link = StoreLink(ArrowRows(), outbox, room, SelfMetrics())
    spans = _spans(LINK_ROWS * 2 + LINK_ROWS // 2)

    async def main() -> None:
        await link.consume(SpanBatch(spans))  # two tables sent, no room for the third
        assert [len(t) for t in _tables(outbox)] == [LINK_ROWS, LINK_ROWS]
        with pytest.raises(Refused):
            await link.consume(SpanBatch(_spans(1)))
        room.release(2)  # the collector took both
        await link.shutdown()

    asyncio.run(main())
    assert _tables(outbox) == [[s.span_id for s in spans[2 * LINK_ROWS :]]]
