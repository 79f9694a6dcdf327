"""The `prometheus` exporter scraped by a real Prometheus server: counts, exemplars with trace ids, bounded labels."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_server import MISSING, PROMETHEUS, PrometheusProcess, free_port, start_prometheus
from running_collector import serve_config, start_collector

from evalsi.component import Settings
from evalsi.exporters.prometheus import PrometheusConfig, PrometheusExporter
from evalsi.model.score import Score, ScoreBatch
from evalsi.policies.intervals import wilson_interval
from evalsi.runtime.telemetry import SelfMetrics

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason=MISSING)

JOB = "evalsi-scores"
# the labels a scraped evalsi series may carry: evalsi's own plus what Prometheus adds
ALLOWED_LABELS = {"__name__", "job", "instance", "policy", "evaluator", "name", "outcome", "le"}
HEX_ID = re.compile(r"[0-9a-f]{16}([0-9a-f]{16})?")


@dataclass
class PrometheusServer(PrometheusProcess):
    """A running `prometheus` scraping one target every second, and its HTTP API."""

    def api(self, path: str, **params: Any) -> Any:
        r = httpx.get(self.url + path, params=params, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", f"{path} {params}: {r.text}"
        return body["data"]

    def query(self, promql: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query: each series' labels (without job and instance) to its value."""
        data = self.api("/api/v1/query", query=promql)
        return {_key(r["metric"]): float(r["value"][1]) for r in data["result"]}

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        assert len(result) <= 1, f"{promql} matched several series: {result}"
        return next(iter(result.values()), None)

    def wait(self, promql: str, expected: float, timeout: float = 30) -> None:
        """Polls until the query returns `expected` (a scrape has seen it)."""
        deadline = time.monotonic() + timeout
        got = None
        while time.monotonic() < deadline:
            got = self.value(promql)
            if got == expected:
                return
            time.sleep(0.25)
        targets = self.api("/api/v1/targets")["activeTargets"]
        raise AssertionError(f"{promql} = {got}, not {expected}, after {timeout}s; targets: {targets}")

    def exemplars(self, promql: str) -> list[dict[str, Any]]:
        """Every exemplar stored for the query's series, each with the `le` of its bucket."""
        data = self.api("/api/v1/query_exemplars", query=promql, start=0, end=time.time() + 60)
        return [{**e, "le": s["seriesLabels"].get("le")} for s in data for e in s["exemplars"]]

    def series(self) -> list[dict[str, str]]:
        return self.api("/api/v1/series", **{"match[]": f'{{job="{JOB}"}}'})


def _key(metric: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in metric.items() if k not in ("job", "instance")))


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], PrometheusServer]]:
    """Starts `prometheus` (own config and storage under tmp_path, loopback, exemplar storage on) scraping a target."""
    started: list[PrometheusServer] = []

    def start(target: str) -> PrometheusServer:
        server = start_prometheus(tmp_path / "prometheus", {JOB: target}, PrometheusServer)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _assert_bounded_labels(server: PrometheusServer, ids: set[str]) -> list[dict[str, str]]:
    series = server.series()
    assert series
    for s in series:
        assert set(s) <= ALLOWED_LABELS, s
        for value in s.values():
            assert value not in ids and not HEX_ID.fullmatch(value), f"an id in a label: {s}"
    assert server.api("/api/v1/label/trace_id/values") == []
    assert server.api("/api/v1/label/span_id/values") == []
    return series


# --- the exporter component, with values chosen so every count and exemplar is known ------------------------


def _score(name: str, *, trace: int, **fields: Any) -> Score:
    s = Score(name, **fields)
    s.policy, s.evaluator = "support", f"builtin/{name}"
    s.trace_id, s.span_id = f"{trace:032x}", f"{trace:016x}"
    return s


def test_prometheus_scrapes_counts_exemplars_and_judge_metrics(
    prometheus: Callable[[str], PrometheusServer],
) -> None:
    settings = Settings("prometheus", SelfMetrics(), logging.getLogger("test.prometheus"))
    exporter = PrometheusExporter(PrometheusConfig(endpoint="127.0.0.1:0", max_series=3), settings)
    exporter.clock = lambda: 1_800_000_010.0  # inside one 5m window, whenever the test runs
    latency = {0x101: 80.0, 0x102: 120.0, 0x103: 2500.0}  # trace -> value: buckets 100, 1000, 10000
    scores = [_score("latency", trace=t, value=v, passed=v <= 1000) for t, v in latency.items()]
    scores += [_score("contains", trace=0x200 + i, passed=i != 0) for i in range(4)]  # 3 of 4 pass
    scores.append(_score("contains", trace=0x300, outcome="skipped", reason="no content"))
    judged = _score("llm-judge", trace=0x400, value=0.9, passed=True, judge_cost_usd=0.002, source="llm_judge")
    judged.metadata = {"input_tokens": 300, "output_tokens": 20}
    broke = _score("llm-judge", trace=0x401, outcome="skipped", reason="budget exhausted", source="llm_judge")
    fourth = _score("toxicity", trace=0x500, value=0.1)  # a 4th label set: past max_series, dropped
    scores += [judged, broke, fourth]

    async def run() -> None:
        await exporter.start()
        try:
            server = await asyncio.to_thread(prometheus, exporter.endpoint)
            await exporter.consume_scores(ScoreBatch(scores))
            # queried while the exporter still serves: once its scrapes fail, Prometheus marks the series stale
            await asyncio.to_thread(_check_scraped, server, scores)
        finally:
            await exporter.shutdown()

    asyncio.run(run())


