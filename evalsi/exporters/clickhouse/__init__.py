"""The `clickhouse` exporter: queues spans, writes them to ClickHouse (embedded chDB or a server) in large batches."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from evalsi.component import ComponentConfig, Refused, Settings, exporter
from evalsi.duration import Duration
from evalsi.exporters.clickhouse.backend import StoreError, error_reason, is_data_error, open_backend
from evalsi.exporters.clickhouse.rows import (
    ArrowRows,
    convert_good,
    from_ipc,
    load_arrow,
    logs_to_arrow,
    scores_to_arrow,
    to_arrow,
)
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.exporters.delivery import items_refused_counter
from evalsi.log_record import LogBatch
from evalsi.score import ScoreBatch
from evalsi.span import BatchKind, SpanBatch
from evalsi.store import RowKind, Rows, StoreType
from evalsi.supervise import supervise


class StoreRetryConfig(ComponentConfig):
    """How soon a write the store refused for its availability (disk full, server down) is tried again. There is no
    deadline: the queue holds the rows meanwhile, and receivers refuse new data once it is full."""

    initial_interval: Duration = 1.0
    max_interval: Duration = 10.0

    @model_validator(mode="before")
    @classmethod
    def _no_deadline(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("enabled", "max_elapsed_time"):
                if key in data:
                    raise ValueError(
                        f"{key}: the store retries a write it cannot take for its availability until the store "
                        "recovers (nothing acknowledged is dropped by a deadline; receivers refuse once the queue "
                        f"is full); remove `{key}`, or bound shutdown with `drain_timeout`"
                    )
        return data


class ClickHouseConfig(ComponentConfig):
    endpoint: str = "chdb://.evalsi/store"
    database: str = "default"
    username: str = "default"
    password: str = ""
    traces_table_name: str = "otel_traces"
    logs_table_name: str = "otel_logs"
    scores_table_name: str = "evalsi_scores"
    ttl_days: int = Field(default=0, ge=0)
    create_schema: bool = True
    timeout: Duration = 10.0
    # chDB pays ~60 ms per INSERT whatever its size: batch by size and by time
    flush_interval: Duration = 1.0
    batch_size: int = Field(default=20_000, gt=0)
    queue_size: int = Field(default=500_000, gt=0)
    retry_on_failure: StoreRetryConfig = StoreRetryConfig()
    # at shutdown, how long writes the store refuses are still retried before what is queued is given up (counted,
    # logged, and the exit code is 1)
    drain_timeout: Duration = 30.0

    @field_validator("endpoint")
    @classmethod
    def _scheme(cls, v: str) -> str:
        if not v.startswith(("chdb://", "http://", "https://")) or v.endswith("://"):
            raise ValueError(f"unsupported endpoint {v!r}: use chdb://PATH (embedded) or http(s)://host:8123")
        return v

    @field_validator("traces_table_name", "logs_table_name", "scores_table_name")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not v.replace("_", "").isalnum():
            raise ValueError(f"invalid table name {v!r}: letters, digits and _ only")
        return v


def _concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


@dataclass
class _Queue:
    """Items of one kind waiting for the store, how to put them in columns, and how to insert those."""

    kind: str  # "spans", "span revisions", "log records", "scores": for logs, errors and metrics
    convert: Callable[[list[Any]], pa.Table]
    insert: Callable[[pa.Table], None]
    sent: Any
    failed: Any
    items: list[Any] = field(default_factory=list)
    tables: bool = False  # items are Arrow tables already in the store's columns (from pipeline workers)
    rows: int = 0  # rows held: len(items) for spans, the tables' rows for tables

    def take(self, rows: int) -> tuple[list[Any], int]:
        """The next chunk of about `rows` rows, and its row count."""
        if not self.tables:
            chunk, self.items = self.items[:rows], self.items[rows:]
            self.rows -= len(chunk)
            return chunk, len(chunk)
        n = i = 0
        while i < len(self.items) and n < rows:
            n += self.items[i].num_rows
            i += 1
        chunk, self.items = self.items[:i], self.items[i:]
        self.rows -= n
        return chunk, n


def _ids(table: pa.Table) -> str:
    """The trace and span ids of a table's rows (each stored table has both columns), for a log line."""
    pairs = zip(table["TraceId"].to_pylist(), table["SpanId"].to_pylist(), strict=True)
    return ", ".join(f"{t}/{s}" if s else t for t, s in pairs)


