"""The `phoenix` pull receiver and exporter against a real `phoenix serve`: traces made with OpenInference's own
tracer (the client `phoenix.otel.register` sets up) are imported, normalized as OpenInference, evaluated by a policy,
and their scores read back from Phoenix as annotations on the same traces; a restart (clean or kill -9) in the middle
neither skips nor duplicates a trace or an annotation."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span
from phoenix_server import MISSING, PYTHON, installed, phoenix_server
from pydantic import ValidationError
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.collector.builtin import load_builtin_components
from evalsi.component import REGISTRY, Settings
from evalsi.exporters.phoenix import PhoenixConfig, PhoenixExporter, annotation_identifier
from evalsi.model.score import Score, ScoreBatch
from evalsi.receivers.pull.phoenix import PhoenixReceiver, PhoenixReceiverConfig, attributes, otlp_span
from evalsi.runtime.telemetry import SelfMetrics

POLICY = """apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: imported}
spec:
  selector: trace.service_name.startsWith('support-bot')
  sampling: {rate: 1.0}
  cascade:
    - ref: builtin/latency
      params: {max_ms: 60000}
    - ref: builtin/tokens
      params: {max_total: 20000}
"""

# OpenInference's tracer and an OTLP exporter to Phoenix, the project named by the resource: what
# `phoenix.otel.register(project_name=..., endpoint=...)` sets up (importing `phoenix.otel` loads the whole server
# package, ~15 s, so the parts are used directly)
MAKE_TRACES = """
import sys
from openinference.instrumentation import TracerProvider
from openinference.semconv.resource import ResourceAttributes
from openinference.semconv.trace import SpanAttributes
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

provider = TracerProvider(resource=Resource({ResourceAttributes.PROJECT_NAME: sys.argv[2]}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(sys.argv[1] + "/v1/traces")))
tracer = provider.get_tracer("support-bot")

@tracer.tool
def get_weather(location: str) -> str:
    return f"sunny in {location}"

@tracer.agent
def agent(question: str) -> str:
    with tracer.start_as_current_span("chat", openinference_span_kind="llm") as span:
        span.set_input(question)
        span.set_attribute(SpanAttributes.LLM_MODEL_NAME, "gpt-4o-mini")
        span.set_attribute("llm.input_messages.0.message.role", "user")
        span.set_attribute("llm.input_messages.0.message.content", question)
        span.set_attribute("llm.output_messages.0.message.role", "assistant")
        span.set_attribute("llm.output_messages.0.message.content", "calling get_weather")
        span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_PROMPT, 10)
        span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_COMPLETION, 5)
        span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_TOTAL, 15)
        span.set_output("calling get_weather")
    return get_weather("Paris")

for i in range(int(sys.argv[3])):
    agent(f"weather in Paris? {sys.argv[4]} {i}")
provider.shutdown()
"""


@pytest.fixture(scope="module")
def phoenix_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not installed():
        pytest.skip(MISSING)
    with phoenix_server(tmp_path_factory.mktemp("phoenix")) as url:
        yield url


def make_traces(url: str, project: str, n: int, tag: str) -> list[str]:
    """`n` traces of an agent (AGENT root, LLM, TOOL) made by OpenInference's tracer, in another process; waits
    until Phoenix has stored them all, and returns every trace id of the project."""
    before = len(trace_ids(url, project))
    subprocess.run([str(PYTHON), "-c", textwrap.dedent(MAKE_TRACES), url, project, str(n), tag], check=True)
    assert wait_until(lambda: len(complete_traces(url, project)) == before + n, 30)
    return trace_ids(url, project)


def listed_traces(url: str, project: str) -> list[dict[str, Any]]:
    """The project's traces as Phoenix lists them; none while it has not made the project yet (it answers 404, or
    briefly something that is not the JSON list, while it ingests the project's first spans)."""
    resp = httpx.get(f"{url}/v1/projects/{project}/traces")
    if resp.status_code != 200:
        return []
    data: list[dict[str, Any]] = resp.json()["data"]
    return data


