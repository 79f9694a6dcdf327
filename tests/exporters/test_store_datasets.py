"""Promoted datasets in the store (`evalsi_datasets`) on real chDB: a row id promoted again into a dataset (another
replica, a restart) stays one row with its first promotion; each project keeps its own rows of a dataset name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalsi.exporters.clickhouse.backend import open_backend
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.policies.promote import StoreDatasets, record


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TraceStore]:
    s = TraceStore(open_backend(f"chdb://{tmp_path / 'store'}"))
    s.create_schema()
    yield s
    s.close()


def _row(project: str, trace: str, output: str, at: float) -> dict[str, Any]:
    row = record(trace_id=trace, input="q", output=output, policy="answers", scores=[], metadata={"project": project},
                 now=at)  # fmt: skip
    return {"project": project, "dataset": "wrong", "row_id": trace, "policy": "answers", "promoted_at": at,
            "record": row}  # fmt: skip


def test_a_row_promoted_again_keeps_its_first_promotion(store: TraceStore) -> None:
    store.write_promoted([_row("default", "a" * 32, "first", 1_800_000_000.0)])
    store.write_promoted([_row("default", "a" * 32, "again", 1_800_000_100.0), _row("default", "b" * 32, "b", 1.8e9)])
    store.write_promoted([_row("default", "a" * 32, "earlier?", 1_799_999_000.0)])  # the earliest promotion wins
    rows = store.dataset_rows("wrong")
    assert [(r["trace_id"], r["output"]) for r in rows] == [("a" * 32, "earlier?"), ("b" * 32, "b")]
    (listed,) = store.list_datasets()
    assert (listed["dataset"], listed["rows"]) == ("wrong", 2)


def test_each_project_keeps_its_own_rows(store: TraceStore) -> None:
    store.write_promoted([_row("team-a", "a" * 32, "from a", 1.8e9), _row("team-b", "a" * 32, "from b", 1.8e9)])
    assert [r["output"] for r in store.dataset_rows("wrong", project="team-a")] == ["from a"]
    assert [r["output"] for r in store.dataset_rows("wrong", project="team-b")] == ["from b"]
    assert store.dataset_rows("wrong", project="team-c") == []
    assert [(d["project"], d["rows"]) for d in store.list_datasets()] == [("team-a", 1), ("team-b", 1)]
    with pytest.raises(ValueError, match="not a project name"):
        store.write_promoted([_row("Team A", "c" * 32, "x", 1.8e9)])


def test_a_process_queues_a_trace_once_per_dataset() -> None:
    datasets = StoreDatasets()
    row = _row("default", "a" * 32, "x", 1.8e9)["record"]
    assert datasets.append(Path("wrong.jsonl"), row, dataset="wrong")
    assert not datasets.append(Path("wrong.jsonl"), row, dataset="wrong")
    assert datasets.append(Path("other.jsonl"), row, dataset="other")
    assert [(r["dataset"], r["row_id"]) for r in datasets.drain()] == [("wrong", "a" * 32), ("other", "a" * 32)]
    assert datasets.drain() == []
