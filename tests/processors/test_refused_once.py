"""A batch refused after normalize and redact took it is not done twice: a sender's retry (a pipeline worker's, or an
OTLP client's after a 429) finds them refusing until what they owe is taken, so every span is stored once and every
counter raised once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from evalsi.collector.workers.worker import _hand_on
from evalsi.component import Next, Refused, Settings
from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.span import Span, SpanBatch
from evalsi.processors.normalize import Normalize, NormalizeConfig
from evalsi.processors.redact import Redact, RedactConfig
from evalsi.runtime.telemetry import SelfMetrics

TRACE = "ab" * 16


class Store:
    """The store behind: refuses the first `refusals` batches of each signal, then keeps what it takes."""

    def __init__(self, refusals: int) -> None:
        self.refusals = {"traces": refusals, "logs": refusals}
        self.spans: list[Span] = []
        self.revisions: list[Span] = []
        self.records: list[LogRecord] = []

    def _check(self, signal: str) -> None:
        if self.refusals[signal]:
            self.refusals[signal] -= 1
            raise Refused("the store is behind; retry later", retry_after=0.02)

    async def consume(self, batch: SpanBatch) -> None:
        self._check("traces")
        (self.revisions if batch.revision else self.spans).extend(batch.spans)

    async def consume_logs(self, batch: LogBatch) -> None:
        self._check("logs")
        self.records.extend(batch.records)


def chain(store: Store, **normalize: Any) -> tuple[Normalize, Redact, SelfMetrics]:
    metrics = SelfMetrics()
    after_redact = Next()
    after_redact.traces = store  # type: ignore[assignment]
    after_redact.logs = store  # type: ignore[assignment]
    redact = Redact(RedactConfig(), Settings("redact", metrics, logging.getLogger("t.redact")), after_redact)
    after_normalize = Next()
    after_normalize.traces = redact  # type: ignore[assignment]
    after_normalize.logs = redact  # type: ignore[assignment]
    settings = Settings("normalize", metrics, logging.getLogger("t.normalize"))
    return Normalize(NormalizeConfig(**normalize), settings, after_normalize), redact, metrics


def chat(span_id: int, service: str = "app", **attributes: Any) -> Span:
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.system": "openai", **attributes}
    return Span(TRACE, f"{span_id:016x}", "", "chat", "CLIENT", 1, 2, service_name=service, attributes=attrs)


def content_event(span_id: int, name: str = "gen_ai.choice") -> LogRecord:
    text = "Write to me at jane.doe@example.com"
    body = {"message": {"role": "assistant", "content": text}} if name == "gen_ai.choice" else {"content": text}
    return LogRecord(5, 5, TRACE, f"{span_id:016x}", body=body, event_name=name, service_name="app")


async def until(check: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def run_twice_refused(refusals: int) -> tuple[Store, Normalize, Redact, SelfMetrics]:
    store = Store(refusals)
    normalize, redact, metrics = chain(store)
    unpriced = {"gen_ai.request.model": "gpt-nonexistent-9", "gen_ai.usage.input_tokens": 10}
    unparsed = chat(1, **unpriced, **{"gen_ai.input.messages": "{not json"})
    mailed = chat(2, **{"gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", '
                        '"content": "mail jane.doe@example.com"}]}]'})  # fmt: skip

    async def scenario() -> None:
        await _hand_on(normalize.consume, SpanBatch([unparsed, mailed]))  # as a pipeline worker hands a request on
        await until(lambda: store.spans)
        await _hand_on(normalize.consume, SpanBatch([chat(3)]))  # the next request finds the chain free again

    asyncio.run(scenario())
    return store, normalize, redact, metrics


COUNTED = [
    ("evalsi_normalize_unparsed_total", {"convention": "otel_genai", "field": "input"}),
    ("evalsi_normalize_cost_unknown_models_total", {"provider": "openai", "model": "gpt-nonexistent-9"}),
    ("evalsi_redaction_masked_total", {"processor": "redact", "rule": "email"}),
]


def test_a_batch_refused_downstream_is_normalized_redacted_and_counted_once() -> None:
    _, _, _, taken_at_once = run_twice_refused(0)
    store, normalize, redact, metrics = run_twice_refused(3)
    assert [s.span_id for s in store.spans] == [f"{i:016x}" for i in (1, 2, 3)]
    for name, labels in COUNTED:
        once = taken_at_once.registry.get_sample_value(name, labels)
        assert once and metrics.registry.get_sample_value(name, labels) == once, name
    assert "jane.doe@example.com" not in str(store.spans[1].input)
    assert normalize.held_since() is None and redact.held_since() is None


def test_while_redact_owes_a_batch_normalize_keeps_its_own_and_refuses_new_ones() -> None:
    store = Store(refusals=2)
    normalize, redact, _ = chain(store)

    async def scenario() -> None:
        await normalize.consume(SpanBatch([chat(1)]))  # taken by normalize and redact; redact owes it to the store
        assert store.spans == [] and redact._owed.pending == 1
        await normalize.consume(SpanBatch([chat(2)]))  # redact refuses it: normalize takes it and owes it
        assert normalize._owed.pending == 1
        try:
            await normalize.consume(SpanBatch([chat(3)]))
            raise AssertionError("a third batch was taken while two were owed")
        except Refused as r:
            assert "has not taken an earlier batch yet" in str(r) and r.retry_after == 0.02
        await until(lambda: len(store.spans) == 2)

    asyncio.run(scenario())
    assert [s.span_id for s in store.spans] == [f"{i:016x}" for i in (1, 2)]


def test_a_span_the_event_join_releases_while_its_batch_is_refused_is_stored_once() -> None:
    # the service logs content events, so its chat spans without content wait for them (event_wait)
    store = Store(refusals=4)
    store.refusals["logs"] = 0
    normalize, _, _ = chain(store, event_wait="10ms")

    async def scenario() -> None:
        await normalize.start()
        await normalize.consume_logs(LogBatch([content_event(99)]))
        held = chat(1)  # waits for its events, then goes on alone
        said = '[{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]'
        batch = SpanBatch([held, chat(2, **{"gen_ai.input.messages": said})])  # has its content: goes on at once
        await _hand_on(normalize.consume, batch)
        await until(lambda: len(store.spans) >= 2)
        await asyncio.sleep(0.2)  # past the wait: anything held twice would be released again
        await normalize.shutdown()

    asyncio.run(scenario())
    assert sorted(s.span_id for s in store.spans) == [f"{i:016x}" for i in (1, 2)]


def test_content_events_refused_by_the_logs_consumer_revise_their_span_once() -> None:
    store = Store(refusals=0)
    normalize, _, metrics = chain(store)

    async def scenario() -> None:
        await normalize.consume(SpanBatch([chat(7)]))  # handed on without content: events may revise it
        store.refusals["logs"] = 3
        # a user message is not the call's last event: the span stays open to more revisions
        await _hand_on(normalize.consume_logs, LogBatch([content_event(7, "gen_ai.user.message")]))
        await until(lambda: store.records)

    asyncio.run(scenario())
    assert [s.span_id for s in store.revisions] == [f"{7:016x}"]
    assert metrics.registry.get_sample_value("evalsi_normalize_spans_revised_total", {"processor": "normalize"}) == 1
    assert len(store.records) == 1
    assert "jane.doe@example.com" not in str(store.revisions[0].input) + str(store.records[0].body)


def test_what_is_still_owed_at_shutdown_is_counted_as_not_stored(monkeypatch: Any) -> None:
    import evalsi.processors.normalize as normalize_module
    import evalsi.processors.redact as redact_module

    for module in (normalize_module, redact_module):
        monkeypatch.setattr(module, "SHUTDOWN_WAIT_S", 0.1)
    store = Store(refusals=1_000_000)  # the store never comes back
    normalize, redact, _ = chain(store)

    async def scenario() -> None:
        await normalize.consume(SpanBatch([chat(1), chat(2)]))  # redact owes it
        await normalize.consume(SpanBatch([chat(3)]))  # redact refuses it: normalize owes it
        await normalize.consume_logs(LogBatch([content_event(9)]))  # the store refuses it: redact owes it
        await normalize.shutdown()
        await redact.shutdown()

    asyncio.run(scenario())
    assert store.spans == []
    assert normalize.unstored == {"spans": 1} and redact.unstored == {"spans": 2, "logs": 1}
