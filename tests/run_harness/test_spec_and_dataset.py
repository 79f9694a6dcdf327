"""The run file and the dataset are checked whole before anything runs; each problem names where it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from evalsi.run_harness.dataset import DatasetError, load_dataset
from evalsi.run_harness.gates import check_gates, compile_gate
from evalsi.run_harness.spec import RunSpecError, load_run


def write_run(tmp: Path, **spec: Any) -> Path:
    doc = {
        "apiVersion": "evals.si/v1alpha1",
        "kind": "EvalRun",
        "metadata": {"name": "r"},
        "spec": {"target": {"python": {"function": "m:f"}}, "dataset": "d.jsonl",
                 "evaluators": [{"ref": "builtin/exact-match"}], **spec},
    }  # fmt: skip
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def errors(path: Path) -> list[str]:
    with pytest.raises(RunSpecError) as info:
        load_run(path)
    return [e.split(": ", 1)[1] for e in info.value.errors]


def test_a_good_run_file(tmp_path: Path) -> None:
    spec = load_run(write_run(tmp_path, trials=3, gates=["metric('exact-match').passHatK(3) >= 0.8"],
                              judge={"model": "m"}, timeout="90s"))  # fmt: skip
    assert (spec.name, spec.body.trials, spec.body.timeout) == ("r", 3, 90.0)
    assert spec.body.dataset.path == "d.jsonl" and spec.path("d.jsonl") == tmp_path / "d.jsonl"
    assert [ref for ref, _, _ in spec.evaluators] == ["builtin/exact-match"]
    assert len(spec.hash) == 64


def test_every_problem_is_named_by_its_key_path(tmp_path: Path) -> None:
    found = errors(
        write_run(tmp_path, trails=3, concurrency=0, target={"python": {"function": "m:f"}, "http": {"url": "x"}})
    )
    assert "spec.trails: unknown key" in found
    assert any(e.startswith("spec.concurrency: Input should be greater than or equal to 1") for e in found)
    assert "spec.target: give exactly one target kind (python, command, openai or http), not 2 (python, http)" in found


def test_evaluators_and_gates_are_checked(tmp_path: Path) -> None:
    found = errors(write_run(tmp_path, evaluators=[{"ref": "builtin/exact-mach"}, {"ref": "builtin/length",
                                                     "params": {"unit": "pages"}}],
                             gates=["metric('x').mean >", "1 > 0"]))  # fmt: skip
    assert "spec.evaluators.0.ref: unknown evaluator 'builtin/exact-mach'; did you mean 'builtin/exact-match'?" in found
    assert any(e.startswith("spec.evaluators.1.params.unit:") for e in found)
    assert any(e.startswith("spec.gates.0.when: invalid CEL expression") for e in found)
    assert "spec.gates.1.when: a gate must read metric('name') or compare('name')" in found


def test_gates_read_aggregates_and_explain_what_they_cannot_answer() -> None:
    metrics = {"ok": {"n": 9, "mean": 0.5, "p95": 120.0, "pass_at_k": {"1": 0.5, "3": 0.9}, "pass_hat_k": {"3": 0.2}}}
    gates = [compile_gate(g) for g in (
        "metric('ok').passAtK(3) >= 0.8 && metric('ok').passHatK(3) < 0.5",  # both hold
        "metric('ok').p95 < 100",  # fails
        "metric('gone').mean > 0",  # no such scores
        "compare('ok').delta >= -0.02",  # no baseline
    )]  # fmt: skip
    results = check_gates(gates, metrics, None)
    assert [r.passed for r in results] == [True, False, False, False]
    assert results[2].detail == "no scores named 'gone' (scored: ok)"
    assert results[3].detail == "reads compare(...) but the run has no --baseline"
    with_baseline = check_gates(gates[3:], metrics, {"ok": {"delta": -0.01, "low": -0.1, "high": 0.05}})
    assert with_baseline[0].passed


# --- datasets -------------------------------------------------------------------------------------------------


ROWS = [
    {"id": "a", "input": "2+2?", "reference": "4"},
    {"id": 7, "input": {"question": "q", "lang": "fr"}, "reference": {"expected_output": "x", "expected_tools": ["t"]},
     "context": "doc", "metadata": {"tier": 1}},
]  # fmt: skip


def check_rows(tasks: list[Any]) -> None:
    assert [t.id for t in tasks] == ["a", "7"]
    assert tasks[0].reference == {"expected_output": "4"} and tasks[0].input_text == "2+2?"
    assert tasks[1].input == {"question": "q", "lang": "fr"} and tasks[1].input_text == "q"
    assert tasks[1].reference["expected_tools"] == ["t"] and tasks[1].context == ["doc"]
    assert tasks[1].metadata == {"tier": 1}


def test_jsonl_json_csv_and_parquet_read_the_same(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    flat = [{k: v if isinstance(v, str) else json.dumps(v) for k, v in r.items()} for r in ROWS]
    pl.DataFrame(flat).write_csv(tmp_path / "d.csv")
    pl.DataFrame(flat).write_parquet(tmp_path / "d.parquet")
    for name in ("d.jsonl", "d.json", "d.csv", "d.parquet"):
        ds = load_dataset(tmp_path / name)
        check_rows(ds.tasks)
        assert len(ds.hash) == 64
    assert load_dataset(tmp_path / "d.jsonl", limit=1).tasks[0].id == "a"


def test_a_promoted_dataset_reads_as_it_is(tmp_path: Path) -> None:
    row = {"id": "ab" * 16, "input": "hi", "output": "hello", "trace_id": "ab" * 16, "reference": "hello"}
    (tmp_path / "bad.jsonl").write_text(json.dumps(row) + "\n")
    [task] = load_dataset(tmp_path / "bad.jsonl").tasks
    assert task.id == "ab" * 16 and task.reference == {"expected_output": "hello"}


def test_bad_rows_are_reported_with_their_lines(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text(
        '{"id": "a", "input": "x"}\n\n{"id": "a", "input": "y"}\n{"id": "b"}\n[1]\n'
        '{"id": "c", "input": "z", "colour": 1}\n'
    )
    with pytest.raises(DatasetError) as info:
        load_dataset(tmp_path / "d.jsonl")
    p = tmp_path / "d.jsonl"
    assert info.value.errors == [
        f"{p}:3: id 'a' is already used on line 1",
        f"{p}:4: input is missing",
        f"{p}:5: a record must be an object, not list",
        f"{p}:6: unknown field 'colour' (fields: id, input, reference, context, metadata)",
    ]
    (tmp_path / "e.jsonl").write_text('{"id": 1, "input": "x"}\n{oops\n')
    with pytest.raises(DatasetError, match=r"e.jsonl:2: not JSON"):
        load_dataset(tmp_path / "e.jsonl")
    (tmp_path / "x.txt").write_text("a")
    with pytest.raises(DatasetError, match=r"unknown dataset format '\.txt'"):
        load_dataset(tmp_path / "x.txt")
