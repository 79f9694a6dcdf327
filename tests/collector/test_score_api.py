"""The Score API against a real `evalsi serve`: /v1/evaluate on records, /v1/feedback as human scores, and
`evalsi policies stats` over what was stored."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterator

import httpx
import pytest
from fake_judge import FakeJudge
from running_collector import Collector, serve_config, start_collector

import evalsi.processors  # noqa: F401  (before evalsi.policies: see the import cycle note in score_api)
from evalsi.collector.score_api import MAX_RECORDS
from evalsi.policies.intervals import log_interval, t_interval, wilson_interval

RECORDS = [
    {"input": "Capital of France?", "output": "Paris.", "reference": "Paris.", "metadata": {"case": "a"}},
    {"input": "Capital of Italy?", "output": "Milan, I think.", "reference": {"expected_output": "Rome."}},
    {"input": "Capital of Spain?", "output": "It is Madrid."},  # no reference: exact-match is skipped
]
EVALUATORS = [
    {"ref": "builtin/contains", "params": {"any": ["Paris", "Madrid"]}},
    {"ref": "builtin/exact-match"},
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp("score_api")
    c = start_collector(tmp, serve_config(tmp / "store"))
    yield c
    if c.proc.poll() is None:
        c.stop()


def _trace_id() -> str:
    return os.urandom(16).hex()


def test_evaluate_scores_each_record_and_aggregates_with_wilson_intervals(served: Collector) -> None:
    resp = httpx.post(served.api + "/v1/evaluate", json={"records": RECORDS, "evaluators": EVALUATORS}, timeout=30)
    assert resp.status_code == 200, resp.text
    doc = resp.json()

    by_record = [{s["evaluator"]: s for s in r["scores"]} for r in doc["results"]]
    assert [r["index"] for r in doc["results"]] == [0, 1, 2]
    assert doc["results"][0]["metadata"] == {"case": "a"}
    # contains: "Paris." and "It is Madrid." have one of the strings, "Milan, I think." has neither
    assert [r["builtin/contains"]["passed"] for r in by_record] == [True, False, True]
    assert all(r["builtin/contains"]["outcome"] == "scored" for r in by_record)
    # exact-match: equal, different, and no reference at all (skipped, never a made-up failure)
    exact = [r["builtin/exact-match"] for r in by_record]
    assert [(s["outcome"], s["passed"]) for s in exact] == [("scored", True), ("scored", False), ("skipped", None)]
    assert exact[2]["reason"] == "no reference"

    aggregates = {a["evaluator"]: a for a in doc["aggregates"]}
    contains = aggregates["builtin/contains"]
    assert (contains["name"], contains["kind"], contains["n"], contains["passed"]) == ("contains", "pass_fail", 3, 2)
    assert contains["mean"] == pytest.approx(2 / 3)
    assert contains["interval"] == list(wilson_interval(2, 3))
    match = aggregates["builtin/exact-match"]
    # only scored outcomes count: n is 2, the skipped one is counted beside
    assert (match["n"], match["passed"], match["skipped"], match["errors"]) == (2, 1, 1, 0)
    assert match["mean"] == 0.5
    assert match["interval"] == list(wilson_interval(1, 2))


def test_evaluate_numeric_scores_get_an_interval_within_their_bounds(served: Collector) -> None:
    outputs = ["ok", "a longer answer", "the longest answer of the three"]
    body = {"records": [{"output": o} for o in outputs], "evaluators": [{"ref": "builtin/length"}]}
    resp = httpx.post(served.api + "/v1/evaluate", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    [agg] = resp.json()["aggregates"]
    values = [float(len(o)) for o in outputs]  # the output's length in characters
    assert [s["value"] for r in resp.json()["results"] for s in r["scores"]] == values
    assert agg["kind"] == "numeric" and agg["n"] == 3
    assert agg["mean"] == pytest.approx(statistics.fmean(values))
    # lengths are never negative: a log-scale interval, above 0 (Student t would reach -20 characters here)
    low, high = log_interval(statistics.fmean(values), statistics.stdev(values), 3)  # type: ignore[misc]
    assert agg["interval"] == [pytest.approx(low), pytest.approx(high)] and agg["method"] == "log-t"
    assert t_interval(statistics.fmean(values), statistics.stdev(values), 3)[0] < 0  # type: ignore[index]


def test_evaluate_runs_judges_with_the_service_judge_runtime(served: Collector) -> None:
    fake = FakeJudge()
    fake.thread.start()
    try:
        judge = {"ref": "builtin/llm-judge", "params": {"endpoint": fake.url, "model": "judge-1", "name": "api-judge"}}
        body = {"records": RECORDS[:1] * 2, "evaluators": [judge]}
        resp = httpx.post(served.api + "/v1/evaluate", json=body, timeout=30)
    finally:
        fake.server.shutdown()
        fake.server.server_close()
    assert resp.status_code == 200, resp.text
    scores = [s for r in resp.json()["results"] for s in r["scores"]]
    assert [(s["name"], s["outcome"], s["value"]) for s in scores] == [("api-judge", "scored", 0.9)] * 2
    assert len(fake.requests) == 1  # the second record is the same judgment: the service's cache answered it
    metrics = httpx.get(served.metrics, timeout=10).text
    assert 'evalsi_judge_calls_total{judge="api-judge",model="judge-1",result="ok"} 1.0' in metrics
    assert 'evalsi_judge_cache_hits_total{judge="api-judge",model="judge-1"} 1.0' in metrics


@pytest.mark.parametrize(
    ("evaluators", "status", "names"),
    [
        ([{"ref": "builtin/contains", "params": {"any": ["x"]}}, {"ref": "builtin/no-such"}], 400,
         ["evaluators.1.ref", "builtin/no-such"]),
        ([{"ref": "builtin/contains", "params": {"any": ["x"], "anyy": ["y"]}}], 400, ["evaluators.0.params.anyy"]),
        ([{"ref": "builtin/contains"}], 400, ["evaluators.0.params"]),
        ([{"ref": "builtin/regex", "params": {"pattern": "("}}], 400, ["evaluators.0.params.pattern"]),
        ([], 400, ["evaluators"]),
    ],
)  # fmt: skip
def test_evaluate_refuses_bad_evaluators_naming_the_key(
    served: Collector, evaluators: list[dict], status: int, names: list[str]
) -> None:
    resp = httpx.post(served.api + "/v1/evaluate", json={"records": RECORDS, "evaluators": evaluators}, timeout=30)
    assert resp.status_code == status, resp.text
    for name in names:
        assert name in resp.json()["detail"]


def test_evaluate_refuses_too_many_records_and_bad_records(served: Collector) -> None:
    body = {"records": [{"output": "x"}] * (MAX_RECORDS + 1), "evaluators": EVALUATORS}
    resp = httpx.post(served.api + "/v1/evaluate", json=body, timeout=30)
    assert resp.status_code == 413
    assert str(MAX_RECORDS) in resp.json()["detail"]
    resp = httpx.post(served.api + "/v1/evaluate", json={"records": [{"ouptut": "x"}], "evaluators": EVALUATORS})
    assert resp.status_code == 400
    assert "records.0.ouptut" in resp.json()["detail"]
    for path in ("/v1/evaluate", "/v1/feedback"):  # not JSON at all: the client's error, said as such
        resp = httpx.post(served.api + path, content=b"{not json", headers={"Content-Type": "application/json"})
        assert resp.status_code == 400, resp.text
        assert "invalid request" in resp.json()["detail"] and "JSON" in resp.json()["detail"]


def test_feedback_is_stored_as_a_human_score(served: Collector) -> None:
    trace_id = _trace_id()
    sent = [
        {"trace_id": trace_id, "name": "thumbs_up", "value": True, "comment": "right answer"},
        {"trace_id": trace_id.upper(), "name": "rating", "value": 4, "span_id": "00f067aa0ba902b7"},
        {"trace_id": trace_id, "name": "category", "value": "billing"},
    ]
    for body in sent:
        resp = httpx.post(served.api + "/v1/feedback", json=body, timeout=30)
        assert resp.status_code == 200, resp.text
        assert resp.json()["stored"]["source"] == "human"

    rows = json.loads(served.cli("scores", "list", "--trace", trace_id, "--json").stdout)
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"thumbs_up", "rating", "category"}
    for r in rows:
        assert (r["trace_id"], r["source"], r["policy"], r["evaluator"], r["outcome"]) == (
            trace_id, "human", "feedback", "feedback", "scored",
        )  # fmt: skip
    assert (by_name["thumbs_up"]["passed"], by_name["thumbs_up"]["value"]) == (True, None)
    assert by_name["thumbs_up"]["explanation"] == "right answer"
    assert (by_name["rating"]["value"], by_name["rating"]["passed"]) == (4.0, None)
    assert by_name["rating"]["span_id"] == "00f067aa0ba902b7"
    assert by_name["category"]["label"] == "billing"


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"trace_id": "not-a-trace", "name": "x", "value": 1}, ["trace_id", "32 hex"]),
        ({"trace_id": "ab" * 16, "value": 1}, ["name"]),
        ({"trace_id": "ab" * 16, "name": "", "value": 1}, ["name"]),
        ({"trace_id": "ab" * 16, "name": "x"}, ["value"]),
        ({"trace_id": "ab" * 16, "name": "x", "value": 1, "span_id": "zz"}, ["span_id"]),
        ({"trace_id": "ab" * 16, "name": "x", "value": [1]}, ["value"]),
    ],
)
def test_feedback_refuses_bad_bodies(served: Collector, body: dict, names: list[str]) -> None:
    resp = httpx.post(served.api + "/v1/feedback", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    for name in names:
        assert name in resp.json()["detail"]


def test_policies_stats_aggregates_feedback_in_the_window(served: Collector) -> None:
    helpful = [True, False, True, True]
    ratings = [3.0, 5.0, 4.0, 1.0]
    for verdict, rating in zip(helpful, ratings, strict=True):
        trace_id = _trace_id()
        for name, value in (("helpful", verdict), ("stars", rating)):
            body = {"trace_id": trace_id, "name": name, "value": value}
            assert httpx.post(served.api + "/v1/feedback", json=body, timeout=30).status_code == 200
    # a label is scored but has neither value nor verdict: counted, no mean
    httpx.post(served.api + "/v1/feedback", json={"trace_id": _trace_id(), "name": "topic", "value": "x"})

    doc = json.loads(served.cli("policies", "stats", "--window", "10m", "--json").stdout)
    stats = {(s["policy"], s["evaluator"], s["name"]): s for s in doc["stats"]}
    h = stats[("feedback", "feedback", "helpful")]
    assert (h["kind"], h["n"], h["passed"]) == ("pass_fail", 4, 3)
    assert h["mean"] == 0.75
    assert h["interval"] == [pytest.approx(x, abs=1e-12) for x in wilson_interval(3, 4)]
    s = stats[("feedback", "feedback", "stars")]
    mean, sd = statistics.fmean(ratings), statistics.stdev(ratings)
    assert (s["kind"], s["n"]) == ("numeric", 4)
    assert s["mean"] == pytest.approx(mean)
    # ratings are non-negative: a log-scale interval, which stays above 0
    assert s["interval"] == [pytest.approx(x) for x in log_interval(mean, sd, 4)] and s["method"] == "log-t"
    # numpy's linear interpolation on [1, 3, 4, 5]
    assert s["p50"] == pytest.approx(3.5) and s["p95"] == pytest.approx(4.85)
    t = stats[("feedback", "feedback", "topic")]
    assert (t["kind"], t["n"], t["mean"], t["interval"]) == ("label", 1, None, None)

    only = json.loads(served.cli("policies", "stats", "--policy", "nobody", "--json").stdout)
    assert only["stats"] == []
    table = served.cli("policies", "stats").stdout
    assert "helpful" in table and "stars" in table


def test_policies_stats_refuses_a_bad_window(served: Collector) -> None:
    res = served.cli("policies", "stats", "--window", "soon", check=False)
    assert res.returncode == 1
    assert "--window" in res.stderr
    resp = httpx.get(served.api + "/api/v1/policies/stats", params={"window": "0s"})
    assert resp.status_code == 400 and "window" in resp.json()["detail"]


def test_evaluate_plans_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first /v1/evaluate imports every evaluator pack (0.6-0.8 s measured in `evalsi serve`, chaos.py e): planning
    runs in a thread, so /healthz (and OTLP over HTTP) is answered meanwhile."""
    import asyncio
    import time

    from evalsi.collector import score_api
    from evalsi.collector.api import build_api

    plan = score_api.plan_evaluation

    def slow_plan(body: object) -> score_api.EvaluationPlan:
        time.sleep(0.5)  # as an import of the packs does, holding whatever thread runs it
        return plan(body)

    monkeypatch.setattr(score_api, "plan_evaluation", slow_plan)
    app = build_api(None, lambda: {})

    async def race() -> tuple[float, float, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://evalsi") as client:
            t0 = time.monotonic()
            evaluating = asyncio.create_task(
                client.post("/v1/evaluate", json={"records": RECORDS[:1], "evaluators": EVALUATORS[:1]})
            )
            await asyncio.sleep(0.05)  # the evaluate request is being planned
            health = await client.get("/healthz")
            healthy_after = time.monotonic() - t0
            resp = await evaluating
            return healthy_after, time.monotonic() - t0, resp.status_code + 1000 * (health.status_code != 200)

    healthy_after, evaluated_after, status = asyncio.run(race())
    assert status == 200
    assert healthy_after < 0.3 < evaluated_after
