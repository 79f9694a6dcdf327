"""The baselines of `regressed(...)` alerts, read from the store's scores table (the processor's project) on a thread
of their own, so evaluation never waits for the store. Its metric: `evalsi_baseline_reads`."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from evalsi.policies.baseline import Regression
from evalsi.policies.compare import Sample

log = logging.getLogger("evalsi.policies")

REFRESH = 60.0
"""A baseline is read again at most this often (and when its period moves with a new window)."""

_Key = tuple[str, str, str]


class StoreBaselines:
    """`Baselines` over the store: `sample` answers what was read (None before the first read, or when the store
    has no scored score of that name in the baseline) and asks for a read when the answer is missing or stale."""

    def __init__(self, store: Callable[[], Any], project: str, *, counter: Any = None, processor: str = "") -> None:
        self._store = store
        self.project = project
        self._counter = counter
        self._processor = processor
        self._known: dict[_Key, tuple[float, float, Sample | None]] = {}
        """(policy, score, baseline) -> (the `before` it was read for, when (monotonic), the sample)."""
        self._pending: set[_Key] = set()
        self._queue: queue.Queue[tuple[_Key, Regression, float] | None] = queue.Queue(1000)
        self._no_store_said = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="evalsi-baselines", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    def sample(self, policy: str, regression: Regression, before: float) -> Sample | None:
        key = (policy, regression.name, regression.baseline)
        known = self._known.get(key)
        fresh = known is not None and time.monotonic() - known[1] < REFRESH
        if known is not None and regression.seconds is not None and known[0] != before:
            fresh = False  # a new window: the period moved
        if not fresh and key not in self._pending and self._thread is not None:
            try:
                self._queue.put_nowait((key, regression, before))
                self._pending.add(key)
            except queue.Full:
                pass  # asked again at the next check
        return known[2] if known is not None else None

    def read(self, policy: str, regression: Regression, before: float) -> Sample | None:
        """The baseline from the store now (on the caller's thread); None without a store or a scored score."""
        store = self._store()
        if store is None:
            if not self._no_store_said:
                self._no_store_said = True
                log.warning(
                    "evaluate: regressed(...) alerts have no baseline: no store exporter (clickhouse) in the scores "
                    "pipeline; they never hold"
                )
            return None
        if regression.run_id is not None:
            rows = store.score_window_stats(since_ns=0, run_id=regression.run_id, project=self.project)
        else:
            assert regression.seconds is not None
            until = int(before * 1e9)
            since = max(0, until - int(regression.seconds * 1e9))
            rows = store.score_window_stats(since_ns=since, until_ns=until, policy=policy, project=self.project)
        named = [r for r in rows if r["name"] == regression.name and int(r["n"])]
        if not named:
            return None
        return Sample.from_row(max(named, key=lambda r: int(r["n"])))

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, regression, before = item
            try:
                found = self.read(key[0], regression, before)
                result = "ok" if found is not None else "empty"
                self._known[key] = (before, time.monotonic(), found)
            except Exception as e:  # the store's error, whatever its type: logged, counted, read again later
                result = "store_error"
                log.warning("baseline %s of policy %s not read: %s: %s", regression.text, key[0], type(e).__name__, e)
            finally:
                self._pending.discard(key)
            if self._counter is not None:
                self._counter.labels(self._processor, result).inc()