def complete_traces(url: str, project: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{url}/v1/projects/{project}/traces", params={"limit": 1000, "include_spans": "true"})
    if resp.status_code == 404:
        return []
    return [t for t in resp.json()["data"] if len(t["spans"]) == 3]


def trace_ids(url: str, project: str) -> list[str]:
    return [t["trace_id"] for t in complete_traces(url, project)]


def annotations(url: str, project: str, trace_id: str) -> list[tuple[str, Any, str]]:
    """(name, score, annotator kind) of the annotations on a trace and on its spans, read through Phoenix's API."""
    spans = httpx.get(f"{url}/v1/projects/{project}/spans", params={"trace_id": trace_id}).json()["data"]
    span_ids = [s["context"]["span_id"] for s in spans]
    found = httpx.get(f"{url}/v1/projects/{project}/trace_annotations", params={"trace_ids": [trace_id]}).json()
    on_spans = httpx.get(f"{url}/v1/projects/{project}/span_annotations", params={"span_ids": span_ids}).json()
    return sorted((a["name"], a["result"]["score"], a["annotator_kind"]) for a in found["data"] + on_spans["data"])


def scored_back(url: str, project: str, ids: list[str]) -> bool:
    return all({n for n, _, _ in annotations(url, project, t)} >= {"latency", "tokens"} for t in ids)


def config(tmp: Path, url: str, project: str, workers: int) -> dict[str, Any]:
    (tmp / "policy.yaml").write_text(POLICY)
    cfg = serve_config(tmp / "store")
    cfg["receivers"] = {
        "phoenix": {"endpoint": url, "projects": [project], "poll_interval": "300ms", "lookback": "1h", "settle": "1s"}
    }
    cfg["processors"] = {
        "normalize": {},
        "tail_sampling": {"decision_wait": "300ms"},
        "evaluate": {"policies": [str(tmp / "policy.yaml")]},
    }
    cfg["exporters"]["phoenix"] = {"endpoint": url}
    cfg["service"]["pipelines"] = {
        "traces": {
            "receivers": ["phoenix"],
            "processors": ["normalize", "tail_sampling", "evaluate"],
            "exporters": ["clickhouse"],
        },
        "scores": {"exporters": ["clickhouse", "phoenix"]},
    }
    cfg["service"]["workers"] = workers
    return cfg


def stored(c: Collector) -> dict[str, int]:
    traces = httpx.get(c.api + "/api/v1/traces?limit=1000").json()["traces"]
    return {t["trace_id"]: t["span_count"] for t in traces}


def metric(c: Collector, name: str) -> float:
    for line in httpx.get(c.metrics).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("workers", [1, 2])
def test_traces_made_with_openinference_are_imported_evaluated_and_annotated_back(
    tmp_path: Path, phoenix_url: str, workers: int
) -> None:
    project = f"support-bot-{uuid.uuid4().hex[:8]}"
    ids = make_traces(phoenix_url, project, 3, "a")
    assert len(ids) == 3
    c = start_collector(tmp_path, config(tmp_path, phoenix_url, project, workers))
    try:
        assert wait_until(lambda: len(stored(c)) == 3 and all(n == 3 for n in stored(c).values()), 60), stored(c)
        assert set(stored(c)) == set(ids)  # Phoenix's trace ids, so scores go back on the very traces
        trace = httpx.get(c.api + f"/api/v1/traces/{ids[0]}").json()["spans"]
        by_type = {s["step_type"]: s for s in trace}
        assert set(by_type) == {"agent", "llm", "tool"}  # OpenInference span kinds, read by its mapper
        assert {s["convention"] for s in trace} == {"openinference"}
        llm = by_type["llm"]
        assert (llm["input_tokens"], llm["output_tokens"]) == (10, 5)
        assert llm["model"] == "gpt-4o-mini"
        assert by_type["tool"]["tool_name"] == "get_weather"
        assert by_type["llm"]["attributes"]["openinference.span.kind"] == "LLM"  # the source's attributes kept
        assert wait_until(lambda: scored_back(phoenix_url, project, ids), 60), [
            annotations(phoenix_url, project, t) for t in ids
        ]
        for t in ids:  # the trace's tokens, as OpenInference recorded them, written by code
            assert [(s, k) for n, s, k in annotations(phoenix_url, project, t) if n == "tokens"] == [(15.0, "CODE")]
        assert metric(c, "evalsi_pull_traces_total") == 3
        # pipeline workers report their counts every second
        assert wait_until(lambda: metric(c, "evalsi_evaluate_traces_total") == 3, 10), metric(
            c, "evalsi_evaluate_traces_total"
        )
    finally:
        c.stop()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["clean stop", "kill -9"])
