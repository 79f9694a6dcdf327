"""Projects end to end: each API key writes to its own project and reads only it, through a running `evalsi serve` and
real clients (the OpenTelemetry SDK's exporters over HTTP and gRPC, the API). The same trace id sent by two projects
stays two traces to their readers; a resource attribute naming another project is not honoured; feedback, run scores
and policy stats stay in their project."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.auth import new_key

A_KEY, A_HASH = new_key()
B_KEY, B_HASH = new_key()
SHARED_TRACE = 0x5EED_0000_0000_0000_0000_0000_0000_0001


class _FixedTrace(IdGenerator):
    """Every trace gets the same id: what a second team would do to join or overwrite another's trace."""

    def __init__(self) -> None:
        self._span = 0

    def generate_span_id(self) -> int:
        self._span += 1
        return self._span

    def generate_trace_id(self) -> int:
        return SHARED_TRACE


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module", params=[1, 2], ids=["one-process", "two-workers"])
def collector(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp("projects")
    cfg = serve_config(tmp / "store")
    cfg["service"]["workers"] = request.param
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["service"]["pipelines"]["traces"]["processors"] = ["normalize", "tail_sampling"]
    cfg["auth"] = {
        "mode": "strict",
        "api_keys": [
            {"hash": A_HASH, "name": "team a's agents", "project": "team-a"},
            {"hash": B_HASH, "name": "team b's agents", "project": "team-b"},
        ],
    }
    c = start_collector(tmp, cfg)
    yield c
    assert c.stop() == 0


def _send(exporter: Any, name: str, resource: dict[str, str] | None = None) -> None:
    attributes = {"service.name": f"svc-{name}", **(resource or {})}
    provider = TracerProvider(resource=Resource.create(attributes), id_generator=_FixedTrace())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span(name):
        pass
    provider.shutdown()


def _trace(c: Collector, key: str) -> httpx.Response:
    return httpx.get(f"{c.api}/api/v1/traces/{SHARED_TRACE:032x}", headers=_bearer(key))


@pytest.fixture(scope="module")
def sent(collector: Collector) -> Collector:
    c = collector
    # team a over HTTP, naming team b in its resource (not honoured: its key writes to team-a)
    _send(HttpExporter(endpoint=c.http + "/v1/traces", headers=_bearer(A_KEY)), "a-step", {"evalsi.project": "team-b"})
    # team b over gRPC, the same trace id
    _send(GrpcExporter(endpoint=c.grpc, insecure=True, headers=(("authorization", f"Bearer {B_KEY}"),)), "b-step")
    for key in (A_KEY, B_KEY):
        assert wait_until(lambda key=key: _trace(c, key).status_code == 200, timeout=30)
    return c


def test_each_project_reads_only_its_own_spans_of_a_shared_trace_id(sent: Collector) -> None:
    a, b = _trace(sent, A_KEY).json()["spans"], _trace(sent, B_KEY).json()["spans"]
    assert [s["name"] for s in a] == ["a-step"]
    assert [s["name"] for s in b] == ["b-step"]
    # the project the key writes to, whatever the resource said
    assert a[0]["resource_attributes"]["evalsi.project"] == "team-a"
    assert b[0]["resource_attributes"]["evalsi.project"] == "team-b"


def test_the_same_trace_id_from_two_projects_is_assembled_as_two_traces(sent: Collector) -> None:
    def completed() -> float:
        text = httpx.get(sent.metrics, headers=_bearer(A_KEY)).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("evalsi_tail_sampling_traces_completed_total{")
        )

    assert wait_until(lambda: completed() == 2, timeout=15)  # workers report every second


def test_trace_lists_are_per_project(sent: Collector) -> None:
    for key, name in ((A_KEY, "svc-a-step"), (B_KEY, "svc-b-step")):
        traces = httpx.get(f"{sent.api}/api/v1/traces", headers=_bearer(key)).json()["traces"]
        assert [(t["trace_id"], t["span_count"], t["service_name"]) for t in traces] == [
            (f"{SHARED_TRACE:032x}", 1, name)
        ]


