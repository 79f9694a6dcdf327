"""The Grafana dashboards of deploy/grafana: generated from code and checked in, loadable by the Grafana Foundation
SDK, and every query they hold run for real: the SQL against a store a running `evalsi serve` filled, the PromQL
against a Prometheus server that scraped it. Grafana itself is not run; the test does what Grafana and the
ClickHouse plugin do to a query before sending it (variables, $__conditionalAll, the plugin's macros)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as dashboard_model, prometheus as prometheus_model
from prometheus_server import PROMETHEUS, PrometheusProcess, free_port, start_prometheus
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.exporters.clickhouse.backend import Backend, open_backend
from evalsi.exporters.clickhouse.schema import LOGS_SCHEMA, TRACES_SCHEMA
from evalsi.policies.intervals import mean_interval, t_quantile, wilson_interval

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DOC = ROOT / "docs" / "grafana.md"
UIDS = {"evalsi-clickhouse": "grafana-clickhouse-datasource", "evalsi-prometheus": "prometheus"}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("evalsi_grafana_dashboards", GRAFANA / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _generator()
register_default_plugins()  # Prometheus targets load back as prometheus.Dataquery


def _dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted((GRAFANA / "dashboards").glob("*.json"))}


def _panels(board: dict[str, Any]) -> Iterator[tuple[dict[str, Any], str | None]]:
    """Every panel that queries, with the variable it repeats over (its own, or its row's)."""
    row_repeat = None
    for panel in board["panels"]:
        if panel["type"] == "row":
            row_repeat = panel.get("repeat")
            for inner in panel.get("panels") or []:
                yield inner, inner.get("repeat") or row_repeat
            continue
        yield panel, panel.get("repeat") or row_repeat


# --- generated, checked in, loadable ----------------------------------------------------------------------------


def test_checked_in_dashboards_are_what_the_generator_builds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    written = gen.write(tmp_path)
    assert {p.name for p in written} == set(_dashboards()) == set(gen.DASHBOARDS)
    for path in written:
        assert path.read_text() == (GRAFANA / "dashboards" / path.name).read_text(), f"{path.name} is stale"
    assert gen.main(["--check", "--dir", str(GRAFANA / "dashboards")]) == 0

    # --check names what differs, what is missing and what it does not build, and writes nothing
    (tmp_path / "judge-spend.json").write_text("{}\n")
    (tmp_path / "offline-runs.json").unlink()
    (tmp_path / "hand-made.json").write_text("{}\n")
    capsys.readouterr()
    assert gen.main(["--check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "judge-spend.json" in err and "offline-runs.json" in err and "hand-made.json" in err
    assert "online-quality.json" not in err
    assert (tmp_path / "judge-spend.json").read_text() == "{}\n" and not (tmp_path / "offline-runs.json").exists()


def test_dashboards_load_into_the_sdk_model_and_name_the_two_data_sources() -> None:
    boards = _dashboards()
    assert len(boards) == 5
    uids = set()
    for name, data in boards.items():
        model = dashboard_model.Dashboard.from_json(data)
        assert json.loads(json.dumps(model, cls=JSONEncoder)) == data, f"{name} does not round-trip through the SDK"
        assert model.uid and model.uid not in uids and model.tags == ["evalsi"]
        uids.add(model.uid)
        panels = [p for p in model.panels or [] if isinstance(p, dashboard_model.Panel)]
        assert panels, name
        ids = [p.id_val for p in model.panels or []]
        assert len(ids) == len(set(ids)) and None not in ids, f"{name}: panel ids must be unique"
        for panel in panels:
            where = f"{name} / {panel.title}"
            assert panel.datasource is not None and panel.datasource.uid in UIDS, where
            assert panel.datasource.type_val == UIDS[panel.datasource.uid], where
            assert panel.targets, where
            for target in panel.targets:
                if panel.datasource.uid == "evalsi-clickhouse":
                    assert isinstance(target, gen.SqlQuery) and target.raw_sql, where
                else:
                    assert isinstance(target, prometheus_model.Dataquery) and target.expr, where
                    assert target.datasource == gen.PROMETHEUS.to_json(), where
        for variable in model.templating.list_val or []:
            assert variable.datasource is not None and variable.datasource.uid in UIDS, f"{name} ${variable.name}"


# --- what Grafana does to a query before the data source gets it ---------------------------------------------


@dataclass
class Variable:
    name: str
    multi: bool
    include_all: bool
    all_value: str | None
    values: list[str] = field(default_factory=list)
    selected: list[str] | None = None
    """None: All."""


ALL = None


@dataclass
class Grafana:
    """Expands a panel's query as Grafana and the ClickHouse plugin would for one dashboard state."""

    start: int
    end: int
    variables: dict[str, Variable]
    interval_s: int = 60
    scoped: dict[str, str] = field(default_factory=dict)
    """A repeated panel's own value of the variable it repeats over."""

    _CONDITIONAL_ALL = re.compile(r"\$__conditionalAll\(([^,]*),\s*\$\{?(\w+)\}?\)")
    _VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(?!__)(\w+)")
    _MACRO = re.compile(r"\$__(\w+)(?:\(([^()]*)\))?")

    def _values(self, name: str) -> tuple[Variable, list[str] | None]:
        if name not in self.variables:
            raise AssertionError(f"${name} is no variable of the dashboard")
        if name in self.scoped:
            return self.variables[name], [self.scoped[name]]
        v = self.variables[name]
        return v, v.selected

    def sql(self, text: str) -> str:
        def conditional_all(m: re.Match[str]) -> str:
            # the plugin drops the condition when the dashboard's value is All (it ignores a repeated panel's own
            # value: the tests below would catch a repeat variable wrapped in $__conditionalAll)
            return "1=1" if self.variables[m.group(2)].selected is ALL else m.group(1)

        text = self._CONDITIONAL_ALL.sub(conditional_all, text)

        def variable(m: re.Match[str]) -> str:
            name, fmt = m.group(1) or m.group(3), m.group(2)
            if fmt != "singlequote":
                raise AssertionError(f"SQL must quote ${name} with ${{{name}:singlequote}}: {m.group(0)}")
            v, values = self._values(name)
            if values is ALL:
                if v.all_value is not None:  # Grafana inserts a custom all value unformatted
                    raise AssertionError(f"${name} is All here, which would put {v.all_value!r} in the SQL")
                values = v.values
            if not values:
                raise AssertionError(f"${name} has no values: IN () is no SQL")
            return ",".join("'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'" for value in values)

        text = self._VARIABLE.sub(variable, text)

        def macro(m: re.Match[str]) -> str:
            name, arg = m.group(1), m.group(2)
            if name == "timeFilter" and arg:
                return f"{arg} >= toDateTime({self.start}) AND {arg} <= toDateTime({self.end})"
            if name == "timeInterval" and arg:
                return f"toStartOfInterval(toDateTime({arg}), INTERVAL {self.interval_s} second)"
            if name == "fromTime" and arg is None:
                return f"toDateTime({self.start})"
            if name == "toTime" and arg is None:
                return f"toDateTime({self.end})"
            if name == "interval_s" and arg is None:
                return str(self.interval_s)
            raise AssertionError(f"a macro this test does not know: {m.group(0)}")

        text = self._MACRO.sub(macro, text)
        assert "$" not in text, text
        return text

    def promql(self, text: str) -> str:
        builtins = {"rate_interval": "1m", "interval": f"{self.interval_s}s", "range": "10m"}

        def builtin(m: re.Match[str]) -> str:
            if m.group(1) not in builtins or m.group(2) is not None:
                raise AssertionError(f"a Grafana variable this test does not know: {m.group(0)}")
            return builtins[m.group(1)]

        text = self._MACRO.sub(builtin, text)

        def variable(m: re.Match[str]) -> str:
            name, fmt = m.group(1) or m.group(3), m.group(2)
            if fmt is not None:
                raise AssertionError(f"unexpected format in PromQL: {m.group(0)}")
            v, values = self._values(name)
            if values is ALL:
                if v.all_value is not None:
                    return v.all_value
                values = v.values
            if not (v.multi or v.include_all):
                return values[0]
            escaped = [re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value) for value in values]
            return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

        text = self._VARIABLE.sub(variable, text)
        assert "$" not in text, text
        return text


# --- a collector with traffic, its store and a Prometheus that scraped it ---------------------------------------


@dataclass
class PrometheusServer(PrometheusProcess):
    def get(self, path: str, **params: Any) -> dict[str, Any]:
        r = httpx.get(self.url + path, params=params, timeout=30)
        return r.json()

    def value(self, promql: str) -> float:
        body = self.get("/api/v1/query", query=promql)
        result = body.get("data", {}).get("result", [])
        return sum(float(r["value"][1]) for r in result)


POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: support-answers}}
spec:
  cascade:
    - ref: builtin/contains
      params: {{any: [Paris]}}
    - ref: builtin/latency
      params: {{max_ms: 1000}}
    - ref: builtin/llm-judge
      when: scores['contains'].passed
      params:
        endpoint: {endpoint}
        model: judge-1
        rubric: correctness
        budget: {{max_calls: 3, window_s: 1000000000}}
        price: {{input_per_1k: 0.01, output_per_1k: 0.03}}
  alerts:
    - name: answers-scored
      when: count('contains') >= 2