def test_a_restart_in_the_middle_neither_skips_nor_duplicates(
    tmp_path: Path, phoenix_url: str, stop: signal.Signals
) -> None:
    project = f"support-bot-{uuid.uuid4().hex[:8]}"
    first = make_traces(phoenix_url, project, 3, "before")
    cfg = config(tmp_path, phoenix_url, project, 1)
    c = start_collector(tmp_path, cfg)
    try:
        assert wait_until(lambda: scored_back(phoenix_url, project, first), 60)
        # the store writes what is short of a batch within its flush_interval: the stop comes once it holds the
        # three traces, so a kill -9 leaves them in the store, where the restart finds them
        assert wait_until(lambda: len(stored(c)) == 3, 30)
    finally:
        c.stop(stop)
    ids = make_traces(phoenix_url, project, 2, "while down")
    assert len(ids) == 5
    c = start_collector(tmp_path, cfg)
    try:
        assert wait_until(lambda: scored_back(phoenix_url, project, ids), 60), [
            annotations(phoenix_url, project, t) for t in ids
        ]
        assert wait_until(lambda: len(stored(c)) == 5, 30)
        assert stored(c) == {t: 3 for t in ids}  # every span once
        for t in ids:  # one annotation of each name per trace, in Phoenix too
            names = [n for n, _, _ in annotations(phoenix_url, project, t)]
            assert sorted(names) == ["latency", "tokens"], names
        if stop == signal.SIGTERM:  # the watermark was kept: the second run read only the new traces
            assert metric(c, "evalsi_pull_traces_total") == 2
        else:  # read again from the last kept watermark: what the store held was left out, not stored twice
            assert metric(c, "evalsi_pull_traces_total") >= 2
        # pipeline workers report their counts every second
        wait_until(lambda: metric(c, "evalsi_evaluate_traces_total") == 2, 10)
        assert metric(c, "evalsi_evaluate_traces_total") == 2  # the three of the first run are not evaluated again
    finally:
        c.stop()


