"""The run-added metrics (`duration_ms`, `tokens`, `cost_usd`) however a run is read: kept by `--resume` and
`rescore`, paired by `compare` and `--baseline` with lower as better; and gates that show the value they saw. The
real CLI against a real collector, with the deterministic agents of test_run_e2e."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import yaml
from running_collector import Collector

from .test_run_e2e import evalsi, run_file, run_json

RUN_ADDED = ("duration_ms", "tokens", "cost_usd")


def steps_run(tmp: Path, gates: list[str], **extra: object) -> Path:
    """Three tasks, two trials, an agent whose every attempt makes two priced model calls (36 tokens, 0.003 USD)."""
    return run_file(tmp, function="agent:with_steps", trials=2, gates=gates, **extra)


def test_resume_keeps_the_run_added_metrics_of_the_earlier_attempts(tmp_path: Path, collector: Collector) -> None:
    gates = ["metric('duration_ms').p95 < 60000", "metric('tokens').mean == 36.0", "metric('cost_usd').n == 6"]
    path = steps_run(tmp_path, gates)
    first = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", "--limit", "2",
                            cwd=tmp_path))  # fmt: skip
    assert [m for m in RUN_ADDED if first["metrics"][m]["n"] == 4] == list(RUN_ADDED)
    # the interrupted run goes on: 2 attempts now, 4 before; the metrics count all 6
    res = evalsi("run", "-f", str(path), "--collector", collector.api, "--json", "--resume", first["run_id"],
                 cwd=tmp_path)  # fmt: skip
    resumed = run_json(res)
    assert res.returncode == 0, resumed["gates"]
    assert (resumed["skipped_resumed"], resumed["attempts"]) == (4, 2)
    assert {m: resumed["metrics"][m]["n"] for m in RUN_ADDED} == dict.fromkeys(RUN_ADDED, 6)
    assert resumed["metrics"]["tokens"]["mean"] == 36 and resumed["metrics"]["cost_usd"]["mean"] == pytest.approx(0.003)

    # resuming the finished run runs nothing and reads the same data: the same metrics, the same verdicts
    res = evalsi("run", "-f", str(path), "--collector", collector.api, "--json", "--resume", first["run_id"],
                 cwd=tmp_path)  # fmt: skip
    again = run_json(res)
    assert res.returncode == 0, again["gates"]
    assert (again["skipped_resumed"], again["attempts"]) == (6, 0)
    assert again["metrics"] == resumed["metrics"] and again["gates"] == resumed["gates"]
    # and the stored record keeps them
    shown = run_json(evalsi("runs", "show", first["run_id"], "--json", "--collector", collector.api, cwd=tmp_path))
    assert shown["metrics"] == resumed["metrics"]


def test_rescore_with_the_run_file_keeps_the_run_added_metrics(tmp_path: Path, collector: Collector) -> None:
    gates = ["metric('exact-match').mean >= 0.3", "metric('duration_ms').p95 < 60000", "metric('cost_usd').mean < 1"]
    path = steps_run(tmp_path, gates)
    first = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    res = evalsi("rescore", "--run", first["run_id"], "-f", str(path), "--json", "--collector", collector.api,
                 cwd=tmp_path)  # fmt: skip
    again = run_json(res)
    assert res.returncode == 0, again["gates"]
    # the same traces: the same figures, to the last digit
    for m in RUN_ADDED:
        assert again["metrics"][m] == first["metrics"][m], m
    assert [g["passed"] for g in again["gates"]] == [True, True, True]
    stored = httpx.get(f"{collector.api}/api/v1/runs/{again['run_id']}").json()["summary"]["metrics"]
    assert set(RUN_ADDED) <= set(stored)


def test_a_trace_without_the_measures_is_measured_from_its_spans(collector: Collector, tmp_path: Path) -> None:
    """A trace a run did not send (or sent before its root carried `evalsi.attempt.*`): rescore measures its spans,
    the root's duration and the model calls' tokens."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import set_span_in_context

    provider = TracerProvider(resource=Resource.create({"service.name": "chat-app"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.http + "/v1/traces")))
    tracer = provider.get_tracer("test")
    t0 = time.time_ns()
    trace_ids = []
    for i in range(2):
        root = tracer.start_span("invoke_agent", start_time=t0, attributes={"gen_ai.operation.name": "invoke_agent",
                                                                             "mark": tmp_path.name})  # fmt: skip
        usage = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1", "gen_ai.usage.input_tokens": 10 + i,
                 "gen_ai.usage.output_tokens": 5}  # fmt: skip
        chat = tracer.start_span("chat m1", context=set_span_in_context(root), start_time=t0 + 1_000_000,
                                 attributes=usage)  # fmt: skip
        chat.end(end_time=t0 + 200_000_000)
        root.end(end_time=t0 + (250 + 50 * i) * 1_000_000)
        trace_ids.append(format(root.get_span_context().trace_id, "032x"))
    provider.shutdown()
    for trace_id in trace_ids:  # stored once the pipeline has them
        deadline = time.monotonic() + 30
        while httpx.get(f"{collector.api}/api/v1/traces/{trace_id}").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    where = f"trace.root.attributes['mark'] == '{tmp_path.name}'"
    res = evalsi("rescore", "--traces", where, "-e", "builtin/length", "--json", "--collector", collector.api,
                 cwd=tmp_path)  # fmt: skip
    chosen = run_json(res)
    assert (chosen["metrics"]["duration_ms"]["n"], chosen["metrics"]["duration_ms"]["mean"]) == (2, 275.0)
    assert chosen["metrics"]["tokens"]["mean"] == 15.5


