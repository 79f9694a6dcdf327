"""Alerts to Alertmanager's API v2 (`POST /api/v2/alerts`), from one background thread: a fired alert is sent at
once and again every `resend_interval` while it fires (its `endsAt` a few intervals ahead, so Alertmanager resolves it
by itself if no replica sends it any more); a resolved one is sent once with `endsAt` now.

An alert's labels are what identify it: `alertname`, `policy`, `project` and the policy's own labels, never which
replica sent it, so Alertmanager merges the same crossing sent by several replicas into one alert and notifies once
(as it does for a Prometheus HA pair), then groups, silences, inhibits and routes it."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from evalsi.policies.notify import AlertEvent, post_json

if TYPE_CHECKING:
    import httpx

__all__ = ["AlertmanagerNotifier", "alert_labels"]

log = logging.getLogger("evalsi.policies")

_LABEL = re.compile(r"[^a-zA-Z0-9_]")
RESERVED = ("alertname", "policy", "project")
EXPIRY_INTERVALS = 4
"""A firing alert's `endsAt` is this many resend intervals ahead (Prometheus sends 4 evaluation intervals ahead)."""


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alert_labels(event: AlertEvent, project: str) -> dict[str, str]:
    """The labels that identify `event`'s alert: the same on every replica for the same crossing. A policy label's
    name is made a valid Alertmanager label name (other characters become `_`); it never replaces the three above."""
    labels = {("_" if k[:1].isdigit() else "") + _LABEL.sub("_", k): v for k, v in event.labels.items()}
    labels = {k: v for k, v in labels.items() if k not in RESERVED and not k.startswith("__")}
    return {**labels, "alertname": event.alert, "policy": event.policy, "project": event.project or project}


class AlertmanagerNotifier:
    """Sends alert events to one Alertmanager (`url`, its API at `<url>/api/v2/alerts`). `fire`/`resolve` never
    block: a background thread posts every `resend_interval` (at once when something new fired or resolved), retrying
    connection errors, 429 and 5xx with the shared backoff; what it could not deliver stays for the next round
    (resolutions up to `max_pending`)."""

    def __init__(
        self,
        url: str,
        *,
        project: str = "default",
        timeout: float = 5.0,
        resend_interval: float = 30.0,
        retries: int = 2,
        backoff: float = 0.5,
        max_pending: int = 1000,
        generator_url: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.endpoint = url.rstrip("/") + "/api/v2/alerts"
        self.project = project
        self.resend_interval = resend_interval
        self.retries = retries
        self.backoff = backoff
        self.max_pending = max_pending
        self.generator_url = generator_url
        self.sent = self.failed = self.dropped = 0
        self._firing: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        self._resolved: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._due = False
        self._closing = False
        import httpx  # here: only the process where alerts fire with an Alertmanager configured sends

        self._client = httpx.Client(timeout=timeout, transport=transport)
        self._thread = threading.Thread(target=self._loop, name="evalsi-alertmanager", daemon=True)
        self._thread.start()

    def _alert(self, event: AlertEvent) -> tuple[tuple[tuple[str, str], ...], dict[str, Any]]:
        labels = alert_labels(event, self.project)
        annotations = {
            "summary": f"policy {event.policy}: {event.alert}",
            "condition": event.condition,
            "values": json.dumps(event.values, sort_keys=True, default=str),
            "window_start": _iso(event.window_start),
            "window_end": _iso(event.window_end),
            "count": str(event.count),
            "example_trace_ids": ",".join(event.example_trace_ids),
        }
        alert: dict[str, Any] = {"labels": labels, "annotations": annotations}
        if self.generator_url:
            alert["generatorURL"] = self.generator_url
        return tuple(sorted(labels.items())), alert

    def fire(self, event: AlertEvent) -> None:
        key, alert = self._alert(event)
        with self._cond:
            before = self._firing.get(key)
            alert["startsAt"] = before["startsAt"] if before else _iso(event.fired_at)
            self._firing[key] = alert
            self._due = True
            self._cond.notify()

    def resolve(self, event: AlertEvent) -> None:
        key, _ = self._alert(event)
        with self._cond:
            before = self._firing.pop(key, None)
            if before is None:
                return  # not fired here (another replica's, or before a restart): whoever fired it resolves it
            if len(self._resolved) >= self.max_pending:
                self.dropped += 1
                return
            before["endsAt"] = _iso(time.time())
            self._resolved.append(before)
            self._due = True
            self._cond.notify()

    @property
    def firing(self) -> int:
        with self._cond:
            return len(self._firing)

    def close(self, timeout: float = 10.0) -> None:
        """Send the resolutions queued (up to `timeout`), then stop. Firing alerts are left to expire at their
        `endsAt` (or to be sent on by the other replicas)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        self._client.close()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._due and not self._closing:
                    self._cond.wait(self.resend_interval)
                self._due = False
                closing = self._closing
                resolved, self._resolved = self._resolved, []
                ends = _iso(time.time() + EXPIRY_INTERVALS * self.resend_interval)
                firing = [{**a, "endsAt": ends} for a in self._firing.values()] if not closing else []
            batch = firing + resolved
            if batch:
                if self._post(batch):
                    self.sent += len(batch)
                else:
                    self.failed += len(batch)
                    with self._cond:  # resolutions wait for the next round; firing ones are sent again anyway
                        room = max(0, self.max_pending - len(self._resolved))
                        self._resolved[:0] = resolved[:room]
                        self.dropped += len(resolved) - min(room, len(resolved))
            if closing:
                return

    def _post(self, alerts: list[dict[str, Any]]) -> bool:
        problem = post_json(self._client, self.endpoint, alerts, retries=self.retries, backoff=self.backoff)
        if problem is None:
            return True
        log.warning("%d alerts not delivered to Alertmanager at %s (%s)", len(alerts), self.endpoint, problem)
        return False