def test_a_score_phoenix_refuses_is_dropped_alone_and_a_replay_adds_no_annotation(phoenix_url: str) -> None:
    project = f"support-bot-{uuid.uuid4().hex[:8]}"
    trace_id = make_traces(phoenix_url, project, 1, "x")[0]
    spans = httpx.get(f"{phoenix_url}/v1/projects/{project}/spans", params={"trace_id": trace_id}).json()["data"]
    llm = next(s for s in spans if s["span_kind"] == "LLM")["context"]["span_id"]
    scores = [
        Score("relevance", value=0.5, explanation="half", trace_id=trace_id, span_id=llm, source="llm_judge"),
        Score("note", value=1.0, trace_id=trace_id),  # a name Phoenix keeps for notes: refused (400)
        Score("safe", passed=True, trace_id=trace_id, policy="p", evaluator="builtin/safe"),
        Score("skipped", outcome="skipped", reason="no content", trace_id=trace_id),
    ]
    metrics = SelfMetrics()
    retry = {"initial_interval": "10ms", "max_interval": "50ms", "max_elapsed_time": "5s"}
    cfg = PhoenixConfig(endpoint=phoenix_url, flush_interval="10ms", retry_on_failure=retry)
    settings = Settings("phoenix", metrics, logging.getLogger("test.phoenix"))

    async def send(batch: list[Score]) -> None:
        exp = PhoenixExporter(cfg, settings)
        await exp.start()
        await exp.consume_scores(ScoreBatch(batch))
        await exp.shutdown()

    asyncio.run(send(scores))
    asyncio.run(send(scores[:1]))  # a replay, by another exporter (as after a restart)
    assert annotations(phoenix_url, project, trace_id) == [("relevance", 0.5, "LLM"), ("safe", 1.0, "CODE")]
    on_span = httpx.get(f"{phoenix_url}/v1/projects/{project}/span_annotations", params={"span_ids": [llm]}).json()
    (relevance,) = on_span["data"]
    assert relevance["identifier"] == annotation_identifier(scores[0])
    assert relevance["result"] == {"score": 0.5, "label": None, "explanation": "half"}
    on_trace = httpx.get(f"{phoenix_url}/v1/projects/{project}/trace_annotations", params={"trace_ids": [trace_id]})
    (safe,) = on_trace.json()["data"]
    assert safe["result"]["label"] == "pass" and safe["metadata"]["evalsi.evaluator"] == "builtin/safe"
    sample = metrics.registry.get_sample_value
    refused = {"exporter": "phoenix", "kind": "scores", "reason": "invalid"}
    assert sample("evalsi_exporter_items_refused_total", refused) == 1
    assert sample("otelcol_exporter_sent_scores_total", {"exporter": "phoenix"}) == 3  # 2, then the replay's 1


