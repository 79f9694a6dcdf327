"""Judge budgets shared by the replicas of one deployment through the store: each replica claims a slice of what is
left of a budget period (a row of the store's judge ledger), spends within its claims, and records its spend there.

The bound (docs/scale-out.md): a replica claims only after reading every replica's row, claims at most what it read
as left, and makes one claim at a time. So when the budget runs out, the claims add up to at most the budget plus one
slice per other replica (the claims made from the same read), and spend to at most the claims plus the calls in
flight when each replica's last claim ran out (a call is admitted while spend is under the claim; its tokens and
cost are known once it returns)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from evalsi.evaluators.judge_client import LedgerUnavailable
from evalsi.store import LedgerRow, ReplicaState

log = logging.getLogger("evalsi.judges")

MIN_SLICE = 0.01
"""The smallest slice, as a fraction of the budget: near the end a replica claims what is left in a few steps."""


@dataclass(frozen=True)
class Limits:
    calls: int | None
    tokens: int | None
    usd: float | None

    @property
    def any(self) -> bool:
        return self.calls is not None or self.tokens is not None or self.usd is not None


def _within(row: LedgerRow, limits: Limits) -> bool:
    """Whether the replica's spend is under its claims in every limited measure."""
    return (
        (limits.calls is None or row.calls < row.claimed_calls)
        and (limits.tokens is None or row.tokens < row.claimed_tokens)
        and (limits.usd is None or row.usd < row.claimed_usd)
    )


def _slice(remaining: float, limit: float, fraction: float) -> float:
    return min(remaining, max(remaining * fraction, limit * MIN_SLICE))


