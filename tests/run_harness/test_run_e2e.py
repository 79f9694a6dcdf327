"""`evalsi run` end to end, as a user runs it: a real `evalsi serve` (or the in-process collector), the CLI in a
subprocess, traces over OTLP, scores read back from the store through the API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from evalsi_cli import evalsi_cli
from running_collector import EVALSI, Collector, serve_config
from statsmodels.stats.inter_rater import cohens_kappa

from .harness_server import Capabilities, HarnessServer

AGENT = '''
import time

ANSWERS = {"france": "Paris", "spain": "Madrid", "italy": "Rome"}
CALLS = {}


def answer(question):
    """Right for France always, for Spain on trial 0 only (it 'forgets'), never for Italy."""
    q = question.lower()
    n = CALLS[q] = CALLS.get(q, -1) + 1
    if "france" in q:
        return "Paris"
    if "spain" in q:
        return "Madrid" if n == 0 else "Barcelona"
    if "boom" in q:
        raise RuntimeError("the agent crashed")
    if "slow" in q:
        time.sleep(5)
    return "Milan"


def with_steps(question):
    return {"output": "Paris", "trajectory": [
        {"type": "llm", "model": "m1", "input": question, "output": "calling get_capital", "input_tokens": 12,
         "output_tokens": 3, "cost_usd": 0.001},
        {"type": "tool", "name": "get_capital", "arguments": {"country": "France"}, "result": "Paris"},
        {"type": "llm", "model": "m1", "input": "Paris", "output": "Paris", "input_tokens": 20, "output_tokens": 1,
         "cost_usd": 0.002},
    ]}
'''

DATA = [
    {"id": "fr", "input": "What is the capital of France?", "reference": "Paris"},
    {"id": "es", "input": "What is the capital of Spain?", "reference": "Madrid"},
    {"id": "it", "input": "What is the capital of Italy?", "reference": "Rome"},
]


def run_file(tmp: Path, *, gates: list[str] | None = None, data: list[dict[str, Any]] | None = None,
             function: str = "agent:answer", trials: int = 3, timeout: str = "60s", **extra: Any) -> Path:  # fmt: skip
    (tmp / "agent.py").write_text(AGENT)
    (tmp / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (data or DATA)))
    doc = {
        "apiVersion": "evals.si/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": "capitals"},
        "spec": {
            "target": {"python": {"function": function}},
            "dataset": "data.jsonl",
            "trials": trials,
            "timeout": timeout,
            "evaluators": [{"ref": "builtin/exact-match"}],
            "gates": gates if gates is not None else ["metric('exact-match').passAtK(3) >= 0.6"],
            "concurrency": 3,
            **extra,
        },
    }
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def evalsi(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`evalsi ARGS` in `cwd`: a command that only reads and writes through a running collector (`--collector`) in
    this process; `evalsi run` always in a process of its own (it imports the target's and tools' modules by name
    from the run's folder, and without `--collector` starts a collector on an embedded store)."""
    if "--collector" in args and args[0] != "run":
        return evalsi_cli(*args, cwd=cwd)
    return subprocess.run([*EVALSI, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def run_json(res: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert res.stdout.strip(), res.stderr
    return json.loads(res.stdout)


def hand_pass_at_k(per_task: list[tuple[int, int]], k: int) -> Fraction:
    """pass@k = mean over tasks of 1 - C(n-c, k)/C(n, k), written out for n = 3."""
    from math import comb

    return sum((1 - Fraction(comb(n - c, k), comb(n, k)) for n, c in per_task), Fraction(0)) / len(per_task)


def hand_pass_hat_k(per_task: list[tuple[int, int]], k: int) -> Fraction:
    from math import comb

    return sum((Fraction(comb(c, k), comb(n, k)) for n, c in per_task), Fraction(0)) / len(per_task)


def test_a_three_trial_run_reports_pass_at_k_and_pass_hat_k_and_stores_everything(
    tmp_path: Path, collector: Collector
) -> None:
    res = evalsi("run", "-f", str(run_file(tmp_path)), "--collector", collector.api, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run = run_json(res)
    m = run["metrics"]["exact-match"]
    # France 3/3, Spain 1/3 (right on trial 0 only), Italy 0/3
    per_task = [(3, 3), (3, 1), (3, 0)]
    assert m["n"] == 9 and m["mean"] == pytest.approx(4 / 9)
    for k in (1, 2, 3):
        assert m["pass_at_k"][str(k)] == pytest.approx(float(hand_pass_at_k(per_task, k)), abs=1e-12)
        assert m["pass_hat_k"][str(k)] == pytest.approx(float(hand_pass_hat_k(per_task, k)), abs=1e-12)
    assert m["pass_at_k"]["3"] == pytest.approx(2 / 3) and m["pass_hat_k"]["3"] == pytest.approx(1 / 3)
    assert run["gates"] == [{"gate": "metric('exact-match').passAtK(3) >= 0.6", "passed": True, "detail": "",
                             "value": pytest.approx(2 / 3), "op": ">=", "threshold": 0.6,
                             "seen": {"metric('exact-match').passAtK(3)": pytest.approx(2 / 3)}}]  # fmt: skip
    assert run["manifest"]["dataset"]["tasks"] == 3 and len(run["manifest"]["dataset"]["hash"]) == 64
    assert run["infra_errors"] == [] and run["attempts"] == 9

    # `runs show` reads the same figures back from the store
    shown = run_json(evalsi("runs", "show", run["run_id"], "--json", "--collector", collector.api, cwd=tmp_path))
    assert shown["metrics"] == run["metrics"] and shown["gates"] == run["gates"]

    # every attempt is a trace in the store, tagged with the run, and scored once
    scores = httpx.get(f"{collector.api}/api/v1/runs/{run['run_id']}/scores").json()["scores"]
    mine = [s for s in scores if s["policy"] == "run:capitals"]
    assert len(mine) == 9 and len({(s["task_id"], s["trial"]) for s in mine}) == 9
    trace = httpx.get(f"{collector.api}/api/v1/traces/{mine[0]['trace_id']}").json()["spans"]
    root = next(s for s in trace if not s["parent_span_id"])
    assert root["attributes"]["evalsi.run_id"] == run["run_id"]
    assert {root["attributes"]["evalsi.task_id"], root["service_name"]} == {mine[0]["task_id"], "evalsi-run"}

    # scoring the same traces again replaces their scores: still one per key
    body = {"name": "capitals", "evaluators": [{"ref": "builtin/exact-match"}],
            "traces": [{"trace_id": s["trace_id"], "task_id": s["task_id"], "trial": s["trial"],
                        "reference": {"expected_output": "Paris"}} for s in mine]}  # fmt: skip
    again = httpx.post(f"{collector.api}/v1/runs/{run['run_id']}/score", json=body, timeout=120)
    assert again.status_code == 200 and len(again.json()["scores"]) == 9
    after = httpx.get(f"{collector.api}/api/v1/runs/{run['run_id']}/scores").json()["scores"]
    assert len([s for s in after if s["policy"] == "run:capitals"]) == 9


def test_a_failing_gate_exits_1_and_says_which(tmp_path: Path, collector: Collector) -> None:
    path = run_file(tmp_path, gates=["metric('exact-match').passHatK(3) >= 0.9", "metric('nope').mean > 0"])
    res = evalsi("run", "-f", str(path), "--collector", collector.api, "-q", cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert "FAIL metric('exact-match').passHatK(3) >= 0.9" in res.stdout
    assert "no scores named 'nope'" in res.stdout


def test_infrastructure_errors_are_reported_apart_and_the_run_goes_on(tmp_path: Path, collector: Collector) -> None:
    data = [*DATA, {"id": "crash", "input": "boom"}, {"id": "slow", "input": "slow please"}]
    path = run_file(tmp_path, data=data, trials=1, timeout="1s")
    run = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    errors = {e["task_id"]: e for e in run["infra_errors"]}
    assert errors["crash"]["kind"] == "crash" and "the agent crashed" in errors["crash"]["message"]
    assert errors["slow"]["kind"] == "timeout"
    m = run["metrics"]["exact-match"]
    assert m["n"] == 3 and m["errors"] == 0  # infrastructure errors are not failures of the answer


def test_trajectories_from_a_callable_become_spans_the_evaluators_read(tmp_path: Path, collector: Collector) -> None:
    path = run_file(tmp_path, function="agent:with_steps", trials=1, data=DATA[:1],
                    gates=["metric('cost_usd').mean <= 0.01"])  # fmt: skip
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["evaluators"] = [{"ref": "builtin/exact-match"}, {"ref": "builtin/tool-selection",
                                 "params": {"expected_tools": ["get_capital"]}}]  # fmt: skip
    path.write_text(yaml.safe_dump(doc))
    res = evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path)
    run = run_json(res)
    assert res.returncode == 0, run["gates"]
    assert run["metrics"]["cost_usd"]["mean"] == pytest.approx(0.003)
    assert run["metrics"]["tokens"]["mean"] == 36
    scores = httpx.get(f"{collector.api}/api/v1/runs/{run['run_id']}/scores").json()["scores"]
    [tool] = [s for s in scores if s["evaluator"] == "builtin/tool-selection"]
    assert tool["outcome"] == "scored" and tool["passed"] is True
    spans = httpx.get(f"{collector.api}/api/v1/traces/{tool['trace_id']}").json()["spans"]
    assert sorted(s["step_type"] for s in spans) == ["agent", "llm", "llm", "tool"]


def test_resume_runs_only_what_is_missing(tmp_path: Path, collector: Collector) -> None:
    path = run_file(tmp_path, trials=2)
    first = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", "--limit", "2",
                            cwd=tmp_path))  # fmt: skip
    assert first["attempts"] == 4
    resumed = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", "--resume",
                              first["run_id"], cwd=tmp_path))  # fmt: skip
    assert resumed["run_id"] == first["run_id"]
    assert (resumed["skipped_resumed"], resumed["attempts"]) == (4, 2)
    assert resumed["metrics"]["exact-match"]["n"] == 6  # the earlier scores count too