def test_compare_and_baseline_cover_every_metric_of_both_runs(tmp_path: Path, collector: Collector) -> None:
    path = steps_run(tmp_path, [])
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["evaluators"] = [{"ref": "builtin/exact-match"}, {"ref": "builtin/length"}]
    path.write_text(yaml.safe_dump(doc))
    a = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    # run B: the same agent without the `length` evaluator, against A, with gates on the comparison
    doc["spec"]["evaluators"] = [{"ref": "builtin/exact-match"}]
    doc["spec"]["gates"] = ["compare('tokens').delta == 0.0", "compare('cost_usd').n == 6", "compare('length').n > 0"]
    path.write_text(yaml.safe_dump(doc))
    res = evalsi("run", "-f", str(path), "--collector", collector.api, "--json", "--baseline", a["run_id"],
                 cwd=tmp_path)  # fmt: skip
    b = run_json(res)
    c = b["comparison"]
    assert set(c) == {"exact-match", "length", *RUN_ADDED}
    for m in RUN_ADDED:  # the run-added metrics, paired record by record, lower being better
        assert (c[m]["better"], c[m]["test"], c[m]["n"]) == ("lower", "paired_bootstrap", 6), m
        assert c[m]["regressions"] + c[m]["fixes"] <= 6 and c[m]["low"] <= c[m]["delta"] <= c[m]["high"]
    assert (c["tokens"]["delta"], c["tokens"]["regressions"], c["tokens"]["fixes"]) == (0.0, 0, 0)
    assert (c["exact-match"]["better"], c["exact-match"]["test"], c["exact-match"]["n"]) == ("higher", "mcnemar", 6)
    # a metric of one run only is listed as such, and a gate on it says why it cannot hold
    assert (c["length"]["n"], c["length"]["test"], c["length"]["unpaired"]) == (0, None, "scored in the baseline only")
    assert [g["passed"] for g in b["gates"]] == [True, True, False] and res.returncode == 1
    assert "'length' has nothing to compare: scored in the baseline only" in b["gates"][2]["detail"]

    # `evalsi compare` reads the same from the store
    res = evalsi("compare", a["run_id"], b["run_id"], "--json", "--collector", collector.api, cwd=tmp_path)
    compared = json.loads(res.stdout)
    assert compared == c
    assert res.returncode == (1 if any(x["regressed"] for x in compared.values()) else 0)
    res = evalsi("compare", b["run_id"], a["run_id"], "--collector", collector.api, cwd=tmp_path)
    table = res.stdout
    for m in RUN_ADDED:
        assert next(line for line in table.splitlines() if f" {m} " in line).split("│")[2].strip() == "lower", table
    assert "scored in the new run only" in table


def test_a_gate_shows_and_stores_the_value_it_saw_and_its_threshold(tmp_path: Path, collector: Collector) -> None:
    # France 3/3, Spain 1/3, Italy 0/3: pass^3 is 1/3
    gates = ["metric('exact-match').passHatK(3) >= 0.9", "0.1 < metric('exact-match').mean",
             "metric('nope').mean > 0"]  # fmt: skip
    path = run_file(tmp_path, gates=gates)
    res = evalsi("run", "-f", str(path), "--collector", collector.api, "-q", "--report", "out.md", "--report",
                 "out.html", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "FAIL metric('exact-match').passHatK(3) >= 0.9  (saw 0.3333; needs >= 0.9)" in res.stdout
    assert "PASS 0.1 < metric('exact-match').mean  (saw 0.4444; needs > 0.1)" in res.stdout
    assert "FAIL metric('nope').mean > 0  (saw none; needs > 0; no scores named 'nope'" in res.stdout
    # the stored record keeps them
    [run] = [r for r in httpx.get(f"{collector.api}/api/v1/runs?limit=100").json()["runs"] if r["name"] == "capitals"
             and r["summary"].get("gates") and r["summary"]["gates"][0]["gate"] == gates[0]]  # fmt: skip
    stored = run["summary"]["gates"]
    assert (stored[0]["value"], stored[0]["op"], stored[0]["threshold"]) == (pytest.approx(1 / 3), ">=", 0.9)
    assert stored[0]["seen"] == {"metric('exact-match').passHatK(3)": pytest.approx(1 / 3)}
    assert (stored[1]["value"], stored[1]["op"], stored[1]["threshold"]) == (pytest.approx(4 / 9), ">", 0.1)
    assert (stored[2]["value"], stored[2]["passed"]) == (None, False)
    shown = run_json(evalsi("runs", "show", run["run_id"], "--json", "--collector", collector.api, cwd=tmp_path))
    assert shown["gates"] == stored
    # the reports' gate rows
    md = (tmp_path / "out.md").read_text()
    assert "- FAIL `metric('exact-match').passHatK(3) >= 0.9` saw 0.3333; needs >= 0.9" in md
    page = (tmp_path / "out.html").read_text()
    assert (
        "<code>metric(&#x27;exact-match&#x27;).passHatK(3) &gt;= 0.9</code></td><td>0.3333</td><td>&gt;= 0.9</td>"
        in (page)
    )
