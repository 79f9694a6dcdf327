"""The `mlflow` pull receiver against a real `mlflow server`: traces made with MLflow's own client are imported,
normalized as MLflow's convention, evaluated by a policy, and their scores read back from MLflow on the same traces;
a restart (clean or kill -9) in the middle neither skips nor duplicates a trace or a score."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from captures import texts
from running_collector import Collector, serve_config, start_collector, wait_until

import evalsi.processors.normalize.mlflow  # noqa: F401  (registers the mapper)
from evalsi.model.span import Span
from evalsi.processors.normalize import normalize_span
from evalsi.receivers.otlp.decode import decode_traces_protobuf

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

MAKE_TRACES = """
import sys, mlflow
mlflow.set_tracking_uri(sys.argv[1])
mlflow.set_experiment(sys.argv[2])

@mlflow.trace(span_type="TOOL")
def get_weather(location: str) -> str:
    return f"sunny in {location}"

@mlflow.trace(span_type="AGENT")
def agent(question: str) -> str:
    with mlflow.start_span(name="chat", span_type="CHAT_MODEL") as s:
        s.set_inputs({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}]})
        s.set_outputs({"choices": [{"message": {"role": "assistant", "content": "calling get_weather"}}]})
        s.set_attribute("mlflow.chat.tokenUsage", {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15})
    return get_weather("Paris")

for i in range(int(sys.argv[3])):
    agent(f"weather in Paris? {sys.argv[4]} {i}")
mlflow.flush_trace_async_logging()
"""


def mlflow_client(uri: str) -> Any:
    """MLflow's client, imported when a test uses it (mlflow takes ~2 s to import, in every xdist worker)."""
    from mlflow import MlflowClient

    return MlflowClient(uri)


def make_traces(uri: str, experiment: str, n: int, tag: str) -> None:
    """`n` traces of an agent (AGENT root, CHAT_MODEL, TOOL) made by MLflow's own client, in another process."""
    script = textwrap.dedent(MAKE_TRACES)
    subprocess.run([sys.executable, "-c", script, uri, experiment, str(n), tag], check=True, timeout=120)


def mlflow_trace_ids(uri: str, experiment: str) -> list[str]:
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    return [t.info.trace_id for t in client.search_traces(locations=[exp.experiment_id], max_results=500)]


def assessments(uri: str, trace_id: str) -> list[tuple[str, Any]]:
    trace = mlflow_client(uri).get_trace(trace_id)
    return sorted((a.name, a.value) for a in trace.info.assessments)


def config(tmp: Path, uri: str, experiment: str, workers: int) -> dict[str, Any]:
    (tmp / "policy.yaml").write_text(POLICY)
    cfg = serve_config(tmp / "store")
    cfg["receivers"] = {
        "mlflow": {"tracking_uri": uri, "experiments": [experiment], "poll_interval": "300ms", "lookback": "1h"}
    }
    cfg["processors"] = {
        "normalize": {},
        "tail_sampling": {"decision_wait": "300ms"},
        "evaluate": {"policies": [str(tmp / "policy.yaml")]},
    }
    cfg["exporters"]["mlflow"] = {"tracking_uri": uri, "trace_wait": "30s"}
    cfg["service"]["pipelines"] = {
        "traces": {
            "receivers": ["mlflow"],
            "processors": ["normalize", "tail_sampling", "evaluate"],
            "exporters": ["clickhouse"],
        },
        "scores": {"exporters": ["clickhouse", "mlflow"]},
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


def scored_back(uri: str, ids: list[str]) -> bool:
    return all({n for n, _ in assessments(uri, t)} >= {"latency", "tokens"} for t in ids)


@pytest.mark.parametrize("workers", [1, 2])
def test_traces_made_with_mlflow_are_imported_evaluated_and_scored_back(
    tmp_path: Path, mlflow_uri: str, workers: int
) -> None:
    experiment = f"support-bot-{uuid.uuid4().hex[:8]}"
    make_traces(mlflow_uri, experiment, 3, "a")
    ids = mlflow_trace_ids(mlflow_uri, experiment)
    assert len(ids) == 3
    c = start_collector(tmp_path, config(tmp_path, mlflow_uri, experiment, workers))
    try:
        assert wait_until(lambda: len(stored(c)) == 3 and all(n == 3 for n in stored(c).values()), 60), stored(c)
        # the same trace ids as in MLflow (tr-<hex>), so scores go back on the very traces
        assert set(stored(c)) == {t.removeprefix("tr-") for t in ids}
        trace = httpx.get(c.api + f"/api/v1/traces/{ids[0].removeprefix('tr-')}").json()["spans"]
        by_type = {s["step_type"]: s for s in trace}
        assert set(by_type) == {"agent", "llm", "tool"}  # MLflow's span types, read by its mapper
        assert {s["convention"] for s in trace} == {"mlflow"}
        llm = by_type["llm"]
        assert (llm["input_tokens"], llm["output_tokens"]) == (10, 5)
        assert by_type["tool"]["tool_name"] == "get_weather"
        # the source's attributes kept, in the form MLflow's OTLP export sends them (JSON-encoded)
        assert by_type["llm"]["attributes"]["mlflow.spanType"] == '"CHAT_MODEL"'
        assert wait_until(lambda: scored_back(mlflow_uri, ids), 60), [assessments(mlflow_uri, t) for t in ids]
        for t in ids:  # the tokens of the CHAT_MODEL span, as MLflow recorded them
            assert [v for n, v in assessments(mlflow_uri, t) if n == "tokens"] == [15]
        assert metric(c, "evalsi_pull_traces_total") == 3
        # pipeline workers report their counts every second
        wait_until(lambda: metric(c, "evalsi_evaluate_traces_total") == 3, 10)
        assert metric(c, "evalsi_evaluate_traces_total") == 3
    finally:
        c.stop()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["clean stop", "kill -9"])