def test_feedback_lands_in_the_senders_project_only(sent: Collector) -> None:
    body = {"trace_id": f"{SHARED_TRACE:032x}", "name": "helpful", "value": True}
    r = httpx.post(f"{sent.api}/v1/feedback", json=body, headers=_bearer(A_KEY))
    assert r.status_code == 200, r.text

    def scores(key: str) -> list[dict[str, Any]]:
        url = f"{sent.api}/api/v1/scores?trace_id={SHARED_TRACE:032x}"
        return httpx.get(url, headers=_bearer(key)).json()["scores"]

    assert wait_until(lambda: len(scores(A_KEY)) == 1, timeout=30)
    assert scores(A_KEY)[0]["project"] == "team-a" and scores(A_KEY)[0]["passed"] is True
    assert scores(B_KEY) == []
    stats = httpx.get(f"{sent.api}/api/v1/policies/stats?window=1h", headers=_bearer(B_KEY)).json()["stats"]
    assert stats == []


def test_runs_are_per_project(sent: Collector) -> None:
    run = {"run_id": "run-projects-1", "name": "smoke", "status": "finished", "manifest": {}, "summary": {}}
    r = httpx.post(f"{sent.api}/v1/runs", json=run, headers=_bearer(A_KEY))
    assert r.status_code == 200, r.text
    assert httpx.get(f"{sent.api}/api/v1/runs/run-projects-1", headers=_bearer(A_KEY)).status_code == 200
    assert httpx.get(f"{sent.api}/api/v1/runs/run-projects-1", headers=_bearer(B_KEY)).status_code == 404
    listed = httpx.get(f"{sent.api}/api/v1/runs", headers=_bearer(B_KEY)).json()["runs"]
    assert "run-projects-1" not in [x["run_id"] for x in listed]


def test_the_same_run_id_recorded_by_two_projects_stays_two_runs(sent: Collector) -> None:
    """Team b recording a run id team a already used must not take team a's run (a then got 404 on its own run):
    each reads its own record, its own list and its own run scores."""
    run_id = "run-shared-id"
    shared = f"{SHARED_TRACE:032x}"  # each project holds its own trace under this id (see `sent`)
    for key, team, passed in ((A_KEY, "a", True), (B_KEY, "b", False)):
        record = {"run_id": run_id, "name": f"nightly-{team}", "status": "finished",
                  "manifest": {"team": team}, "summary": {"passed": passed, "aggregates": {"team": team}}}  # fmt: skip
        r = httpx.post(f"{sent.api}/v1/runs", json=record, headers=_bearer(key))
        assert r.status_code == 200, r.text
        body = {"name": f"nightly-{team}", "since_unix_nano": 0, "wait_s": 10,
                "traces": [{"trace_id": shared, "task_id": f"task-{team}", "trial": 0,
                            "scores": [{"name": "solved", "passed": passed}]}]}  # fmt: skip
        r = httpx.post(f"{sent.api}/v1/runs/{run_id}/score", json=body, headers=_bearer(key))
        assert r.status_code == 200, r.text
        assert r.json()["missing"] == {} and len(r.json()["scores"]) == 1

    for key, team, passed in ((A_KEY, "a", True), (B_KEY, "b", False)):
        r = httpx.get(f"{sent.api}/api/v1/runs/{run_id}", headers=_bearer(key))
        assert r.status_code == 200, f"team {team} lost its run: {r.text}"
        run = r.json()
        assert (run["name"], run["manifest"], run["summary"]) == (
            f"nightly-{team}",
            {"team": team},
            {"passed": passed, "aggregates": {"team": team}},
        )
        listed = httpx.get(f"{sent.api}/api/v1/runs", headers=_bearer(key)).json()["runs"]
        assert [x["name"] for x in listed if x["run_id"] == run_id] == [f"nightly-{team}"]
        assert {x["project"] for x in listed} == {f"team-{team}"}
        assert {x["manifest"].get("team", team) for x in listed} == {team}

        def run_scores(key: str = key) -> list[dict[str, Any]]:
            return httpx.get(f"{sent.api}/api/v1/runs/{run_id}/scores", headers=_bearer(key)).json()["scores"]

        assert wait_until(lambda: len(run_scores()) == 1, timeout=30), run_scores()
        (score,) = run_scores()
        assert (score["project"], score["task_id"], score["passed"]) == (f"team-{team}", f"task-{team}", passed)