def _check_scraped(server: PrometheusServer, scores: list[Score]) -> None:
    server.wait(f'evalsi_prometheus_series_dropped_total{{job="{JOB}"}}', 1)
    series = 'policy="support",evaluator="builtin/{0}",name="{0}"'
    lat, contains, judge = series.format("latency"), series.format("contains"), series.format("llm-judge")
    assert server.value(f'evalsi_scores_total{{{contains},outcome="scored"}}') == 4
    assert server.value(f'evalsi_scores_total{{{contains},outcome="skipped"}}') == 1
    assert server.value(f"evalsi_score_passed_total{{{contains}}}") == 3
    assert server.value(f"evalsi_score_failed_total{{{contains}}}") == 1
    assert server.value(f"evalsi_score_failed_total{{{lat}}}") == 1
    assert server.value(f"evalsi_score_value_count{{{lat}}}") == 3
    assert server.value(f"evalsi_score_value_sum{{{lat}}}") == 2700
    buckets = server.query(f"evalsi_score_value_bucket{{{lat}}}")
    assert {dict(k)["le"]: v for k, v in buckets.items()} == {
        "0.1": 0, "0.25": 0, "0.5": 0, "0.75": 0, "0.9": 0, "1.0": 0,
        "10.0": 0, "100.0": 1, "1000.0": 2, "10000.0": 3, "+Inf": 3,
    }  # fmt: skip
    # the gauges carry the window: pass rate with its Wilson interval
    assert server.value(f"evalsi_policy_window_n{{{contains}}}") == 4
    assert server.value(f"evalsi_policy_window_mean{{{contains}}}") == 0.75
    low, high = wilson_interval(3, 4)  # type: ignore[misc]
    assert server.value(f"evalsi_policy_window_lower{{{contains}}}") == pytest.approx(low, rel=1e-12)
    assert server.value(f"evalsi_policy_window_upper{{{contains}}}") == pytest.approx(high, rel=1e-12)
    # judge spend and budget, by (policy, evaluator) only
    judge_only = 'policy="support",evaluator="builtin/llm-judge"'
    assert server.value(f"evalsi_judge_tokens_total{{{judge_only}}}") == 320
    assert server.value(f"evalsi_judge_cost_usd_total{{{judge_only}}}") == pytest.approx(0.002)
    assert server.value(f"evalsi_judge_budget_exhausted_total{{{judge_only}}}") == 1
    assert server.value(f'evalsi_scores_total{{{judge},outcome="skipped"}}') == 1
    assert server.query('{name="toxicity"}') == {}
    # the types Prometheus read from the OpenMetrics metadata
    metadata = server.api("/api/v1/metadata")
    types = {name: entries[0]["type"] for name, entries in metadata.items() if name.startswith("evalsi_")}
    assert types["evalsi_scores"] == "counter"
    assert types["evalsi_score_value"] == "histogram"
    assert types["evalsi_policy_window_mean"] == "gauge"

    # exemplars were scraped (OpenMetrics was negotiated): each bucket's last observation, with its trace and span
    stored = server.exemplars(f"evalsi_score_value_bucket{{{lat}}}")
    got = sorted((e["le"], e["labels"]["trace_id"], e["labels"]["span_id"], float(e["value"])) for e in stored)
    assert got == [
        ("100.0", f"{0x101:032x}", f"{0x101:016x}", 80.0),
        ("1000.0", f"{0x102:032x}", f"{0x102:016x}", 120.0),
        ("10000.0", f"{0x103:032x}", f"{0x103:016x}", 2500.0),
    ]

    ids = {s.trace_id for s in scores} | {s.span_id for s in scores if s.span_id}
    series_seen = _assert_bounded_labels(server, ids)
    label_sets = {(s["policy"], s["evaluator"], s["name"]) for s in series_seen if "policy" in s and "name" in s}
    assert label_sets == {("support", f"builtin/{n}", n) for n in ("latency", "contains", "llm-judge")}


# --- end to end: `evalsi serve` scores OTLP traces with a policy, Prometheus scrapes its exporter ---------------

POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: support-answers}
spec:
  cascade:
    - ref: builtin/contains
      params: {any: [Paris]}
    - ref: builtin/latency
      params: {max_ms: 1000}