def test_a_restart_in_the_middle_neither_skips_nor_duplicates(
    tmp_path: Path, mlflow_uri: str, stop: signal.Signals
) -> None:
    experiment = f"support-bot-{uuid.uuid4().hex[:8]}"
    make_traces(mlflow_uri, experiment, 3, "before")
    cfg = config(tmp_path, mlflow_uri, experiment, 1)
    c = start_collector(tmp_path, cfg)
    first = mlflow_trace_ids(mlflow_uri, experiment)
    try:
        assert wait_until(lambda: scored_back(mlflow_uri, first), 60)
        # the store writes what is short of a batch within its flush_interval: the stop comes once it holds the
        # three traces, so a kill -9 leaves them in the store, where the restart finds them
        assert wait_until(lambda: len(stored(c)) == 3, 30)
    finally:
        c.stop(stop)
    make_traces(mlflow_uri, experiment, 2, "while down")
    ids = mlflow_trace_ids(mlflow_uri, experiment)
    assert len(ids) == 5
    c = start_collector(tmp_path, cfg)
    try:
        assert wait_until(lambda: scored_back(mlflow_uri, ids), 60), [assessments(mlflow_uri, t) for t in ids]
        assert wait_until(lambda: len(stored(c)) == 5, 30)
        assert stored(c) == {t.removeprefix("tr-"): 3 for t in ids}  # every span once
        for t in ids:  # one score of each name per trace, in MLflow too
            names = [n for n, _ in assessments(mlflow_uri, t)]
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


