"""The `clickhouse` exporter: queues spans, writes them to ClickHouse (embedded chDB or a server) in large batches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, field_validator

from evalsi.component import ComponentConfig, Refused, Settings, exporter
from evalsi.duration import Duration
from evalsi.exporters.clickhouse.backend import StoreError, open_backend
from evalsi.exporters.clickhouse.rows import load_arrow
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.exporters.delivery import RetryConfig, deliver
from evalsi.log_record import LogBatch
from evalsi.score import ScoreBatch
from evalsi.span import SpanBatch


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
    retry_on_failure: RetryConfig = RetryConfig(initial_interval=1.0)

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


@dataclass
class _Queue:
    """Items of one kind waiting for the store, and how to write them."""

    kind: str  # "spans", "span revisions", "log records": for logs and errors
    write: Callable[[list[Any]], None]
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


@exporter("clickhouse", config=ClickHouseConfig, signals=("traces", "logs", "scores"))
class ClickHouseExporter:
    def __init__(self, config: ClickHouseConfig, settings: Settings) -> None:
        self._config = config
        self._log = settings.logger
        self._settings = settings
        m = settings.metrics
        self._queue_gauge = m.exporter_queue_size.labels(settings.id)
        m.exporter_queue_capacity.labels(settings.id).set(config.queue_size)
        self._queues: list[_Queue] = []
        self._held = 0  # items queued plus the chunk being written
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self.store: TraceStore | None = None

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
        self._spans = _Queue("spans", store.write, sent_spans, failed_spans)
        # revisions go after the spans queued before them, so a revision never lands before its span
        self._revisions = _Queue("span revisions", store.revise, sent_spans, failed_spans)
        self._logs = _Queue(
            "log records",
            store.write_logs,
            m.exporter_sent_log_records.labels(cid),
            m.exporter_send_failed_log_records.labels(cid),
        )
        self._scores = _Queue(
            "scores",
            store.write_scores,
            m.counter("evalsi_exporter_sent_scores", "Scores written to the store.", ["exporter"]).labels(cid),
            m.counter("evalsi_exporter_send_failed_scores", "Scores the store would not take.", ["exporter"]).labels(
                cid
            ),
        )
        # the same, already in Arrow columns: what pipeline worker processes send (service.workers > 1)
        self._span_tables = _Queue("spans", store.write_tables, sent_spans, failed_spans, tables=True)
        self._revision_tables = _Queue("span revisions", store.revise_tables, sent_spans, failed_spans, tables=True)
        self._log_tables = _Queue(
            "log records", store.write_log_tables, self._logs.sent, self._logs.failed, tables=True
        )
        self._queues = [
            self._spans, self._span_tables, self._revisions, self._revision_tables, self._logs, self._log_tables,
            self._scores,
        ]  # fmt: skip
        self._log.info("store open", extra={"store": backend.description})
        self._task = asyncio.create_task(self._flush_loop())

    def _enqueue(self, queue: _Queue, items: list[Any], rows: int | None = None) -> None:
        n = len(items) if rows is None else rows
        if self._stopping:
            raise Refused("the collector is shutting down", unavailable=True, retry_after=5)
        if self._held + n > self._config.queue_size:
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
        if batch.unit == "session":
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

    def consume_table(self, kind: Literal["spans", "revisions", "logs"], table: pa.Table) -> None:
        """Rows a pipeline worker process already put in the store's columns (`rows.to_arrow`); raises `Refused`
        like `consume` when the queue is full."""
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
            while any(q.items for q in self._queues):
                for queue in self._queues:
                    if not queue.items:
                        continue
                    chunk, rows = queue.take(self._config.batch_size)
                    await self._write(queue, chunk, rows)
                    self._held -= rows
                    self._queue_gauge.set(self._held)
            if self._stopping:
                return

    async def _write(self, queue: _Queue, chunk: list[Any], rows: int) -> None:
        assert self.store is not None
        delivered = await deliver(
            lambda: asyncio.to_thread(queue.write, chunk),
            self._config.retry_on_failure,
            log=self._log,
            what=queue.kind,
            extra={"count": rows, "store": self.store.description},
        )
        (queue.sent if delivered else queue.failed).inc(rows)

    async def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
