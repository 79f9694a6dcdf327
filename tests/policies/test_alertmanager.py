"""The Alertmanager notifier against a real Alertmanager (`apt-get install prometheus-alertmanager`; skipped without
it): an alert fired from several senders is one active alert there, a resolution ends it, and one that no sender keeps
sending expires at its `endsAt`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from running_collector import wait_until
from test_replicas_e2e import ALERTMANAGER, Recorder, _start_alertmanager

from evalsi.policies.alertmanager import AlertmanagerNotifier
from evalsi.policies.notify import AlertEvent

pytestmark = pytest.mark.skipif(ALERTMANAGER is None, reason="no Alertmanager: apt-get install prometheus-alertmanager")


def _event(state: str = "firing", fired_at: float | None = None) -> AlertEvent:
    now = time.time() if fired_at is None else fired_at
    return AlertEvent(
        policy="chat-quality", alert="pii leaking", condition="rate('pii-leak') < 0.99", notify=None,
        window_start=now - 10, window_end=now + 290, count=412, aggregates={}, example_trace_ids=["ab" * 16],
        labels={"team": "assistants", "app.kubernetes.io/part-of": "chat"}, fired_at=now,
        values={"count": 412, "rate('pii-leak')": 0.982}, state=state, project="team-a",
    )  # fmt: skip


def _alerts(url: str) -> list[dict[str, Any]]:
    return httpx.get(url + "/api/v2/alerts", params={"active": "true", "silenced": "true"}, timeout=10).json()


def test_three_senders_make_one_alert_and_a_resolution_ends_it(tmp_path: Path) -> None:
    hook = Recorder()
    am, url = _start_alertmanager(tmp_path, hook.url)
    senders = [AlertmanagerNotifier(url, resend_interval=1.0) for _ in range(3)]
    try:
        for i, sender in enumerate(senders):
            sender.fire(_event(fired_at=time.time() - i))  # each replica saw it at its own moment
        assert wait_until(lambda: len(_alerts(url)) == 1, timeout=20)
        (alert,) = _alerts(url)
        assert alert["labels"] == {
            "alertname": "pii leaking", "policy": "chat-quality", "project": "team-a", "team": "assistants",
            "app_kubernetes_io_part_of": "chat",
        }  # fmt: skip
        assert alert["annotations"]["condition"] == "rate('pii-leak') < 0.99"
        assert alert["status"]["state"] == "active"
        assert wait_until(lambda: len(hook.bodies) >= 1, timeout=20)
        time.sleep(2.5)  # the senders resent it twice since
        assert len(hook.bodies) == 1, "one notification for three senders"
        for sender in senders:
            sender.resolve(_event("resolved"))
        assert wait_until(lambda: _alerts(url) == [], timeout=20), "resolved: no longer active"
        assert all(s.sent >= 2 and s.failed == 0 and s.firing == 0 for s in senders)
    finally:
        for sender in senders:
            sender.close()
        am.terminate()
        am.wait(10)
        hook.stop()


def test_an_alert_no_sender_keeps_sending_expires(tmp_path: Path) -> None:
    hook = Recorder()
    am, url = _start_alertmanager(tmp_path, hook.url)
    sender = AlertmanagerNotifier(url, resend_interval=0.5)  # endsAt 2 s ahead
    try:
        sender.fire(_event())
        assert wait_until(lambda: len(_alerts(url)) == 1, timeout=20)
        sender.close()  # a replica gone: nobody sends it again, nor resolves it
        assert wait_until(lambda: _alerts(url) == [], timeout=20), "Alertmanager resolves it at its endsAt"
    finally:
        am.terminate()
        am.wait(10)
        hook.stop()
