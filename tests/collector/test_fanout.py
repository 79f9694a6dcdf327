"""Fan-out is all or nothing: a consumer that refuses leaves the others without the batch, or, when the others
already took it, gets its part later while new batches are refused, so a sender's retry duplicates nothing."""

from __future__ import annotations

import asyncio

import pytest

from evalsi.collector.fanout import FanOut, LogFanOut, ScoreFanOut
from evalsi.component import Refused
from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import BatchKind, Span, SpanBatch


class Store:
    """A consumer that keeps what it takes and refuses while `full`."""

    def __init__(self, full: bool = False) -> None:
        self.full = full
        self.span_ids: list[str] = []
        self.records: list[LogRecord] = []
        self.scores: list[Score] = []
        self.kinds: list[BatchKind] = []

    def _check(self) -> None:
        if self.full:
            raise Refused("full", retry_after=0.01)

    async def consume(self, batch: SpanBatch) -> None:
        self._check()
        self.span_ids += [s.span_id for s in batch]
        self.kinds.append(batch.kind)

    async def consume_logs(self, batch: LogBatch) -> None:
        self._check()
        self.records += batch.records

    async def consume_scores(self, batch: ScoreBatch) -> None:
        self._check()
        self.scores += batch.scores


def spans(n: int, start: int = 0) -> SpanBatch:
    return SpanBatch(
        [Span(f"{1:032x}", f"{i + 1:016x}", "", f"s{i}", "INTERNAL", 1, 2) for i in range(start, start + n)],
        kind=BatchKind.TRACE,
    )


async def send_until_taken(fan: FanOut, batch: SpanBatch) -> None:
    """What an OTLP sender does: send again while refused."""
    while True:
        try:
            await fan.consume(batch)
            return
        except Refused:
            await asyncio.sleep(0.01)


def test_a_refusal_before_anyone_took_the_batch_leaves_every_consumer_without_it() -> None:
    async def run() -> None:
        taker, refuser = Store(), Store(full=True)
        fan = FanOut([taker, refuser])  # the copies go first: `refuser` is tried before `taker`
        with pytest.raises(Refused):
            await fan.consume(spans(3))
        assert taker.span_ids == [] and refuser.span_ids == []
        assert fan.pending == 0

    asyncio.run(run())


def test_a_refusal_after_others_took_it_is_delivered_later_and_a_retry_duplicates_nothing() -> None:
    async def run() -> None:
        first, second = Store(full=True), Store()
        fan = FanOut([first, second])  # `second` (a copy) takes it, then `first` refuses
        await fan.consume(spans(3))  # acknowledged: the fan-out owns first's part now
        assert second.span_ids == [f"{i:016x}" for i in (1, 2, 3)]
        assert fan.pending == 1
        # a new batch is refused before anyone sees it while the part is pending
        with pytest.raises(Refused, match="has not taken an earlier batch"):
            await fan.consume(spans(2, start=3))
        assert len(second.span_ids) == 3
        first.full = False
        await asyncio.wait_for(send_until_taken(fan, spans(2, start=3)), 5)
        expected = [f"{i:016x}" for i in (1, 2, 3, 4, 5)]
        assert first.span_ids == expected and second.span_ids == expected  # each span once, in order
        assert first.kinds == second.kinds == [BatchKind.TRACE, BatchKind.TRACE]  # the kind goes with the copies
        assert fan.pending == 0

    asyncio.run(run())


def test_copies_are_independent() -> None:
    async def run() -> None:
        a, b = Store(), Store()
        seen: list[Span] = []

        class Keeper(Store):
            async def consume(self, batch: SpanBatch) -> None:
                seen.extend(batch.spans)

        fan = FanOut([Keeper(), a, b])
        batch = spans(1)
        await fan.consume(batch)
        assert seen[0] is batch.spans[0]  # the first consumer gets the original, the others copies

    asyncio.run(run())


class Reader(Store):
    """A read-only consumer (an exporter): keeps the spans it is handed, to read them later as a queue would."""

    mutates_data = False

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Span] = []

    async def consume(self, batch: SpanBatch) -> None:
        self.held.extend(batch.spans)


class Renamer(Store):
    """A consumer that mutates (a processor): renames each span and adds an attribute."""

    async def consume(self, batch: SpanBatch) -> None:
        for s in batch.spans:
            s.name = "renamed"
            s.attributes["added"] = 1
        await super().consume(batch)


@pytest.mark.parametrize("mutator_first", [True, False])
def test_a_mutating_consumer_cannot_change_what_a_read_only_sibling_sees(mutator_first: bool) -> None:
    async def run() -> None:
        reader, renamer = Reader(), Renamer()
        fan = FanOut([renamer, reader] if mutator_first else [reader, renamer])
        batch = spans(3)
        await fan.consume(batch)
        assert renamer.span_ids == [f"{i:016x}" for i in (1, 2, 3)]
        assert [(s.name, s.attributes) for s in reader.held] == [("s0", {}), ("s1", {}), ("s2", {})]
        assert reader.held == batch.spans  # the reader shares the original, which the renamer's copy left alone

    asyncio.run(run())


def test_read_only_consumers_share_the_batch_without_copies() -> None:
    async def run() -> None:
        a, b, renamer = Reader(), Reader(), Renamer()
        batch = spans(2)
        await FanOut([a, b]).consume(batch)
        assert all(x is y for x, y in zip(a.held, batch.spans, strict=True))
        assert all(x is y for x, y in zip(b.held, batch.spans, strict=True))
        c = Reader()
        other = spans(2)
        await FanOut([renamer, c]).consume(other)  # one mutator, one reader: only the mutator's part is a copy
        assert all(x is y for x, y in zip(c.held, other.spans, strict=True))
        assert [s.name for s in other.spans] == ["s0", "s1"]

    asyncio.run(run())


def test_a_fan_out_mutates_when_any_of_its_consumers_does() -> None:
    assert FanOut([Reader(), Reader()]).mutates_data is False
    assert FanOut([Reader(), Renamer()]).mutates_data is True
    assert FanOut([Reader(), Store()]).mutates_data is True  # a consumer that does not say is taken to mutate


def test_shutdown_counts_a_part_never_taken() -> None:
    async def run() -> None:
        stuck, ok = Store(full=True), Store()
        fan = FanOut([stuck, ok])
        await fan.consume(spans(4))
        await fan.drain(0.1)
        assert fan.lost == 4 and fan.pending == 0

    asyncio.run(run())


def test_logs_and_scores_fan_out_all_or_nothing_too() -> None:
    async def run() -> None:
        a, b = Store(), Store(full=True)
        logs = LogFanOut([b, a])  # b is tried first and refuses: nothing taken
        with pytest.raises(Refused):
            await logs.consume_logs(LogBatch([LogRecord(1, 1)]))
        assert a.records == []
        scores = ScoreFanOut([a, b])  # a takes, b refuses: b's part waits, new batches are refused
        await scores.consume_scores(ScoreBatch([Score("x", 1.0)]))
        with pytest.raises(Refused):
            await scores.consume_scores(ScoreBatch([Score("y", 1.0)]))
        b.full = False
        for _ in range(100):
            if scores.pending == 0:
                break
            await asyncio.sleep(0.01)
        assert [s.name for s in a.scores] == [s.name for s in b.scores] == ["x"]

    asyncio.run(run())
