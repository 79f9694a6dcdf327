"""Tenancy conformance: team a's data is written, then every API route (taken from the app's route table, so a
route added later is tried without editing this test) and every pipeline entry point (OTLP over HTTP and gRPC,
feedback over HTTP and as OTLP log records, `/v1/evaluate`, runs and run scoring) is tried as team b with team a's
ids: b reads nothing of a's, and nothing b sends changes a's traces, scores, runs, sessions, datasets or policy
stats. Pull import has no sender to bind (its project is the receiver's config) and is not tried here."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.auth import new_key
from evalsi.collector.api import build_api

A_KEY, A_HASH = new_key()
B_KEY, B_HASH = new_key()
TRACE = "7e4a" * 8
SPAN = "a1a1a1a1a1a1a1a1"
SESSION = "shared-session-1"
RUN = "shared-run-1"
# what only team a's data holds: none of it may appear in anything team b is answered
SECRETS = ("svc-team-a-private", "a-private-step", "a-private-answer", "a-private-run", SPAN)

POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: complaints}
spec:
  sampling: {rate: 0, always: [feedback.negative]}
  cascade:
    - ref: builtin/latency
      params: {max_ms: 60000}
  promote: {when: feedback.negative, dataset: complaints}
"""


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _attr(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def _span_body(service: str, name: str, answer: str, span_id: str) -> dict[str, Any]:
    now = time.time_ns()
    span = {
        "traceId": TRACE,
        "spanId": span_id,
        "name": name,
        "kind": 3,
        "startTimeUnixNano": str(now - 1_000_000),
        "endTimeUnixNano": str(now),
        "attributes": [
            _attr("gen_ai.operation.name", "chat"),
            _attr("gen_ai.request.model", "gpt-4o-mini"),
            _attr("gen_ai.conversation.id", SESSION),
            _attr("gen_ai.input.messages", json.dumps([{"role": "user", "parts": [{"type": "text", "content": "q"}]}])),
            _attr(
                "gen_ai.output.messages",
                json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]),
            ),
        ],
    }
    resource = {"attributes": [_attr("service.name", service)]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "app"}, "spans": [span]}]}]}


def _feedback_log(label: str) -> dict[str, Any]:
    record = {
        "timeUnixNano": str(time.time_ns()),
        "eventName": "gen_ai.evaluation.result",
        "traceId": TRACE,
        "attributes": [_attr("gen_ai.evaluation.name", "correctness"), _attr("gen_ai.evaluation.score.label", label)],
    }
    return {"resourceLogs": [{"scopeLogs": [{"scope": {"name": "reviewer"}, "logRecords": [record]}]}]}


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp("tenancy")
    (tmp / "complaints.yaml").write_text(POLICY)
    cfg = serve_config(tmp / "store")
    cfg["service"]["workers"] = 2  # feedback crosses from the collector process to the worker holding the trace
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {
        "policies": [str(tmp / "complaints.yaml")],
        "datasets_dir": str(tmp / "datasets"),
        "late_signals": {"window": "5m", "max_traces": 1000},
    }
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["logs"]["processors"] = ["normalize", "evaluate"]
    pipelines["scores"] = {"processors": ["evaluate"], "exporters": ["clickhouse"]}
    cfg["auth"] = {
        "mode": "strict",
        "api_keys": [
            {"hash": A_HASH, "name": "a", "project": "team-a"},
            {"hash": B_HASH, "name": "b", "project": "team-b"},
        ],
    }
    c = start_collector(tmp, cfg)
    c.datasets = tmp / "datasets"  # type: ignore[attr-defined]
    yield c
    assert c.stop() == 0


def _get(c: Collector, path: str, key: str, **params: Any) -> httpx.Response:
    return httpx.get(c.api + path, params=params, headers=_bearer(key), timeout=30)


def _post(url: str, body: Any, key: str) -> httpx.Response:
    return httpx.post(url, json=body, headers=_bearer(key), timeout=60)


