"""Alert events and the webhook notifier that POSTs them from a background thread."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from evalsi.backoff import Backoff, retry_after

__all__ = ["AlertEvent", "Notifier"]

log = logging.getLogger("evalsi.policies")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


@dataclass(slots=True)
class AlertEvent:
    """An alert that fired: what the webhook gets (`body()`), and where it goes (`notify`, None: recorded only)."""

    policy: str
    alert: str
    condition: str
    notify: str | None
    window_start: float
    window_end: float
    count: int
    aggregates: dict[str, dict[str, Any]]
    example_trace_ids: list[str]
    labels: dict[str, str]
    fired_at: float

    def body(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "alert": self.alert,
            "condition": self.condition,
            "labels": self.labels,
            "window": {"start": _iso(self.window_start), "end": _iso(self.window_end), "count": self.count},
            "aggregates": self.aggregates,
            "example_trace_ids": self.example_trace_ids,
            "fired_at": _iso(self.fired_at),
        }


class Notifier:
    """Sends alert webhooks from one background thread, so the caller never waits: a JSON POST per alert, retried
    on connection errors, 429 and 5xx with the shared backoff policy (`evalsi.backoff`: exponential with jitter, a
    `Retry-After` in seconds or as an HTTP date honoured up to `max_retry_after`). Other 4xx answers are not
    retried."""

    def __init__(
        self,
        *,
        retries: int = 3,
        backoff: float = 0.5,
        timeout: float = 5.0,
        max_pending: int = 1000,
        max_retry_after: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retries = retries
        self.backoff = backoff
        self.max_retry_after = max_retry_after
        self.sent = self.failed = self.dropped = 0
        self.max_pending = max_pending
        self._queue: queue.Queue[AlertEvent | None] = queue.Queue(max_pending)
        self._client = httpx.Client(timeout=timeout, transport=transport)
        self._thread = threading.Thread(target=self._loop, name="evalsi-alert-notifier", daemon=True)
        self._thread.start()

    def send(self, event: AlertEvent) -> None:
        """Queue `event` for its webhook (nothing to send without `notify`); drops it when the queue is full."""
        if not event.notify:
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            log.warning(
                "alert %r of policy %s dropped: %d webhooks pending", event.alert, event.policy, self.max_pending
            )

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (up to `timeout`), then stop."""
        self._queue.put(None)
        self._thread.join(timeout)
        self._client.close()

    def _loop(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            if self._post(event):
                self.sent += 1
            else:
                self.failed += 1

    def _post(self, event: AlertEvent) -> bool:
        assert event.notify is not None
        problem = self._deliver(event.notify, event.body())
        if problem is None:
            return True
        log.warning("alert %r of policy %s: webhook failed (%s)", event.alert, event.policy, problem)
        return False

    def _deliver(self, url: str, body: dict[str, Any]) -> str | None:
        """POST `body` to `url`, retrying with exponential backoff on connection errors, 429 and 5xx; None when
        delivered, else what went wrong the last time."""
        problem = ""
        wait = Backoff(self.backoff, 8 * self.backoff, max_retry_after=self.max_retry_after)
        server_says: float | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(wait.next_wait(server_says))
            server_says = None
            try:
                response = self._client.post(url, json=body)
            except httpx.HTTPError as e:
                problem = f"{type(e).__name__}: {e}"
                continue
            if response.status_code < 300:
                return None
            problem = f"HTTP {response.status_code}"
            if response.status_code != 429 and response.status_code < 500:
                break
            server_says = retry_after(response.headers.get("retry-after"))
        return problem
