"""The `prometheus` exporter records a batch of scores a label set at a time: what Prometheus scrapes (counters,
histogram buckets, sums and counts, exemplars, window gauges, the order of every series) is the same as when each
score is recorded alone, in order; and the prometheus_client internals the batched histogram update relies on are
still there."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
from typing import Any

import pytest
from prometheus_client import Histogram
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.values import MutexValue

from evalsi.component import Settings
from evalsi.exporters.prometheus import PrometheusConfig, PrometheusExporter
from evalsi.model.score import Score, ScoreBatch
from evalsi.runtime.telemetry import SelfMetrics

T0 = 1_800_000_000.0  # on a 5m boundary


def _exporter(**config: Any) -> PrometheusExporter:
    settings = Settings("prometheus", SelfMetrics(), logging.getLogger("test.prometheus"))
    return PrometheusExporter(PrometheusConfig(endpoint="127.0.0.1:0", **config), settings)


def _random_score(rng: random.Random, n: int) -> Score:
    """Scores of a few policies, evaluators and names, with every outcome, finite and odd values, verdicts or none,
    judge costs and tokens, budget skips, and trace ids an exemplar can or cannot carry."""
    name = rng.choice(["contains", "latency", "tokens", "judge", "cost"])
    outcome = rng.choices(["scored", "skipped", "error"], [8, 1, 1])[0]
    value = rng.choice([None, rng.random(), rng.uniform(0, 20_000), 0.0, 1.0, math.inf, -math.inf, math.nan, -3.0])
    s = Score(name, value=value, passed=rng.choice([None, True, False]), outcome=outcome)  # type: ignore[arg-type]
    s.policy = rng.choice(["support", "billing"])
    s.evaluator = f"builtin/{name}" if rng.random() < 0.9 else "custom/other"
    s.trace_id = rng.choice([f"{n:032x}", f"{n:032x}", "", "x" * 200])
    s.span_id = rng.choice([f"{n:016x}", ""])
    if name == "judge":
        s.source = "llm_judge"
        s.judge_cost_usd = rng.choice([None, 0.0, rng.random() / 100])
        s.metadata = {"input_tokens": rng.randint(0, 900), "output_tokens": rng.choice([5, -1, "7", None])}
        if outcome == "skipped" and rng.random() < 0.5:
            s.reason = "budget exhausted"
    elif outcome == "skipped" and rng.random() < 0.2:
        s.reason = "budget exhausted"
    return s


def _scrape(exporter: PrometheusExporter) -> str:
    return generate_latest(exporter.registry).decode()  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(8))
def test_batched_scrape_equals_one_score_at_a_time(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.time", lambda: T0)  # exemplars' and `_created` timestamps
    rng = random.Random(seed)
    batches = [[_random_score(rng, 1000 * b + i) for i in range(rng.choice([0, 2, 5, 200]))] for b in range(25)]
    clocks = [T0 + 10 + 90 * b for b in range(25)]  # the windows tumble every few batches
    max_series = rng.choice([3, 7, 10_000])
    batched, one_by_one = _exporter(max_series=max_series), _exporter(max_series=max_series)
    groups: list[int] = []
    record_group = batched._record_group
    monkeypatch.setattr(
        batched, "_record_group", lambda c, g, start: (groups.append(len(g)), record_group(c, g, start))
    )
    for clock, batch in zip(clocks, batches, strict=True):
        recorded, dropped = batched.record(list(batch), clock)
        kept = [one_by_one._record(score, clock) for score in batch]  # the exporter before batching, in order
        assert (recorded, dropped) == (kept.count(True), kept.count(False))
        assert _scrape(batched) == _scrape(one_by_one)
    assert len(groups) >= 5  # label sets recorded as groups were compared
    text = _scrape(batched)
    assert "# {span_id=" in text  # exemplars were compared
    if max_series > 10:
        assert re.search(r"evalsi_judge_cost_usd_total\{[^}]*\} 0\.0*[1-9]", text)  # judge sums too


def test_batched_observe_keeps_a_bucket_exemplar_from_its_last_observation_that_has_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("time.time", lambda: T0)
    exporter = _exporter()
    exporter.clock = lambda: T0 + 1
    scores = []
    for i, trace in enumerate([f"{1:032x}", f"{2:032x}", ""]):  # the last one has no trace: no exemplar
        s = Score("latency", value=0.2)
        s.policy, s.evaluator, s.trace_id, s.span_id = "support", "builtin/latency", trace, f"{i:016x}"
        scores.append(s)
    asyncio.run(exporter.consume_scores(ScoreBatch(scores[:1])))  # the series' children exist: the batch groups
    asyncio.run(exporter.consume_scores(ScoreBatch(scores[1:])))
    text = _scrape(exporter)
    assert f'le="0.25",name="latency",policy="support"}} 3.0 # {{span_id="{1:016x}",trace_id="{2:032x}"}} 0.2 ' in text
    assert 'evalsi_score_value_sum{evaluator="builtin/latency",name="latency",policy="support"} 0.6000000000000001' in (
        text
    )  # 0.2 + 0.2 + 0.2, added in order


def test_prometheus_client_internals_the_batched_observe_uses() -> None:
    """prometheus_client's private histogram fields: an upgrade that renames them fails here, not in production."""
    h = Histogram("x", "x", ["a"], buckets=(1.0, 2.0), registry=None).labels("v")
    assert h._upper_bounds == [1.0, 2.0, math.inf]
    assert len(h._buckets) == 3 and all(isinstance(b, MutexValue) for b in h._buckets)
    assert isinstance(h._sum, MutexValue)
    assert isinstance(h._sum._value, float) and hasattr(h._sum._lock, "__enter__")
    h.observe(1.5, exemplar={"trace_id": "t"})
    assert h._sum._value == 1.5 and h._buckets[1]._value == 1.0
    assert h._buckets[1].get_exemplar().labels == {"trace_id": "t"}
