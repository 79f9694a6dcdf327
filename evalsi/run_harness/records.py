"""Records read from JSONL files, each with its line number, every line that is no JSON named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from evalsi.run_harness.model import DatasetError


def jsonl_rows(path: Path, data: bytes) -> list[tuple[int, Any]]:
    """(line, record) for each non-blank line of a JSONL file; `DatasetError` naming every line that is no JSON."""
    rows: list[tuple[int, Any]] = []
    errors: list[str] = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((number, orjson.loads(line)))
        except orjson.JSONDecodeError as e:
            errors.append(f"{path}:{number}: not JSON: {e}")
    if errors:
        raise DatasetError(errors)
    return rows