"""


def _otlp_trace(trace_id: str, answer: str, duration_ms: int, *, error: bool = False) -> dict[str, Any]:
    """An app request (a server span) around one chat call whose content the judge sees."""
    end = time.time_ns()
    start = end - duration_ms * 1_000_000
    question = [{"role": "user", "parts": [{"type": "text", "content": "Capital of France?"}]}]
    reply = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
    chat = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.input.messages": json.dumps(question),
        "gen_ai.output.messages": json.dumps(reply),
    }
    root_id, chat_id = "1" + trace_id[17:], "2" + trace_id[17:]
    root = {
        "traceId": trace_id,
        "spanId": root_id,
        "name": "POST /support",
        "kind": 2,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [{"key": "http.route", "value": {"stringValue": "/support"}}],
        "status": {"code": 2, "message": "upstream failed"} if error else {},
    }
    call = {
        "traceId": trace_id,
        "spanId": chat_id,
        "parentSpanId": root_id,
        "name": "chat gpt-4o-mini",
        "kind": 3,
        "startTimeUnixNano": str(start + 1_000_000),
        "endTimeUnixNano": str(end - 1_000_000),
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in chat.items()]
        + [
            {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "12"}},
            {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "7"}},
        ],
        "events": [{"timeUnixNano": str(end - 2_000_000), "name": "gen_ai.choice", "attributes": []}],
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "support"}}]}
    return {
        "resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "app"}, "spans": [root, call]}]}]
    }


def _otlp_log(trace_id: str) -> dict[str, Any]:
    record = {
        "timeUnixNano": str(time.time_ns()),
        "severityText": "INFO",
        "body": {"stringValue": "answered"},
        "traceId": trace_id,
        "spanId": "2" + trace_id[17:],
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "support"}}]}
    return {"resourceLogs": [{"resource": resource, "scopeLogs": [{"scope": {"name": "app"}, "logRecords": [record]}]}]}


# (trace, answer, duration ms, error): contains fails on Lyon and the unsure one, latency on the slow ones; the judge
# judges the three right answers of the first batch, then answers the repeated one from its cache and skips the
# last two (its budget is three calls)
FIRST = [
    (0xA1, "It is Paris. Write to help@example.com for more.", 60, False),
    (0xA2, "Paris, answer two.", 90, False),
    (0xA3, "Paris, answer three.", 2500, False),
    (0xA4, "Lyon.", 120, False),
    (0xA5, "I am not sure.", 1500, True),
]
SECOND = [
    (0xB1, "Paris, answer two.", 70, False),
    (0xB2, "Paris, answer seven.", 80, False),
    (0xB3, "Paris, answer eight.", 110, False),
]


def _run_summary(exact: list[bool], durations: list[float]) -> dict[str, Any]:
    """A finished run's summary as `evalsi run` computes it (aggregates, gates) from per-task observations."""
    from evalsi.run_harness.gates import check_gates, compile_gate
    from evalsi.run_harness.runner import RunResult, summarize
    from evalsi.run_harness.stats import Observation

    tasks = [f"task-{i}" for i in range(len(exact))]
    observations = {
        "exact-match": [Observation(t, 0, None, ok, "scored") for t, ok in zip(tasks, exact, strict=True)],
        "duration_ms": [Observation(t, 0, d, None, "scored") for t, d in zip(tasks, durations, strict=True)],
    }
    metrics = summarize(observations, seed=0, trials=1)
    gates = [compile_gate("metric('exact-match').mean >= 0.6"), compile_gate("metric('duration_ms').p95 < 1000")]
    results = check_gates(gates, {k: v.to_dict() for k, v in metrics.items()}, None)
    run = RunResult("x", "nightly-support", {}, metrics, results, [], len(tasks), 0, 0, wall_s=12.5)
    return run.summary()


