"""The `clickhouse` exporter: queues spans, writes them to ClickHouse (embedded chDB or a server) in large batches."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from evalsi.component import ComponentConfig, Refused, Settings, exporter
from evalsi.duration import Duration
from evalsi.exporters.clickhouse.backend import (
    Backend,
    ServerOptions,
    StoreError,
    error_reason,
    is_data_error,
    open_backend,
)
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
from evalsi.exporters.sending import Lane, SendQueue
from evalsi.model.log_record import LogBatch
from evalsi.model.score import ScoreBatch
from evalsi.model.span import BatchKind, SpanBatch
from evalsi.runtime.backoff import Backoff
from evalsi.runtime.held import arrived_of, earliest
from evalsi.store import RowKind, Rows, StoreType


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


class ClickHouseTlsConfig(ComponentConfig):
    """TLS to a ClickHouse server (an `https://` endpoint), named as the OpenTelemetry Collector's `configtls`."""

    ca_file: str | None = None  # the CA that signed the server's certificate (default: the system's CAs)
    cert_file: str | None = None  # a client certificate, with `key_file` (mutual TLS)
    key_file: str | None = None
    insecure_skip_verify: bool = False  # accept any server certificate: for tests, never in production
    server_name_override: str | None = None  # the name to check the certificate against (SNI), if not the host

    @model_validator(mode="after")
    def _files(self) -> ClickHouseTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (a client certificate and its key): set both")
        for key in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, key)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{key}: no file at {path!r}")
        return self


class ClickHouseConfig(ComponentConfig):
    endpoint: str = "chdb://.evalsi/store"
    database: str = "default"
    username: str = "default"
    password: str = ""
    tls: ClickHouseTlsConfig | None = None
    traces_table_name: str = "otel_traces"
    logs_table_name: str = "otel_logs"
    scores_table_name: str = "evalsi_scores"
    # how long spans, log records and scores are kept (0: forever); applied to existing tables at start
    ttl: Duration = 0.0
    # a server buffers inserts and writes them as parts in the background; evalsi waits for the write
    # (wait_for_async_insert) before it counts rows as stored, so nothing acknowledged rests only in a buffer
    async_insert: bool = False
    create_schema: bool = True
    timeout: Duration = 10.0
    # chDB pays ~20-60 ms per INSERT whatever its size: batch by size and by time. What an INSERT holds in chDB grows
    # with its rows: at 10,000 rather than 20,000 the collector peaked 150-200 MB lower under full load, for 2-4 us
    # more CPU a span (benchmarks/README.md, ninth pass)
    flush_interval: Duration = 1.0
    batch_size: int = Field(default=10_000, gt=0)
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

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "ttl_days" in data:
            days = data["ttl_days"]
            hours = f"{int(days) * 24}h" if isinstance(days, int) and not isinstance(days, bool) else "720h"
            raise ValueError(
                f"ttl_days: renamed to `ttl`, a duration that also covers scores: write `ttl: {hours}` (hours, as "
                "the OpenTelemetry Collector writes durations), or `ttl: 0` to keep everything"
            )
        return data

    @model_validator(mode="after")
    def _server_only(self) -> ClickHouseConfig:
        embedded = self.endpoint.startswith("chdb://")
        if embedded and self.async_insert:
            raise ValueError(
                "async_insert: applies to a ClickHouse server (an http(s):// endpoint); the embedded store writes "
                "each batch in-process already: remove `async_insert`"
            )
        if self.tls is not None and not self.endpoint.startswith("https://"):
            raise ValueError(
                f"tls: the endpoint {self.endpoint!r} does not use TLS: write it https://host:8443, or remove `tls`"
            )
        if 0 < self.ttl < 1:
            raise ValueError(f"ttl: {self.ttl}s is under a second: use e.g. 720h (30 days), or 0 to keep forever")
        return self

    @field_validator("traces_table_name", "logs_table_name", "scores_table_name")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not v.replace("_", "").isalnum():
            raise ValueError(f"invalid table name {v!r}: letters, digits and _ only")
        return v


def _concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _rows(table: pa.Table) -> int:
    return table.num_rows


def _ids(table: pa.Table) -> str:
    """The trace and span ids of a table's rows (each stored table has both columns), for a log line."""
    pairs = zip(table["TraceId"].to_pylist(), table["SpanId"].to_pylist(), strict=True)
    return ", ".join(f"{t}/{s}" if s else t for t, s in pairs)