def test_phoenix_span_json_becomes_the_otlp_span_its_sender_wrote() -> None:
    span = otlp_span(
        {
            "name": "retrieve",
            "context": {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"},
            "span_kind": "RETRIEVER",
            "parent_id": "00f067aa0ba902b7",
            "start_time": "2026-12-02T08:16:31.904091+00:00",
            "end_time": "2026-12-02T08:16:32.000001Z",
            "status_code": "ERROR",
            "status_message": "boom",
            "attributes": {
                "retrieval.documents": [{"document": {"content": "a", "metadata": {"source": "wiki"}}}],
                "tool.parameters.properties.q.type": "string",
                "metadata": {"user": "u1"},
                "llm.token_count.prompt": 3,
                "tags": ["a", "b"],
            },
            "events": [{"name": "exception", "timestamp": "2026-12-02T08:16:31.95Z", "attributes": {"x": 1}}],
        }
    )
    assert span.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c" and span.parent_span_id.hex() == "00f067aa0ba902b7"
    assert span.start_time_unix_nano == 1796199391904091000 and span.end_time_unix_nano == 1796199392000001000
    assert span.status.code == 2 and span.status.message == "boom"
    attrs = {kv.key: kv.value for kv in span.attributes}
    assert attrs["openinference.span.kind"].string_value == "RETRIEVER"
    assert attrs["retrieval.documents.0.document.content"].string_value == "a"
    assert attrs["retrieval.documents.0.document.metadata"].string_value == '{"source": "wiki"}'
    assert attrs["tool.parameters"].string_value == '{"properties": {"q": {"type": "string"}}}'
    assert attrs["metadata"].string_value == '{"user": "u1"}'
    assert attrs["llm.token_count.prompt"].int_value == 3
    assert [v.string_value for v in attrs["tags"].array_value.values] == ["a", "b"]
    assert span.events[0].name == "exception" and span.events[0].time_unix_nano == 1796199391950000000
    # a span sent without OpenInference's kind is left to the other conventions' mappers
    assert "openinference.span.kind" not in attributes({"span_kind": "UNKNOWN", "attributes": {"gen_ai.system": "x"}})


@pytest.mark.parametrize(
    "receiver, error",
    [
        ({"endpoint": "phoenix:6006", "projects": ["a"]}, "unsupported endpoint"),
        ({"endpoint": "http://phoenix:6006", "projects": []}, "at least 1"),
        ({"endpoint": "http://phoenix:6006", "projects": ["a", "a"]}, "listed twice"),
        ({"endpoint": "http://phoenix:6006", "projects": [" "]}, "is empty"),
        ({"endpoint": "http://phoenix:6006", "projects": ["a/b"]}, "give its id"),
        ({"endpoint": "http://phoenix:6006", "projects": ["a"], "settle": "-1s"}, "invalid duration"),
        ({"endpoint": "http://phoenix:6006", "projects": ["a"], "poll_interval": "0s"}, "more than 0"),
    ],
)
def test_config_errors_say_what_to_fix(receiver: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        PhoenixReceiverConfig(**receiver)


def test_exporter_config_errors_and_registration() -> None:
    with pytest.raises(ValidationError, match="unsupported endpoint"):
        PhoenixConfig(endpoint="phoenix:6006")
    load_builtin_components()
    assert REGISTRY[("receiver", "phoenix")].cls is PhoenixReceiver
    exporter = REGISTRY[("exporter", "phoenix")]
    assert exporter.cls is PhoenixExporter and set(exporter.signals) == {"scores"}


def test_a_project_phoenix_lacks_is_logged_and_read_once_it_exists(tmp_path: Path, phoenix_url: str) -> None:
    project = f"support-bot-{uuid.uuid4().hex[:8]}"
    c = start_collector(tmp_path, config(tmp_path, phoenix_url, project, 1))
    try:
        assert wait_until(lambda: any("no project" in str(e.get("msg", "")) for e in c.logs()), 30)
        ids = make_traces(phoenix_url, project, 1, "late")
        assert wait_until(lambda: set(stored(c)) == set(ids), 30), stored(c)
    finally:
        c.stop()


def post_spans(url: str, project: str, spans: list[Span]) -> None:
    """Spans sent straight to Phoenix's OTLP/HTTP endpoint, as any OpenInference exporter sends them."""
    resource = ResourceSpans()
    resource.resource.attributes.add(key="openinference.project.name").value.string_value = project
    resource.scope_spans.add().spans.extend(spans)
    body = ExportTraceServiceRequest(resource_spans=[resource]).SerializeToString()
    resp = httpx.post(url + "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"})
    assert resp.status_code == 200, resp.text


def oi_span(trace_id: bytes, span_id: bytes, parent: bytes, kind: str, start_s: float) -> Span:
    span = Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=kind.lower())
    span.start_time_unix_nano = int(start_s * 1e9)
    span.end_time_unix_nano = int((start_s + 0.5) * 1e9)
    span.attributes.add(key="openinference.span.kind").value.string_value = kind
    return span


def test_a_trace_whose_root_phoenix_lacks_waits_for_it_and_later_ones_go_on(tmp_path: Path, phoenix_url: str) -> None:
    project = f"support-bot-{uuid.uuid4().hex[:8]}"
    now = time.time()
    running, root_id, done = os.urandom(16), os.urandom(8), os.urandom(16)
    post_spans(phoenix_url, project, [oi_span(running, os.urandom(8), root_id, "LLM", now - 5)])  # its root still runs
    post_spans(phoenix_url, project, [oi_span(done, os.urandom(8), b"", "AGENT", now - 4)])  # started later, complete
    assert wait_until(lambda: len(listed_traces(phoenix_url, project)) == 2, 30)
    c = start_collector(tmp_path, config(tmp_path, phoenix_url, project, 1))
    try:
        assert wait_until(lambda: done.hex() in stored(c), 30)  # read ahead of the running one
        time.sleep(1.5)  # several polls
        assert running.hex() not in stored(c)
        post_spans(phoenix_url, project, [oi_span(running, root_id, b"", "AGENT", now - 6)])  # the root ends
        assert wait_until(lambda: stored(c).get(running.hex()) == 2, 30), stored(c)
        assert stored(c) == {done.hex(): 1, running.hex(): 2}

        # latency only: these spans carry no token counts, so `tokens` is skipped (not an annotation)
        def names() -> dict[str, list[str]]:
            return {t: [n for n, _, _ in annotations(phoenix_url, project, t)] for t in (running.hex(), done.hex())}

        assert wait_until(lambda: names() == {running.hex(): ["latency"], done.hex(): ["latency"]}, 30), names()
        assert metric(c, "evalsi_pull_traces_total") == 2
    finally:
        c.stop()