def test_without_auth_a_resource_may_name_its_project(tmp_path: Path) -> None:
    c = start_collector(tmp_path, serve_config(tmp_path / "store"))
    try:
        _send(HttpExporter(endpoint=c.http + "/v1/traces"), "solo", {"evalsi.project": "team-c"})
        assert wait_until(lambda: httpx.get(f"{c.api}/api/v1/traces/{SHARED_TRACE:032x}").status_code == 200)
        spans = httpx.get(f"{c.api}/api/v1/traces/{SHARED_TRACE:032x}").json()["spans"]
        assert spans[0]["resource_attributes"]["evalsi.project"] == "team-c"  # no credential: nothing to check
    finally:
        assert c.stop() == 0


def test_which_spans_are_stored_is_answered_within_the_askers_project(sent: Collector) -> None:
    """POST /api/v1/spans/stored (what `evalsi import` leaves out) never names another project's spans: it would
    tell a team which of another team's trace ids exist."""
    only_a = "0a" * 16
    span = {"traceId": only_a, "spanId": "0b" * 8, "name": "a-only", "kind": 1,
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000"}  # fmt: skip
    body = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [span]}]}]}
    r = httpx.post(sent.http + "/v1/traces", json=body, headers=_bearer(A_KEY))
    assert r.status_code == 200, r.text

    def stored(key: str) -> list[list[str]]:
        r = httpx.post(f"{sent.api}/api/v1/spans/stored", json={"trace_ids": [only_a]}, headers=_bearer(key))
        assert r.status_code == 200, r.text
        return r.json()["spans"]

    assert wait_until(lambda: stored(A_KEY) == [[only_a, "0b" * 8]], timeout=30)
    assert stored(B_KEY) == []


LATENCY_POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: every-trace}
spec:
  cascade:
    - ref: builtin/latency
      params: {max_ms: 60000}