@dataclass
class Stack:
    """What the module's one collector run left: its store, a Prometheus that scraped it, and when."""

    store: Backend
    prometheus: PrometheusServer | None
    """None without a `prometheus` binary: the SQL is still tested, the PromQL is skipped."""
    start: int
    at: float
    """The time PromQL is evaluated at: after the last scrape of the traffic, before the collector stopped."""
    traces: dict[str, int]
    """Trace id to its number of spans."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from fake_judge import FakeJudge

    tmp = tmp_path_factory.mktemp("grafana")
    start = int(time.time()) - 60
    metrics_port, scores_port = free_port(), free_port()
    targets = {"evalsi": f"127.0.0.1:{metrics_port}", "evalsi-scores": f"127.0.0.1:{scores_port}"}
    prometheus = start_prometheus(tmp / "prometheus", targets, PrometheusServer) if PROMETHEUS else None
    judge = FakeJudge()
    judge.thread.start()
    collector: Collector | None = None
    try:
        (tmp / "support.yaml").write_text(POLICY.format(endpoint=judge.url))
        cfg = serve_config(tmp / "store")
        cfg["processors"]["redact"] = {}
        cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
        cfg["processors"]["evaluate"] = {"policies": ["support.yaml"]}
        # a window no test run crosses, so the window gauges hold every score
        cfg["exporters"]["prometheus"] = {"endpoint": f"127.0.0.1:{scores_port}", "window": "8760h"}
        cfg["service"]["telemetry"]["metrics"]["address"] = f"127.0.0.1:{metrics_port}"
        pipelines = cfg["service"]["pipelines"]
        pipelines["traces"]["processors"] = ["normalize", "redact", "tail_sampling", "evaluate"]
        pipelines["logs"]["processors"] = ["normalize", "redact"]
        pipelines["scores"] = {"exporters": ["clickhouse", "prometheus"]}
        collector = start_collector(tmp, cfg)
        c = collector

        def send(batch: list[tuple[int, str, int, bool]]) -> list[str]:
            ids = []
            for n, answer, ms, error in batch:
                trace_id = f"{n:032x}"
                r = httpx.post(c.http + "/v1/traces", json=_otlp_trace(trace_id, answer, ms, error=error))
                assert r.status_code == 200, r.text
                ids.append(trace_id)
            return ids

        def scored(ids: list[str]) -> bool:
            listed = httpx.get(c.api + "/api/v1/scores", params={"limit": 1000}).json()["scores"]
            return {s["trace_id"] for s in listed} >= set(ids)

        first = send(FIRST)
        assert httpx.post(c.http + "/v1/logs", json=_otlp_log(first[0])).status_code == 200
        assert wait_until(lambda: scored(first), timeout=30), "the first traces were not scored"
        second = send(SECOND)
        assert wait_until(lambda: scored(second), timeout=30), "the second traces were not scored"
        assert len(judge.requests) == 3, "the judge judges the first batch's three right answers, and no more"

        for i, (status, exact, durations) in enumerate(
            [
                ("finished", [True, True, False, True], [420.0, 380.0, 910.0, 505.0]),
                ("finished", [True, False, False, True], [610.0, 1200.0, 980.0, 700.0]),
                ("running", [], []),
            ]
        ):
            summary = _run_summary(exact, durations) if exact else {}
            body = {"run_id": f"nightly-support-{i}", "name": "nightly-support", "status": status,
                    "manifest": {"trials": 1}, "summary": summary}  # fmt: skip
            assert httpx.post(c.api + "/v1/runs", json=body).status_code == 200

        # Prometheus has scraped the last counts; two more scrapes after, every rate has samples to go on
        want = {
            'sum(evalsi_scores_total{outcome="scored"})': None,
            "sum(evalsi_judge_cache_hits_total)": 1,
            'sum(evalsi_judge_budget_exhausted_total{judge!=""})': 2,
            "sum(otelcol_receiver_accepted_spans_total)": 2 * (len(FIRST) + len(SECOND)),
            "sum(otelcol_receiver_accepted_log_records_total)": 1,
        }
        stored = len(httpx.get(c.api + "/api/v1/scores", params={"limit": 1000}).json()["scores"])
        want['sum(evalsi_scores_total{outcome="scored"})'] = stored - 2  # the two budget skips are not scored
        for promql, expected in want.items() if prometheus is not None else ():
            assert wait_until(lambda q=promql, e=expected: prometheus.value(q) == e, timeout=30), (
                f"{promql} = {prometheus.value(promql)}, not {expected}"
            )
        time.sleep(2.5)
        at = time.time()
        traces = {
            t["trace_id"]: t["span_count"] for t in httpx.get(c.api + "/api/v1/traces?limit=100").json()["traces"]
        }
        assert collector.stop() == 0
        collector = None
        store = open_backend(f"chdb://{tmp / 'store'}", create=False)
        try:
            yield Stack(store, prometheus, start, at, traces)
        finally:
            store.close()
    finally:
        if collector is not None:
            collector.stop()
        judge.server.shutdown()
        if prometheus is not None:
            prometheus.stop()


def _variables(board: dict[str, Any]) -> dict[str, Variable]:
    return {
        v["name"]: Variable(v["name"], v.get("multi", False), v.get("includeAll", False), v.get("allValue"))
        for v in board["templating"].get("list", [])
    }


def _resolve(stack: Stack, board: dict[str, Any], mode: str) -> Grafana:
    """The dashboard's variables, each filled by running its own query, in order, as Grafana does: multi-valued
    ones set to All (mode "all") or to their first value (mode "first"), single ones to their first value."""
    grafana = Grafana(stack.start, int(stack.at) + 60, _variables(board))
    for v in board["templating"].get("list", []):
        variable = grafana.variables[v["name"]]
        if v["datasource"]["uid"] == "evalsi-clickhouse":
            rows = stack.store.query(grafana.sql(v["query"]["rawSql"]))
            values = [str(next(iter(r.values()))) for r in rows]
        elif stack.prometheus is None:  # its SQL filters on it with $__conditionalAll: All is no filter
            variable.selected = ALL
            continue
        else:
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["query"])
            assert m, v["query"]
            body = stack.prometheus.get(
                f"/api/v1/label/{m.group(2)}/values",
                **{"match[]": grafana.promql(m.group(1)), "start": stack.start, "end": stack.at},
            )
            assert body["status"] == "success", body
            values = body["data"]
        assert values, f"{board['title']}: ${variable.name} has no values"
        variable.values = values
        variable.selected = ALL if variable.include_all and mode == "all" else values[:1]
    return grafana


def _seconds(interval: str) -> int:
    """A panel's min interval ("1m", "5m", "30s") in seconds: what $__interval_s is at least."""
    return int(interval[:-1]) * {"s": 1, "m": 60, "h": 3600}[interval[-1]]


