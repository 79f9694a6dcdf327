"""τ-bench task files read into tasks: the simulated user's instruction in the metadata, the expected actions and
outputs in the reference (what `builtin/expected-actions` reads), and every bad record listed with where it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evalsi.evaluators import REGISTRY, Target, load_evaluators, parse_params, run
from evalsi.model.span import Span
from evalsi.model.trajectory import build_trajectory
from evalsi.run_harness.dataset import DatasetError
from evalsi.run_harness.model import Task
from evalsi.run_harness.tau import load_tau_tasks

# two tasks as τ-bench's retail tasks are written (its `annotator` field included)
CANCEL = {
    "annotator": "0",
    "user_id": "yusuf_rossi_9620",
    "instruction": "You are Yusuf Rossi in 19122. You want to cancel order #W2378156 because you no longer need it.",
    "actions": [
        {"name": "find_user_id_by_name_zip", "kwargs": {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}},
        {"name": "cancel_pending_order", "kwargs": {"order_id": "#W2378156", "reason": "no longer needed"}},
    ],
    "outputs": ["1234.5"],
}
ASK = {
    "user_id": "mei_kovacs_8020",
    "instruction": "You want to know how many t-shirt options are available. You do not want to buy anything.",
    "actions": [],
    "outputs": ["10"],
    "persona": "terse, in a hurry",
}


def write(tmp_path: Path, name: str, records: Any, jsonl: bool = False) -> Path:
    path = tmp_path / name
    if jsonl:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path.write_text(json.dumps(records, indent=2))
    return path


def bad(path: Path) -> list[str]:
    with pytest.raises(DatasetError) as info:
        load_tau_tasks(path)
    assert str(info.value) == "\n".join(info.value.errors)
    return info.value.errors


def test_a_tau_bench_task_file(tmp_path: Path) -> None:
    cancel, ask = load_tau_tasks(write(tmp_path, "tasks.json", [CANCEL, ASK]))
    assert cancel == Task(
        "0",
        None,
        reference={
            "expected_actions": [
                {"name": "find_user_id_by_name_zip", "arguments": {"first_name": "Yusuf", "last_name": "Rossi",
                                                                   "zip": "19122"}},
                {"name": "cancel_pending_order", "arguments": {"order_id": "#W2378156", "reason": "no longer needed"}},
            ],
            "expected_outputs": ["1234.5"],
        },
        metadata={"user": {"instruction": CANCEL["instruction"], "user_id": "yusuf_rossi_9620", "persona": None}},
        line=1,
    )  # fmt: skip
    assert (ask.id, ask.input, ask.line) == ("1", None, 2)
    assert ask.reference == {"expected_actions": [], "expected_outputs": ["10"]}
    assert ask.metadata["user"] == {"instruction": ASK["instruction"], "user_id": "mei_kovacs_8020",
                                    "persona": "terse, in a hurry"}  # fmt: skip


def test_ids_given_or_the_task_index(tmp_path: Path) -> None:
    minimal = {"instruction": "Ask for a refund.", "actions": []}
    tasks = load_tau_tasks(write(tmp_path, "t.json", [{**minimal, "id": "refund-1"}, minimal, {**minimal, "id": 7}]))
    assert [t.id for t in tasks] == ["refund-1", "1", "7"]
    assert tasks[1].reference == {"expected_actions": [], "expected_outputs": []}
    assert tasks[1].metadata == {"user": {"instruction": "Ask for a refund.", "user_id": None, "persona": None}}


def test_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(CANCEL) + "\n\n" + json.dumps(ASK) + "\n")
    cancel, ask = load_tau_tasks(path)
    # ids are task indexes (the blank line is no task); lines are where the records are
    assert [(t.id, t.line) for t in (cancel, ask)] == [("0", 1), ("1", 3)]
    assert cancel.reference["expected_actions"][1]["arguments"]["order_id"] == "#W2378156"
    # JSONL in a .json file is read too
    same = load_tau_tasks(write(tmp_path, "tasks.json", [CANCEL, ASK], jsonl=True))
    assert [t.reference for t in same] == [cancel.reference, ask.reference]


def test_every_bad_record_is_listed(tmp_path: Path) -> None:
    records = [
        CANCEL,
        {"instruction": "", "actions": []},
        {"instruction": "Cancel it.", "actions": {"name": "cancel_pending_order"}},
        {"instruction": "Cancel it.", "actions": [{"kwargs": {}}, {"name": "cancel_pending_order", "kwargs": "#W1"}]},
        {"id": "0", "instruction": "Cancel it.", "actions": []},
        {"instruction": "Cancel it."},
        {"instruction": "Cancel it.", "actions": [], "outputs": "10", "user_id": ["x"], "persona": 3},
        ["not", "a", "task"],
        {"instruction": 42, "actions": ["cancel_pending_order"], "id": True},
    ]
    path = write(tmp_path, "tasks.json", records)
    assert bad(path) == [
        f"{path}:2: instruction is missing (the simulated user's goal)",
        f"{path}:3: actions must be a list of {{name, kwargs}}, not an object",
        f"{path}:4: actions[0] has no name",
        f"{path}:4: actions[1] (cancel_pending_order): kwargs must be an object, not a string",
        f"{path}:5: id '0' is already used at {path}:1",
        f"{path}:6: actions is missing (a list of {{name, kwargs}}, [] for none)",
        f"{path}:7: outputs must be a list of strings",
        f"{path}:7: user_id must be a string, not a list",
        f"{path}:7: persona must be a string, not a number",
        f"{path}:8: a task must be an object, not a list",
        f"{path}:9: id must be a string or an integer, not a boolean",
        f"{path}:9: instruction must be a string, not a number",
        f"{path}:9: actions[0] must be an object {{name, kwargs}}, not a string",
    ]


def test_bad_files(tmp_path: Path) -> None:
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text(json.dumps(CANCEL) + "\n{not json\n" + json.dumps(ASK) + "\n[1,\n")
    errors = bad(jsonl)
    assert [e.split(": ", 2)[:2] for e in errors] == [[f"{jsonl}:2", "not JSON"], [f"{jsonl}:4", "not JSON"]]
    broken = tmp_path / "broken.json"
    broken.write_text('[{"instruction": "x", "actions": []},')
    assert bad(broken)[0].startswith(f"{broken}: not JSON: ")
    assert bad(write(tmp_path, "object.json", {"tasks": []})) == [
        f"{tmp_path / 'object.json'}: expected a JSON array of tasks (or JSONL), not an object"
    ]
    assert bad(write(tmp_path, "empty.json", [])) == [f"{tmp_path / 'empty.json'}: no tasks"]
    missing = tmp_path / "missing.json"
    assert bad(missing) == [f"{missing}: cannot read: No such file or directory"]


# --- the reference is what builtin/expected-actions reads ---------------------------------------------------------


def _agent_trace(task: Task, calls: list[tuple[str, dict[str, Any]]], answer: str) -> Target:
    trace_id = "6df92f3577b34da6a3ce929d0e0e4738"

    def span(n: int, step_type: str, **fields: Any) -> Span:
        parent = "" if n == 1 else f"{1:016x}"
        return Span(trace_id, f"{n:016x}", parent, step_type, "INTERNAL", n * 1000, n * 1000 + 500,
                    step_type=step_type, content_captured=True, **fields)  # fmt: skip

    spans = [span(1, "agent")]
    for n, (name, arguments) in enumerate(calls, start=2):
        part = {"type": "tool_call", "id": f"c{n}", "name": name, "arguments": json.dumps(arguments)}
        spans.append(span(n, "tool", tool_name=name, input=[{"role": "assistant", "parts": [part]}]))
    said = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
    spans.append(span(len(spans) + 1, "llm", output=said))
    return Target(spans, span=spans[0], trajectory=build_trajectory(spans), reference=task.reference)


def test_the_reference_feeds_expected_actions(tmp_path: Path) -> None:
    load_evaluators()
    ev = REGISTRY["builtin/expected-actions"]
    [task] = load_tau_tasks(write(tmp_path, "tasks.json", [CANCEL]))
    lookup, cancel = ((a["name"], a["arguments"]) for a in task.reference["expected_actions"])
    done = _agent_trace(task, [lookup, ("get_order_details", {"order_id": "#W2378156"}), cancel],
                        "Cancelled. You will get $1,234.50 back.")  # fmt: skip
    (score,) = run(ev, done, parse_params(ev, {"allow_extra": False}))
    assert (score.value, score.passed, score.label) == (1.0, True, "3/3 matched")
    gave_up = _agent_trace(task, [lookup], "I cannot cancel that order.")
    (score,) = run(ev, gave_up, parse_params(ev, {}))
    assert score.value == pytest.approx(1 / 3) and score.passed is False
