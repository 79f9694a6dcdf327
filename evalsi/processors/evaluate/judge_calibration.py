"""Judge calibration in the metrics: how far each judge agrees with people (Cohen's kappa, sensitivity,
specificity) and the prediction-powered pass rate, read from the store (the processor's project) on a thread of its
own every `calibration.every`. Its metrics: `evalsi_judge_kappa` (`_low`, `_high`), `evalsi_judge_sensitivity`,
`evalsi_judge_specificity`, `evalsi_judge_rate_ppi` (`_low`, `_high`), `evalsi_judge_labeled`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from evalsi.component import Settings
from evalsi.policies.calibration import judge_calibrations

log = logging.getLogger("evalsi.policies")

_LABELS = ["processor", "policy", "evaluator", "score", "feedback"]


class JudgeCalibration:
    def __init__(
        self, settings: Settings, store: Callable[[], Any], project: str, *, every: float, over: float,
        negative_below: float,
    ) -> None:  # fmt: skip
        self.settings = settings
        self._store = store
        self.project = project
        self.every = every
        self.over = over
        self.negative_below = negative_below
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        m = settings.metrics
        about = "(judge verdicts of the last calibration.over beside people's feedback on the same traces)"
        self._gauges = {
            "kappa": m.gauge("evalsi_judge_kappa", f"Cohen's kappa of a judge against people {about}.", _LABELS),
            "kappa_low": m.gauge("evalsi_judge_kappa_low", "The low end of kappa's 95% interval.", _LABELS),
            "kappa_high": m.gauge("evalsi_judge_kappa_high", "The high end of kappa's 95% interval.", _LABELS),
            "sensitivity": m.gauge(
                "evalsi_judge_sensitivity", "Of the traces people failed, the share the judge failed.", _LABELS
            ),
            "specificity": m.gauge(
                "evalsi_judge_specificity", "Of the traces people passed, the share the judge passed.", _LABELS
            ),
            "rate": m.gauge(
                "evalsi_judge_rate_ppi",
                "The pass rate by prediction-powered inference: the judge's rate corrected by people's labels.",
                _LABELS,
            ),
            "rate_low": m.gauge("evalsi_judge_rate_ppi_low", "The low end of its 95% interval.", _LABELS),
            "rate_high": m.gauge("evalsi_judge_rate_ppi_high", "The high end of its 95% interval.", _LABELS),
            "labeled": m.gauge("evalsi_judge_labeled", "Traces both the judge and people gave a verdict.", _LABELS),
        }

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="evalsi-judge-calibration", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def refresh(self, now: float | None = None) -> list[dict[str, Any]]:
        """Read the store and set the gauges; returns the calibrations (empty without a store)."""
        store = self._store()
        if store is None:
            return []
        now = time.time() if now is None else now
        since = max(0, int((now - self.over) * 1e9))
        found = judge_calibrations(store.judge_agreement(since_ns=since, project=self.project), self.negative_below)
        sid = self.settings.id
        for c in found:
            labels = (sid, c["policy"], c["evaluator"], c["name"], c["feedback"])
            values: dict[str, float | None] = {"labeled": c["n"]}
            if c["kappa"]:
                values |= {"kappa": c["kappa"]["kappa"], "kappa_low": c["kappa"]["low"],
                           "kappa_high": c["kappa"]["high"]}  # fmt: skip
            if c["sensitivity"]:
                values["sensitivity"] = c["sensitivity"][0]
            if c["specificity"]:
                values["specificity"] = c["specificity"][0]
            if c["ppi"]:
                values |= {"rate": c["ppi"]["estimate"], "rate_low": c["ppi"]["low"], "rate_high": c["ppi"]["high"]}
            for key, value in values.items():
                if value is not None:
                    self._gauges[key].labels(*labels).set(value)
        return found

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.refresh()
            except Exception as e:  # the store's error, whatever its type: logged, tried again next time
                log.warning("judge calibration not read: %s: %s", type(e).__name__, e)
