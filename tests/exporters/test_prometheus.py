"""The `prometheus` exporter: scores become counters, a histogram with trace exemplars and windowed intervals."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from running_collector import serve_config, start_collector

from evalsi.component import Settings
from evalsi.exporters.prometheus import PrometheusConfig, PrometheusExporter
from evalsi.model.score import Score, ScoreBatch
from evalsi.policies.intervals import log_interval, t_interval, wilson_interval
from evalsi.runtime.telemetry import SelfMetrics

OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}
T0 = 1_800_000_000.0  # on a 5m boundary


def _exporter(**config: Any) -> PrometheusExporter:
    settings = Settings("prometheus", SelfMetrics(), logging.getLogger("test.prometheus"))
    return PrometheusExporter(PrometheusConfig(endpoint="127.0.0.1:0", **config), settings)


def _score(name: str, *, trace: int, **fields: Any) -> Score:
    s = Score(name, **fields)
    s.policy, s.evaluator = "support", f"builtin/{name}"
    s.trace_id, s.span_id = f"{trace:032x}", f"{trace:016x}"
    return s


def _samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _value(samples: list[Sample], metric: str, /, **labels: str) -> float | None:
    for s in samples:
        if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


async def _scrape(exporter: PrometheusExporter, *batches: ScoreBatch) -> tuple[str, httpx.Response]:
    await exporter.start()
    try:
        for batch in batches:
            await exporter.consume_scores(batch)
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://{exporter.endpoint}/metrics", headers=OPENMETRICS)
            missing = await client.get(f"http://{exporter.endpoint}/")
        return response.text, missing
    finally:
        await exporter.shutdown()


def test_counts_histogram_exemplars_and_window_intervals() -> None:
    exporter = _exporter()
    exporter.clock = lambda: T0 + 10
    contains = [_score("contains", trace=i, passed=i % 4 != 0) for i in range(1, 9)]  # 6 of 8 pass
    latency = [_score("latency", trace=100 + i, value=v) for i, v in enumerate([120.0, 80.0, 2500.0])]
    skipped = _score("contains", trace=200, outcome="skipped", reason="no content")
    error = _score("latency", trace=201, outcome="error", reason="timeout")
    text, missing = asyncio.run(
        _scrape(exporter, ScoreBatch(contains[:5]), ScoreBatch([*contains[5:], *latency, skipped, error]))
    )
    samples = _samples(text)
    series = {"policy": "support", "evaluator": "builtin/contains", "name": "contains"}
    lat = {"policy": "support", "evaluator": "builtin/latency", "name": "latency"}

    assert _value(samples, "evalsi_scores_total", **series, outcome="scored") == 8
    assert _value(samples, "evalsi_scores_total", **series, outcome="skipped") == 1
    assert _value(samples, "evalsi_scores_total", **lat, outcome="error") == 1
    assert _value(samples, "evalsi_score_passed_total", **series) == 6
    assert _value(samples, "evalsi_score_failed_total", **series) == 2

    # histogram of values: cumulative buckets, with the trace of an observation as exemplar
    assert _value(samples, "evalsi_score_value_count", **lat) == 3
    assert _value(samples, "evalsi_score_value_sum", **lat) == 2700
    assert _value(samples, "evalsi_score_value_bucket", **lat, le="100.0") == 1
    assert _value(samples, "evalsi_score_value_bucket", **lat, le="1000.0") == 2
    assert _value(samples, "evalsi_score_value_bucket", **lat, le="+Inf") == 3
    exemplars = {
        s.labels["le"]: s.exemplar
        for s in samples
        if s.name == "evalsi_score_value_bucket" and s.labels["name"] == "latency" and s.exemplar
    }
    assert exemplars["100.0"].labels == {"trace_id": f"{101:032x}", "span_id": f"{101:016x}"}
    assert exemplars["100.0"].value == 80.0
    assert exemplars["10000.0"].labels["trace_id"] == f"{102:032x}"
    # contains has verdicts only: no histogram observations
    assert _value(samples, "evalsi_score_value_count", **series) is None

    # windows: pass rate with Wilson bounds, mean value within its bounds (latencies: log-t), computed by `intervals`
    low, high = wilson_interval(6, 8, 0.95)  # type: ignore[misc]
    assert _value(samples, "evalsi_policy_window_n", **series) == 8
    assert _value(samples, "evalsi_policy_window_mean", **series) == pytest.approx(0.75)
    assert _value(samples, "evalsi_policy_window_lower", **series) == pytest.approx(low, abs=1e-12)
    assert _value(samples, "evalsi_policy_window_upper", **series) == pytest.approx(high, abs=1e-12)
    values = [120.0, 80.0, 2500.0]
    mean = sum(values) / 3
    sd = (sum((v - mean) ** 2 for v in values) / 2) ** 0.5
    t_low, t_high = log_interval(mean, sd, 3, 0.95)  # type: ignore[misc]
    assert t_interval(mean, sd, 3, 0.95)[0] < 0 < t_low  # type: ignore[index]  (a plain t bound would be below 0)
    assert _value(samples, "evalsi_policy_window_n", **lat) == 3
    assert _value(samples, "evalsi_policy_window_mean", **lat) == pytest.approx(mean)
    assert _value(samples, "evalsi_policy_window_lower", **lat) == pytest.approx(t_low, rel=1e-9)
    assert _value(samples, "evalsi_policy_window_upper", **lat) == pytest.approx(t_high, rel=1e-9)

    # no trace ids in any label
    assert not any(len(v) == 32 for s in samples for v in s.labels.values())
    assert missing.status_code == 404


def test_window_tumbles_and_only_scored_outcomes_count() -> None:
    exporter = _exporter(window="1m")
    now = [T0 + 5]
    exporter.clock = lambda: now[0]

    async def run() -> list[str]:
        await exporter.start()
        texts = []
        try:
            async with httpx.AsyncClient() as client:
                url = f"http://{exporter.endpoint}/metrics"
                await exporter.consume_scores(ScoreBatch([_score("contains", trace=i, passed=False) for i in range(3)]))
                await exporter.consume_scores(ScoreBatch([_score("contains", trace=9, outcome="skipped", reason="x")]))
                texts.append((await client.get(url, headers=OPENMETRICS)).text)
                now[0] = T0 + 65  # the next window: the old one no longer shows
                texts.append((await client.get(url, headers=OPENMETRICS)).text)
                await exporter.consume_scores(ScoreBatch([_score("contains", trace=5, passed=True)]))
                texts.append((await client.get(url, headers=OPENMETRICS)).text)
        finally:
            await exporter.shutdown()
        return texts

    first, rolled, fresh = (_samples(t) for t in asyncio.run(run()))
    assert _value(first, "evalsi_policy_window_n", name="contains") == 3
    assert _value(first, "evalsi_policy_window_mean", name="contains") == 0.0
    assert _value(first, "evalsi_policy_window_upper", name="contains") == pytest.approx(wilson_interval(0, 3)[1])  # type: ignore[index]
    assert _value(rolled, "evalsi_policy_window_n", name="contains") == 0
    assert _value(rolled, "evalsi_policy_window_mean", name="contains") is None
    assert _value(fresh, "evalsi_policy_window_n", name="contains") == 1
    assert _value(fresh, "evalsi_policy_window_mean", name="contains") == 1.0
    assert _value(fresh, "evalsi_scores_total", name="contains", outcome="scored") == 4  # counters never reset


def test_judge_cost_tokens_and_budget() -> None:
    judged = _score("llm-judge", trace=1, value=0.9, passed=True, judge_cost_usd=0.002, source="llm_judge")
    judged.metadata = {"model": "judge-1", "input_tokens": 300, "output_tokens": 20}
    cached = _score("llm-judge", trace=2, value=0.9, passed=True, judge_cost_usd=0.0, source="llm_judge")
    cached.metadata = {"cached": True}
    broke = _score("llm-judge", trace=3, outcome="skipped", reason="budget exhausted", source="llm_judge")
    text, _ = asyncio.run(_scrape(_exporter(), ScoreBatch([judged, cached, broke, broke])))
    samples = _samples(text)
    judge = {"policy": "support", "evaluator": "builtin/llm-judge"}
    assert _value(samples, "evalsi_judge_tokens_total", **judge) == 320
    assert _value(samples, "evalsi_judge_cost_usd_total", **judge) == pytest.approx(0.002)
    assert _value(samples, "evalsi_judge_budget_exhausted_total", **judge) == 2
    assert _value(samples, "evalsi_scores_total", **judge, outcome="skipped") == 2


def test_max_series_bounds_label_sets() -> None:
    exporter = _exporter(max_series=3)
    scores = [_score(f"check-{i}", trace=i, passed=True) for i in range(5)]
    again = _score("check-0", trace=9, passed=False)  # a known label set is still recorded
    text, _ = asyncio.run(_scrape(exporter, ScoreBatch([*scores, again])))
    samples = _samples(text)
    names = {s.labels["name"] for s in samples if s.name == "evalsi_scores_total"}
    assert names == {"check-0", "check-1", "check-2"}
    assert _value(samples, "evalsi_prometheus_series_dropped_total") == 2
    assert _value(samples, "evalsi_score_failed_total", name="check-0") == 1


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        PrometheusConfig(endpoint="nowhere")
    with pytest.raises(ValueError, match="max_series"):
        PrometheusConfig(max_series=0)
    with pytest.raises(ValueError, match="buckets"):
        PrometheusConfig(buckets=(1.0, 0.5))


POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: support-answers}
spec:
  cascade:
    - ref: builtin/contains
      params: {any: [Paris]}
    - ref: builtin/latency
      params: {max_ms: 60000}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _otlp_trace(trace_id: str, answer: str) -> dict[str, Any]:
    now = time.time_ns()
    out = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
    inp = [{"role": "user", "parts": [{"type": "text", "content": "Capital of France?"}]}]
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.input.messages": json.dumps(inp),
        "gen_ai.output.messages": json.dumps(out),
    }
    span = {
        "traceId": trace_id,
        "spanId": trace_id[16:],
        "name": "chat gpt-4o-mini",
        "kind": 3,
        "startTimeUnixNano": str(now - 1_000_000),
        "endTimeUnixNano": str(now),
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "support"}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "app"}, "spans": [span]}]}]}


def test_serve_exports_scores_to_prometheus_with_trace_exemplars(tmp_path: Path) -> None:
    (tmp_path / "support.yaml").write_text(POLICY)
    endpoint = f"127.0.0.1:{_free_port()}"
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {"policies": ["support.yaml"]}
    cfg["exporters"]["prometheus"] = {"endpoint": endpoint}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse", "prometheus"]}
    c = start_collector(tmp_path, cfg)
    try:
        good = [f"{0xA0 + i:032x}" for i in range(3)]
        bad = f"{0xB0:032x}"
        for trace_id in good:
            r = httpx.post(c.http + "/v1/traces", json=_otlp_trace(trace_id, "It is Paris."))
            assert r.status_code == 200, r.text
        assert httpx.post(c.http + "/v1/traces", json=_otlp_trace(bad, "Lyon.")).status_code == 200
        series = {"policy": "support-answers", "evaluator": "builtin/contains", "name": "contains"}
        deadline = time.monotonic() + 30
        samples: list[Sample] = []
        while time.monotonic() < deadline:
            samples = _samples(httpx.get(f"http://{endpoint}/metrics", headers=OPENMETRICS).text)
            if (
                _value(samples, "evalsi_scores_total", **series, outcome="scored") == 4
                and _value(samples, "evalsi_score_value_count", name="latency") == 4
            ):
                break
            time.sleep(0.2)
        assert _value(samples, "evalsi_scores_total", **series, outcome="scored") == 4
        assert _value(samples, "evalsi_score_passed_total", **series) == 3
        assert _value(samples, "evalsi_score_failed_total", **series) == 1
        assert _value(samples, "evalsi_policy_window_n", **series) == 4
        assert _value(samples, "evalsi_policy_window_mean", **series) == 0.75
        assert _value(samples, "evalsi_policy_window_lower", **series) == pytest.approx(wilson_interval(3, 4)[0])  # type: ignore[index]
        lat = {"policy": "support-answers", "evaluator": "builtin/latency", "name": "latency"}
        assert _value(samples, "evalsi_score_value_count", **lat) == 4
        exemplars = [s.exemplar for s in samples if s.name == "evalsi_score_value_bucket" and s.exemplar]
        assert exemplars and {e.labels["trace_id"] for e in exemplars} <= {*good, bad}
        sent = httpx.get(c.metrics).text
        assert 'evalsi_exporter_sent_scores_total{exporter="prometheus"} 8.0' in sent
    finally:
        assert c.stop() == 0