def test_evalsi_import_counts_on_a_dry_run_and_lands_the_same_counts_once(tmp_path: Path, mlflow_uri: str) -> None:
    """`evalsi import mlflow`: a one-off backfill through the config's pipeline (an in-process collector here)."""
    experiment = f"support-bot-{uuid.uuid4().hex[:8]}"
    make_traces(mlflow_uri, experiment, 2, "backfill")
    ids = mlflow_trace_ids(mlflow_uri, experiment)
    cfg = config(tmp_path, mlflow_uri, experiment, 1)
    cfg["receivers"] = serve_config(tmp_path / "store")["receivers"]  # the import hands its spans to the otlp one
    cfg["service"]["pipelines"]["traces"]["receivers"] = ["otlp"]
    config_path = tmp_path / "import.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    evalsi = [str(Path(sys.executable).parent / "evalsi")]

    def run_import(*extra: str) -> dict[str, Any]:
        args = ["import", "mlflow", "--tracking-uri", mlflow_uri, "-e", experiment, "--since", "1h", "--json"]
        res = subprocess.run(
            [*evalsi, *args, "-c", str(config_path), *extra], capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def stored_traces() -> dict[str, int]:
        res = subprocess.run(
            [*evalsi, "traces", "list", "--json", "-c", str(config_path)], capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stderr
        return {t["trace_id"]: t["span_count"] for t in json.loads(res.stdout)}

    dry = run_import("--dry-run")
    assert (dry["traces"], dry["spans"], dry["sent"], dry["dry_run"]) == (2, 6, 0, True)
    assert not (tmp_path / "store").exists() or stored_traces() == {}
    assert all(assessments(mlflow_uri, t) == [] for t in ids)

    done = run_import()
    assert (done["traces"], done["spans"], done["sent"], done["stored_already"]) == (2, 6, 6, 0)
    assert stored_traces() == {t.removeprefix("tr-"): 3 for t in ids}
    assert scored_back(mlflow_uri, ids)  # the config's policy scored them; its mlflow exporter wrote them back

    again = run_import()
    assert (again["traces"], again["sent"], again["stored_already"]) == (2, 0, 6)
    assert stored_traces() == {t.removeprefix("tr-"): 3 for t in ids}
    assert all(sorted(n for n, _ in assessments(mlflow_uri, t)) == ["latency", "tokens"] for t in ids)


# --- the REST form read as the OTLP form ---------------------------------------------------------------------

BOTH_FORMS = """
import sys, mlflow
mlflow.set_tracking_uri(sys.argv[1])
mlflow.set_experiment(sys.argv[2])

@mlflow.trace(span_type="TOOL")
def lookup(city: str) -> str:
    return f"{city} is the capital of France"

@mlflow.trace(span_type="AGENT")
def agent(question: str) -> str:
    mlflow.update_current_trace(metadata={"mlflow.trace.session": "sess-" + sys.argv[3], "mlflow.trace.user": "alice"})
    with mlflow.start_span(name="plain", span_type="CHAT_MODEL") as s:
        s.set_inputs("what is the capital of France?")
        s.set_outputs("Paris is the capital.")
        s.set_attribute("mlflow.chat.tokenUsage", {"input_tokens": 7, "output_tokens": 4, "total_tokens": 11})
    with mlflow.start_span(name="object", span_type="CHAT_MODEL") as s:
        s.set_inputs({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}]})
        s.set_outputs({"choices": [{"message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop"}]})
    lookup("Paris")
    return '{"answer": "Paris"}'  # a JSON string: the answer is this text, not the object it encodes

with mlflow.start_span(name="plain root", span_type="CHAIN") as root:
    root.set_inputs("capital of France?")
    root.set_outputs("Paris.")
agent("capital of France?")
mlflow.flush_trace_async_logging()
"""


@contextlib.contextmanager
def otlp_sink() -> Iterator[tuple[str, list[bytes]]]:
    """An OTLP/HTTP endpoint keeping every request body it is sent: yields its traces URL and the bodies."""
    bodies: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", bodies
    finally:
        server.shutdown()
        server.server_close()


def write_both_ways(uri: str, experiment: str, otlp_traces_url: str, tag: str) -> None:
    """The traces of BOTH_FORMS, written by MLflow's own client to the tracking server and, the same spans, exported
    by it over OTLP/HTTP (protobuf) to `otlp_traces_url`."""
    env = {
        **os.environ,
        "MLFLOW_TRACE_ENABLE_OTLP_DUAL_EXPORT": "true",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp_traces_url,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    script = textwrap.dedent(BOTH_FORMS)
    subprocess.run([sys.executable, "-c", script, uri, experiment, tag], check=True, timeout=120, env=env)


def pulled(uri: str, experiment: str) -> bytes:
    """The experiment's traces as the `mlflow` receiver reads them (its source: search, then batchGet)."""
    from evalsi.receivers.pull.mlflow import MlflowSource

    async def read() -> bytes:
        async with httpx.AsyncClient(base_url=uri, timeout=30) as client:
            source = MlflowSource(client, uri, experiment)
            page = await source.list_since(0, 100, None)
            return await source.fetch(page.traces)

    return asyncio.run(read())


def read_spans(*bodies: bytes) -> dict[str, Span]:
    """OTLP/protobuf request bodies decoded and normalized: spans by span id."""
    out: dict[str, Span] = {}
    for body in bodies:
        decoded = decode_traces_protobuf(body)
        assert decoded.rejected == 0, decoded.message
        for span in decoded.batch:
            normalize_span(span)
            out[span.span_id] = span
    return out


def test_content_pulled_over_rest_reads_as_the_same_spans_exported_over_otlp(mlflow_uri: str) -> None:
    """MLflow's REST API hands attribute values decoded (a string as itself, an object as a key-value list) where
    its OTLP export sends their JSON text: read from either, every span's content is the same."""
    experiment = f"both-forms-{uuid.uuid4().hex[:8]}"
    with otlp_sink() as (url, bodies):
        write_both_ways(mlflow_uri, experiment, url, "1")
    exported = read_spans(*bodies)
    imported = read_spans(pulled(mlflow_uri, experiment))
    assert set(imported) == set(exported) and len(imported) == 5
    for span_id, want in exported.items():
        got = imported[span_id]
        assert got.convention == want.convention == "mlflow"
        for field in ("step_type", "input", "output", "model", "tool_name", "input_tokens", "output_tokens"):
            assert getattr(got, field) == getattr(want, field), (want.name, field)
        assert got.unparsed == want.unparsed == [], want.name
    by_name = {s.name: s for s in imported.values()}
    assert texts(by_name["plain"].input) == ["what is the capital of France?"]  # text, not unparsed
    assert texts(by_name["plain root"].output) == ["Paris."]
    assert texts(by_name["agent"].output) == ['{"answer": "Paris"}']  # the JSON string as written, 19 characters


def test_session_and_user_come_from_the_trace_metadata(mlflow_uri: str) -> None:
    experiment = f"both-forms-{uuid.uuid4().hex[:8]}"
    with otlp_sink() as (url, _):
        write_both_ways(mlflow_uri, experiment, url, "2")
    spans = read_spans(pulled(mlflow_uri, experiment))
    agent = next(s for s in spans.values() if s.name == "agent")
    assert (agent.session_id, agent.user_id) == ("sess-2", "alice")
    plain_root = next(s for s in spans.values() if s.name == "plain root")  # a trace with no session
    assert (plain_root.session_id, plain_root.user_id) == (None, None)


SAME_SCORES_POLICY = """apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: both-ways}
spec:
  selector: 'true'
  sampling: {rate: 1.0}
  cascade:
    - ref: builtin/length
    - ref: builtin/json-valid
    - ref: builtin/contains
      params: {any: [Paris]}
    - ref: builtin/regex
      params: {pattern: '^Paris'}
    - ref: builtin/tokens
      params: {max_total: 20000}
    - ref: builtin/latency
      params: {max_ms: 60000}
    - ref: builtin/refusal
    - ref: builtin/prompt-injection
    - ref: builtin/pii-leak
    - ref: builtin/tool-call-error-rate
"""


def scores_of(c: Collector) -> dict[tuple[str, str, str], tuple[Any, ...]]:
    """Every stored score: (trace, span, name) -> what it says."""
    scores = httpx.get(c.api + "/api/v1/scores?limit=1000").json()["scores"]
    return {
        (s["trace_id"], s["span_id"], s["name"]): (s["value"], s["passed"], s["label"], s["outcome"], s["reason"])
        for s in scores
    }


def test_one_trace_pulled_and_pushed_gets_the_same_scores(tmp_path: Path, mlflow_uri: str) -> None:
    """MLflow's client writes the traces to the tracking server and exports them over OTLP to one collector; another
    collector pulls them from the tracking server. Both run the same policy: every score is the same."""
    experiment = f"both-ways-{uuid.uuid4().hex[:8]}"
    (tmp_path / "policy.yaml").write_text(SAME_SCORES_POLICY)
    evaluate = {"policies": [str(tmp_path / "policy.yaml")]}
    pushed_dir, pulled_dir = tmp_path / "pushed", tmp_path / "pulled"
    pushed_dir.mkdir()
    pulled_dir.mkdir()
    pushed_cfg = serve_config(pushed_dir / "store")
    pushed_cfg["processors"] = {"normalize": {}, "tail_sampling": {"decision_wait": "300ms"}, "evaluate": evaluate}
    pushed_cfg["service"]["pipelines"]["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pushed_cfg["service"]["pipelines"]["scores"] = {"exporters": ["clickhouse"]}
    pulled_cfg = config(pulled_dir, mlflow_uri, experiment, 1)
    pulled_cfg["processors"]["evaluate"] = evaluate
    pulled_cfg["service"]["pipelines"]["scores"] = {"exporters": ["clickhouse"]}
    del pulled_cfg["exporters"]["mlflow"]
    pushed = start_collector(pushed_dir, pushed_cfg)
    try:
        write_both_ways(mlflow_uri, experiment, pushed.http + "/v1/traces", "3")
        pulled_c = start_collector(pulled_dir, pulled_cfg)
        try:
            n = 2 * 10  # two traces, ten trace-scope evaluators
            assert wait_until(lambda: len(scores_of(pushed)) >= n and len(scores_of(pulled_c)) >= n, 60)
            time.sleep(1)  # nothing more comes
            want, got = scores_of(pushed), scores_of(pulled_c)
        finally:
            pulled_c.stop()
    finally:
        pushed.stop()
    assert len(want) == n
    assert got == want, {k: (want.get(k), got.get(k)) for k in want.keys() | got.keys() if want.get(k) != got.get(k)}