"""


# docs/exporters/prometheus.md's pass rate panel
PASS_RATE = (
    "sum by (policy, name) (rate(evalsi_score_passed_total[5m])) / (sum by (policy, name) "
    "(rate(evalsi_score_passed_total[5m])) + sum by (policy, name) (rate(evalsi_score_failed_total[5m])))"
)


def _otlp_trace(trace_id: str, answer: str, duration_ms: int) -> dict[str, Any]:
    end = time.time_ns()
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
        "startTimeUnixNano": str(end - duration_ms * 1_000_000),
        "endTimeUnixNano": str(end),
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "support"}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "app"}, "spans": [span]}]}]}


def test_serve_scores_reach_prometheus_with_trace_exemplars_and_bounded_labels(
    tmp_path: Path, prometheus: Callable[[str], PrometheusServer]
) -> None:
    (tmp_path / "support.yaml").write_text(POLICY)
    endpoint = f"127.0.0.1:{free_port()}"
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {"policies": ["support.yaml"]}
    cfg["exporters"]["prometheus"] = {"endpoint": endpoint}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse", "prometheus"]}
    server = prometheus(endpoint)  # first, as it waits ~5s before its first scrape while evalsi starts
    c = start_collector(tmp_path, cfg)

    def send(trace_id: str, answer: str, duration_ms: int) -> None:
        r = httpx.post(c.http + "/v1/traces", json=_otlp_trace(trace_id, answer, duration_ms))
        assert r.status_code == 200, r.text

    contains = 'policy="support-answers",evaluator="builtin/contains",name="contains"'
    lat = 'policy="support-answers",evaluator="builtin/latency",name="latency"'
    try:
        # first, only passing traces: the failure counters exist, at 0, before any failure
        first = [f"{0xA0 + i:032x}" for i in range(4)]
        for trace_id in first:
            send(trace_id, "It is Paris.", 50)
        server.wait(f'evalsi_scores_total{{{contains},outcome="scored"}}', 4)
        server.wait(f"evalsi_score_value_count{{{lat}}}", 4)
        assert server.value(f"evalsi_score_passed_total{{{contains}}}") == 4
        assert server.value(f"evalsi_score_failed_total{{{contains}}}") == 0
        assert server.value(f'evalsi_scores_total{{{contains},outcome="error"}}') == 0
        before = _assert_bounded_labels(server, _ids(first))

        # then more traces, one of them wrong and slow: it fails both checks
        more = [f"{0xC0 + i:032x}" for i in range(5)]
        bad = f"{0xB0:032x}"
        for trace_id in more:
            send(trace_id, "Paris.", 50)
        send(bad, "Lyon.", 2500)
        server.wait(f'evalsi_scores_total{{{contains},outcome="scored"}}', 10)
        server.wait(f"evalsi_score_value_count{{{lat}}}", 10)
        assert server.value(f"evalsi_score_passed_total{{{contains}}}") == 9
        assert server.value(f"evalsi_score_failed_total{{{contains}}}") == 1
        assert server.value(f"evalsi_score_failed_total{{{lat}}}") == 1

        # the Grafana queries of docs/exporters/prometheus.md: the failure shows in rate(), the pass rate drops
        failures = server.query("sum by (policy, name) (rate(evalsi_score_failed_total[5m]))")
        assert set(failures) == {(("name", n), ("policy", "support-answers")) for n in ("contains", "latency")}
        assert all(v > 0 for v in failures.values()), failures
        pass_rate = server.query(PASS_RATE)
        assert all(0.5 < v < 1 for v in pass_rate.values()) and len(pass_rate) == 2, pass_rate
        median = server.value(f"histogram_quantile(0.5, sum by (le) (rate(evalsi_score_value_bucket{{{lat}}}[5m])))")
        assert median is not None and 10 < median <= 100  # most latencies are 50 ms: the (10, 100] bucket

        # Grafana's link from a bad score to its trace: the exemplar on the slow bucket is the bad trace
        exemplars = server.exemplars(f"evalsi_score_value_bucket{{{lat}}}")
        by_le = {e["le"]: e["labels"] for e in exemplars}
        assert by_le["10000.0"] == {"trace_id": bad, "span_id": bad[16:]}
        assert by_le["100.0"]["trace_id"] in {*first, *more}
        assert {e["labels"]["trace_id"] for e in exemplars} <= {*first, *more, bad}

        # more traces, and a first failure, added counts, not label sets (the window gauges come and go with their
        # window, by design, under label sets the counters already have)
        after = _assert_bounded_labels(server, _ids([*first, *more, bad]))
        assert _label_sets(after) == _label_sets(before)
    finally:
        assert c.stop() == 0


def _label_sets(series: list[dict[str, str]]) -> set[frozenset[tuple[str, str]]]:
    return {frozenset((k, v) for k, v in s.items() if k != "__name__") for s in series}


def _ids(trace_ids: list[str]) -> set[str]:
    """The trace ids and the span ids (_otlp_trace's span id is the trace id's second half)."""
    return {*trace_ids, *(t[16:] for t in trace_ids)}
