"""Nothing the traces pipeline does with a span leaves a reference cycle: once a span is stored and its trace
evaluated, it and everything built for it are freed by reference counting, not left for the garbage collector.

Pipeline workers count on it (`collector/heap.py` runs young collections rarely there): a cycle a trace, or a
refusal kept with its traceback, held every span it reached until a collection, whose walk over the tens of
thousands of spans a worker holds cost 6-10% of its CPU."""

from __future__ import annotations

import asyncio
import gc
import logging
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from evalsi.collector.builtin import load_builtin_components
from evalsi.component import REGISTRY, Next, Refused, Settings
from evalsi.evaluators import Target
from evalsi.exporters.clickhouse.rows import ArrowRows
from evalsi.model.log_record import LogBatch
from evalsi.model.score import ScoreBatch
from evalsi.model.span import Span, SpanBatch
from evalsi.policies.trace_view import TraceView
from evalsi.receivers.otlp.decode_protobuf import decode_logs_protobuf, decode_traces_protobuf
from evalsi.runtime.telemetry import SelfMetrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
POLICY = {
    "apiVersion": "evals.si/v1alpha1", "kind": "OnlineEvalPolicy", "metadata": {"name": "p"},
    "spec": {"selector": "trace.llm_calls >= 0", "sampling": {"rate": 1.0},
             "cascade": [{"ref": "builtin/latency", "params": {"max_ms": 60000}}, {"ref": "builtin/tokens"},
                         {"ref": "builtin/cost"}]},
}  # fmt: skip
HELD = (Span, SpanBatch, TraceView, Target, types.FrameType, types.TracebackType)


def _ours(o: Any) -> bool:
    """A frame or traceback of evalsi's code (a thread another test left running may leave its own); any other
    held type is evalsi's."""
    frame = o.tb_frame if isinstance(o, types.TracebackType) else o if isinstance(o, types.FrameType) else None
    return frame is None or "/evalsi/" in frame.f_code.co_filename


class Store:
    """What a worker's store link does with a batch (its Arrow rows), refusing the calls numbered in `refusing`
    (the store behind, twice: refusals go up the pipeline and are kept, then replaced)."""

    def __init__(self, refusing: set[int]) -> None:
        self.refusing = refusing
        self.calls = 0
        self.rows = ArrowRows()
        self.spans = 0
        self.scores = 0
        self.records = 0

    async def consume(self, batch: SpanBatch) -> None:
        self.calls += 1
        if self.calls in self.refusing:
            await asyncio.sleep(0.02)  # requests meanwhile find tail_sampling blocked, and normalize and redact
            raise Refused("the store is behind; retry later", retry_after=0.01)
        body, bad = self.rows.encode("spans", batch.spans)
        assert body is not None and not bad
        self.spans += len(batch.spans)

    async def consume_scores(self, batch: ScoreBatch) -> None:
        self.scores += len(batch.scores)

    async def consume_logs(self, batch: LogBatch) -> None:
        self.records += len(batch.records)


def chain(tmp_path: Path, store: Store) -> list[Any]:
    """normalize, redact, probabilistic_sampler, tail_sampling, evaluate: the README's traces pipeline."""
    load_builtin_components()
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(POLICY))
    configs: list[tuple[str, dict[str, Any]]] = [
        ("normalize", {}),
        ("redact", {}),
        ("probabilistic_sampler", {"sampling_percentage": 100}),
        ("tail_sampling", {"decision_wait": "50ms"}),
        ("evaluate", {"policies": [str(tmp_path / "p.yaml")], "datasets_dir": str(tmp_path / "datasets")}),
    ]
    metrics = SelfMetrics()
    after = Next()
    after.traces = store  # type: ignore[assignment]
    after.scores = store  # type: ignore[assignment]
    processors: list[Any] = []
    for name, config in reversed(configs):
        factory = REGISTRY[("processor", name)]
        settings = Settings(id=name, metrics=metrics, logger=logging.getLogger(f"t.{name}"))
        if name == "redact":
            after.logs = store  # type: ignore[assignment]
        processor = factory.cls(factory.config(**config), settings, after)
        processors.insert(0, processor)
        after = Next()
        after.traces = processor
        if name == "redact":
            after.logs = processor  # the logs pipeline: normalize, redact
    return processors


def requests() -> list[tuple[bytes, bytes | None]]:
    """Each capture's spans, and its GenAI content events where it has them."""
    found = sorted(p for p in FIXTURES.glob("*/*.pb") if not p.name.endswith(".logs.pb"))
    assert len(found) >= 20
    return [(p.read_bytes(), p.with_suffix(".logs.pb").read_bytes() if p.with_suffix(".logs.pb").exists() else None)
            for p in found]  # fmt: skip


async def hand_on(processor: Any, batch: SpanBatch) -> None:
    while True:  # as a pipeline worker does with a refused batch
        try:
            await processor.consume(batch)
            return
        except Refused:
            await asyncio.sleep(0.01)


def test_spans_through_the_traces_pipeline_leave_no_cycle_behind(tmp_path: Path) -> None:
    store = Store(refusing={1, 2, 3, 4, 5, 6, 9, 10, 11, 12})
    processors = chain(tmp_path, store)

    tail = processors[3]
    take, tail_refused = tail.consume, []

    async def counted(batch: SpanBatch) -> None:
        try:
            await take(batch)
        except Refused:
            tail_refused.append(1)
            raise

    tail.consume = counted

    async def scenario() -> None:
        for p in processors:
            await p.start()
        sent = events = 0
        for n, (body, logs) in enumerate(requests()):
            spans = decode_traces_protobuf(body).batch.spans
            records = decode_logs_protobuf(logs).batch.records if logs else []
            sent += len(spans)
            events += len(records)
            if records and n % 2:  # content events before their spans: the join holds them
                await processors[0].consume_logs(LogBatch(records))
            await hand_on(processors[0], SpanBatch(spans))
            if records and not n % 2:  # after: the spans are revised
                await processors[0].consume_logs(LogBatch(records))
            await asyncio.sleep(0.005)
        assert events
        deadline = asyncio.get_running_loop().time() + 20
        while store.spans < sent:
            assert asyncio.get_running_loop().time() < deadline, f"{store.spans} of {sent} spans stored"
            await asyncio.sleep(0.05)
        for p in processors:
            await p.shutdown()
        assert store.scores > 0 and store.records == events
        revised = processors[0].settings.metrics.registry.get_sample_value(
            "evalsi_normalize_spans_revised_total", {"processor": "normalize"}
        )
        assert revised, "no span was revised by its content events: the join's paths were not taken"
        assert tail_refused, "tail_sampling never refused: the refusal paths were not taken"

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        asyncio.run(scenario())
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, HELD) and _ours(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert cyclic == [], sorted({type(o).__qualname__ for o in cyclic})


@pytest.fixture(autouse=True)
def _no_garbage_left() -> Any:
    yield
    gc.set_debug(0)
    gc.garbage.clear()