def test_compare_pairs_two_runs(tmp_path: Path, collector: Collector) -> None:
    path = run_file(tmp_path, concurrency=1)  # one at a time: Spain's right answer is on trial 0 in both runs
    a = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    b = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", "--baseline", a["run_id"],
                        cwd=tmp_path))  # fmt: skip
    # the agent's memory is per process: each run gets the same answers, so nothing changed
    c = b["comparison"]["exact-match"]
    assert (c["n"], c["delta"], c["regressions"], c["fixes"], c["pValue"]) == (9, 0.0, 0, 0, 1.0)
    assert not c["regressed"]
    res = evalsi("compare", a["run_id"], b["run_id"], "--json", "--collector", collector.api, cwd=tmp_path)
    compared = json.loads(res.stdout)
    assert compared["exact-match"]["n"] == 9
    # exit 1 only on a significant regression (the runs' wall times may differ)
    assert res.returncode == (1 if any(c["regressed"] for c in compared.values()) else 0)


def test_bad_rows_and_bad_specs_exit_2_naming_where(tmp_path: Path) -> None:
    path = run_file(tmp_path)
    (tmp_path / "data.jsonl").write_text('{"id": "a", "input": "x"}\n{"id": "a", "input": "y"}\nnot json\n')
    res = evalsi("run", "-f", str(path), cwd=tmp_path)
    assert res.returncode == 2
    assert "data.jsonl:3: not JSON" in res.stderr
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["evaluators"] = [{"ref": "builtin/exact-mach"}]
    doc["spec"]["trails"] = 3
    path.write_text(yaml.safe_dump(doc))
    res = evalsi("validate", "-f", str(path), cwd=tmp_path)
    assert res.returncode == 1
    assert "spec.trails: unknown key" in res.stderr


