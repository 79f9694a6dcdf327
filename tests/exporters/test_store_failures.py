"""The store exporter when the store refuses: a row refused for its data is dropped alone (halving the batch), a write
refused for the store's availability (disk full) holds the queue, turns ingest into 503 and `/readyz` into not ready,
and everything acknowledged is stored once the store recovers. The engine is the real one (chDB); failures of the
store are injected in front of it, as ClickHouse raises them (`Code: 243. ... (NOT_ENOUGH_SPACE)`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import evalsi.exporters.clickhouse as clickhouse_exporter
from evalsi.component import Refused, Settings
from evalsi.exporters.clickhouse import ClickHouseConfig, ClickHouseExporter
from evalsi.exporters.clickhouse.backend import ChdbBackend, error_reason, is_data_error
from evalsi.exporters.clickhouse.rows import ArrowRows
from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.score import Score, ScoreBatch
from evalsi.model.span import Span, SpanBatch
from evalsi.runtime.telemetry import SelfMetrics

DISK_FULL = "Code: 243. DB::Exception: Cannot reserve 1.00 MiB, not enough space. (NOT_ENOUGH_SPACE)"
TYPE_MISMATCH = "Code: 53. DB::Exception: Type mismatch in IN or VALUES section. (TYPE_MISMATCH)"
T0 = time.time_ns() - 3_600_000_000_000


class FaultyBackend:
    """The real embedded engine, with the failures a test switches on in front of its inserts."""

    def __init__(self, real: ChdbBackend) -> None:
        self.real = real
        self.description = real.description
        self.table_settings = real.table_settings
        self.disk_full = False
        self.refused_span: str | None = None  # a span id whose rows the "store" refuses for their data
        self.insert_s = 0.0  # how long each insert takes at least
        self.inserts = 0

    def command(self, sql: str) -> None:
        self.real.command(sql)

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self.real.query(sql, params)

    def insert(self, table: str, data: pa.Table) -> None:
        self.inserts += 1
        time.sleep(self.insert_s)  # in the exporter's insert thread
        if self.disk_full:
            raise RuntimeError(DISK_FULL)
        if self.refused_span is not None and self.refused_span in data["SpanId"].to_pylist():
            raise RuntimeError(TYPE_MISMATCH)
        self.real.insert(table, data)

    def ping(self) -> bool:
        return self.real.ping()

    def close(self) -> None:
        pass  # the module's engine stays open for the next test


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbBackend]:
    real = ChdbBackend(str(tmp_path_factory.mktemp("faulty") / "store"))
    yield real
    real.close()


_tables = iter(range(1, 1000))


@pytest.fixture
def backend(engine: ChdbBackend, monkeypatch: pytest.MonkeyPatch) -> FaultyBackend:
    faulty = FaultyBackend(engine)
    monkeypatch.setattr(clickhouse_exporter, "open_backend", lambda *a, **k: faulty)
    return faulty


def _exporter(**config: Any) -> tuple[ClickHouseExporter, SelfMetrics]:
    n = next(_tables)  # tables of its own per test, in the one engine
    cfg = ClickHouseConfig(
        traces_table_name=f"spans_{n}", logs_table_name=f"logs_{n}", scores_table_name=f"scores_{n}",
        **{"flush_interval": 0.05, **config},
    )  # fmt: skip
    metrics = SelfMetrics()
    return ClickHouseExporter(cfg, Settings("clickhouse", metrics, logging.getLogger("test.store"))), metrics


def _spans(n: int, trace: int = 1, **canonical: Any) -> list[Span]:
    return [
        Span(f"{trace:032x}", f"{i + 1:016x}", "", f"span {i}", "CLIENT", T0 + i, T0 + i + 1000, **canonical)
        for i in range(n)
    ]


def _count(exp: ClickHouseExporter, table: str = "traces") -> int:
    assert exp.store is not None
    name = {"traces": exp.store.table, "logs": exp.store.logs_table, "scores": exp.store.scores_table}[table]
    return int(exp.store.backend.query(f"SELECT count() AS n FROM {name}")[0]["n"])


def _sample(metrics: SelfMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _dropped(metrics: SelfMetrics, kind: str) -> float:
    """Items of `kind` dropped for their data, whatever the reason (the conversion's exception type)."""
    return sum(
        sample.value
        for family in metrics.registry.collect()
        if family.name == "evalsi_exporter_items_refused"
        for sample in family.samples
        if sample.labels.get("kind") == kind
    )


async def _until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def test_errors_are_told_apart_by_what_a_retry_can_change() -> None:
    assert error_reason(RuntimeError(DISK_FULL)) == "NOT_ENOUGH_SPACE" and not is_data_error(RuntimeError(DISK_FULL))
    assert is_data_error(RuntimeError(TYPE_MISMATCH))
    assert is_data_error(OverflowError("Python int too large to convert to C long"))
    assert not is_data_error(ConnectionRefusedError("server down"))
    parts = "Code: 252. DB::Exception: Too many parts (300). Merges are processing slower than inserts (TOO_MANY_PARTS)"
    assert not is_data_error(RuntimeError(parts))


def test_rows_that_come_in_while_an_insert_runs_wait_for_the_next_flush_and_shutdown_writes_them_at_once(
    backend: FaultyBackend,
) -> None:
    """Each INSERT costs the embedded store ~20 ms and a part to merge, whatever its size: what a worker sends while
    one runs goes in the next flush's INSERT, not in small ones of its own, and shutdown does not wait for it."""

    def rows(trace: int) -> bytes:
        body, bad = ArrowRows().encode("spans", _spans(10, trace))
        assert body is not None and not bad
        return bytes(body)

    async def main() -> None:
        exp, _ = _exporter(flush_interval=2.0)
        await exp.start()
        backend.insert_s = 0.3
        exp.write_rows("spans", rows(1))
        await _until(lambda: backend.inserts == 1)  # written at the first flush, in an insert that takes a while
        exp.write_rows("spans", rows(2))  # during that insert
        await asyncio.sleep(0.5)
        exp.write_rows("spans", rows(3))  # after it: without the flush interval, during the insert of trace 2
        await _until(lambda: _count(exp) == 30)
        assert backend.inserts == 2  # traces 2 and 3 in one INSERT
        backend.insert_s = 0.0
        exp.write_rows("spans", rows(4))
        await asyncio.wait_for(exp.shutdown(), timeout=2.0)  # written at once, not at the next flush
        assert (_count(exp), backend.inserts, exp.unstored) == (40, 3, {})

    asyncio.run(main())


def test_a_span_no_column_can_hold_is_dropped_alone_and_counted(backend: FaultyBackend) -> None:
    async def main() -> None:
        exp, metrics = _exporter()
        await exp.start()
        spans = _spans(50)
        spans[17].input_tokens = 1 << 70  # past UInt64: the conversion to columns raises OverflowError
        spans[33].start_time_unix_nano = 1 << 64  # past the timestamp column
        await exp.consume(SpanBatch(spans))
        await _until(lambda: _sample(metrics, "otelcol_exporter_sent_spans_total", exporter="clickhouse") == 48)
        assert _count(exp) == 48
        assert _sample(metrics, "evalsi_exporter_items_refused_total", exporter="clickhouse", kind="spans",
                       reason="OverflowError") == 2  # fmt: skip
        await exp.shutdown()
        assert exp.unstored == {}

    asyncio.run(main())


def test_rows_the_store_refuses_for_their_data_are_found_by_halving(backend: FaultyBackend) -> None:
    async def main() -> None:
        exp, metrics = _exporter()
        await exp.start()
        spans = _spans(1000)
        backend.refused_span = spans[612].span_id
        await exp.consume(SpanBatch(spans))
        await _until(lambda: _sample(metrics, "otelcol_exporter_sent_spans_total", exporter="clickhouse") == 999)
        assert _count(exp) == 999
        assert _sample(metrics, "evalsi_exporter_items_refused_total", exporter="clickhouse", kind="spans",
                       reason="TYPE_MISMATCH") == 1  # fmt: skip
        assert backend.inserts <= 2 * 11 + 1  # about two inserts per halving of 1000 rows, not one per row
        stored = {r["SpanId"] for r in exp.store.backend.query(f"SELECT SpanId FROM {exp.store.table}")}  # type: ignore[union-attr]
        assert spans[612].span_id not in stored and spans[611].span_id in stored
        await exp.shutdown()

    asyncio.run(main())


def test_spans_spread_over_many_days_are_all_stored(backend: FaultyBackend) -> None:
    """ClickHouse refuses one insert touching more than 100 partitions (days): smaller inserts take them all."""

    async def main() -> None:
        exp, metrics = _exporter()
        await exp.start()
        day = 86_400 * 10**9
        spans = _spans(300)
        for i, s in enumerate(spans):
            s.start_time_unix_nano = s.end_time_unix_nano = T0 - i * day
        await exp.consume(SpanBatch(spans))
        await _until(lambda: _count(exp) == 300, timeout=30)
        assert _sample(metrics, "otelcol_exporter_send_failed_spans_total", exporter="clickhouse") == 0
        await exp.shutdown()

    asyncio.run(main())


def test_a_full_disk_holds_the_queue_refuses_with_503_and_stores_everything_once_space_returns(
    backend: FaultyBackend,
) -> None:
    async def main() -> None:
        exp, metrics = _exporter(queue_size=300, batch_size=100, retry_on_failure={"initial_interval": "50ms"})
        await exp.start()
        backend.disk_full = True
        acknowledged = 0
        refusal: Refused | None = None
        for trace in range(1, 100):
            try:
                await exp.consume(SpanBatch(_spans(50, trace)))
                acknowledged += 50
            except Refused as r:
                refusal = r
                break
            await asyncio.sleep(0.02)
        assert refusal is not None and refusal.unavailable, "a full queue during an outage is a 503, not a 429"
        assert refusal.retry_after >= 1 and "NOT_ENOUGH_SPACE" in str(refusal)
        why = exp.not_ready()
        assert why is not None and "NOT_ENOUGH_SPACE" in why and "refuses writes" in why
        assert _sample(metrics, "evalsi_exporter_store_unavailable", exporter="clickhouse") == 1
        assert _sample(metrics, "evalsi_exporter_write_retries_total", exporter="clickhouse",
                       reason="NOT_ENOUGH_SPACE") >= 1  # fmt: skip
        await asyncio.sleep(0.5)  # retries go on; nothing is dropped by a deadline
        assert _sample(metrics, "otelcol_exporter_send_failed_spans_total", exporter="clickhouse") == 0
        backend.disk_full = False
        await _until(lambda: _count(exp) == acknowledged, timeout=15)
        assert exp.not_ready() is None
        assert _sample(metrics, "evalsi_exporter_store_unavailable", exporter="clickhouse") == 0
        await exp.consume(SpanBatch(_spans(5, 500)))  # and it takes data again
        await _until(lambda: _count(exp) == acknowledged + 5)
        await exp.shutdown()
        assert exp.unstored == {}

    asyncio.run(main())


def test_shutdown_during_an_outage_gives_up_at_the_drain_timeout_and_says_how_much(backend: FaultyBackend) -> None:
    async def main() -> None:
        exp, _ = _exporter(drain_timeout="500ms", retry_on_failure={"initial_interval": "50ms"})
        await exp.start()
        backend.disk_full = True
        await exp.consume(SpanBatch(_spans(40)))
        await exp.consume_logs(LogBatch([LogRecord(T0, T0, body="hello")]))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await exp.shutdown()
        assert time.monotonic() - started < 5
        assert exp.unstored == {"spans": 40, "log records": 1}

    asyncio.run(main())


def test_one_bad_score_or_log_record_does_not_hold_back_the_others(backend: FaultyBackend) -> None:
    async def main() -> None:
        exp, metrics = _exporter()
        await exp.start()
        scores = [Score(name="accuracy", value=0.5, trace_id=f"{i:032x}", trial=i) for i in range(10)]
        scores[3].trial = -1  # the UInt32 column cannot hold it
        await exp.consume_scores(ScoreBatch(scores))
        records = [LogRecord(T0, T0, body=f"record {i}") for i in range(10)]
        records[5].severity_number = 1 << 40  # past the Int32 column
        await exp.consume_logs(LogBatch(records))
        await _until(lambda: _dropped(metrics, "scores") == 1 and _dropped(metrics, "log records") == 1)
        await _until(lambda: _count(exp, "scores") == 9 and _count(exp, "logs") == 9)
        await exp.shutdown()

    asyncio.run(main())


def test_a_retry_config_with_a_deadline_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_elapsed_time: the store retries"):
        ClickHouseConfig(retry_on_failure={"max_elapsed_time": "5m"})


DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("page", ["receivers/otlp.md", "configuration.md"])
def test_the_config_examples_of_the_failure_docs_validate(page: str) -> None:
    import re

    import yaml

    from evalsi.collector.config import parse_config

    text = (DOCS / page).read_text()
    # a block right after `<!-- refused: ... -->` shows an error (tests/test_docs_examples.py checks it says that)
    blocks = re.findall(r"(<!-- refused:[^\n]*-->\n)?```yaml\n(.*?)```", text, re.S)
    for refused, block in blocks:
        if refused:
            continue
        raw = yaml.safe_load(block)
        if "pipelines" not in raw.get("service", {}):  # a section shown alone: in the smallest whole config
            raw = {"receivers": {"otlp": {}}, "exporters": {"clickhouse": {}}, **raw}
            pipeline = {"receivers": ["otlp"], "exporters": ["clickhouse"]}
            raw["service"] = {**raw.get("service", {}), "pipelines": {"traces": pipeline}}
        parse_config(raw, source=page)
    if page == "receivers/otlp.md":
        assert blocks, "the page shows its config"


def test_the_deploy_config_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from evalsi.auth import hash_of, new_key
    from evalsi.collector.config import parse_config

    monkeypatch.setenv("EVALSI_API_KEY_HASH", hash_of(new_key()[0]))  # the image's config reads the key's hash

    path = DOCS.parent / "deploy" / "evalsi.yaml"
    parse_config(yaml.safe_load(path.read_text()), source=str(path))