def _instances(grafana: Grafana, repeat: str | None) -> Iterator[dict[str, str]]:
    """A repeated panel once per value of its variable (as Grafana draws it), else once."""
    if repeat is None:
        yield {}
        return
    variable = grafana.variables[repeat]
    for value in variable.values if variable.selected is ALL else variable.selected or []:
        yield {repeat: value}


def _targets(uid: str) -> set[tuple[str, int, str]]:
    """Every query of every dashboard on the data source `uid`, by dashboard, panel and refId."""
    return {
        (name, panel["id"], target["refId"])
        for name, board in _dashboards().items()
        for panel, _ in _panels(board)
        if panel["datasource"]["uid"] == uid
        for target in panel["targets"]
    }


def _promql(stack: Stack, expr: str, instant: bool) -> dict[str, Any]:
    assert stack.prometheus is not None
    if instant:
        return stack.prometheus.get("/api/v1/query", query=expr, time=stack.at)
    return stack.prometheus.get("/api/v1/query_range", query=expr, start=stack.at - 300, end=stack.at, step=5)


# PromQL whose series the test's traffic does not create, and why. Everything else must return data.
MAY_BE_EMPTY = {
    "evalsi_sampler_spans_total": "no probabilistic_sampler in the pipeline",
    "otelcol_exporter_enqueue_failed_spans_total": "only exporters that send spans to a backend (otlp) drop them",
    "evalsi_exporter_items_refused_total": "the store refused no row",
    "evalsi_traces_evicted_total": "no buffer limit was reached",
    "evalsi_sessions_evicted_total": "no session limit was reached",
    "evalsi_redaction_removed_total": "allow_all_keys (the default) removes nothing",
    "evalsi_redaction_failures_total": "no redaction failed",
    "evalsi_worker_spans_total": "one process (workers: 1)",
    "evalsi_exporter_write_retries_total": "the store never refused a write",
    "otelcol_exporter_send_failed_scores_total": "only exporters that send scores to a backend (otlp, ...)",
    "otelcol_exporter_enqueue_failed_scores_total": "only exporters that send scores to a backend",
    "otelcol_exporter_sent_scores_total": "only exporters that send scores to a backend",
    "evalsi_policy_difference": "no regressed(...) alert in the test's policies",
    "evalsi_policy_difference_low": "no regressed(...) alert in the test's policies",
    "evalsi_policy_difference_high": "no regressed(...) alert in the test's policies",
    "evalsi_policy_regressed": "no regressed(...) alert in the test's policies",
    "evalsi_judge_kappa": "no people's feedback beside judge verdicts in the test's traffic",
    "evalsi_judge_kappa_low": "no people's feedback beside judge verdicts",
    "evalsi_judge_kappa_high": "no people's feedback beside judge verdicts",
    "evalsi_judge_sensitivity": "no people's feedback beside judge verdicts",
    "evalsi_judge_specificity": "no people's feedback beside judge verdicts",
    "evalsi_judge_rate_ppi": "no people's feedback beside judge verdicts",
    "evalsi_judge_rate_ppi_low": "no people's feedback beside judge verdicts",
    "evalsi_judge_rate_ppi_high": "no people's feedback beside judge verdicts",
    "evalsi_judge_labeled": "no people's feedback beside judge verdicts",
}