class SharedLedger:
    """A `JudgeLedger` over the store's judge ledger (`ReplicaState`), for one replica of several.

    `reserve` and `charge` work on this replica's row in memory; a reservation past the replica's claims claims the
    next slice from the store (and writes the row). `flush` writes the rows whose spend changed since (the evaluate
    processor calls it every second). The rate limit is divided among the replicas: each replica spaces its calls
    `replicas()` times wider."""

    def __init__(
        self, store: Callable[[], ReplicaState | None], *, project: str, replica: str,
        replicas: Callable[[], int], budget_slice: float,
    ) -> None:  # fmt: skip
        self._store = store
        self.project = project
        self.replica = replica
        self._replicas = replicas
        self.budget_slice = budget_slice
        self._lock = threading.Lock()  # one claim at a time in this replica: the bound counts on it
        self._rows: dict[tuple[str, int], LedgerRow] = {}
        self._dirty: set[tuple[str, int]] = set()
        self._retired: list[LedgerRow] = []  # rows of periods that ended, still to be written
        self._next_call: dict[str, float] = {}
        self.claims = 0
        """Slices claimed (a store read and a write each)."""
        self.writes = 0
        """Ledger rows written (claims and flushes)."""

    def _state(self) -> ReplicaState:
        store = self._store()
        if store is None:
            raise LedgerUnavailable("no store to keep the judge budget ledger in (the store exporter is not started)")
        return store

    def _row(self, slot: tuple[str, int], must: bool) -> LedgerRow:
        """This replica's row of the slot, read back from the store at its first use (after a restart the claims
        made before it still count)."""
        row = self._rows.get(slot)
        if row is not None:
            return row
        for old in [k for k in self._rows if k[0] == slot[0] and k[1] < slot[1]]:
            if old in self._dirty:
                self._retired.append(replace(self._rows[old]))
                self._dirty.discard(old)
            del self._rows[old]
        budget, period = slot
        row = LedgerRow(self.project, budget, period, self.replica)
        try:
            for found in self._state().judge_ledger(self.project, budget, period):
                if found.replica == self.replica:
                    row = found
        except Exception as e:
            if must:
                raise LedgerUnavailable(f"the judge budget ledger cannot be read: {e}") from None
            log.warning("judge ledger: cannot read %s's row (%s); recording from zero", budget, e)
        self._rows[slot] = row
        return row

    def reserve(self, slot: tuple[str, int], max_calls: int | None, max_tokens: int | None,
                max_usd: float | None) -> bool:  # fmt: skip
        limits = Limits(max_calls, max_tokens, max_usd)
        with self._lock:
            row = self._row(slot, must=limits.any)
            if limits.any and not _within(row, limits) and not self._claim(row, limits):
                return False
            row.calls += 1
            self._dirty.add(slot)
            return True

    def _claim(self, row: LedgerRow, limits: Limits) -> bool:
        """Claim the next slice of what every replica's rows leave of the budget; False when nothing is left."""
        try:
            rows = self._state().judge_ledger(self.project, row.budget, row.period)
        except Exception as e:
            raise LedgerUnavailable(f"the judge budget ledger cannot be read: {e}") from None
        others = [r for r in rows if r.replica != self.replica]
        claim = replace(row)
        f = self.budget_slice
        if limits.calls is not None:
            used = sum(max(r.claimed_calls, r.calls) for r in others) + max(row.claimed_calls, row.calls)
            left = limits.calls - used
            if left <= 0:
                return False
            claim.claimed_calls = max(row.claimed_calls, row.calls) + max(1, math.ceil(_slice(left, limits.calls, f)))
        if limits.tokens is not None:
            used = sum(max(r.claimed_tokens, r.tokens) for r in others) + max(row.claimed_tokens, row.tokens)
            left = limits.tokens - used
            if left <= 0:
                return False
            claim.claimed_tokens = max(row.claimed_tokens, row.tokens) + max(
                1, math.ceil(_slice(left, limits.tokens, f))
            )
        if limits.usd is not None:
            used_usd = sum(max(r.claimed_usd, r.usd) for r in others) + max(row.claimed_usd, row.usd)
            left_usd = limits.usd - used_usd
            if left_usd <= 0:
                return False
            claim.claimed_usd = max(row.claimed_usd, row.usd) + _slice(left_usd, limits.usd, f)
        try:
            self._state().write_judge_ledger([claim])
        except Exception as e:
            raise LedgerUnavailable(f"the judge budget ledger cannot be written: {e}") from None
        row.claimed_calls, row.claimed_tokens = claim.claimed_calls, claim.claimed_tokens
        row.claimed_usd = claim.claimed_usd
        self._dirty.discard((row.budget, row.period))
        self.claims += 1
        self.writes += 1
        return True

    def charge(self, slot: tuple[str, int], tokens: int, usd: float) -> None:
        with self._lock:
            row = self._rows.get(slot)
            if row is None:  # the period ended between the reservation and the charge: the next one pays
                row = self._row(slot, must=False)
            row.tokens += tokens
            row.usd += usd
            self._dirty.add(slot)

    def flush(self) -> int:
        """Write the rows whose spend changed since they were last written; returns how many. A store error leaves
        them to the next flush."""
        with self._lock:
            rows = self._retired + [replace(self._rows[k]) for k in self._dirty if k in self._rows]
            self._retired, dirty = [], set(self._dirty)
            self._dirty.clear()
        if not rows:
            return 0
        try:
            self._state().write_judge_ledger(rows)
        except Exception as e:
            with self._lock:
                self._dirty |= {k for k in dirty if k in self._rows}
                self._retired = [r for r in rows if (r.budget, r.period) not in self._rows] + self._retired
            log.warning("judge ledger: %d rows not written (%s); written with the next flush", len(rows), e)
            return 0
        with self._lock:
            self.writes += len(rows)
        return len(rows)

    def next_call(self, judge: str, interval_s: float) -> float:
        """The judge's next call slot here: with N replicas each spaces its calls N times the interval, so together
        they keep the rate limit while they agree on N."""
        with self._lock:
            now = time.monotonic()
            at = max(now, self._next_call.get(judge, 0.0))
            self._next_call[judge] = at + interval_s * self._replicas()
            return at
