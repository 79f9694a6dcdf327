"""The store's tables: what the embedded store tunes, and that a server's tables keep ClickHouse's defaults."""

from __future__ import annotations

from pathlib import Path

from evalsi.exporters.clickhouse.backend import ChdbBackend, ServerBackend
from evalsi.exporters.clickhouse.schema import logs_ddl, traces_ddl
from evalsi.exporters.clickhouse.store import TraceStore


def test_embedded_tables_write_compact_parts_and_merge_wider(tmp_path: Path) -> None:
    store = TraceStore(ChdbBackend(str(tmp_path / "store")))
    try:
        store.create_schema()
        rows = store.backend.query(
            "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase() "
            "AND name IN ('otel_traces', 'otel_logs') ORDER BY name"
        )
    finally:
        store.backend.close()
    assert [r["name"] for r in rows] == ["otel_logs", "otel_traces"]
    for r in rows:
        assert "min_bytes_for_wide_part = 134217728" in r["engine_full"], r
        assert "merge_selector_base = 10" in r["engine_full"], r
        assert "index_granularity_bytes = 2097152" in r["engine_full"], r


def test_server_tables_keep_the_server_defaults() -> None:
    assert ServerBackend.table_settings == ""
    for statement in traces_ddl("otel_traces", ServerBackend.table_settings) + logs_ddl("otel_logs"):
        assert "min_bytes_for_wide_part" not in statement
        assert "merge_selector_base" not in statement
        assert "index_granularity_bytes" not in statement