def open_queries(config: ClickHouseConfig) -> TraceStore:
    """The store of `config`, opened for reading with no collector running (the CLI); raises `StoreError`."""
    c = config
    backend = open_backend(
        c.endpoint, database=c.database, username=c.username, password=c.password, timeout=c.timeout, create=False
    )
    return TraceStore(
        backend, table=c.traces_table_name, logs_table=c.logs_table_name, scores_table=c.scores_table_name
    )


@exporter(
    "clickhouse",
    config=ClickHouseConfig,
    signals=("traces", "logs", "scores"),
    store=StoreType(rows=ArrowRows, open_queries=open_queries),
)
class ClickHouseExporter:
    """Writes what it queued in large inserts. A row the store refuses for its data (a value its column cannot hold)
    is dropped alone, counted and logged with its ids: the batch is halved until it is alone. A write the store
    refuses for its availability (disk full, server down) is retried until it passes, holding the queue; once the
    queue is full the receivers answer 503 and `/readyz` says why."""

    def __init__(self, config: ClickHouseConfig, settings: Settings) -> None:
        self._config = config
        self._log = settings.logger
        self._settings = settings
        m = settings.metrics
        self._queue_gauge = m.exporter_queue_size.labels(settings.id)
        m.exporter_queue_capacity.labels(settings.id).set(config.queue_size)
        self._dropped = items_refused_counter(m)
        self._retries = m.counter(
            "evalsi_exporter_write_retries",
            "Writes the store could not take for its availability, retried (by reason, e.g. NOT_ENOUGH_SPACE).",
            ["exporter", "reason"],
        )
        self._unavailable_gauge = m.gauge(
            "evalsi_exporter_store_unavailable",
            "1 while the store refuses writes for its availability (the queue holds what was acknowledged).",
            ["exporter"],
        ).labels(settings.id)
        self._queues: list[_Queue] = []
        self._held = 0  # items queued plus the chunk being written
        self._wake = asyncio.Event()
        self._stopping = False
        self._deadline = float("inf")  # set by shutdown: when retries give up
        self._outage: tuple[str, float] | None = None  # (reason, since): the store refuses writes
        self._task: asyncio.Task[None] | None = None
        self.store: TraceStore | None = None
        self.unstored: dict[str, int] = {}  # what shutdown could not write, by kind

    async def start(self) -> None:
        c = self._config
        backend = await asyncio.to_thread(
            open_backend, c.endpoint, database=c.database, username=c.username, password=c.password,
            timeout=c.timeout,
        )  # fmt: skip
        store = TraceStore(
            backend,
            table=c.traces_table_name,
            logs_table=c.logs_table_name,
            scores_table=c.scores_table_name,
            ttl_days=c.ttl_days,
        )
        if c.create_schema:
            try:
                await asyncio.to_thread(store.create_schema)
            except Exception as e:
                backend.close()
                raise StoreError(f"cannot create the tables in the {backend.description}: {e}") from None
        await asyncio.to_thread(load_arrow)
        self.store = store
        m, cid = self._settings.metrics, self._settings.id
        sent_spans, failed_spans = m.exporter_sent_spans.labels(cid), m.exporter_send_failed_spans.labels(cid)
        sent_logs, failed_logs = m.exporter_sent_log_records.labels(cid), m.exporter_send_failed_log_records.labels(cid)
        self._spans = _Queue("spans", to_arrow, store.insert_spans, sent_spans, failed_spans)
        # revisions go after the spans queued before them, so a revision never lands before its span
        self._revisions = _Queue("span revisions", to_arrow, store.revise_spans, sent_spans, failed_spans)
        self._logs = _Queue("log records", logs_to_arrow, store.insert_logs, sent_logs, failed_logs)
        self._scores = _Queue(
            "scores",
            scores_to_arrow,
            store.insert_scores,
            m.counter("evalsi_exporter_sent_scores", "Scores written to the store.", ["exporter"]).labels(cid),
            m.counter("evalsi_exporter_send_failed_scores", "Scores the store would not take.", ["exporter"]).labels(
                cid
            ),
        )
        # the same, already in Arrow columns: what pipeline worker processes send (service.workers > 1)
        self._span_tables = _Queue("spans", _concat, store.insert_spans, sent_spans, failed_spans, tables=True)
        self._revision_tables = _Queue(
            "span revisions", _concat, store.revise_spans, sent_spans, failed_spans, tables=True
        )
        self._log_tables = _Queue("log records", _concat, store.insert_logs, sent_logs, failed_logs, tables=True)
        self._queues = [
            self._spans, self._span_tables, self._revisions, self._revision_tables, self._logs, self._log_tables,
            self._scores,
        ]  # fmt: skip
        self._log.info("store open", extra={"store": backend.description})
        self._task = supervise(f"{self._settings.id} flush", self._flush_loop, log=self._log, metrics=m)

    def not_ready(self) -> str | None:
        """Why the store cannot take writes now (for `/readyz`), None while it can."""
        if self._outage is None:
            return None
        reason, since = self._outage
        assert self.store is not None
        return (
            f"the {self.store.description} refuses writes ({reason}) for {time.monotonic() - since:.0f}s; "
            f"{self._held} items wait in the exporter's queue (capacity {self._config.queue_size})"
        )

    def _enqueue(self, queue: _Queue, items: list[Any], rows: int | None = None) -> None:
        n = len(items) if rows is None else rows
        if self._stopping:
            raise Refused("the collector is shutting down", unavailable=True, retry_after=5)
        if self._held + n > self._config.queue_size:
            if self._outage is not None:
                raise Refused(
                    f"{self.not_ready()}; retry later",
                    unavailable=True,
                    retry_after=max(1.0, self._config.retry_on_failure.max_interval),
                )
            raise Refused(
                f"store queue is full ({self._held} items waiting for the store); retry later",
                retry_after=max(1.0, self._config.flush_interval),
            )
        queue.items.extend(items)
        queue.rows += n
        self._held += n
        self._queue_gauge.set(self._held)
        if queue.rows >= self._config.batch_size:
            self._wake.set()

    async def consume(self, batch: SpanBatch) -> None:
        if batch.kind is BatchKind.SESSION:
            return  # a session's spans were stored as their traces completed
        spans = batch.spans
        if not all(s.sampled for s in spans):
            spans = [s for s in spans if s.sampled]  # the sampler counted the others
        if spans:
            self._enqueue(self._revisions if batch.revision else self._spans, spans)

    async def consume_logs(self, batch: LogBatch) -> None:
        self._enqueue(self._logs, batch.records)

    async def consume_scores(self, batch: ScoreBatch) -> None:
        self._enqueue(self._scores, batch.scores)

    def write_rows(self, kind: RowKind, body: Rows) -> None:
        """Rows a pipeline worker already put in the store's columns (`ArrowRows.encode`); raises `Refused` like
        `consume` when the queue is full."""
        table = from_ipc(body)
        queue = {"spans": self._span_tables, "revisions": self._revision_tables, "logs": self._log_tables}[kind]
        self._enqueue(queue, [table], table.num_rows)

    async def _flush_loop(self) -> None:
        while True:
            if not self._stopping:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self._config.flush_interval)
                except TimeoutError:
                    pass
            self._wake.clear()
            while any(q.items for q in self._queues) and time.monotonic() < self._deadline:
                for queue in self._queues:
                    if not queue.items:
                        continue
                    chunk, rows = queue.take(self._config.batch_size)
                    try:
                        await self._write(queue, chunk)
                    finally:
                        self._held -= rows
                        self._queue_gauge.set(self._held)
            if self._stopping:
                return

    async def _write(self, queue: _Queue, chunk: list[Any]) -> None:
        table, bad = await asyncio.to_thread(convert_good, chunk, queue.convert)
        for item, error in bad:
            ids = f"{item.trace_id}/{item.span_id}" if not queue.tables else _ids(item)
            self._drop(queue, 1 if not queue.tables else item.num_rows, error, ids)
        if table is not None and table.num_rows:
            await self._insert(queue, table)

    async def _insert(self, queue: _Queue, table: pa.Table) -> None:
        pending = [table]
        delay = self._config.retry_on_failure.initial_interval
        while pending:
            part = pending.pop()
            try:
                await asyncio.to_thread(queue.insert, part)
            except Exception as e:
                if is_data_error(e):
                    if part.num_rows == 1:
                        self._drop(queue, 1, e, _ids(part))
                    else:  # halve until the rows the store refuses are alone
                        half = part.num_rows // 2
                        pending += [part.slice(half), part.slice(0, half)]
                    continue
                pending.append(part)
                if not await self._wait_out(e, delay):
                    self._give_up(queue, sum(p.num_rows for p in pending), e)
                    return
                delay = min(delay * 2, self._config.retry_on_failure.max_interval)
                continue
            queue.sent.inc(part.num_rows)
            if self._outage is not None:
                self._log.warning(
                    "the store takes writes again",
                    extra={"store": self.store.description if self.store else "", "outage_s": self._outage_s()},
                )
                self._outage = None
                self._unavailable_gauge.set(0)

    def _outage_s(self) -> float:
        return round(time.monotonic() - self._outage[1], 1) if self._outage else 0.0

    async def _wait_out(self, error: Exception, delay: float) -> bool:
        """Wait before retrying a write the store refused for its availability; False when shutdown's deadline
        passes first."""
        reason = error_reason(error)
        if self._outage is None:
            self._outage = (reason, time.monotonic())
            self._unavailable_gauge.set(1)
        self._retries.labels(self._settings.id, reason).inc()
        wait = delay * random.uniform(0.8, 1.2)
        self._log.warning(
            "the store refuses writes; the queue holds them and the write is retried",
            extra={"error": str(error).splitlines()[0][:500], "reason": reason, "retry_in_s": round(wait, 2),
                   "queued": self._held, "outage_s": self._outage_s()},
        )  # fmt: skip
        retry_at = time.monotonic() + wait
        while (left := retry_at - time.monotonic()) > 0:
            if time.monotonic() >= self._deadline:
                return False
            await asyncio.sleep(min(left, 0.25))
        return time.monotonic() < self._deadline

    def _drop(self, queue: _Queue, rows: int, error: BaseException, ids: str) -> None:
        reason = error_reason(error)
        self._dropped.labels(self._settings.id, queue.kind, reason).inc(rows)
        queue.failed.inc(rows)
        self._log.error(
            f"dropping {queue.kind} the store refuses for their data; the others are stored",
            extra={"reason": reason, "error": str(error).splitlines()[0][:500] if str(error) else reason,
                   "count": rows, "ids": ids[:2000]},
        )  # fmt: skip

    def _give_up(self, queue: _Queue, rows: int, error: BaseException) -> None:
        queue.failed.inc(rows)
        self.unstored[queue.kind] = self.unstored.get(queue.kind, 0) + rows
        self._log.error(
            f"shutdown: giving up {rows} {queue.kind} the store would not take in time",
            extra={"reason": error_reason(error), "drain_timeout_s": self._config.drain_timeout},
        )

    async def shutdown(self) -> None:
        self._stopping = True
        self._deadline = time.monotonic() + self._config.drain_timeout
        self._wake.set()
        if self._task is not None:
            await self._task
        for queue in self._queues:  # what the deadline left queued
            if queue.rows:
                queue.failed.inc(queue.rows)
                self.unstored[queue.kind] = self.unstored.get(queue.kind, 0) + queue.rows
                queue.items, queue.rows = [], 0
        if self.unstored:
            self._log.error(
                "acknowledged data was not stored: the store refused writes until the drain timeout",
                extra={"unstored": self.unstored, "reason": self._outage[0] if self._outage else ""},
            )
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