def test_a_run_alone_starts_its_own_collector_and_the_traces_stay(tmp_path: Path) -> None:
    config = serve_config(tmp_path / "store")
    (tmp_path / "evalsi.yaml").write_text(yaml.safe_dump(config))
    path = run_file(tmp_path, trials=1, gates=["metric('exact-match').mean >= 0.3"])
    res = evalsi("run", "-f", str(path), "-c", "evalsi.yaml", "-q", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "in-process collector" in res.stdout
    listed = evalsi("traces", "list", "--json", "-c", "evalsi.yaml", cwd=tmp_path)
    traces = json.loads(listed.stdout)
    assert len([t for t in traces if t["service_name"] == "evalsi-run"]) == 3, listed.stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_rescore_scores_stored_traces_as_a_new_run(tmp_path: Path, collector: Collector) -> None:
    path = run_file(tmp_path)
    first = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    # the run's traces with a new evaluator, no agent run
    res = evalsi("rescore", "--run", first["run_id"], "-e", "builtin/length", "--json", "--collector", collector.api,
                 cwd=tmp_path)  # fmt: skip
    again = run_json(res)
    assert again["run_id"] != first["run_id"] and again["manifest"]["rescore"] == {"run": first["run_id"]}
    assert again["metrics"]["length"]["n"] == 9 and again["attempts"] == 0
    # with the run file: its evaluators, and references from its dataset (the same data): the same figures
    same = run_json(evalsi("rescore", "--run", first["run_id"], "-f", str(path), "--json", "--collector",
                           collector.api, cwd=tmp_path))  # fmt: skip
    assert same["metrics"]["exact-match"]["pass_at_k"] == first["metrics"]["exact-match"]["pass_at_k"]
    # stored traces chosen by CEL
    chosen = run_json(evalsi("rescore", "--traces", f"trace.root.attributes['evalsi.run_id'] == '{first['run_id']}'",
                             "-e", "builtin/length", "--json", "--collector", collector.api, cwd=tmp_path))  # fmt: skip
    assert chosen["metrics"]["length"]["n"] == 9
    bad = evalsi("rescore", "--traces", "trace.nope ==", "-e", "builtin/length", "--collector", collector.api,
                 cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "where: invalid CEL expression" in bad.stderr


def test_reports_carry_the_figures_and_the_failing_trajectories(tmp_path: Path, collector: Collector) -> None:
    path = run_file(tmp_path, trials=1)
    res = evalsi("run", "-f", str(path), "--collector", collector.api, "--json", "--report", "out.html", "--report",
                 "out.md", cwd=tmp_path)  # fmt: skip
    run = run_json(res)
    page, md = (tmp_path / "out.html").read_text(), (tmp_path / "out.md").read_text()
    assert run["run_id"] in page and run["run_id"] in md
    assert "| exact-match | pass/fail | 3 | 0.667 |" in md and "FAIL `metric('exact-match').passAtK(3) >= 0.6`" in md
    # Italy's wrong answer is a failing example, shown with its trajectory (the agent span's output)
    scores = httpx.get(f"{collector.api}/api/v1/runs/{run['run_id']}/scores").json()["scores"]
    [italy] = [s for s in scores if s["task_id"] == "it"]
    assert italy["passed"] is False and italy["trace_id"] in page and "Milan" in page
    # beside the expected answer from the dataset, and so in the Markdown; the passed attempts' trajectories too
    assert '<mark class="want">Rome</mark>' in page and '<mark class="got">Milan</mark>' in page
    assert page.count("<summary>trajectory: ") == 3 and '<table class="grid" id="grid">' in page
    assert "| `it` | **FAIL** | 1 of 1 |" in md and "### `it` trial 0" in md
    assert "expected:\n\n```text\nRome\n```\n\nactual:\n\n```text\nMilan\n```" in md


def test_an_http_agent_run_goes_on_past_its_failures(tmp_path: Path, collector: Collector) -> None:
    data = [{"id": q.split(":")[0], "input": q, "reference": ref} for q, ref in (
        ("atif", "The answer is 42."), ("flaky:2", "answer to flaky:2"), ("polls:2", "answer to polls:2"),
        ("fail", ""), ("malformed", ""), ("hang", ""),
    )]  # fmt: skip
    with HarnessServer(capabilities=Capabilities(max_concurrent_runs=2)) as agent:
        path = run_file(tmp_path, data=data, trials=1, timeout="2s", gates=[])
        doc = yaml.safe_load(path.read_text())
        doc["spec"]["target"] = {"http": {"url": agent.url, "api_key": "env:AGENT_KEY", "poll_interval": "50ms",
                                          "stop_grace": "1s"}}  # fmt: skip
        path.write_text(yaml.safe_dump(doc))
        env_res = subprocess.run([*EVALSI, "run", "-f", str(path), "--collector", collector.api, "--json"],
                                 capture_output=True, text=True, cwd=tmp_path, timeout=240,
                                 env={**os.environ, "AGENT_KEY": "test-key"})  # fmt: skip
        run = run_json(env_res)
        assert agent.max_active <= 2  # the agent's limit caps the run's concurrency
        assert {p["metadata"]["case_id"] for p in agent.posts} >= {"atif", "flaky", "polls"}
        assert all(p["metadata"]["experiment_id"] == run["run_id"] for p in agent.posts)
        assert agent.stops  # the hanging run was stopped
    errors = {e["task_id"]: e["kind"] for e in run["infra_errors"]}
    assert errors == {"fail": "target_error", "malformed": "malformed", "hang": "timeout"}
    m = run["metrics"]["exact-match"]
    assert (m["n"], m["mean"]) == (3, 1.0)
    # the ATIF trajectory became spans: the subagent's own invoke_agent span, its model calls and tool call
    scores = httpx.get(f"{collector.api}/api/v1/runs/{run['run_id']}/scores").json()["scores"]
    [atif] = [s for s in scores if s["task_id"] == "atif"]
    spans = httpx.get(f"{collector.api}/api/v1/traces/{atif['trace_id']}").json()["spans"]
    names = sorted(s["name"] for s in spans)
    assert "invoke_agent researcher" in names and "execute_tool web_search" in names
    assert sum(1 for s in spans if s["step_type"] == "llm") >= 4


def test_a_command_agent_gets_the_input_and_the_trace_context(tmp_path: Path, collector: Collector) -> None:
    script = tmp_path / "cmd.py"
    script.write_text(
        "import os, sys\n"
        "text = sys.stdin.read()\n"
        "if 'boom' in text:\n"
        "    sys.stderr.write('it broke')\n"
        "    sys.exit(3)\n"
        "print(os.environ['TRACEPARENT'].split('-')[1] + ' ' + text.upper())\n"
    )
    data = [{"id": "a", "input": "hello"}, {"id": "b", "input": "boom"}]
    path = run_file(tmp_path, data=data, trials=1, gates=[])
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["target"] = {"command": {"argv": [sys.executable, "cmd.py"]}}
    doc["spec"]["evaluators"] = [{"ref": "builtin/length"}]
    path.write_text(yaml.safe_dump(doc))
    run = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    [crash] = run["infra_errors"]
    assert (crash["task_id"], crash["kind"]) == ("b", "crash") and "exit code 3: it broke" in crash["message"]
    scores = httpx.get(f"{collector.api}/api/v1/runs/{run['run_id']}/scores").json()["scores"]
    [a] = [s for s in scores if s["task_id"] == "a"]
    spans = httpx.get(f"{collector.api}/api/v1/traces/{a['trace_id']}").json()["spans"]
    [root] = [s for s in spans if not s["parent_span_id"]]
    # the program saw the attempt's own trace id in TRACEPARENT, and its stdout is the answer
    assert root["output"][0]["parts"][0]["content"] == f"{a['trace_id']} HELLO"


def test_the_openai_agent_with_a_model_override_and_a_budget_that_stops_the_run(
    tmp_path: Path, collector: Collector
) -> None:
    data = [{"id": f"t{i}", "input": f"What is {i} + 1?", "reference": str(i + 1)} for i in range(6)]
    path = run_file(tmp_path, data=data, trials=1, gates=[], concurrency=1, budget={"tokens": 40})
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["target"] = {"openai": {"base_url": "stub", "model": "stub-1", "price": {"input": 1, "output": 2}}}
    path.write_text(yaml.safe_dump(doc))
    run = run_json(evalsi("run", "-f", str(path), "--model", "stub-2", "--collector", collector.api, "--json",
                          cwd=tmp_path))  # fmt: skip
    assert run["manifest"]["target"].endswith("#stub-2")
    # attempts run one at a time until their tokens reach the budget of 40; the others never start
    n, per_attempt = run["attempts"], run["metrics"]["tokens"]["mean"]
    assert 0 < n < 6 and run["not_run"] == 6 - n
    assert n * per_attempt >= 40 > (n - 1) * per_attempt
    assert run["metrics"]["exact-match"]["mean"] == 1.0
    res = evalsi("run", "-f", str(run_file(tmp_path)), "--model", "x", "--collector", collector.api, cwd=tmp_path)
    assert res.returncode == 2 and "--model: a python target has no model to override" in res.stderr


def test_the_run_api_refuses_bad_requests_with_a_400_naming_the_field(collector: Collector) -> None:
    trace = {"trace_id": "ab" * 16, "task_id": "t", "trial": 0}
    cases = [
        ("/v1/runs/bad%20id/score", {"name": "n", "evaluators": [{"ref": "builtin/length"}], "traces": [trace]},
         "invalid run id 'bad id'"),
        ("/v1/runs/r1/score", {"name": "n", "evaluators": [{"ref": "builtin/nope"}], "traces": [trace]},
         "evaluators.0.ref: unknown evaluator 'builtin/nope'"),
        ("/v1/runs/r1/score", {"name": "n", "evaluators": [{"ref": "builtin/length"}],
                               "traces": [{**trace, "trace_id": "xyz\\n"}]}, "traces.0.trace_id: not a trace id"),
        ("/v1/runs", {"run_id": "x" * 201, "name": "n", "status": "running"}, "run_id"),
        ("/v1/traces/select", {"where": "trace.x =="}, "where: invalid CEL expression"),
    ]  # fmt: skip
    for path, body, message in cases:
        resp = httpx.post(collector.api + path, json=body, timeout=30)
        assert resp.status_code == 400 and message in resp.json()["detail"], (path, resp.text)


def test_a_dataset_with_peoples_labels_gets_a_judge_calibration_section(tmp_path: Path, collector: Collector) -> None:
    """People labeled three of four tasks' answers: France right, Italy wrong (as exact-match says), Spain right
    (exact-match fails it on two trials of three: Barcelona, where people accepted any answer for Spain)."""
    data = [
        {"id": "fr", "input": "What is the capital of France?",
         "reference": {"expected_output": "Paris", "labels": {"exact-match": True}}},
        {"id": "es", "input": "What is the capital of Spain?",
         "reference": {"expected_output": "Madrid", "labels": {"exact-match": "pass"}}},
        {"id": "it", "input": "What is the capital of Italy?",
         "reference": {"expected_output": "Rome", "labels": {"exact-match": "thumbs_down"}}},
        {"id": "de", "input": "What is the capital of Germany?", "reference": {"expected_output": "Berlin"}},
    ]  # fmt: skip
    path = run_file(tmp_path, data=data, gates=[])
    res = evalsi("run", "-f", str(path), "--collector", collector.api, "--json", "--report", "out.md", "--report",
                 "out.html", cwd=tmp_path)  # fmt: skip
    run = run_json(res)
    [c] = run["judge_calibration"]
    assert (c["evaluator"], c["name"], c["feedback"], c["n"]) == ("builtin/exact-match", "exact-match", "labels", 9)
    assert c["confusion"] == {"both_pass": 4, "both_fail": 3, "judge_pass_human_fail": 0, "judge_fail_human_pass": 2}
    expected = cohens_kappa(np.array([[3, 2], [0, 4]]))
    assert c["kappa"]["kappa"] == pytest.approx(expected.kappa) and c["kappa"]["se"] == pytest.approx(
        expected.std_kappa
    )
    assert c["sensitivity"][0] == 1.0 and c["specificity"][0] == pytest.approx(4 / 6)
    # the judge passes none of Germany's 3 attempts; on labeled ones it passes 4/9 where people pass 6/9
    assert c["ppi"]["unlabeled"] == 3 and c["ppi"]["estimate"] == pytest.approx(0 - (4 / 9 - 6 / 9))
    md = (tmp_path / "out.md").read_text()
    assert '<a id="judge-calibration"></a>' in md and "## Judge calibration" in md
    assert "| `builtin/exact-match` | exact-match | 9 | 7 / 2 |" in md
    page = (tmp_path / "out.html").read_text()
    assert '<section id="judge-calibration"><h2>Judge calibration</h2>' in page
    assert "<td>builtin/exact-match</td><td>exact-match</td><td class=\"num\">9</td><td>7 / 2</td>" in page
    # without labels, no section
    plain = run_json(evalsi("run", "-f", str(run_file(tmp_path, gates=[])), "--collector", collector.api, "--json",
                            cwd=tmp_path))  # fmt: skip
    assert plain["judge_calibration"] == []
