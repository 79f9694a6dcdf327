"""Datasets: JSONL, JSON, CSV and Parquet files of tasks (`id`, `input`, optional `reference`, `context`,
`metadata`), read whole and checked row by row; a bad row is reported with its line, never skipped."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evalsi.run_harness.model import DatasetError, Task
from evalsi.run_harness.records import jsonl_rows

__all__ = ["Dataset", "DatasetError", "load_dataset"]

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
KNOWN = frozenset({"id", "input", "reference", "context", "metadata", "output", "trace_id", "expected_output", "task"})


@dataclass(frozen=True)
class Dataset:
    path: Path
    tasks: list[Task]
    hash: str
    """sha256 of the file's bytes: the manifest records which data a run saw."""


def _rows(path: Path, data: bytes) -> list[tuple[int, Any]]:
    """(line, row) pairs. JSONL and JSON are read with orjson, row by row, so a bad line is named and a record's
    `input` keeps its own shape (a columnar reader unifies objects across rows); CSV and Parquet with polars."""
    kind = FORMATS.get(path.suffix.lower())
    if kind == "jsonl":
        return jsonl_rows(path, data)
    if kind == "json":
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise DatasetError([f"{path}: not JSON: {e}"]) from None
        if isinstance(doc, dict) and isinstance(doc.get("records"), list):
            doc = doc["records"]
        if not isinstance(doc, list):
            raise DatasetError([f'{path}: expected a JSON array of records (or {{"records": [...]}})'])
        return [(i, row) for i, row in enumerate(doc, 1)]
    if kind in ("csv", "parquet"):
        import polars as pl

        try:
            frame = pl.read_csv(path, infer_schema=False) if kind == "csv" else pl.read_parquet(path)
        except Exception as e:
            raise DatasetError([f"{path}: cannot read {kind.upper()}: {e}"]) from None
        first = 2 if kind == "csv" else 1  # a CSV's first line is its header
        return [(i + first, row) for i, row in enumerate(frame.to_dicts())]
    raise DatasetError([f"{path}: unknown dataset format {path.suffix!r} (use .jsonl, .json, .csv or .parquet)"])


def _decoded(value: Any) -> Any:
    """A CSV cell holding JSON (an object, a list) is read as JSON; other text stays text."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _from_folder(path: Path, line: int, row: dict[str, Any], errors: list[str]) -> dict[str, Any] | None:
    """A row naming a task folder (`task: tasks/fix-bug`, relative to the dataset): the folder's task, the row's
    own fields on top."""
    from evalsi.run_harness.environment import load_task_folder

    folder = Path(str(row["task"])).expanduser()
    folder = folder if folder.is_absolute() else path.parent / folder
    found: list[str] = []
    task = load_task_folder(folder, line, found)
    if task is None:
        errors.extend(f"{path}:{line}: task: {e}" for e in found)
        return None
    base = {"id": task.id, "input": task.input, "reference": task.reference, "context": task.context,
            "metadata": task.metadata, "folder": task.folder}  # fmt: skip
    return {**base, **{k: v for k, v in row.items() if k != "task"}}


def _task(path: Path, line: int, row: Any, errors: list[str], seen: dict[str, int]) -> Task | None:
    where = f"{path}:{line}"
    if not isinstance(row, dict):
        errors.append(f"{where}: a record must be an object, not {type(row).__name__}")
        return None
    row = {k: _decoded(v) for k, v in row.items()}
    folder = None
    if row.get("task") is not None:
        from_folder = _from_folder(path, line, row, errors)
        if from_folder is None:
            return None
        folder = from_folder.pop("folder")
        row = from_folder
    unknown = sorted(k for k in row if k not in KNOWN)
    if unknown:
        errors.append(f"{where}: unknown field {unknown[0]!r} (fields: id, input, reference, context, metadata)")
    raw_id = row.get("id", row.get("trace_id"))
    if raw_id is None or raw_id == "":
        task_id = str(line)  # a dataset without ids: the record's line
    elif isinstance(raw_id, str | int) and not isinstance(raw_id, bool):
        task_id = str(raw_id)
    else:
        errors.append(f"{where}: id must be a string or an integer")
        return None
    if task_id in seen:
        errors.append(f"{where}: id {task_id!r} is already used on line {seen[task_id]}")
    seen[task_id] = line
    task_input = row.get("input")
    conversation = (
        isinstance((row.get("metadata") or {}).get("user"), dict) if isinstance(row.get("metadata"), dict) else False
    )
    if (task_input is None and not conversation) or task_input == "":
        errors.append(f"{where}: input is missing")
        return None
    reference = row.get("reference")
    if reference is None and "expected_output" in row:
        reference = row["expected_output"]
    if reference is None:
        reference = {}
    elif not isinstance(reference, dict):
        reference = {"expected_output": reference}
    context = row.get("context") or []
    if isinstance(context, str):
        context = [context]
    if not isinstance(context, list) or not all(isinstance(c, str) for c in context):
        errors.append(f"{where}: context must be a string or a list of strings")
        return None
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        errors.append(f"{where}: metadata must be an object")
        return None
    return Task(task_id, task_input, reference, context, metadata, line, folder)


def _tree_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for p in sorted(directory.rglob("*")):
        if p.is_file():
            digest.update(str(p.relative_to(directory)).encode() + b"\0" + p.read_bytes() + b"\0")
    return digest.hexdigest()


def load_dataset(path: Path, limit: int | None = None, kind: str = "auto") -> Dataset:
    """Every task of the file (the first `limit`): a JSONL/JSON/CSV/Parquet file, a directory of task folders, or
    (`kind="tau"`) a τ-bench-style task file; raises `DatasetError` listing each bad row."""
    if path.is_dir():
        from evalsi.run_harness.environment import load_task_folders

        tasks = load_task_folders(path)
        return Dataset(path, tasks[:limit] if limit else tasks, _tree_hash(path))
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError([f"{path}: cannot read: {e.strerror}"]) from None
    if kind == "tau":
        from evalsi.run_harness.tau import load_tau_tasks

        tasks = load_tau_tasks(path)
        return Dataset(path, tasks[:limit] if limit else tasks, hashlib.sha256(data).hexdigest())
    errors: list[str] = []
    seen: dict[str, int] = {}
    tasks = [t for line, row in _rows(path, data) if (t := _task(path, line, row, errors, seen)) is not None]
    if errors:
        raise DatasetError(errors)
    if not tasks:
        raise DatasetError([f"{path}: no records"])
    return Dataset(path, tasks[:limit] if limit else tasks, hashlib.sha256(data).hexdigest())