"""


def test_online_scores_carry_their_traces_project_not_the_processors(tmp_path: Path) -> None:
    """The evaluate processor's `project` (here `default`) names only traces that have none: team a's trace is
    scored in team-a, where team a reads it and team b (or a `default` key) does not."""
    (tmp_path / "policy.yaml").write_text(LATENCY_POLICY)
    d_key, d_hash = new_key()
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {"policies": [str(tmp_path / "policy.yaml")]}
    cfg["service"]["pipelines"]["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    cfg["service"]["pipelines"]["scores"] = {"exporters": ["clickhouse"]}
    cfg["auth"] = {
        "mode": "strict",
        "api_keys": [
            {"hash": A_HASH, "name": "a", "project": "team-a"},
            {"hash": B_HASH, "name": "b", "project": "team-b"},
            {"hash": d_hash, "name": "d"},
        ],
    }
    c = start_collector(tmp_path, cfg)
    try:
        _send(HttpExporter(endpoint=c.http + "/v1/traces", headers=_bearer(A_KEY)), "a-scored")

        def scores(key: str) -> list[dict[str, Any]]:
            url = f"{c.api}/api/v1/scores?trace_id={SHARED_TRACE:032x}"
            return httpx.get(url, headers=_bearer(key)).json()["scores"]

        assert wait_until(lambda: len(scores(A_KEY)) == 1, timeout=30)
        assert scores(A_KEY)[0]["project"] == "team-a" and scores(A_KEY)[0]["evaluator"] == "builtin/latency"
        assert scores(B_KEY) == [] and scores(d_key) == []
        for key in (B_KEY, d_key):
            stats = httpx.get(f"{c.api}/api/v1/policies/stats?window=1h", headers=_bearer(key)).json()["stats"]
            assert stats == []
    finally:
        assert c.stop() == 0


COMPLAINTS_POLICY = """
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


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_another_projects_feedback_on_a_trace_id_runs_none_of_its_policy_stages(tmp_path: Path, workers: int) -> None:
    """Team b's negative feedback on team a's trace id neither scores nor promotes team a's trace (the late path
    is keyed by project and trace id); team a's own feedback then does, once, into a row that names team-a."""
    (tmp_path / "complaints.yaml").write_text(COMPLAINTS_POLICY)
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = workers
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {
        "policies": [str(tmp_path / "complaints.yaml")], "datasets_dir": str(tmp_path / "datasets"),
        "late_signals": {"window": "5m", "max_traces": 1000},
    }  # fmt: skip
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"processors": ["evaluate"], "exporters": ["clickhouse"]}
    cfg["auth"] = {
        "mode": "strict",
        "api_keys": [
            {"hash": A_HASH, "name": "a", "project": "team-a"},
            {"hash": B_HASH, "name": "b", "project": "team-b"},
        ],
    }
    c = start_collector(tmp_path, cfg)
    dataset = tmp_path / "datasets" / "complaints.jsonl"
    trace_id = f"{SHARED_TRACE:032x}"

    def metric(name: str) -> float:
        for line in httpx.get(c.metrics, headers=_bearer(A_KEY)).text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def complain(key: str) -> None:
        body = {"trace_id": trace_id, "name": "thumbs_up", "value": False}
        r = httpx.post(f"{c.api}/v1/feedback", json=body, headers=_bearer(key))
        assert r.status_code == 200, r.text

    def policy_scores(key: str) -> list[dict[str, Any]]:
        url = f"{c.api}/api/v1/scores?trace_id={trace_id}&policy=complaints"
        return httpx.get(url, headers=_bearer(key)).json()["scores"]

    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "support"}), id_generator=_FixedTrace())
        provider.add_span_processor(SimpleSpanProcessor(HttpExporter(c.http + "/v1/traces", headers=_bearer(A_KEY))))
        with provider.get_tracer("support.app").start_as_current_span("chat gpt-4o-mini") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "gpt-4o-mini")
            for attribute, role, text in (("input", "user", "Capital of France?"), ("output", "assistant", "Lyon")):
                message = [{"role": role, "parts": [{"type": "text", "content": text}]}]
                chat.set_attribute(f"gen_ai.{attribute}.messages", json.dumps(message))
        provider.shutdown()
        evaluated = 'evalsi_evaluate_traces_total{processor="evaluate"}'
        assert wait_until(lambda: metric(evaluated) == 1, timeout=30)

        complain(B_KEY)  # team b knows team a's trace id
        unmatched = 'evalsi_late_signals_unmatched_total{processor="evaluate",reason="unknown_trace"}'
        assert wait_until(lambda: metric(unmatched) == 1, timeout=15)  # not team b's trace: matched nothing
        assert policy_scores(A_KEY) == [] and not dataset.exists()

        complain(A_KEY)
        assert wait_until(dataset.exists, timeout=30)
        rows = [json.loads(line) for line in dataset.read_text().splitlines()]
        assert [(r["trace_id"], r["metadata"]["project"], r["output"]) for r in rows] == [(trace_id, "team-a", "Lyon")]
        assert wait_until(lambda: [s["name"] for s in policy_scores(A_KEY)] == ["latency"], timeout=15)
        assert policy_scores(B_KEY) == []
    finally:
        assert c.stop() == 0
