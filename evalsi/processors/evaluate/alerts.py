"""Alerts sending: the alert events the policies' windows raise go to the log, the metrics, the notifier (the
policies' webhooks, or Alertmanager) and the store; closed windows' figures go to the log. With pipeline workers only
the collector process's instance sends (a worker's windows only record). Its metrics: `evalsi_alerts_fired`,
`evalsi_alert_firing`, `evalsi_alerts_unrecorded`, `evalsi_promoted_unrecorded`, and for `regressed(...)` conditions
`evalsi_policy_difference` (with `_low`, `_high`), `evalsi_policy_regressed`, `evalsi_baseline_reads`."""

from __future__ import annotations

import asyncio
from typing import Any

from evalsi.component import Settings
from evalsi.policies import AlertEvent, AlertRecorder, Notifier, PolicySet, WindowStats
from evalsi.policies.alertmanager import AlertmanagerNotifier
from evalsi.policies.window import PolicyWindow
from evalsi.processors.evaluate.config import AlertmanagerConfig
from evalsi.store import DatasetStore


class Alerts:
    """Sends the fired and resolved alerts of a policy set, on the engine thread; the store writes go through a
    background recorder, so evaluation never waits for the store."""

    def __init__(
        self, settings: Settings, project: str, alertmanager: AlertmanagerConfig | None = None, store: bool = False
    ) -> None:
        self.settings = settings
        self.store_windows = store
        """Windows are read from the store (`windows.scope: store`): this process's own windows, over its share of
        the traffic, are not logged as closed windows."""
        self.project = project
        """The project the alerts of a process's windows are recorded under (a store window's carry their own)."""
        self.alertmanager_config = alertmanager
        self._notifier: Notifier | None = None
        self.alertmanager: AlertmanagerNotifier | None = None
        self._recorder: AlertRecorder | None = None
        self._promotions: AlertRecorder | None = None
        self._no_store_said = False
        m = settings.metrics
        self._fired = m.counter(
            "evalsi_alerts_fired",
            "Policy alerts fired (once per window that breaks the alert's condition, whatever the worker count).",
            ["processor", "policy", "alert"],
        )
        self._firing = m.gauge(
            "evalsi_alert_firing",
            "1 while a policy alert fires (from its firing until a window closes without its condition holding), "
            "then 0.",
            ["processor", "policy", "alert"],
        )
        self._unrecorded = m.counter(
            "evalsi_alerts_unrecorded",
            "Alert events (fired or resolved) not written to the store: `store_error`, `no_store` (no store exporter "
            "in the scores pipeline), `queue_full`.",
            ["processor", "reason"],
        )

        comparison = ["processor", "policy", "score", "baseline"]
        self._difference = m.gauge(
            "evalsi_policy_difference",
            "regressed(...) alerts: the score's mean (or pass rate) in the current window minus its baseline's, as "
            "last compared.",
            comparison,
        )
        self._difference_low = m.gauge(
            "evalsi_policy_difference_low", "regressed(...) alerts: the low end of the difference's interval.",
            comparison,
        )  # fmt: skip
        self._difference_high = m.gauge(
            "evalsi_policy_difference_high", "regressed(...) alerts: the high end of the difference's interval.",
            comparison,
        )  # fmt: skip
        self._regressed = m.gauge(
            "evalsi_policy_regressed",
            "regressed(...) alerts: 1 when the difference's interval lies wholly beyond the margin on the worse side.",
            [*comparison, "test"],
        )
        self.baseline_reads = m.counter(
            "evalsi_baseline_reads",
            "Baseline reads of regressed(...) alerts from the store, by result: ok, empty (no scored score there), "
            "store_error.",
            ["processor", "result"],
        )
        self._promoted = m.counter(
            "evalsi_promoted_rows",
            "Promoted dataset rows written to the store (`promote_to: store`); a trace promoted again (another "
            "replica, a restart) is written again and kept once.",
            ["processor"],
        )
        self._unpromoted = m.counter(
            "evalsi_promoted_unrecorded",
            "Promoted dataset rows (`promote_to: store`) not written to the store: `store_error`, `no_store`, "
            "`queue_full`.",
            ["processor", "reason"],
        )

    def start(self, record: bool) -> None:
        """Open the notifier, and the store recorder when `record` (in the process where alerts fire)."""
        am = self.alertmanager_config
        if am is not None and record:
            self.alertmanager = AlertmanagerNotifier(
                am.url, project=self.project, timeout=am.timeout, resend_interval=am.resend_interval,
                generator_url=am.generator_url,
            )  # fmt: skip
        elif am is None:
            self._notifier = Notifier()
        if record:
            self._recorder = AlertRecorder(self._record, lost=self._lost)
            self._promotions = AlertRecorder(self._write_promoted, lost=self._lost_promoted)

    def send(self, policies: PolicySet) -> None:
        """The alerts `policies` fired or resolved since the last call, in time order: an alert that resolved as its
        window closed may fire again in the next one."""
        events = sorted(policies.drain_alerts() + policies.drain_resolved(), key=lambda e: e.fired_at)
        self.send_events(events)
        closed = policies.drain_windows()
        if not self.store_windows:
            self.log_closed(closed)
        self._show_comparisons(policies)

    def send_events(self, events: list[AlertEvent]) -> None:
        """Alert events (a process's windows' or the store windows'), in time order."""
        sid = self.settings.id
        for event in events:
            project = event.project or self.project
            if event.state == "resolved":
                self.settings.logger.info(
                    "alert resolved", extra={"policy": event.policy, "alert": event.alert, "project": project}
                )
                self._firing.labels(sid, event.policy, event.alert).set(0)
                if self.alertmanager is not None:
                    self.alertmanager.resolve(event)
                continue
            self.settings.logger.warning(
                "alert fired",
                extra={"policy": event.policy, "alert": event.alert, "project": project,
                       "notify": bool(event.notify) or self.alertmanager is not None},
            )  # fmt: skip
            self._fired.labels(sid, event.policy, event.alert).inc()
            self._firing.labels(sid, event.policy, event.alert).set(1)
            if self.alertmanager is not None:
                self.alertmanager.fire(event)
            elif self._notifier is not None:
                self._notifier.send(event)
        if events and self._recorder is not None:
            self._recorder.record(events)

    def _show_comparisons(self, policies: PolicySet) -> None:
        """Each `regressed(...)` term's latest comparison in the metrics."""
        sid = self.settings.id
        for p in policies.policies:
            if not isinstance(p.window, PolicyWindow):
                continue  # a worker's window only records
            for regression, found in p.window.comparisons.values():
                labels = (sid, p.name, regression.name, regression.baseline)
                self._difference.labels(*labels).set(found.difference)
                self._difference_low.labels(*labels).set(found.low)
                self._difference_high.labels(*labels).set(found.high)
                self._regressed.labels(*labels, found.method).set(1 if found.regressed else 0)

    def store(self) -> Any:
        return self._store()

    def log_closed(self, windows: list[WindowStats]) -> None:
        """A closed window's final figures, one log line per policy, evaluator and score name."""
        for w in windows:
            figures = w.as_dict()
            figures["project"] = w.project or self.project
            figures["scope"] = "store" if self.store_windows else "process"
            self.settings.logger.info("policy window closed", extra={"window": figures})

    def _store(self) -> Any:
        """Where alerts are recorded: the store of the service this instance runs in (the collector process, where
        alerts fire with pipeline workers too); None when the config has no store."""
        host = self.settings.host
        return host.store if host is not None else None

    def _record(self, events: list[AlertEvent]) -> None:
        """On the recorder's thread: the events into the store (raises the store's error)."""
        store = self._store()
        if store is None:
            self._lost("no_store", len(events))
            if not self._no_store_said:
                self._no_store_said = True
                self.settings.logger.warning(
                    "evaluate: alerts are not recorded: no store exporter (clickhouse) in the scores pipeline "
                    "(add `scores: {exporters: [clickhouse]}`); they are still logged and counted"
                )
            return
        by_project: dict[str, list[AlertEvent]] = {}
        for event in events:
            by_project.setdefault(event.project or self.project, []).append(event)
        for project, some in by_project.items():
            store.write_alerts(some, project=project)

    def record_promoted(self, rows: list[dict[str, Any]]) -> None:
        """Promoted rows (`promote_to: store`) to the store, from the same kind of background writer as alerts."""
        if self._promotions is not None:
            self._promotions.record(rows)

    def _write_promoted(self, rows: list[dict[str, Any]]) -> None:
        store = self._store()
        if not isinstance(store, DatasetStore):
            self._lost_promoted("no_store", len(rows))
            return
        store.write_promoted(rows)
        self._promoted.labels(self.settings.id).inc(len(rows))

    def _lost_promoted(self, reason: str, n: int) -> None:
        self._unpromoted.labels(self.settings.id, reason).inc(n)
        self.settings.logger.warning("%d promoted rows not written to the store (%s)", n, reason)

    def _lost(self, reason: str, n: int) -> None:
        self._unrecorded.labels(self.settings.id, reason).inc(n)

    async def close(self) -> None:
        """Close the notifier and the recorder (what is queued still goes out)."""
        if self._notifier is not None:
            await asyncio.to_thread(self._notifier.close)
        if self.alertmanager is not None:
            await asyncio.to_thread(self.alertmanager.close)
        if self._recorder is not None:
            await asyncio.to_thread(self._recorder.close)
        if self._promotions is not None:
            await asyncio.to_thread(self._promotions.close)
