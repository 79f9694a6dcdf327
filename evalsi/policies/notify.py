"""Alert events, the webhook notifier that POSTs them and the recorder that stores them, each from a background
thread."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from evalsi.runtime.backoff import Backoff, retry_after

if TYPE_CHECKING:
    import httpx

__all__ = ["AlertEvent", "AlertRecorder", "Notifier", "post_json"]

log = logging.getLogger("evalsi.policies")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


@dataclass(slots=True)
class AlertEvent:
    """An alert that fired (or resolved): what the webhook gets (`body()`), and where it goes (`notify`, None:
    recorded only). `values` are the window aggregates the condition read when it held (or, resolved, when the
    window closed), e.g. `{"count": 12, "rate('contains')": 0.25}`, a `regressed(...)` as its comparison (difference,
    interval, test); `fired_at` is when it fired (resolved: when the
    window without it closed)."""

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
    values: dict[str, Any] = field(default_factory=dict)
    state: str = "firing"
    """`firing`, or `resolved`: a whole window closed without the condition holding (never sent to a webhook)."""
    project: str = ""
    """The project whose window fired it (windows read from the store are per project); "" for a process's window,
    which holds every project's traces (recorded under its processor's project)."""

    def body(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "alert": self.alert,
            "condition": self.condition,
            "labels": self.labels,
            "window": {"start": _iso(self.window_start), "end": _iso(self.window_end), "count": self.count},
            "aggregates": self.aggregates,
            "values": self.values,
            "example_trace_ids": self.example_trace_ids,
            "fired_at": _iso(self.fired_at),
        }


class Notifier:
    """Sends alert webhooks from one background thread, so the caller never waits: a JSON POST per alert, retried
    on connection errors, 429 and 5xx with the shared backoff policy (`evalsi.runtime.backoff`: exponential with
    jitter, a `Retry-After` in seconds or as an HTTP date honoured up to `max_retry_after`). Other 4xx answers are
    not retried. Its thread and HTTP client start with the first webhook to send: a service whose policies notify
    no one (every pipeline worker, most deployments) holds neither."""

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
        self._timeout, self._transport = timeout, transport
        self._client: httpx.Client | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._started = threading.Lock()

    def _start(self) -> None:
        with self._started:
            if self._thread is None and not self._closed:
                import httpx  # here: most services never send a webhook, and httpx is ~13 MB of a process

                self._client = httpx.Client(timeout=self._timeout, transport=self._transport)
                self._thread = threading.Thread(target=self._loop, name="evalsi-alert-notifier", daemon=True)
                self._thread.start()

    def send(self, event: AlertEvent) -> None:
        """Queue `event` for its webhook (nothing to send without `notify`, or once resolved); drops it when the
        queue is full."""
        if not event.notify or event.state != "firing" or self._closed:
            return
        if self._thread is None:
            self._start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            log.warning(
                "alert %r of policy %s dropped: %d webhooks pending", event.alert, event.policy, self.max_pending
            )

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued (up to `timeout`), then stop."""
        with self._started:
            self._closed = True  # nothing starts or is queued after close
            thread, client = self._thread, self._client
        if thread is None or client is None:
            return
        self._queue.put(None)
        thread.join(timeout)
        client.close()

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
        assert event.notify is not None and self._client is not None
        problem = post_json(
            self._client, event.notify, event.body(), retries=self.retries, backoff=self.backoff,
            max_retry_after=self.max_retry_after,
        )  # fmt: skip
        if problem is None:
            return True
        log.warning("alert %r of policy %s: webhook failed (%s)", event.alert, event.policy, problem)
        return False


def post_json(
    client: httpx.Client, url: str, body: Any, *, retries: int, backoff: float, max_retry_after: float = 300.0
) -> str | None:
    """POST `body` as JSON to `url`, retrying connection errors, 429 and 5xx with the shared backoff (a `Retry-After`
    honoured up to `max_retry_after`); other 4xx are not retried. None when delivered, else what went wrong last."""
    import httpx  # loaded already: the caller holds a client

    problem = ""
    wait = Backoff(backoff, 8 * backoff, max_retry_after=max_retry_after)
    server_says: float | None = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(wait.next_wait(server_says))
        server_says = None
        try:
            response = client.post(url, json=body)
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


class AlertRecorder:
    """Hands alert events to `write` (the store) from one background thread, so evaluation never waits for the
    store: what is queued goes in one call. A failed write is logged and its events dropped, each counted through
    `lost(reason, n)`: `store_error`, or `queue_full` past `max_pending` events waiting."""

    def __init__(
        self,
        write: Callable[[list[AlertEvent]], None],
        *,
        lost: Callable[[str, int], None] | None = None,
        max_pending: int = 10_000,
    ) -> None:
        self.write = write
        self.lost = lost or (lambda reason, n: None)
        self.written = 0
        self.max_pending = max_pending
        self._pending: list[AlertEvent] = []
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="evalsi-alert-recorder", daemon=True)
        self._thread.start()

    def record(self, events: list[AlertEvent]) -> None:
        """Queue `events` for the store; never blocks."""
        if not events:
            return
        with self._cond:
            room = max(0, self.max_pending - len(self._pending))
            self._pending += events[:room]
            self._cond.notify()
        if len(events) > room:
            self.lost("queue_full", len(events) - room)
            log.warning("%d alert events not recorded: %d wait for the store", len(events) - room, self.max_pending)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (up to `timeout`), then stop."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                batch, self._pending = self._pending, []
                if not batch and self._closing:
                    return
            try:
                self.write(batch)
                self.written += len(batch)
            except Exception as e:  # the store's error, whatever its type: logged and counted, never raised
                self.lost("store_error", len(batch))
                log.warning("%d alert events not recorded: %s: %s", len(batch), type(e).__name__, e)
