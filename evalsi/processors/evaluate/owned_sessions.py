"""Sessions across replicas (`replicas:`): every replica records in the store when it completes a trace of a session;
the replica that owns the session (rendezvous hash of project and session id over the replica set) evaluates it
once no replica has seen it for `session_timeout`, over all of its traces as the store holds them, and records that
it did. A change of membership hands a session to its new owner, which finds it not yet evaluated; a session two
owners evaluate (during the change) gets the same score keys twice, which the scores table keeps once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from evalsi.component import Settings
from evalsi.model.span import Span, span_from_canonical
from evalsi.processors.tail_sampling.buffer import session_of
from evalsi.replicas import Membership, ReplicasConfig
from evalsi.store import QuietSession, ReplicaState

LOOKBACK_S = 3600.0
"""Sessions seen this long ago (beyond `session_timeout`) and never evaluated are no longer looked for."""


class OwnedSessions:
    """`note` records the sessions of completed traces (written by `tick`); `tick` evaluates the quiet sessions this
    replica owns (`evaluate(spans, done)`: `done` once their scores are handed on) and records them evaluated."""

    def __init__(
        self, config: ReplicasConfig, membership: Membership, store: Callable[[], ReplicaState | None],
        evaluate: Callable[[list[Span], Callable[[], None]], None], settings: Settings,
    ) -> None:  # fmt: skip
        self.config = config
        self.membership = membership
        self._store = store
        self._evaluate = evaluate
        self.settings = settings
        self.tick_s = min(1.0, config.session_timeout / 4)
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], tuple[int, int]] = {}  # (project, session id) -> (newest completion here,
        # ns; stored traces completed since the last write)
        self._evaluated: list[QuietSession] = []  # handed on, to be recorded
        self._in_flight: set[tuple[str, str]] = set()  # queued for evaluation, or evaluated and not yet recorded
        m, sid = settings.metrics, settings.id
        self._sessions = m.counter(
            "evalsi_replica_sessions",
            "Quiet sessions this replica owned, by outcome: `evaluated`, `not_stored` (no trace of it in the store), "
            "`incomplete` (evaluated with fewer traces than the replicas stored, after waiting a session_timeout).",
            ["processor", "outcome"],
        )
        self._errors = m.counter(
            "evalsi_replica_store_errors", "Store errors of the shared session state (retried).", ["processor"]
        ).labels(sid)
        self.store_queries = 0
        """Reads of the shared state (the quiet sessions, a session's spans)."""

    def note(self, spans: list[Span]) -> None:
        """A trace completed here; its session (if any) was active now. A trace tail sampling stores (some span
        sampled) is counted: the owner waits until the store holds as many."""
        key = session_of(spans)
        if key is not None:
            stored = int(any(s.sampled for s in spans))
            with self._lock:
                _, before = self._seen.get((key.project, key.session_id), (0, 0))
                self._seen[(key.project, key.session_id)] = (time.time_ns(), before + stored)

    async def run(self) -> None:
        """Every `tick_s` until cancelled: `tick` on a thread (its store calls block)."""
        while True:
            await asyncio.sleep(self.tick_s)
            await asyncio.to_thread(self.tick)

    def flush(self) -> None:
        """Write what was noted and evaluated since the last write (a store error keeps it for the next)."""
        store = self._store()
        if store is None:
            return
        with self._lock:
            seen, self._seen = self._seen, {}
            evaluated, self._evaluated = self._evaluated, []
        if not seen and not evaluated:
            return
        try:
            store.note_sessions(self.membership.me, seen)
        except Exception as e:
            self._restore(seen, [])
            self._failed(e)
            evaluated_failed = evaluated
        else:
            evaluated_failed = []
            try:
                store.mark_sessions_evaluated(evaluated)
            except Exception as e:
                evaluated_failed = evaluated
                self._failed(e)
        if evaluated_failed:
            self._restore({}, evaluated_failed)
        done = [q for q in evaluated if q not in evaluated_failed]
        if done:  # recorded: a later look at the store no longer finds them due
            with self._lock:
                self._in_flight.difference_update((q.project, q.session_id) for q in done)

    def _restore(self, seen: dict[tuple[str, str], tuple[int, int]], evaluated: list[QuietSession]) -> None:
        with self._lock:
            for key, (at, n) in seen.items():
                later, more = self._seen.get(key, (0, 0))
                self._seen[key] = (max(at, later), n + more)
            self._evaluated = evaluated + self._evaluated

    def _failed(self, error: Exception) -> None:
        self._errors.inc()
        self.settings.logger.warning("evaluate: the store's session state: %s (retried)", error)

    def tick(self, now_ns: int | None = None) -> int:
        """Write the noted activity, then queue the quiet sessions this replica owns for evaluation; returns how many
        were queued."""
        self.flush()
        store = self._store()
        if store is None:
            return 0
        now_ns = time.time_ns() if now_ns is None else now_ns
        quiet_ns = int(self.config.session_timeout * 1e9)
        try:
            self.store_queries += 1
            since = max(0, now_ns - quiet_ns)
            due = store.quiet_sessions(quiet_since_ns=since, active_since_ns=max(0, since - int(LOOKBACK_S * 1e9)))
        except Exception as e:
            self._failed(e)
            return 0
        queued = 0
        for session in due:
            key = (session.project, session.session_id)
            with self._lock:
                if key in self._in_flight:
                    continue
            if not self.membership.owns(*key):
                continue
            try:
                self.store_queries += 1
                rows = store.session_spans(*key)
            except Exception as e:
                self._failed(e)
                continue
            stored = len({r["trace_id"] for r in rows})
            if stored < session.traces and now_ns - session.seen_ns < 2 * quiet_ns:
                continue  # a trace is not in the store yet (its replica's writes lag): look again next tick
            if stored < session.traces:
                self.settings.logger.warning(
                    "evaluate: session %s evaluated with %d of the %d stored traces the replicas completed",
                    session.session_id, stored, session.traces,
                )  # fmt: skip
                self._sessions.labels(self.settings.id, "incomplete").inc()
            if not rows:  # seen, but none of its traces stored (tail_sampling dropped them): nothing to evaluate
                self._sessions.labels(self.settings.id, "not_stored").inc()
                with self._lock:
                    self._in_flight.add(key)
                    self._evaluated.append(session)
                continue
            with self._lock:
                self._in_flight.add(key)
            self._evaluate([span_from_canonical(r) for r in rows], self._done(session))
            queued += 1
        return queued

    def _done(self, session: QuietSession) -> Callable[[], None]:
        def done() -> None:
            self._sessions.labels(self.settings.id, "evaluated").inc()
            with self._lock:  # in flight until `flush` has recorded it evaluated
                self._evaluated.append(session)

        return done