def _may_be_empty(expr: str) -> str | None:
    """Why `expr` may return no data, when every metric it reads is one the traffic does not create."""
    metrics = set(re.findall(r"\b((?:evalsi|otelcol)_[a-z_]+)", expr))
    reasons = [MAY_BE_EMPTY[m] for m in metrics if m in MAY_BE_EMPTY]
    return "; ".join(reasons) if reasons and len(reasons) == len(metrics) else None


def test_every_sql_query_runs_on_a_filled_store_and_returns_rows(stack: Stack) -> None:
    ran: set[tuple[str, int, str]] = set()
    for name, board in _dashboards().items():
        for mode in ("all", "first"):
            grafana = _resolve(stack, board, mode)
            for panel, repeat in _panels(board):
                if panel["datasource"]["uid"] != "evalsi-clickhouse":
                    continue
                grafana.interval_s = _seconds(panel.get("interval", "1m"))
                for scoped in _instances(grafana, repeat):
                    grafana.scoped = scoped
                    for target in panel["targets"]:
                        sql = grafana.sql(target["rawSql"])
                        where = f"{name} / {panel['title']} {scoped} ({mode})"
                        try:
                            rows = stack.store.query(sql)
                        except Exception as e:
                            raise AssertionError(f"{where} failed: {e}\n{sql}") from None
                        ran.add((name, panel["id"], target["refId"]))
                        if mode == "all":
                            assert rows, f"{where} returned no rows:\n{sql}"
                grafana.scoped = {}
    assert ran == _targets("evalsi-clickhouse")