def _open(config: ClickHouseConfig, *, create: bool) -> Backend:
    c = config
    tls = c.tls
    return open_backend(
        c.endpoint, database=c.database, username=c.username, password=c.password, timeout=c.timeout, create=create,
        server=ServerOptions(
            async_insert=c.async_insert,
            ca_file=tls.ca_file if tls else None,
            cert_file=tls.cert_file if tls else None,
            key_file=tls.key_file if tls else None,
            verify=not tls.insecure_skip_verify if tls else True,
            server_name=tls.server_name_override if tls else None,
        ),
    )  # fmt: skip


def _store(config: ClickHouseConfig, backend: Backend) -> TraceStore:
    c = config
    return TraceStore(
        backend, table=c.traces_table_name, logs_table=c.logs_table_name, scores_table=c.scores_table_name, ttl=c.ttl
    )


def open_queries(config: ClickHouseConfig) -> TraceStore:
    """The store of `config`, opened for reading with no collector running (the CLI); raises `StoreError`."""
    return _store(config, _open(config, create=False))


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

    mutates_data = False
    """`MutatesData`: it only reads the spans it is handed, so a fan-out hands it the batch itself."""

    def __init__(self, config: ClickHouseConfig, settings: Settings) -> None:
        self._config = config
        self._log = settings.logger
        self._settings = settings
        m, cid = settings.metrics, settings.id
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
        self._outage: tuple[str, float] | None = None  # (reason, since): the store refuses writes
        self._cohorts: dict[int, deque[list[Any]]] = {}  # by lane: [arrived, weight] of each offer not yet settled
        self.store: TraceStore | None = None
        self.unstored: dict[str, int] = {}  # what shutdown could not write, by kind
        lane = self._lane
        sent_spans, failed_spans = m.exporter_sent_spans.labels(cid), m.exporter_send_failed_spans.labels(cid)
        sent_logs, failed_logs = m.exporter_sent_log_records.labels(cid), m.exporter_send_failed_log_records.labels(cid)
        self._spans = lane("spans", to_arrow, TraceStore.insert_spans, sent_spans, failed_spans)
        self._revisions = lane("span revisions", to_arrow, TraceStore.revise_spans, sent_spans, failed_spans)
        self._logs = lane("log records", logs_to_arrow, TraceStore.insert_logs, sent_logs, failed_logs)
        self._scores = lane(
            "scores",
            scores_to_arrow,
            TraceStore.insert_scores,
            m.counter("evalsi_exporter_sent_scores", "Scores written to the store.", ["exporter"]).labels(cid),
            m.counter("evalsi_exporter_send_failed_scores", "Scores the store would not take.", ["exporter"]).labels(
                cid
            ),
        )
        # the same, already in Arrow columns: what pipeline worker processes send (service.workers > 1)
        self._span_tables = lane("spans", _concat, TraceStore.insert_spans, sent_spans, failed_spans, tables=True)
        self._revision_tables = lane(
            "span revisions", _concat, TraceStore.revise_spans, sent_spans, failed_spans, tables=True
        )
        self._log_tables = lane("log records", _concat, TraceStore.insert_logs, sent_logs, failed_logs, tables=True)
        # one sender visits the lanes in this order: a revision goes after the spans queued before it, so it never
        # lands before its span. `queue_size` counts rows, the chunk being written too; a write the store refuses
        # for its availability is retried in `send` until shutdown's deadline, so nothing is cancelled. An INSERT
        # costs chDB ~20 ms whatever its size, and each makes a part to merge: what comes in while one is written
        # waits for the next flush interval (or a full batch) instead of going at once in a small INSERT
        self._queue = SendQueue(
            settings,
            (self._spans, self._span_tables, self._revisions, self._revision_tables, self._logs, self._log_tables,
             self._scores),
            capacity=config.queue_size,
            ordered=True,
            full="refuse",
            refusal=self._refusal,
            flush_interval=config.flush_interval,
            shutdown_timeout=config.drain_timeout,
            attempt_timeout=None,  # inserts run in threads: shutdown waits for them
            on_unsent=self._unsent,
            what="clickhouse",
            partial_once_per_flush=True,
        )  # fmt: skip

    def _lane(
        self,
        kind: str,
        convert: Callable[[list[Any]], pa.Table],
        insert: Callable[[TraceStore, pa.Table], None],
        sent: Any,
        failed: Any,
        *,
        tables: bool = False,
    ) -> Lane[Any]:
        """A lane of `kind` ("spans", "span revisions", "log records", "scores": its name in logs, errors and
        metrics), put in columns by `convert` and written by `insert`. `tables`: its items are Arrow tables already in
        the store's columns (from pipeline workers), counted by their rows. Only revisions must wait for what the
        lanes before them hold (`keeps_order`): the spans they revise."""
        lane: Lane[Any] = Lane(
            kind, self._config.batch_size, lambda chunk: self._write(lane, chunk, convert, insert, tables),
            sent=sent, failed=failed, weight=_rows if tables else None, held_in_flight=True,
            done=lambda chunk: self._settled(lane, chunk), keeps_order=kind == "span revisions",
        )  # fmt: skip
        self._cohorts[id(lane)] = deque()
        return lane

    def _offer(self, lane: Lane[Any], items: list[Any], arrived: float | None) -> None:
        """Queue `items`, noting when the oldest reached a receiver: the lane sends in order, so what `done` reports
        settles the oldest offers first."""
        cohorts = self._cohorts[id(lane)]
        cohorts.append([arrived, lane.weigh(items)])
        try:
            self._queue.offer(lane, items)
        except BaseException:
            cohorts.pop()
            raise

    def _settled(self, lane: Lane[Any], chunk: list[Any]) -> None:
        cohorts = self._cohorts[id(lane)]
        left = lane.weigh(chunk)
        while left and cohorts:
            oldest = cohorts[0]
            taken = min(oldest[1], left)
            oldest[1] -= taken
            left -= taken
            if not oldest[1]:
                cohorts.popleft()

    def held_since(self) -> float | None:
        """When the oldest span or log record queued or being written reached a receiver (see `wal.py`)."""
        return earliest(c[0] for cohorts in self._cohorts.values() for c in cohorts)

    async def start(self) -> None:
        c = self._config
        backend = await asyncio.to_thread(_open, c, create=c.create_schema)
        store = _store(c, backend)
        try:
            await asyncio.to_thread(store.create_schema if c.create_schema else store.check_schema)
        except StoreError:
            backend.close()
            raise
        except Exception as e:
            backend.close()
            raise StoreError(f"cannot create the tables in the {backend.description}: {e}") from None
        await asyncio.to_thread(load_arrow)
        self.store = store
        self._log.info("store open", extra={"store": backend.description})
        self._queue.start()

    def not_ready(self) -> str | None:
        """Why the store cannot take writes now (for `/readyz`), None while it can."""
        if self._outage is None:
            return None
        reason, since = self._outage
        assert self.store is not None
        return (
            f"the {self.store.description} refuses writes ({reason}) for {time.monotonic() - since:.0f}s; "
            f"{self._queue.held} items wait in the exporter's queue (capacity {self._config.queue_size})"
        )

    def _refusal(self) -> Refused:
        """Why the queue takes nothing now: shutting down, or full (a 503 while the store refuses writes)."""
        if self._queue.stopping:
            return Refused("the collector is shutting down", unavailable=True, retry_after=5)
        if self._outage is not None:
            return Refused(
                f"{self.not_ready()}; retry later",
                unavailable=True,
                retry_after=max(1.0, self._config.retry_on_failure.max_interval),
            )
        return Refused(
            f"store queue is full ({self._queue.held} items waiting for the store); retry later",
            retry_after=max(1.0, self._config.flush_interval),
        )

    async def consume(self, batch: SpanBatch) -> None:
        if batch.kind is BatchKind.SESSION:
            return  # a session's spans were stored as their traces completed
        spans = batch.spans
        if not all(s.sampled for s in spans):
            spans = [s for s in spans if s.sampled]  # the sampler counted the others
        if spans:
            self._offer(self._revisions if batch.revision else self._spans, spans, arrived_of(spans))

    async def consume_logs(self, batch: LogBatch) -> None:
        self._offer(self._logs, batch.records, arrived_of(batch.records))

    async def consume_scores(self, batch: ScoreBatch) -> None:
        self._queue.offer(self._scores, batch.scores)

    def write_rows(self, kind: RowKind, body: Rows, arrived: float | None = None) -> None:
        """Rows a pipeline worker already put in the store's columns (`ArrowRows.encode`), the oldest of which reached
        a receiver at `arrived`; raises `Refused` like `consume` when the queue is full."""
        table = from_ipc(body)
        lane = {"spans": self._span_tables, "revisions": self._revision_tables, "logs": self._log_tables}[kind]
        self._offer(lane, [table], arrived)

    async def _write(
        self,
        lane: Lane[Any],
        chunk: list[Any],
        convert: Callable[[list[Any]], pa.Table],
        insert: Callable[[TraceStore, pa.Table], None],
        tables: bool,
    ) -> None:
        """A lane's `send`: put a chunk in columns and insert it, dropping alone what the store cannot hold."""
        table, bad = await asyncio.to_thread(convert_good, chunk, convert)
        for item, error in bad:
            ids = f"{item.trace_id}/{item.span_id}" if not tables else _ids(item)
            self._drop(lane, 1 if not tables else item.num_rows, error, ids)
        if table is not None and table.num_rows:
            await self._insert(lane, insert, table)

    async def _insert(self, lane: Lane[Any], insert: Callable[[TraceStore, pa.Table], None], table: pa.Table) -> None:
        """Insert `table`; rows refused for their data are halved until alone and dropped, a write refused for the
        store's availability is retried (the shared backoff, no deadline) until it passes or shutdown's passes."""
        store, pending = self.store, [table]
        assert store is not None, "the sender starts with the store"
        retry = self._config.retry_on_failure
        backoff = Backoff(retry.initial_interval, retry.max_interval)
        while pending:
            part = pending.pop()
            try:
                await asyncio.to_thread(insert, store, part)
            except Exception as e:
                if is_data_error(e):
                    if part.num_rows == 1:
                        self._drop(lane, 1, e, _ids(part))
                    else:  # halve until the rows the store refuses are alone
                        half = part.num_rows // 2
                        pending += [part.slice(half), part.slice(0, half)]
                    continue
                pending.append(part)
                if not await self._wait_out(e, backoff.next_wait()):
                    self._give_up(lane, sum(p.num_rows for p in pending), e)
                    return
                continue
            lane.sent.inc(part.num_rows)
            if self._outage is not None:
                self._log.warning(
                    "the store takes writes again",
                    extra={"store": self.store.description if self.store else "", "outage_s": self._outage_s()},
                )
                self._outage = None
                self._unavailable_gauge.set(0)

    def _outage_s(self) -> float:
        return round(time.monotonic() - self._outage[1], 1) if self._outage else 0.0

    async def _wait_out(self, error: Exception, wait: float) -> bool:
        """Wait before retrying a write the store refused for its availability; False when shutdown's deadline
        passes first."""
        reason = error_reason(error)
        if self._outage is None:
            self._outage = (reason, time.monotonic())
            self._unavailable_gauge.set(1)
        self._retries.labels(self._settings.id, reason).inc()
        self._log.warning(
            "the store refuses writes; the queue holds them and the write is retried",
            extra={"error": str(error).splitlines()[0][:500], "reason": reason, "retry_in_s": round(wait, 2),
                   "queued": self._queue.held, "outage_s": self._outage_s()},
        )  # fmt: skip
        retry_at = time.monotonic() + wait
        while (left := retry_at - time.monotonic()) > 0:
            if time.monotonic() >= self._queue.deadline():
                return False
            await asyncio.sleep(min(left, 0.25))
        return time.monotonic() < self._queue.deadline()

    def _drop(self, lane: Lane[Any], rows: int, error: BaseException, ids: str) -> None:
        reason = error_reason(error)
        self._dropped.labels(self._settings.id, lane.kind, reason).inc(rows)
        lane.failed.inc(rows)
        self._log.error(
            f"dropping {lane.kind} the store refuses for their data; the others are stored",
            extra={"reason": reason, "error": str(error).splitlines()[0][:500] if str(error) else reason,
                   "count": rows, "ids": ids[:2000]},
        )  # fmt: skip

    def _give_up(self, lane: Lane[Any], rows: int, error: BaseException) -> None:
        lane.failed.inc(rows)
        self.unstored[lane.kind] = self.unstored.get(lane.kind, 0) + rows
        self._log.error(
            f"shutdown: giving up {rows} {lane.kind} the store would not take in time",
            extra={"reason": error_reason(error), "drain_timeout_s": self._config.drain_timeout},
        )

    def _unsent(self, lane: Lane[Any], rows: int) -> None:
        """What the drain timeout left queued (the queue counted it in `failed`), for the one log line of `shutdown`."""
        self.unstored[lane.kind] = self.unstored.get(lane.kind, 0) + rows

    async def shutdown(self) -> None:
        await self._queue.shutdown()  # writes what is queued, retrying until `drain_timeout`
        if self.unstored:
            self._log.error(
                "acknowledged data was not stored: the store refused writes until the drain timeout",
                extra={"unstored": self.unstored, "reason": self._outage[0] if self._outage else ""},
            )
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
