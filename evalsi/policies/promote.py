"""Promotion: traces a policy's `promote.when` picks are appended to a JSONL dataset, or written to the store's
datasets table (`promote_to: store`), once per trace id.

A record is what the harness reads as a dataset row: `input`, `output`, `reference` (only when known), `trace_id`
and `metadata` (policy, service, session, models, this policy's scores, when it was promoted).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evalsi.model.score import Score
from evalsi.model.span import DEFAULT_PROJECT, TraceKey

log = logging.getLogger("evalsi.policies")


def dataset_path(dataset: str, datasets_dir: Path, base_dir: Path) -> Path:
    """A name goes to `<datasets_dir>/<name>.jsonl`; a value ending in `.jsonl` is a path (relative: to base_dir)."""
    if dataset.endswith(".jsonl"):
        path = Path(dataset).expanduser()
        return path if path.is_absolute() else base_dir / path
    return datasets_dir / f"{dataset}.jsonl"


def record(
    *,
    trace_id: str,
    input: str | None,
    output: str | None,
    policy: str,
    scores: list[Score],
    metadata: dict[str, Any],
    reference: Any = None,
    now: float | None = None,
) -> dict[str, Any]:
    """One dataset row for a promoted trace."""
    row: dict[str, Any] = {"id": trace_id, "input": input, "output": output}
    if reference is not None:
        row["reference"] = reference
    row["trace_id"] = trace_id
    row["metadata"] = {
        "policy": policy,
        **metadata,
        "scores": {
            s.name: {"value": s.value, "passed": s.passed, "label": s.label, "outcome": s.outcome} for s in scores
        },
        "promoted_at": datetime.fromtimestamp(time.time() if now is None else now, UTC)
        .isoformat()
        .replace("+00:00", "Z"),
    }
    return row


class Datasets:
    """Appends rows to JSONL files, each trace (project and trace id) at most once per file (the traces already in
    a file are read the first time it is written to, so a restart does not promote a trace twice)."""

    def __init__(self) -> None:
        self._seen: dict[Path, set[TraceKey]] = {}
        self._lock = threading.Lock()

    def _ids(self, path: Path) -> set[TraceKey]:
        seen = self._seen.get(path)
        if seen is None:
            seen = self._seen[path] = set()
            if path.exists():
                with path.open(encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        if not line.strip():
                            continue
                        try:
                            seen.add(_key(json.loads(line)))
                        except (ValueError, KeyError, TypeError):
                            log.warning("%s:%d: not a promoted record (no trace_id); ignored for dedup", path, number)
        return seen

    def append(self, path: Path, row: dict[str, Any], dataset: str = "") -> bool:
        """Append `row` unless its trace (project and trace id) is already in the file; True when written."""
        key = _key(row)
        with self._lock:
            seen = self._ids(path)
            if key in seen:
                return False
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            seen.add(key)
            return True


class StoreDatasets:
    """Promoted rows for the store (`promote_to: store`): kept here until `drain()` hands them to whoever writes the
    store (the collector process; a pipeline worker sends them there). The store keeps each (project, dataset, row
    id) once whichever replica promoted it; the trace keys seen here (the last `remember` of them) only spare it the
    writes of a trace this process promoted already."""

    def __init__(self, remember: int = 100_000) -> None:
        self.remember = remember
        self._seen: dict[tuple[str, str, str], None] = {}
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def append(self, path: Path, row: dict[str, Any], dataset: str = "") -> bool:
        """Queue `row` for dataset `dataset` (or the file name's stem) unless this process promoted its trace into
        it already; True when queued."""
        key = _key(row)
        name = dataset or path.stem
        seen = (key.project, name, key.trace_id)
        with self._lock:
            if seen in self._seen:
                return False
            self._seen[seen] = None
            if len(self._seen) > self.remember:
                del self._seen[next(iter(self._seen))]
            promoted_at = datetime.fromisoformat(row["metadata"]["promoted_at"].replace("Z", "+00:00")).timestamp()
            self._pending.append({
                "project": key.project, "dataset": name, "row_id": key.trace_id,
                "policy": row["metadata"].get("policy", ""), "promoted_at": promoted_at, "record": row,
            })  # fmt: skip
            return True

    def drain(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self._pending = self._pending, []
        return out


def _key(row: dict[str, Any]) -> TraceKey:
    """A promoted row's trace: its project (metadata.project; rows written before it was recorded are the default
    project's) and trace id."""
    metadata = row.get("metadata")
    project = metadata.get("project") if isinstance(metadata, dict) else None
    return TraceKey(project if isinstance(project, str) and project else DEFAULT_PROJECT, row["trace_id"])