def test_a_score_for_a_trace_phoenix_does_not_have_yet_is_written_once_it_arrives(phoenix_url: str) -> None:
    project = f"support-bot-{uuid.uuid4().hex[:8]}"
    trace_id = os.urandom(16)
    retry = {"initial_interval": "100ms", "max_interval": "300ms", "max_elapsed_time": "20s"}
    cfg = PhoenixConfig(endpoint=phoenix_url, flush_interval="10ms", retry_on_failure=retry)
    metrics = SelfMetrics()

    async def send() -> None:
        exp = PhoenixExporter(cfg, Settings("phoenix", metrics, logging.getLogger("test.phoenix")))
        await exp.start()
        await exp.consume_scores(ScoreBatch([Score("latency", value=1.5, trace_id=trace_id.hex())]))
        await asyncio.sleep(1)  # answered 404 meanwhile: retried, not dropped
        span = oi_span(trace_id, os.urandom(8), b"", "AGENT", time.time() - 2)
        await asyncio.to_thread(post_spans, phoenix_url, project, [span])
        await exp.shutdown()  # sends what it holds: the retried annotation, now that its trace is there

    asyncio.run(send())
    assert annotations(phoenix_url, project, trace_id.hex()) == [("latency", 1.5, "CODE")]
    assert metrics.registry.get_sample_value("otelcol_exporter_sent_scores_total", {"exporter": "phoenix"}) == 1


def test_evalsi_import_phoenix_counts_on_a_dry_run_and_lands_the_same_counts_once(
    tmp_path: Path, phoenix_url: str
) -> None:
    """`evalsi import phoenix`: a one-off backfill through the config's pipeline (an in-process collector here)."""
    project = f"support-bot-{uuid.uuid4().hex[:8]}"
    ids = make_traces(phoenix_url, project, 2, "backfill")
    cfg = config(tmp_path, phoenix_url, project, 1)
    cfg["receivers"] = serve_config(tmp_path / "store")["receivers"]  # the import hands its spans to the otlp one
    cfg["service"]["pipelines"]["traces"]["receivers"] = ["otlp"]
    config_path = tmp_path / "import.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    evalsi = [str(Path(sys.executable).parent / "evalsi")]

    def run_import(*extra: str) -> dict[str, Any]:
        args = ["import", "phoenix", "--endpoint", phoenix_url, "-p", project, "--since", "1h", "--settle", "0s"]
        res = subprocess.run(
            [*evalsi, *args, "--json", "-c", str(config_path), *extra],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        return dict(json.loads(res.stdout))

    def stored_traces() -> dict[str, int]:
        res = subprocess.run(
            [*evalsi, "traces", "list", "--json", "-c", str(config_path)], capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stderr
        return {t["trace_id"]: t["span_count"] for t in json.loads(res.stdout)}

    dry = run_import("--dry-run")
    assert (dry["traces"], dry["spans"], dry["sent"], dry["dry_run"]) == (2, 6, 0, True)
    assert not (tmp_path / "store").exists() or stored_traces() == {}
    assert all(annotations(phoenix_url, project, t) == [] for t in ids)

    done = run_import()
    assert (done["traces"], done["spans"], done["sent"], done["stored_already"]) == (2, 6, 6, 0)
    assert stored_traces() == dict.fromkeys(ids, 3)
    assert scored_back(phoenix_url, project, ids)  # the config's policy scored them; its phoenix exporter wrote them

    again = run_import()
    assert (again["traces"], again["sent"], again["stored_already"]) == (2, 0, 6)
    assert stored_traces() == dict.fromkeys(ids, 3)
