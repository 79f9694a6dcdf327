"""`evalsi import atif|inspect` end to end: outside results become a run whose traces are in the store, scored by
evalsi's evaluators beside the imported scores, readable with `evalsi runs show` like any run."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from running_collector import Collector

from evalsi.model.span import span_from_canonical
from evalsi.model.trajectory import build_trajectory

from .harness_server import atif_document
from .test_inspect_import import logs  # noqa: F401  (the fixture: real Inspect logs written in a subprocess)
from .test_run_e2e import evalsi, run_json


def test_atif_files_with_subagents_become_a_scored_run(tmp_path: Path, collector: Collector) -> None:
    files = []
    for i, question in enumerate(["what is 6*7?", "and 7*6?"]):
        doc = atif_document(question, f"run-{i}")
        doc["session_id"] = f"s{i}"
        path = tmp_path / f"t{i}.json"
        path.write_text(json.dumps(doc))
        files.append(str(path))
    (tmp_path / "refs.jsonl").write_text('{"id": "s0", "input": "what is 6*7?", "reference": "The answer is 42."}\n')
    res = evalsi("import", "atif", *files, "-e", "builtin/exact-match", "-e", "builtin/tool-call-error-rate",
                 "--dataset", "refs.jsonl", "--name", "atif-test", "--collector", collector.api, "--json",
                 cwd=tmp_path)  # fmt: skip
    run = run_json(res)
    assert run["attempts"] == 2 and run["infra_errors"] == []
    scores = httpx.get(f"{collector.api}/api/v1/runs/{run['run_id']}/scores").json()["scores"]
    by = {(s["task_id"], s["name"]): s for s in scores}
    assert by[("s0", "exact-match")]["passed"] is True  # the reference came from the dataset
    assert by[("s1", "exact-match")]["outcome"] == "skipped"  # no reference for s1
    assert by[("s0", "tool-call-error-rate")]["value"] > 0  # the document's failed lookup
    spans = httpx.get(f"{collector.api}/api/v1/traces/{by[('s0', 'exact-match')]['trace_id']}").json()["spans"]
    trajectory = build_trajectory([span_from_canonical(s) for s in spans])
    agents = [s["agent_name"] for s in trajectory["steps"] if s["type"] == "agent"]
    assert agents == ["test-agent", "researcher"]  # the subagent is a nested invoke_agent
    shown = evalsi("runs", "show", run["run_id"], "--collector", collector.api, cwd=tmp_path)
    assert shown.returncode == 0 and "exact-match" in shown.stdout and run["run_id"] in shown.stdout


def test_an_unreadable_atif_file_is_named_and_nothing_is_imported(tmp_path: Path, collector: Collector) -> None:
    (tmp_path / "bad.json").write_text(json.dumps({"schema_version": "ATIF-v1.7", "steps": {}}))
    res = evalsi("import", "atif", "bad.json", "-e", "builtin/length", "--collector", collector.api, cwd=tmp_path)
    assert res.returncode == 2 and "bad.json: steps: expected an array" in res.stderr
    res = evalsi("import", "atif", "bad.json", "--collector", collector.api, cwd=tmp_path)
    assert res.returncode == 2 and "--evaluator" in res.stderr


def test_an_inspect_log_becomes_a_run_with_its_scorers_and_ours(
    tmp_path: Path,
    collector: Collector,
    logs: dict[str, Path],  # noqa: F811
) -> None:
    res = evalsi("import", "inspect", str(logs["arith"]), "-e", "builtin/length", "--collector", collector.api,
                 "--json", cwd=tmp_path)  # fmt: skip
    run = run_json(res)
    assert run["attempts"] == 6 and run["manifest"]["imported"]["format"] == "inspect_ai"
    assert run["metrics"]["match"]["n"] == 6 and run["metrics"]["match"]["mean"] == pytest.approx(4 / 6)
    scores = httpx.get(f"{collector.api}/api/v1/runs/{run['run_id']}/scores").json()["scores"]
    match = [s for s in scores if s["name"] == "match"]
    assert {s["source"] for s in match} == {"imported"} and {s["trial"] for s in match} == {0, 1}
    assert {s["name"] for s in scores} == {"match", "length"}
    listed = evalsi("runs", "list", "--json", "--collector", collector.api, cwd=tmp_path)
    assert run["run_id"] in {r["run_id"] for r in json.loads(listed.stdout)}