def _metric(c: Collector, name: str) -> float:
    for line in httpx.get(c.metrics, headers=_bearer(A_KEY)).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _a_view(c: Collector) -> dict[str, Any]:
    """What team a reads of its own data (compared before and after team b's requests)."""
    trace = _get(c, f"/api/v1/traces/{TRACE}", A_KEY).json()
    run = _get(c, f"/api/v1/runs/{RUN}", A_KEY).json()
    return {
        "spans": sorted((s["span_id"], s["name"]) for s in trace["spans"]),
        "scores": sorted(
            (s["policy"], s["name"], s["source"])
            for s in _get(c, "/api/v1/scores", A_KEY, trace_id=TRACE).json()["scores"]
        ),
        "run": (run.get("name"), run.get("status"), run.get("summary")),
        "run_scores": len(_get(c, f"/api/v1/runs/{RUN}/scores", A_KEY).json()["scores"]),
        "sessions": [s["session_id"] for s in _get(c, "/api/v1/sessions", A_KEY).json()["sessions"]],
        "stats": _get(c, "/api/v1/policies/stats", A_KEY, window="1h").json()["stats"],
    }


@pytest.fixture(scope="module")
def team_a(collector: Collector) -> dict[str, Any]:
    """Team a's trace (evaluated online), its run with a run score, and its view of them."""
    c = collector
    body = _span_body("svc-team-a-private", "a-private-step", "a-private-answer", SPAN)
    assert _post(c.http + "/v1/traces", body, A_KEY).status_code == 200
    assert wait_until(lambda: _metric(c, 'evalsi_evaluate_traces_total{processor="evaluate"}') == 1, 30)
    assert wait_until(lambda: _get(c, f"/api/v1/traces/{TRACE}", A_KEY).status_code == 200, 30)
    run = {"run_id": RUN, "name": "a-private-run", "status": "finished", "manifest": {}, "summary": {"n": 1}}
    assert _post(c.api + "/v1/runs", run, A_KEY).status_code == 200
    scoring = {
        "name": "a-private-run",
        "evaluators": [{"ref": "builtin/latency", "params": {"max_ms": 60000}}],
        "traces": [{"trace_id": TRACE, "task_id": "t1", "trial": 0}],
        "wait_s": 10,
    }
    r = _post(f"{c.api}/v1/runs/{RUN}/score", scoring, A_KEY)
    assert r.status_code == 200, r.text
    assert wait_until(lambda: _a_view(c)["run_scores"] >= 1, 30)
    view = _a_view(c)
    assert view["spans"] == [(SPAN, "a-private-step")] and view["sessions"] == [SESSION]
    return view


# --- every API route, from the route table ----------------------------------------------------------------------

PATH_PARAMS = {"trace_id": TRACE, "session_id": SESSION, "run_id": RUN, "span_id": SPAN}
"""A path parameter named like one of a's ids gets a's id; any other gets a word."""

BODIES: dict[str, Any] = {
    "/api/v1/spans/stored": {"trace_ids": [TRACE]},
    "/v1/feedback": {"trace_id": TRACE, "name": "thumbs_up", "value": False},
    "/v1/runs": {"run_id": RUN, "name": "b-run", "status": "failed", "manifest": {}, "summary": {"n": 99}},
    "/v1/runs/{run_id}/score": {
        "name": "b-run",
        "evaluators": [{"ref": "builtin/latency"}],
        "traces": [{"trace_id": TRACE, "task_id": "t1", "trial": 0}],
        "wait_s": 1,
    },
    "/v1/traces/select": {"where": "true"},
    "/v1/evaluate": {
        "evaluators": [{"ref": "builtin/contains", "params": {"any": ["x"]}}],
        "records": [{"output": "x", "metadata": {"trace_id": TRACE}}],
    },
}
"""The body each known write route takes; a route not listed gets every id of a's in one body (a route that
refuses it is not a leak; one that takes it is held to the same checks)."""
GENERIC_BODY = {"trace_id": TRACE, "trace_ids": [TRACE], "session_id": SESSION, "run_id": RUN, "span_id": SPAN}
QUERY = {"trace_id": TRACE, "session_id": SESSION, "run_id": RUN, "window": "1h", "since": "1d"}
"""Every GET is asked with a's ids as filters (a route ignores the ones it does not take)."""


