"""The store's tables: what the embedded store tunes, and that a server's tables keep ClickHouse's defaults."""

from __future__ import annotations

from pathlib import Path

from evalsi.exporters.clickhouse.backend import ChdbBackend, ServerBackend
from evalsi.exporters.clickhouse.schema import logs_ddl, settings_clause, traces_ddl
from evalsi.exporters.clickhouse.store import TraceStore

EMBEDDED = (
    "min_bytes_for_wide_part = 67108864",
    "vertical_merge_algorithm_min_rows_to_activate = 1",
    "merge_selector_base = 10",
    "index_granularity_bytes = 2097152",
)


def _engines(store: TraceStore) -> dict[str, str]:
    rows = store.backend.query(
        "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase() "
        "AND name IN ('otel_traces', 'otel_logs') ORDER BY name"
    )
    return {r["name"]: r["engine_full"] for r in rows}


def test_embedded_tables_write_compact_parts_and_merge_wider(tmp_path: Path) -> None:
    store = TraceStore(ChdbBackend(str(tmp_path / "store")))
    try:
        store.create_schema()
        engines = _engines(store)
    finally:
        store.backend.close()
    assert sorted(engines) == ["otel_logs", "otel_traces"]
    for name, engine in engines.items():
        for setting in EMBEDDED:
            assert setting in engine, (name, engine)


def test_a_store_made_by_an_earlier_version_gets_the_settings_it_can_still_take(tmp_path: Path) -> None:
    """Tables made with the settings of an earlier evalsi (Compact up to 128 MiB, horizontal merges, 10 MiB granules)
    take the new merge settings at the next start; the granule size is fixed when a table is made, so it stays."""
    backend = ChdbBackend(str(tmp_path / "store"))
    earlier = settings_clause({"min_bytes_for_wide_part": 128 << 20, "merge_selector_base": 10})
    for statement in traces_ddl("otel_traces", earlier) + logs_ddl("otel_logs", earlier):
        backend.command(statement)
    store = TraceStore(backend)
    try:
        store.create_schema()
        engines = _engines(store)
        store.create_schema()  # a second start finds nothing to change
        assert _engines(store) == engines
    finally:
        backend.close()
    for name, engine in engines.items():
        for setting in EMBEDDED[:3]:
            assert setting in engine, (name, engine)
        assert "min_bytes_for_wide_part = 134217728" not in engine
        assert "index_granularity_bytes" not in engine, (name, engine)


def test_server_tables_keep_the_server_defaults() -> None:
    assert not ServerBackend.table_settings
    for statement in traces_ddl("otel_traces", settings_clause(ServerBackend.table_settings)) + logs_ddl("otel_logs"):
        assert "min_bytes_for_wide_part" not in statement
        assert "merge_selector_base" not in statement
        assert "index_granularity_bytes" not in statement
        assert "vertical_merge_algorithm_min_rows_to_activate" not in statement