def test_every_promql_query_runs_on_the_scraped_collector(stack: Stack) -> None:
    if stack.prometheus is None:
        pytest.skip(
            "needs a Prometheus server binary on PATH: `apt-get install prometheus` (Debian/Ubuntu; .ci/run tries it) "
            "or a release from https://prometheus.io/download/"
        )
    ran: set[tuple[str, int, str]] = set()
    with_data: set[tuple[str, int, str]] = set()
    queries: dict[tuple[str, int, str], str] = {}
    for name, board in _dashboards().items():
        for mode in ("all", "first"):
            grafana = _resolve(stack, board, mode)
            for panel, repeat in _panels(board):
                if panel["datasource"]["uid"] != "evalsi-prometheus":
                    continue
                for scoped in _instances(grafana, repeat):
                    grafana.scoped = scoped
                    for target in panel["targets"]:
                        key = (name, panel["id"], target["refId"])
                        expr = grafana.promql(target["expr"])
                        where = f"{name} / {panel['title']} / {target['refId']} {scoped} ({mode})"
                        body = _promql(stack, expr, bool(target.get("instant")))
                        assert body.get("status") == "success", f"{where}: {expr}: {body}"
                        ran.add(key)
                        queries[key] = target["expr"]
                        if mode == "all" and body["data"]["result"]:
                            with_data.add(key)  # a repeated panel: in at least one of its copies
                grafana.scoped = {}
    assert ran == _targets("evalsi-prometheus")
    # what the traffic creates has data; what had none is only what it could not create
    for key in ran - with_data:
        assert _may_be_empty(queries[key]), f"{key} returned no data: {queries[key]}"


def test_promql_names_only_metrics_evalsi_exports() -> None:
    """Every metric a query reads is one evalsi's code defines (a counter read with its _total, a histogram with
    _bucket), so none is invented, including those the test's traffic cannot create."""
    code = "".join(p.read_text() for p in (ROOT / "evalsi").rglob("*.py"))
    defined = set(re.findall(r'"((?:evalsi|otelcol)_[a-z0-9_]+)"', code))
    for name, board in _dashboards().items():
        for panel, _ in _panels(board):
            for target in panel["targets"]:
                for metric in re.findall(r"\b((?:evalsi|otelcol)_[a-z0-9_]+)", target.get("expr", "")):
                    base = re.sub(r"_(total|bucket|sum|count)$", "", metric)
                    assert base in defined, f"{name} / {panel['title']}: {metric} is no metric of evalsi"
    for metric in MAY_BE_EMPTY:
        assert re.sub(r"_total$", "", metric) in defined, metric