def _routes() -> list[tuple[str, str]]:
    app = build_api(None, status=dict)
    found = [(m, r.path) for r in app.routes for m in sorted(getattr(r, "methods", None) or ()) if m != "HEAD"]
    return [(m, p) for m, p in found if not p.startswith(("/docs", "/redoc", "/openapi"))]


def _fill(path: str) -> str:
    return re.sub(r"{(\w+)(?::path)?}", lambda m: PATH_PARAMS.get(m.group(1), "anything"), path)


def test_every_route_answers_team_b_nothing_of_team_as_and_changes_nothing(
    collector: Collector, team_a: dict[str, Any]
) -> None:
    c = collector
    routes = _routes()
    assert len(routes) >= 19 and ("POST", "/v1/feedback") in routes  # the table is read, not empty
    answers: dict[str, str] = {}
    for method, path in routes:
        url = c.api + _fill(path)
        if method == "GET":
            r = httpx.get(url, params=QUERY, headers=_bearer(B_KEY), timeout=30)
        else:
            r = httpx.request(method, url, json=BODIES.get(path, GENERIC_BODY), headers=_bearer(B_KEY), timeout=60)
        assert r.status_code < 500, f"{method} {path}: {r.status_code} {r.text[:300]}"
        answers[f"{method} {path}"] = r.text
    leaks = {route: s for route, text in answers.items() for s in SECRETS if s in text}
    assert leaks == {}
    # a's ids that b named are b's own: b's run is b's, and b's lists hold only b's
    assert json.loads(answers["GET /api/v1/runs/{run_id}"])["summary"] == {"n": 99}
    assert json.loads(answers["POST /api/v1/spans/stored"])["spans"] == []

    # b's feedback on a's trace id is b's: a's feedback-gated stage did not run, nothing was promoted
    unmatched = 'evalsi_late_signals_unmatched_total{processor="evaluate",reason="unknown_trace"}'
    assert wait_until(lambda: _metric(c, unmatched) >= 1, 15)
    time.sleep(1.5)  # what b's requests could still set off (late stages, run scores) has had time to land
    assert _a_view(c) == team_a
    assert not (c.datasets / "complaints.jsonl").exists()  # type: ignore[attr-defined]


def test_team_bs_spans_and_feedback_through_the_pipeline_leave_team_as_trace_alone(
    collector: Collector, team_a: dict[str, Any]
) -> None:
    """The same trace id from team b over gRPC and HTTP is b's trace; b's negative feedback as an OTLP log record
    (gen_ai.evaluation.result) on it promotes nothing of a's."""
    c = collector

    class SameTrace(IdGenerator):
        def generate_span_id(self) -> int:
            return 0xB2B2B2B2B2B2B2B2

        def generate_trace_id(self) -> int:
            return int(TRACE, 16)

    provider = TracerProvider(resource=Resource.create({"service.name": "svc-b"}), id_generator=SameTrace())
    exporter = GrpcExporter(endpoint=c.grpc, insecure=True, headers=(("authorization", f"Bearer {B_KEY}"),))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("b").start_as_current_span("b-step"):
        pass
    provider.shutdown()
    body = _span_body("svc-b", "b-http-step", "b-answer", "b3b3b3b3b3b3b3b3")
    assert _post(c.http + "/v1/traces", body, B_KEY).status_code == 200
    assert _post(c.http + "/v1/logs", _feedback_log("incorrect"), B_KEY).status_code == 200

    def b_spans() -> list[str]:
        r = _get(c, f"/api/v1/traces/{TRACE}", B_KEY)
        return sorted(s["name"] for s in r.json()["spans"]) if r.status_code == 200 else []

    assert wait_until(lambda: b_spans() == ["b-http-step", "b-step"], 30)
    assert wait_until(lambda: _metric(c, 'evalsi_evaluate_traces_total{processor="evaluate"}') >= 2, 30)
    time.sleep(1.5)
    assert _a_view(c) == team_a
    # b's complaints promote b's own trace (its feedback from the first test waited for it), never a's
    dataset = c.datasets / "complaints.jsonl"  # type: ignore[attr-defined]
    assert wait_until(dataset.exists, 15)
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    assert [(r["metadata"]["project"], r["output"]) for r in rows] == [("team-b", "b-answer")]
