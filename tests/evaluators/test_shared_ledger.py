"""Judge budgets shared by replicas through the store (`SharedLedger` over the real chDB store): several replica
objects share one store's ledger, spend within the budget plus at most one slice per other replica, pick up their
claims after a restart, divide the rate limit among themselves, and skip judgments when the store cannot be read."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalsi.evaluators.judge_client import LedgerUnavailable
from evalsi.evaluators.shared_ledger import SharedLedger
from evalsi.exporters.clickhouse.backend import ChdbBackend
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.store import LedgerRow, ReplicaState

PERIOD = 29_000_000  # a budget window's index; any, as long as every replica uses the same


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TraceStore]:
    opened = TraceStore(ChdbBackend(str(tmp_path_factory.mktemp("ledger") / "store")))
    opened.create_schema()
    yield opened
    opened.close()


def _ledgers(store: ReplicaState, n: int, budget_slice: float, replicas: int | None = None) -> list[SharedLedger]:
    return [
        SharedLedger(
            lambda: store, project="acme", replica=f"r{i}", replicas=lambda: replicas or n, budget_slice=budget_slice
        )
        for i in range(n)
    ]


def _spend_until_refused(ledger: SharedLedger, slot: tuple[str, int], **limits: Any) -> int:
    made = 0
    while ledger.reserve(slot, limits.get("max_calls"), limits.get("max_tokens"), limits.get("max_usd")):
        made += 1
        if "cost" in limits:
            ledger.charge(slot, 0, limits["cost"])
    return made


class ReadsTogether:
    """The real store, except that each replica's ledger read waits until every replica has read: their claims are
    then made from the same view of the ledger, the race the bound is about."""

    def __init__(self, store: TraceStore, replicas: int) -> None:
        self.store = store
        self.barrier = threading.Barrier(replicas, timeout=30)
        self.racing = True

    def judge_ledger(self, project: str, budget: str, period: int) -> list[LedgerRow]:
        rows = self.store.judge_ledger(project, budget, period)
        if self.racing:
            self.barrier.wait()
        return rows

    def write_judge_ledger(self, rows: list[LedgerRow]) -> None:
        self.store.write_judge_ledger(rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_one_replica_spends_exactly_the_budget(store: TraceStore) -> None:
    [ledger] = _ledgers(store, 1, budget_slice=0.25)
    slot = ("one#0", PERIOD)
    assert _spend_until_refused(ledger, slot, max_calls=40) == 40
    ledger.flush()
    [row] = store.judge_ledger("acme", "one#0", PERIOD)
    assert (row.replica, row.calls, row.claimed_calls) == ("r0", 40, 40)
    # slices of a quarter of what is left, down to 1% of the budget: a few claims, not one per call
    assert 4 <= ledger.claims <= 16


def test_replicas_racing_for_the_budget_overshoot_by_at_most_one_slice_each(store: TraceStore) -> None:
    """The worst case: three replicas read the ledger at the same moment and each claims all that is left (a slice
    of 1.0). Together they spend the budget plus one slice per other replica, and then nothing more."""
    racing = ReadsTogether(store, 3)
    ledgers = _ledgers(racing, 3, budget_slice=1.0)  # type: ignore[arg-type]
    slot = ("race#0", PERIOD)
    made = [0, 0, 0]

    def replica(i: int) -> None:
        assert ledgers[i].reserve(slot, 10, None, None)  # the first claim: all three read before any writes
        made[i] += 1

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    racing.racing = False
    for i, ledger in enumerate(ledgers):
        made[i] += _spend_until_refused(ledger, slot, max_calls=10)
    slice_ = 10  # each claimed all 10 it saw left
    assert sum(made) == 10 + (3 - 1) * slice_  # the bound, reached
    assert made == [10, 10, 10]
    assert all(not ledger.reserve(slot, 10, None, None) for ledger in ledgers)
    rows = store.judge_ledger("acme", "race#0", PERIOD)
    assert sorted((r.replica, r.claimed_calls) for r in rows) == [("r0", 10), ("r1", 10), ("r2", 10)]


def test_replicas_spending_concurrently_stay_within_the_bound(store: TraceStore) -> None:
    """Three replicas on threads spend one budget until each is refused: together at least the budget (no replica
    is refused while any is left) and at most the budget plus one slice per other replica."""
    limit, fraction = 200, 0.25
    ledgers = _ledgers(store, 3, budget_slice=fraction)
    slot = ("threads#0", PERIOD)
    made = [0, 0, 0]
    start = threading.Barrier(3)

    def replica(i: int) -> None:
        start.wait()
        made[i] = _spend_until_refused(ledgers[i], slot, max_calls=limit)

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert limit <= sum(made) <= limit + (3 - 1) * math.ceil(fraction * limit)
    for ledger in ledgers:
        ledger.flush()
    rows = store.judge_ledger("acme", "threads#0", PERIOD)
    assert sorted(r.calls for r in rows) == sorted(made)  # the store holds what each replica spent


def test_usd_spend_across_replicas_stays_within_the_bound(store: TraceStore) -> None:
    """A cost known only after each call: spend stays under the claims plus one call per replica."""
    limit, fraction, cost = 1.0, 0.5, 0.03
    racing = ReadsTogether(store, 2)
    ledgers = _ledgers(racing, 2, budget_slice=fraction)  # type: ignore[arg-type]
    slot = ("usd#0", PERIOD)
    spent = [0.0, 0.0]

    def replica(i: int) -> None:
        assert ledgers[i].reserve(slot, None, None, limit)
        ledgers[i].charge(slot, 0, cost)
        spent[i] += cost

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    racing.racing = False
    for i, ledger in enumerate(ledgers):
        spent[i] += cost * _spend_until_refused(ledger, slot, max_usd=limit, cost=cost)
    assert limit <= sum(spent) <= limit + (2 - 1) * fraction * limit + 2 * cost


def test_a_restarted_replica_keeps_the_claims_it_made(store: TraceStore) -> None:
    [before] = _ledgers(store, 1, budget_slice=1.0)
    slot = ("restart#0", PERIOD)
    assert before.reserve(slot, 5, None, None) and before.reserve(slot, 5, None, None)
    before.flush()
    [after] = _ledgers(store, 1, budget_slice=1.0)  # the same replica name, a new process
    assert _spend_until_refused(after, slot, max_calls=5) == 3  # 5 in all, not 5 more
    [row] = store.judge_ledger("acme", "restart#0", PERIOD)
    assert (row.calls, row.claimed_calls) == (2, 5)  # (its later spend is written by its next flush)
    after.flush()
    [row] = store.judge_ledger("acme", "restart#0", PERIOD)
    assert row.calls == 5


def test_a_new_budget_period_starts_from_nothing(store: TraceStore) -> None:
    [ledger] = _ledgers(store, 1, budget_slice=1.0)
    assert _spend_until_refused(ledger, ("period#0", PERIOD), max_calls=2) == 2
    assert _spend_until_refused(ledger, ("period#0", PERIOD + 1), max_calls=2) == 2
    ledger.flush()  # the ended period's row is still written
    assert [r.calls for r in store.judge_ledger("acme", "period#0", PERIOD)] == [2]


def test_the_rate_limit_is_divided_among_the_replicas(store: TraceStore) -> None:
    [one] = _ledgers(store, 1, budget_slice=1.0)
    [of_three] = _ledgers(store, 1, budget_slice=1.0, replicas=3)
    for ledger, spacing in ((one, 0.5), (of_three, 1.5)):
        first = ledger.next_call("judge#0", 0.5)  # 2 calls/s for the whole deployment
        second = ledger.next_call("judge#0", 0.5)
        assert second - first == pytest.approx(spacing)


def test_an_unreadable_ledger_refuses_limited_judgments_and_spares_unlimited_ones(tmp_path: Path) -> None:
    class Down:
        def judge_ledger(self, *_: Any) -> list[LedgerRow]:
            raise ConnectionError("store down")

        def write_judge_ledger(self, rows: list[LedgerRow]) -> None:
            raise ConnectionError("store down")

    ledger = SharedLedger(lambda: Down(), project="acme", replica="r0", replicas=lambda: 2, budget_slice=0.5)  # type: ignore[arg-type, return-value]
    with pytest.raises(LedgerUnavailable, match="store down"):
        ledger.reserve(("down#0", PERIOD), 10, None, None)
    assert ledger.reserve(("free#0", PERIOD), None, None, None)  # no limit: nothing to check
    assert ledger.flush() == 0  # its spend waits for the store
    gone = SharedLedger(lambda: None, project="acme", replica="r0", replicas=lambda: 2, budget_slice=0.5)
    with pytest.raises(LedgerUnavailable, match="no store"):
        gone.reserve(("down#0", PERIOD), 10, None, None)