def test_the_score_band_is_the_policy_windows_interval(stack: Stack) -> None:
    """The SQL's intervals equal evalsi.policies.intervals on the same scores."""
    board = _dashboards()["online-quality.json"]
    grafana = _resolve(stack, board, "all")
    grafana.interval_s = 10**9  # one bucket: every score of the range
    band_sql = next(p for p, _ in _panels(board) if p["title"] == "$name over time")["targets"][0]["rawSql"]
    scores = stack.store.query(
        "SELECT Name, Value, Passed FROM evalsi_scores FINAL WHERE Outcome = 'scored' AND RunId = ''"
    )
    for name in ("latency", "contains"):
        grafana.scoped = {"name": name}
        (row,) = stack.store.query(grafana.sql(band_sql))
        mine = [s for s in scores if s["Name"] == name]
        if name == "latency":  # values: their mean with an interval within their bounds (durations: log-t)
            values = [s["Value"] for s in mine]
            mean = sum(values) / len(values)
            sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
            expected, method = mean_interval(len(values), mean, sd, minimum=min(values), maximum=max(values))
            assert method == "log-t"
            assert row["n"] == len(values) == len(FIRST) + len(SECOND)
        else:  # verdicts only: the pass rate with a Wilson interval
            passes = sum(1 for s in mine if s["Passed"])
            mean = passes / len(mine)
            expected = wilson_interval(passes, len(mine))
            assert 0 < mean < 1 and row["n"] == len(mine)
        assert expected is not None
        assert row["mean"] == pytest.approx(mean, rel=1e-9)
        assert (row["lower"], row["upper"]) == pytest.approx(expected, rel=1e-5), name


@pytest.mark.parametrize(
    ("values", "method"),
    [
        ([0.0, 1.0, 1.0, 1.0, 0.0], "wilson"),
        ([0.2, 0.9, 0.95, 1.0], "t[0,1]"),
        ([5.0, 8.0, 12.0, 250.0], "log-t"),
        ([0.0, 0.0, 0.0], "wilson"),
        ([-3.0, 2.0, 7.5], "t"),
        ([4.0], None),
    ],
)
def test_the_sql_band_picks_the_policy_windows_method(stack: Stack, values: list[float], method: str | None) -> None:
    inner = " UNION ALL ".join(f"SELECT toFloat64({v}) AS v" for v in values)
    sql = f"""SELECT {gen.mean_band_sql("lower")} AS lower, {gen.mean_band_sql("upper")} AS upper FROM (
        SELECT nv, vmean, sd, vmin, vmax, nbinary, {gen.t975_sql("(nv - 1)")} AS t FROM (
            SELECT count() AS nv, avg(v) AS vmean, stddevSamp(v) AS sd, min(v) AS vmin, max(v) AS vmax,
                countIf(v = 0 OR v = 1) AS nbinary FROM ({inner})))"""
    (row,) = stack.store.query(sql)
    n, mean = len(values), sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 if n > 1 else 0.0
    binary = sum(v in (0.0, 1.0) for v in values)
    expected, found = mean_interval(n, mean, sd, minimum=min(values), maximum=max(values), binary=binary)
    if method is None:
        assert expected is None and (row["lower"], row["upper"]) == (None, None)
        return
    assert found == method and expected is not None
    assert (row["lower"], row["upper"]) == pytest.approx(expected, rel=1e-5, abs=1e-6)  # z to 6 places in SQL


def test_the_sql_t_quantile_is_the_policy_windows(stack: Stack) -> None:
    """The score bands' t quantile: a table to 30 degrees of freedom, an expansion past it."""
    rows = stack.store.query(f"SELECT number AS df, {gen.t975_sql('number')} AS t FROM numbers(1, 400)")
    assert len(rows) == 400
    for row in rows:
        assert row["t"] == pytest.approx(t_quantile(0.975, int(row["df"])), abs=2e-6), row


