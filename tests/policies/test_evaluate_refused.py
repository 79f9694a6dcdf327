"""A batch the next consumer refuses comes back: its traces are evaluated once, when a consumer took it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import yaml
from policy_helpers import span

from evalsi.collector.builtin import load_builtin_components
from evalsi.component import REGISTRY, Next, Refused, Settings
from evalsi.model.span import BatchKind, SpanBatch
from evalsi.runtime.telemetry import SelfMetrics


class RefusesFirst:
    """The store behind: refuses the first `refusals` batches, then takes them."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.taken: list[SpanBatch] = []

    async def consume(self, batch: SpanBatch) -> None:
        if self.refusals:
            self.refusals -= 1
            raise Refused("the store is behind; retry later", retry_after=0.01)
        self.taken.append(batch)


@pytest.mark.parametrize("overload", ["backpressure", "shed"])
def test_a_refused_batch_handed_on_again_is_evaluated_once(tmp_path: Path, overload: str) -> None:
    load_builtin_components()
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump({
        "apiVersion": "evals.si/v1alpha1", "kind": "OnlineEvalPolicy", "metadata": {"name": "p"},
        "spec": {"selector": "true", "sampling": {"rate": 1.0}, "cascade": [{"ref": "builtin/latency"}]},
    }))  # fmt: skip
    factory = REGISTRY[("processor", "evaluate")]
    config = factory.config(policies=[str(policy)], datasets_dir=str(tmp_path / "datasets"), overload=overload)
    nxt, store = Next(), RefusesFirst(2)
    nxt.traces = store  # type: ignore[assignment]
    settings = Settings(id="evaluate", metrics=SelfMetrics(), logger=logging.getLogger("t"))
    processor = factory.cls(config, settings, nxt)
    batch = SpanBatch([span(f"{n + 1:032x}", "a" * 16, duration_ms=10) for n in range(3)], kind=BatchKind.TRACE)

    async def hand_on_until_taken() -> None:  # as tail sampling does with a refused batch
        while True:
            try:
                await processor.consume(batch)
                return
            except Refused:
                await asyncio.sleep(0)

    asyncio.run(hand_on_until_taken())
    assert store.taken == [batch]
    assert processor.queue.waiting == 3  # each trace once, not once a hand-off
