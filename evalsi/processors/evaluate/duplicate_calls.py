"""Duplicate-call joining: a model call that a vendor SDK and an instrumentation both record, in two traces (no span
of the app around the call: docs/conventions.md, "Duplicate model calls"), is evaluated once, as one trace. Such
traces wait up to `duplicate_calls.wait` for each other (`policies.twins.TwinBuffer` pairs them); with pipeline
workers they meet in the collector process. Its metrics: `evalsi_evaluate_duplicate_call_traces`, `_waiting`,
`_services`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from evalsi.component import Settings
from evalsi.model.span import VENDOR_SDK_SCOPES, Span
from evalsi.model.trajectory import lone_sdk_call
from evalsi.policies.twins import TwinBuffer
from evalsi.processors.evaluate.config import DuplicateCallsConfig

TICK_S = 0.1
"""How often traces whose twin did not come in `duplicate_calls.wait` go to evaluation alone."""


class DuplicateCalls:
    """Holds the traces that may record a call another trace records too, and hands each on to `evaluate(spans,
    completed)`: joined with its twin as soon as both are here, or alone once the wait is over. Off (`enabled`
    false) with `duplicate_calls.wait: 0`."""

    def __init__(
        self,
        config: DuplicateCallsConfig,
        settings: Settings,
        evaluate: Callable[[list[Span], float], None],
    ) -> None:
        self.settings = settings
        self.evaluate = evaluate
        self.buffer = (
            TwinBuffer(config.wait, frozenset(VENDOR_SDK_SCOPES.values()), config.max_traces)
            if config.wait > 0
            else None
        )
        """Lone vendor SDK calls and root-level instrumentation calls waiting for their twin."""
        m, sid = settings.metrics, settings.id
        self._joined = m.counter(
            "evalsi_evaluate_duplicate_call_traces",
            "Traces that recorded a call another trace recorded too (a vendor SDK's lone span and an instrumentation's "
            "root span), evaluated with it as one trace.",
            ["processor"],
        ).labels(sid)
        self._waiting = m.gauge(
            "evalsi_evaluate_duplicate_call_waiting",
            "Traces waiting for a twin in another trace that records the same call (`duplicate_calls.wait`).",
            ["processor"],
        ).labels(sid)
        self._armed = m.gauge(
            "evalsi_evaluate_duplicate_call_services",
            "Services that sent a vendor SDK's lone call in the last hour, whose root-level instrumentation calls "
            "therefore wait for a twin (summed over the collector process and its workers).",
            ["processor"],
        ).labels(sid)

    @property
    def enabled(self) -> bool:
        return self.buffer is not None

    def wanted(self, spans: list[Span]) -> bool:
        """Whether the trace waits for a twin (a lone SDK call arms its service)."""
        assert self.buffer is not None
        now = time.monotonic()
        wanted = self.buffer.wants(spans, now)
        if wanted and lone_sdk_call(spans) is not None:
            self._armed.set(self.buffer.armed_services(now))
        return wanted

    def take(self, spans: list[Span], completed: float) -> None:
        """Hold the trace for its twin; whatever is ready (a joined pair, or traces evicted by `max_traces`) goes to
        evaluation."""
        assert self.buffer is not None
        joined_before = self.buffer.joined
        for ready, at in self.buffer.add(spans, completed or time.monotonic(), time.monotonic()):
            self.evaluate(ready, at)
        self._joined.inc(2 * (self.buffer.joined - joined_before))
        self._waiting.set(len(self.buffer))

    def take_from_worker(self, spans: list[Span]) -> None:
        """In the collector process: a worker's trace that may record a call another worker's trace records too. A
        lone SDK call arms its service in every worker (so their root-level instrumentation calls come here too)."""
        if self.buffer is None:
            self.evaluate(spans, time.monotonic())
            return
        service, now = spans[0].service_name, time.monotonic()
        if lone_sdk_call(spans) is not None:
            collector = self.settings.collector
            if self.buffer.arm(service, now) and collector is not None:  # every worker is told
                collector.arm_twins(self.settings.id, service)
            self._armed.set(self.buffer.armed_services(now))
        self.take(spans, 0.0)

    def arm(self, service: str) -> None:
        """In a worker: `service` sent a lone SDK call (seen in some worker): its root-level instrumentation calls
        wait for a twin from now on."""
        if self.buffer is not None:
            now = time.monotonic()
            self.buffer.arm(service, now)
            self._armed.set(self.buffer.armed_services(now))

    async def run(self) -> None:
        """Traces whose wait is over to evaluation alone, until cancelled."""
        assert self.buffer is not None
        while True:
            await asyncio.sleep(TICK_S)
            for ready, at in self.buffer.due(time.monotonic()):
                self.evaluate(ready, at)
            self._waiting.set(len(self.buffer))

    def drain(self) -> None:
        """At shutdown: traces still waiting for a twin are evaluated alone."""
        if self.buffer is not None:
            for ready, at in self.buffer.drain():
                self.evaluate(ready, at)