def test_a_worst_trace_opens_in_the_trace_view(stack: Stack) -> None:
    board = _dashboards()["worst-traces.json"]
    grafana = _resolve(stack, board, "all")
    (panel,) = [p for p, _ in _panels(board)]
    rows = stack.store.query(grafana.sql(panel["targets"][0]["rawSql"]))
    worst = rows[0]
    # the slow, unsure answer failed two checks: it comes first; then the lowest score between 0 and 1
    assert worst["TraceId"] == f"{0xA5:032x}" and worst["failed"] == 2 and worst["errors"] == 1
    assert [r["failed"] for r in rows] == sorted((r["failed"] for r in rows), reverse=True)
    assert worst["spans"] == 2 and worst["root_span"] == "POST /support" and worst["service"] == "support"

    (override,) = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "TraceId"]
    (link,) = next(p["value"] for p in override["properties"] if p["id"] == "links")
    url = link["url"]
    assert url == gen.trace_explore_url() and url.startswith("/explore?")
    assert re.findall(r"\$\{[^}]*\}", url) == ["${__value.raw}"]
    # what Grafana does when the trace id is clicked: fill in the value, open Explore with the panes
    opened = url.replace("${__value.raw}", worst["TraceId"])
    (panes,) = parse_qs(urlparse(opened).query)["panes"]
    (pane,) = json.loads(panes).values()
    assert pane["datasource"] == "evalsi-clickhouse"
    (query,) = pane["queries"]
    assert query["datasource"] == {"type": "grafana-clickhouse-datasource", "uid": "evalsi-clickhouse"}
    assert query["queryType"] == "traces" and query["format"] == gen.FORMAT_TRACE and query["editorType"] == "sql"
    spans = stack.store.query(query["rawSql"])
    assert len(spans) == stack.traces[worst["TraceId"]] == 2
    assert {s["traceID"] for s in spans} == {worst["TraceId"]}
    root = next(s for s in spans if s["parentSpanID"] == "")
    chat = next(s for s in spans if s["parentSpanID"] == root["spanID"])
    assert root["operationName"] == "POST /support" and root["serviceName"] == "support"
    assert root["duration"] > 0 and root["startTime"] > 0 and root["kind"] == "SPAN_KIND_SERVER"
    tags = {t["key"]: t["value"] for t in chat["tags"]}
    assert tags["gen_ai.request.model"] == "gpt-4o-mini" and tags["evalsi.step_type"] == "llm"
    assert [e["name"] for e in chat["logs"]] == ["gen_ai.choice"]
    assert {"key": "service.name", "value": "support"} in root["serviceTags"]


# --- provisioning and the doc ------------------------------------------------------------------------------------


def _grafana_env(value: Any, env: dict[str, str]) -> Any:
    """Grafana's expansion of provisioning values: ${VAR} or $VAR from the environment, $$ a literal $."""
    if isinstance(value, dict):
        return {k: _grafana_env(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_grafana_env(v, env) for v in value]
    if not isinstance(value, str):
        return value
    return re.sub(
        r"\$\$|\$\{(\w+)\}|\$(\w+)", lambda m: "$" if m.group(0) == "$$" else env[m.group(1) or m.group(2)], value
    )


def test_data_sources_are_provisioned_for_the_otel_schema() -> None:
    raw = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "evalsi.yaml").read_text())
    env = {"CLICKHOUSE_USER": "grafana", "CLICKHOUSE_PASSWORD": "secret"}
    sources = {d["uid"]: d for d in _grafana_env(raw, env)["datasources"]}
    assert {uid: d["type"] for uid, d in sources.items()} == UIDS

    prom = sources["evalsi-prometheus"]
    assert prom["url"] == "http://prometheus:9090"
    (exemplar,) = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert exemplar["name"] == "trace_id"  # the exemplar label of evalsi_score_value
    assert exemplar["url"] == gen.trace_explore_url()

    ch = sources["evalsi-clickhouse"]["jsonData"]
    assert (ch["host"], ch["port"], ch["protocol"], ch["defaultDatabase"]) == ("clickhouse", 8123, "http", "evalsi")
    assert ch["username"] == "grafana" and sources["evalsi-clickhouse"]["secureJsonData"]["password"] == "secret"
    traces, logs = ch["traces"], ch["logs"]
    assert traces["otelEnabled"] and logs["otelEnabled"]
    assert (traces["defaultTable"], logs["defaultTable"]) == ("otel_traces", "otel_logs")
    assert traces["defaultDatabase"] == logs["defaultDatabase"] == "evalsi"
    assert traces["durationUnit"] == "nanoseconds" and traces["traceTimestampTableSuffix"] == "_trace_id_ts"
    columns = [v for k, v in traces.items() if k.endswith("Column")]
    assert len(columns) == 15 and set(columns) <= set(TRACES_SCHEMA.names), set(columns) - set(TRACES_SCHEMA.names)
    for prefix in (traces["traceEventsColumnPrefix"], traces["traceLinksColumnPrefix"]):
        assert any(n.startswith(prefix + ".") for n in TRACES_SCHEMA.names), prefix
    assert {v for k, v in logs.items() if k.endswith("Column")} <= set(LOGS_SCHEMA.names)

    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "evalsi.yaml").read_text())["providers"]
    (provider,) = providers
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_the_doc_shows_the_provisioned_files_as_they_are() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    for path in ("datasources/evalsi.yaml", "dashboards/evalsi.yaml"):
        text = (GRAFANA / "provisioning" / path).read_text()
        assert text in blocks, f"docs/grafana.md has no yaml block equal to deploy/grafana/provisioning/{path}"
    doc = DOC.read_text()
    for name in gen.DASHBOARDS:
        assert name in doc, f"docs/grafana.md does not describe {name}"
