"""Intervals within their bounds: Wilson for proportions, log-scale t for durations and counts, t clamped to [0, 1]
for unit-scale scores; the method is named beside each figure (window stats, the API, the CLI)."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from policy_helpers import policy_doc, span, write

from evalsi.collector.score_api import aggregate, window_stats
from evalsi.model.score import Score
from evalsi.policies import load_policies
from evalsi.policies.intervals import log_interval, mean_interval, t_interval, wilson_interval

# latencies (ms) of a quiet window: one slow trace among fast ones. Their t interval reaches below zero.
LATENCIES = [5.0, 8.0, 12.0, 250.0]


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values)


def test_a_duration_interval_stays_non_negative_and_contains_the_mean() -> None:
    mean, sd = _mean_sd(LATENCIES)
    t = t_interval(mean, sd, len(LATENCIES))
    assert t is not None and t[0] < 0  # the old figure: a negative latency
    found, method = mean_interval(len(LATENCIES), mean, sd, minimum=min(LATENCIES), maximum=max(LATENCIES))
    assert method == "log-t"
    assert found is not None
    low, high = found
    assert 0 <= low <= mean <= high
    # on the log scale: the bounds are the mean divided and multiplied by one factor
    assert mean / low == pytest.approx(high / mean)
    # many observations: it tends to the t interval
    many = [random.Random(1).uniform(90, 110) for _ in range(10_000)]
    m, s = _mean_sd(many)
    assert log_interval(m, s, len(many)) == pytest.approx(t_interval(m, s, len(many)), rel=1e-4)


def test_wilson_matches_the_known_value_and_is_used_for_proportions() -> None:
    low, high = wilson_interval(8, 10)  # type: ignore[misc]
    assert (round(low, 3), round(high, 3)) == (0.49, 0.943)
    # values that are all 0 or 1 are a proportion: the same Wilson interval, not a t one
    values = [1.0] * 8 + [0.0] * 2
    mean, sd = _mean_sd(values)
    found, method = mean_interval(10, mean, sd, minimum=0.0, maximum=1.0, binary=10)
    assert method == "wilson"
    assert found == pytest.approx((low, high))


def test_unit_scale_scores_are_clamped_to_zero_and_one_and_negative_values_keep_t() -> None:
    values = [0.97, 0.99, 1.0, 0.62]
    mean, sd = _mean_sd(values)
    t = t_interval(mean, sd, 4)
    assert t is not None and t[1] > 1
    found, method = mean_interval(4, mean, sd, minimum=min(values), maximum=max(values))
    assert method == "t[0,1]" and found is not None
    assert found == (pytest.approx(t[0]), 1.0)
    signed = [-2.0, 1.0, 3.0]
    mean, sd = _mean_sd(signed)
    assert mean_interval(3, mean, sd, minimum=-2.0, maximum=3.0) == (t_interval(mean, sd, 3), "t")
    # every value 0: a proportion of none, whose upper bound says how few were seen
    assert mean_interval(3, 0.0, 0.0, minimum=0.0, maximum=0.0, binary=3) == (wilson_interval(0, 3), "wilson")
    assert log_interval(0.0, 0.0, 3) == (0.0, 0.0)
    assert mean_interval(1, 5.0, 0.0, minimum=5.0, maximum=5.0) == (None, "log-t")


def test_coverage_by_simulation() -> None:
    """Skewed durations (lognormal) and rates: the intervals hold the true value about 95% of the time, and the
    log-scale one at least as often as the t interval it replaces."""
    rng = random.Random(20261202)
    mu, sigma, n, runs = 3.0, 0.8, 30, 1500
    true_mean = math.exp(mu + sigma**2 / 2)
    log_hits = t_hits = 0
    for _ in range(runs):
        values = [rng.lognormvariate(mu, sigma) for _ in range(n)]
        mean, sd = _mean_sd(values)
        found, method = mean_interval(n, mean, sd, minimum=min(values), maximum=max(values))
        assert method == "log-t" and found is not None and found[0] > 0
        log_hits += found[0] <= true_mean <= found[1]
        low, high = t_interval(mean, sd, n)  # type: ignore[misc]
        t_hits += low <= true_mean <= high
    assert 0.90 <= log_hits / runs <= 0.98
    assert log_hits >= t_hits
    for p in (0.1, 0.5, 0.8):
        hits = 0
        for _ in range(runs):
            k = sum(rng.random() < p for _ in range(n))
            low, high = wilson_interval(k, n)  # type: ignore[misc]
            hits += low <= p <= high
        assert 0.92 <= hits / runs <= 0.99, p


def test_store_rows_get_their_interval_and_method() -> None:
    """`policies stats` (the store's window rows) and `/v1/evaluate` (scores in hand) name one method alike."""
    mean, sd = _mean_sd(LATENCIES)
    keys = {"policy": "p", "evaluator": "e", "name": "n", "p50": None, "p95": None}
    row: dict[str, Any] = {
        **keys, "n": 4, "value_n": 4, "value_mean": mean, "value_sd": sd, "value_min": 5.0, "value_max": 250.0,
        "value_binary": 0, "pass_n": 4, "passed": 3,
    }  # fmt: skip
    verdicts = {**keys, "n": 10, "value_n": 0, "value_mean": None, "value_sd": None, "pass_n": 10, "passed": 8}
    label = {**keys, "n": 1, "value_n": 0, "value_mean": None, "value_sd": None, "pass_n": 0, "passed": 0}
    latency, rate, topic = window_stats([row, verdicts, label])
    assert latency["method"] == "log-t" and 0 <= latency["interval"][0] <= mean <= latency["interval"][1]
    assert (rate["interval"], rate["method"]) == (pytest.approx(list(wilson_interval(8, 10))), "wilson")
    assert (topic["interval"], topic["method"]) == (None, None)
    scores = [Score("latency", value=v, outcome="scored", evaluator="e") for v in LATENCIES]
    (aggregate_,) = aggregate(scores)
    assert aggregate_["method"] == "log-t" and aggregate_["interval"] == pytest.approx(latency["interval"])
    rates = [Score("f1", value=v, outcome="scored", evaluator="e") for v in (0.2, 0.9, 0.95, 1.0)]
    (bounded,) = aggregate(rates)
    assert bounded["method"] == "t[0,1]" and bounded["interval"][1] <= 1.0


def test_policy_window_names_its_method(tmp_path: Path) -> None:
    write(tmp_path / "p.yaml", policy_doc("lat", cascade=[{"ref": "test/attribute"}], window="1m"))
    ps = load_policies(["p.yaml"], tmp_path)
    for i, v in enumerate(LATENCIES):
        ps.evaluate_trace([span(f"{i:032x}", attributes={"test.value": v})], now=120 + i)
    [stats] = ps.windows()
    assert stats.method == "log-t"
    assert stats.low is not None and stats.high is not None
    assert 0 <= stats.low <= stats.mean <= stats.high  # type: ignore[operator]
