"""τ-bench task files (a JSON array or JSONL of `{user_id, instruction, actions, outputs}`) read into tasks whose
reference holds the expected actions and outputs, and whose simulated user gets the instruction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from evalsi.run_harness.model import DatasetError, Task
from evalsi.run_harness.records import jsonl_rows

_JSONL = frozenset((".jsonl", ".ndjson"))


def _records(path: Path, data: bytes) -> list[tuple[int, Any]]:
    """(where, record) pairs: a JSON array's records numbered from 1, or a JSONL file's by line (blank lines are
    skipped). A `.jsonl`/`.ndjson` file is JSONL; another file is a JSON array, or JSONL when it is not one JSON
    document but its first record is an object."""
    text = data.lstrip()
    if path.suffix.lower() not in _JSONL:
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            if not text.startswith(b"{"):
                raise DatasetError([f"{path}: not JSON: {e}"]) from None
        else:
            if not isinstance(doc, list):
                raise DatasetError([f"{path}: expected a JSON array of tasks (or JSONL), not {_kind(doc)}"])
            return list(enumerate(doc, 1))
    return jsonl_rows(path, data)


def _actions(value: Any, where: str, errors: list[str]) -> list[dict[str, Any]]:
    """τ-bench's `[{name, kwargs}]` as the evaluators' `[{name, arguments}]`; each problem added to `errors`."""
    if not isinstance(value, list):
        errors.append(f"{where}: actions must be a list of {{name, kwargs}}, not {_kind(value)}")
        return []
    actions = []
    for i, action in enumerate(value):
        if not isinstance(action, dict):
            errors.append(f"{where}: actions[{i}] must be an object {{name, kwargs}}, not {_kind(action)}")
            continue
        name = action.get("name")
        if not isinstance(name, str) or not name:
            errors.append(f"{where}: actions[{i}] has no name")
            continue
        kwargs = action.get("kwargs", action.get("arguments", {}))
        if not isinstance(kwargs, dict):
            errors.append(f"{where}: actions[{i}] ({name}): kwargs must be an object, not {_kind(kwargs)}")
            continue
        actions.append({"name": name, "arguments": kwargs})
    return actions


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def _optional_text(record: dict[str, Any], key: str, where: str, errors: list[str]) -> str | None:
    value = record.get(key)
    if value is None or isinstance(value, str):
        return value
    errors.append(f"{where}: {key} must be a string, not {_kind(value)}")
    return None


def _task(path: Path, index: int, number: int, record: Any, errors: list[str], seen: dict[str, str]) -> Task | None:
    """Record `index` (0-based), at `number` in the file, as a task; or None with its problems added to `errors`."""
    where = f"{path}:{number}"
    if not isinstance(record, dict):
        errors.append(f"{where}: a task must be an object, not {_kind(record)}")
        return None
    problems: list[str] = []
    raw_id = record.get("id")
    task_id = str(index)  # τ-bench's task index
    if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) and raw_id != "":
        task_id = str(raw_id)
    elif raw_id is not None:
        problems.append(f"{where}: id must be a string or an integer, not {_kind(raw_id)}")
    if task_id in seen:
        problems.append(f"{where}: id {task_id!r} is already used at {seen[task_id]}")
    else:
        seen[task_id] = where
    instruction = record.get("instruction")
    if instruction is None or instruction == "":
        problems.append(f"{where}: instruction is missing (the simulated user's goal)")
    elif not isinstance(instruction, str):
        problems.append(f"{where}: instruction must be a string, not {_kind(instruction)}")
    if "actions" not in record:
        problems.append(f"{where}: actions is missing (a list of {{name, kwargs}}, [] for none)")
        actions: list[dict[str, Any]] = []
    else:
        actions = _actions(record["actions"], where, problems)
    outputs = record.get("outputs")
    if outputs is None:
        outputs = []
    elif not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
        problems.append(f"{where}: outputs must be a list of strings")
    user_id = record.get("user_id")
    if isinstance(user_id, int) and not isinstance(user_id, bool):
        user_id = str(user_id)
    elif user_id is not None and not isinstance(user_id, str):
        problems.append(f"{where}: user_id must be a string, not {_kind(user_id)}")
    persona = _optional_text(record, "persona", where, problems)
    if problems:
        errors.extend(problems)
        return None
    return Task(
        task_id,
        None,  # the simulated user writes the opening message
        reference={"expected_actions": actions, "expected_outputs": outputs},
        metadata={"user": {"instruction": instruction, "user_id": user_id, "persona": persona}},
        line=number,
    )


def load_tau_tasks(path: Path) -> list[Task]:
    """Every task of a τ-bench task file; raises `DatasetError` listing each bad record as `<file>:<n>: message`
    (`n` is the record's number in a JSON array, its line in JSONL).

    A record holds `instruction` (required: the simulated user's hidden goal), `actions` (required, may be empty:
    `[{name, kwargs}]`), and optionally `outputs` (texts the agent must say), `user_id`, `persona` and `id` (else
    the record's 0-based index, τ-bench's task index). Other fields (τ-bench's `annotator`, ...) are ignored. The
    task's input is None, its reference `{expected_actions: [{name, arguments}], expected_outputs}` (what
    `builtin/expected-actions` reads), its metadata `{user: {instruction, user_id, persona}}`."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError([f"{path}: cannot read: {e.strerror}"]) from None
    errors: list[str] = []
    seen: dict[str, str] = {}  # id -> where it is first used
    tasks = [
        task
        for index, (number, record) in enumerate(_records(path, data))
        if (task := _task(path, index, number, record, errors, seen)) is not None
    ]
    if errors:
        raise DatasetError(errors)
    if not tasks:
        raise DatasetError([f"{path}: no tasks"])
    return tasks
