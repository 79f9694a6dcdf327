"""The store port: what the collector, its API, the CLI and the pipeline workers ask of the exporter that owns the
store, whatever the store is. The ClickHouse exporter implements it; the collector names no store type."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

Rows = bytes | bytearray | memoryview
"""Rows in a store's own encoding, as they cross from a pipeline worker to the collector process."""

RowKind = Literal["spans", "revisions", "logs"]
"""What a table of rows holds: new spans, revisions of spans already stored (they replace them), log records."""


class StoreError(Exception):
    """The store cannot be opened or used; the message says what to do."""


class StoreBusy(StoreError):
    """Another process holds the store (an embedded store opens in one process at a time)."""


class TraceQueries(Protocol):
    """Reading the store: what the API and the CLI show."""

    @property
    def description(self) -> str:
        """Where the store is, e.g. `embedded ClickHouse store at ./evalsi-data`."""
        ...

    # `project`: only what that project's senders sent and its scores (None: every project)

    def list_traces(
        self, *, limit: int = 20, service: str | None = None, project: str | None = None
    ) -> list[dict[str, Any]]: ...

    def get_trace(self, trace_id: str, *, project: str | None = None) -> list[dict[str, Any]]: ...

    def list_scores(
        self, *, limit: int = 100, trace_id: str | None = None, policy: str | None = None, project: str | None = None
    ) -> list[dict[str, Any]]: ...

    def score_window_stats(
        self,
        *,
        since_ns: int,
        policy: str | None = None,
        project: str | None = None,
        until_ns: int | None = None,
        run_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Aggregates per (policy, evaluator, name) of the scored scores since `since_ns`, before `until_ns`, of one
        offline run with `run_id`."""
        ...

    def judge_agreement(
        self, *, since_ns: int, policy: str | None = None, project: str | None = None, limit: int = 100_000
    ) -> dict[str, list[dict[str, Any]]]:
        """Judge verdicts since `since_ns` beside people's feedback on the same traces (`pairs`), and per judge the
        traces it gave a verdict (`totals`): what judge calibration is computed from."""
        ...

    def span_counts(self, trace_ids: list[str], *, since_ns: int = 0, project: str | None = None) -> dict[str, int]:
        """Stored spans of each trace started since `since_ns` (a trace with none is left out)."""
        ...

    def get_traces(
        self, trace_ids: list[str], *, since_ns: int = 0, project: str | None = None
    ) -> dict[str, list[dict[str, Any]]]: ...

    def stored_span_keys(self, trace_ids: list[str], *, project: str | None = None) -> set[tuple[str, str]]:
        """The (trace id, span id) of every stored span of these traces (of one project; None: of any)."""
        ...

    def write_scores(self, scores: list[Any]) -> None:
        """Scores written directly, when no scores pipeline runs (`Score` objects)."""
        ...

    def run_scores(self, run_id: str, *, project: str | None = None) -> list[dict[str, Any]]: ...

    def write_run(
        self, run_id: str, name: str, status: str, manifest: dict[str, Any], summary: dict[str, Any],
        *, project: str = "default",
    ) -> None:  # fmt: skip
        """Record an offline run of `project` (the newest record of its run id in that project wins; another
        project's run of the same id is another run)."""
        ...

    def list_runs(
        self, *, limit: int = 20, run_id: str | None = None, project: str | None = None
    ) -> list[dict[str, Any]]: ...

    def write_alerts(self, alerts: Sequence[Any], *, project: str = "default") -> None:
        """Record policy alerts that fired or resolved (`evalsi.policies.AlertEvent`)."""
        ...

    def list_alerts(
        self, *, limit: int = 100, policy: str | None = None, since_ns: int = 0, project: str | None = None
    ) -> list[dict[str, Any]]: ...

    def read_watermark(self, source: str) -> dict[str, Any] | None:
        """How far a pull receiver read `source` (see `evalsi.receivers.pull`), None before its first poll."""
        ...

    def write_watermark(self, source: str, watermark: dict[str, Any]) -> None: ...

    def ping(self) -> bool: ...

    def close(self) -> None: ...


@runtime_checkable
class WindowStore(Protocol):
    """A store that computes a policy's window over every replica's scores (`windows.scope: store`)."""

    def policy_window(self, policy: str, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        """Per (project, evaluator, name) the window's aggregates, and per project a row with `evaluator` and `name`
        '' and `traces`: the traces with any score of the policy (see the ClickHouse store's `policy_window`)."""
        ...


@runtime_checkable
class DatasetStore(Protocol):
    """A store that keeps promoted datasets (`promote`), so every replica promotes into one place."""

    def write_promoted(self, rows: Sequence[dict[str, Any]]) -> None:
        """Rows `{project, dataset, row_id, policy, promoted_at, record}`; a row id already in its dataset stays."""
        ...

    def list_datasets(self, *, project: str | None = None) -> list[dict[str, Any]]: ...

    def dataset_rows(
        self, dataset: str, *, limit: int = 100_000, project: str | None = None
    ) -> list[dict[str, Any]]: ...
@dataclass
class LedgerRow:
    """One replica's claims on a judge budget in one budget period, and what it spent of them (cumulative: a newer
    row of the same key replaces the older)."""

    project: str
    budget: str  # `<policy>#<stage>`: the policy stage whose judge the budget limits
    period: int  # the budget window's index since 1970 (`time // window_s`)
    replica: str
    claimed_calls: int = 0
    claimed_tokens: int = 0
    claimed_usd: float = 0.0
    calls: int = 0
    tokens: int = 0
    usd: float = 0.0


@dataclass(frozen=True)
class QuietSession:
    """A session no replica completed a trace of since `seen_ns`, not evaluated since."""

    project: str
    session_id: str
    seen_ns: int
    traces: int = 0
    """Stored traces of it the replicas completed (a trace completed twice, e.g. split by a change of the routing
    ring, counts twice)."""


@runtime_checkable
class ReplicaState(Protocol):
    """What replicas of one deployment share through the store (`replicas:` in the evaluate processor's config):
    the judge budget ledger and the sessions' activity."""

    def judge_ledger(self, project: str, budget: str, period: int) -> list[LedgerRow]:
        """Every replica's newest row for one budget period."""
        ...

    def write_judge_ledger(self, rows: list[LedgerRow]) -> None: ...

    def note_sessions(self, replica: str, seen: dict[tuple[str, str], tuple[int, int]]) -> None:
        """`replica` completed stored traces of each (project, session id): (the last at this time, ns since 1970; how
        many since its previous note)."""
        ...

    def quiet_sessions(self, *, quiet_since_ns: int, active_since_ns: int) -> list[QuietSession]:
        """Sessions some replica saw since `active_since_ns`, none since `quiet_since_ns`, and not evaluated since."""
        ...

    def mark_sessions_evaluated(self, sessions: list[QuietSession]) -> None:
        """These sessions were evaluated over what was seen of them until their `seen_ns`."""
        ...

    def session_spans(self, project: str, session_id: str) -> list[dict[str, Any]]:
        """Every stored span of every trace of the session (in the canonical shape), by trace and start."""
        ...


class RowEncoder(Protocol):
    """In a pipeline worker: items put in the store's own row encoding, to be written by the collector process."""

    def prepare(self) -> None:
        """Load what encoding needs (before the worker reports ready)."""
        ...

    def encode(self, kind: RowKind, items: list[Any]) -> tuple[Rows | None, list[tuple[Any, BaseException]]]:
        """The rows of the items the store can hold (None when there are none), and each item it cannot, with why:
        those are dropped alone."""
        ...


@runtime_checkable
class StoreExporter(Protocol):
    """The exporter that owns the store, as the collector sees it."""

    store: TraceQueries | None
    """Set once started."""

    unstored: dict[str, int]
    """What it was handed (acknowledged to senders) but could not write before it stopped, by kind."""

    def not_ready(self) -> str | None:
        """Why it cannot take data now (a store outage), or None."""
        ...

    def write_rows(self, kind: RowKind, body: Rows, arrived: float | None = None) -> None:
        """Queue rows a worker's `RowEncoder` made, the oldest of which reached a receiver at `arrived` (monotonic);
        raises `Refused` while its queue is full."""
        ...


@dataclass(frozen=True)
class StoreType:
    """What an exporter type that owns a store registers beside its class (`@exporter(..., store=StoreType(...))`)."""

    rows: Callable[[], RowEncoder]
    """The encoder pipeline workers use in place of the exporter."""
    open_queries: Callable[[Any], TraceQueries]
    """Open the store of a config of this type for reading, with no collector running (raises `StoreError`)."""
