"""The store's SQL, one text for embedded chDB and a ClickHouse server: the tables and the queries that read them.

`otel_traces` keeps the OpenTelemetry Collector ClickHouse exporter's columns and types unchanged (so Grafana's
ClickHouse data source shows our traces as it shows theirs); the canonical GenAI columns sit beside them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import pyarrow as pa

_MAP = "Map(LowCardinality(String), String)"

# MergeTree settings of the traces and logs tables in the embedded store, tuned for its one writer (a server's
# operator tunes theirs; older servers may not know these names):
# - parts below 64 MiB (uncompressed) are written Compact (one data file) rather than Wide (files per column and
#   subcolumn). An insert of 10-20k spans is 30-60 MB: Compact halves its CPU (a 10k-span insert ~230 ms instead
#   of ~400 ms). ClickHouse's default is 10 MiB.
# - a merge whose part is Wide runs column by column (vertical) instead of all columns at once: ClickHouse's
#   default waits for 131,072 rows. A horizontal merge of 10 parts of 6,000 spans (166 MB uncompressed) held
#   260-300 MB while it ran, whatever the block size, granule size or codec; a vertical one 15-90 MB (benchmarks/
#   merge_memory.py). Merges into a part under 64 MiB stay horizontal (~100 MB). With both, the collector's peak under
#   benchmarks/pipeline.py fell by 30-80 MB, its CPU within the noise.
# - merges wait for 10 parts of a size instead of 5: spans arrive as an insert every second or two, and a wider
#   merge rewrites each row fewer times (~40% less merge CPU during benchmarks/ingest.py) for a few more parts.
# - a granule (the rows a merge reads of a part at a time) holds at most 2 MiB instead of 10: a span row with its
#   messages is ~3 KB, so a merge of 10 parts read 10 granules of ~30 MB each at once. The collector's peak under
#   benchmarks/pipeline.py fell by 100-220 MB, for 5-10% more CPU a span at 240,000 spans (finer merges).
EMBEDDED_TABLE_SETTINGS: dict[str, int] = {
    "min_bytes_for_wide_part": 64 << 20,
    "vertical_merge_algorithm_min_rows_to_activate": 1,
    "merge_selector_base": 10,
    "index_granularity_bytes": 2 << 20,
}
CREATION_SETTINGS = frozenset({"index_granularity_bytes"})
"""Table settings ClickHouse fixes when a table is created: a store made before they were set keeps its own."""


def settings_clause(settings: Mapping[str, int]) -> str:
    """MergeTree settings as they follow a table's own in its DDL (", name = value, ...")."""
    return "".join(f", {name} = {value}" for name, value in settings.items())


def settings_to_apply(ddl: str, settings: Mapping[str, int]) -> dict[str, int]:
    """Of `settings`, those a table made by `ddl` (its `create_table_query`) lacks and can still take: what a
    store made by an earlier evalsi gets at start."""
    return {
        name: value
        for name, value in settings.items()
        if name not in CREATION_SETTINGS and not re.search(rf"\b{name} = {value}\b", ddl)
    }


def traces_ddl(table: str, extra_settings: str = "") -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes {_MAP} CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes {_MAP} CODEC(ZSTD(1)),
    Duration UInt64 CODEC(ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes {_MAP}
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes {_MAP}
    ) CODEC(ZSTD(1)),
    StepType LowCardinality(String) CODEC(ZSTD(1)),
    Model LowCardinality(String) CODEC(ZSTD(1)),
    Provider LowCardinality(String) CODEC(ZSTD(1)),
    InputTokens Nullable(UInt64) CODEC(ZSTD(1)),
    OutputTokens Nullable(UInt64) CODEC(ZSTD(1)),
    ToolName LowCardinality(String) CODEC(ZSTD(1)),
    SessionId String CODEC(ZSTD(1)),
    AgentName LowCardinality(String) CODEC(ZSTD(1)),
    UserId String CODEC(ZSTD(1)),
    CostUsd Nullable(Float64) CODEC(ZSTD(1)),
    ErrorType LowCardinality(String) CODEC(ZSTD(1)),
    Input String CODEC(ZSTD(3)),
    Output String CODEC(ZSTD(3)),
    ContentCaptured Bool CODEC(ZSTD(1)),
    Convention LowCardinality(String) CODEC(ZSTD(1)),
    Unparsed Array(LowCardinality(String)) CODEC(ZSTD(1)),
    Details String CODEC(ZSTD(3)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1,
    INDEX idx_session_id SessionId TYPE bloom_filter(0.01) GRANULARITY 1
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1{extra_settings}""",
        f"""CREATE TABLE IF NOT EXISTS {table}_trace_id_ts (
    TraceId String CODEC(ZSTD(1)),
    Start DateTime64(9) CODEC(Delta, ZSTD(1)),
    End DateTime64(9) CODEC(Delta, ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.01) GRANULARITY 1
) ENGINE = MergeTree()
PARTITION BY toDate(Start)
ORDER BY (Start)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1""",
        f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {table}_trace_id_ts_mv
TO {table}_trace_id_ts
AS SELECT
    TraceId,
    min(Timestamp) AS Start,
    max(Timestamp) AS End
FROM {table}
WHERE TraceId != ''
GROUP BY TraceId""",
    ]


def logs_ddl(table: str, extra_settings: str = "") -> list[str]:
    """The OTel Collector ClickHouse exporter's `otel_logs` (with its newer `EventName` column)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    TraceFlags UInt32 CODEC(ZSTD(1)),
    SeverityText LowCardinality(String) CODEC(ZSTD(1)),
    SeverityNumber Int32 CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    Body String CODEC(ZSTD(1)),
    ResourceSchemaUrl String CODEC(ZSTD(1)),
    ResourceAttributes {_MAP} CODEC(ZSTD(1)),
    ScopeSchemaUrl String CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    ScopeAttributes {_MAP} CODEC(ZSTD(1)),
    LogAttributes {_MAP} CODEC(ZSTD(1)),
    EventName String CODEC(ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_log_attr_key mapKeys(LogAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_log_attr_value mapValues(LogAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_body Body TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 1
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SeverityText, toUnixTimestamp(Timestamp), TraceId)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1{extra_settings}"""
    ]


def scores_ddl(table: str) -> list[str]:
    """Scores, one row per key (project, trace, span, policy, evaluator, name, run, trial): ReplacingMergeTree keeps
    the newest, and reads use FINAL, so a retried or replayed write never counts twice. No partitions: two writes of
    one key must meet in one part to be merged."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    Project LowCardinality(String) CODEC(ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    SessionId String CODEC(ZSTD(1)),
    Policy LowCardinality(String) CODEC(ZSTD(1)),
    Evaluator LowCardinality(String) CODEC(ZSTD(1)),
    EvaluatorVersion LowCardinality(String) CODEC(ZSTD(1)),
    Name LowCardinality(String) CODEC(ZSTD(1)),
    Value Nullable(Float64) CODEC(ZSTD(1)),
    Passed Nullable(Bool) CODEC(ZSTD(1)),
    Label String CODEC(ZSTD(1)),
    Explanation String CODEC(ZSTD(3)),
    Outcome LowCardinality(String) CODEC(ZSTD(1)),
    Reason LowCardinality(String) CODEC(ZSTD(1)),
    Source LowCardinality(String) CODEC(ZSTD(1)),
    JudgeCostUsd Nullable(Float64) CODEC(ZSTD(1)),
    RunId String CODEC(ZSTD(1)),
    Trial UInt32 CODEC(ZSTD(1)),
    TaskId String CODEC(ZSTD(1)),
    Metadata String CODEC(ZSTD(3)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1
) ENGINE = ReplacingMergeTree(Timestamp)
ORDER BY (Project, Policy, Evaluator, Name, TraceId, SpanId, RunId, Trial)
SETTINGS index_granularity = 8192"""
    ]


@dataclass(frozen=True)
class Tables:
    """The names of the store's tables (configurable) and the MergeTree settings its backend adds."""

    traces: str = "otel_traces"
    logs: str = "otel_logs"
    scores: str = "evalsi_scores"
    runs: str = "evalsi_runs"
    extra_settings: str = ""
    alerts: str = "evalsi_alerts"
    watermarks: str = "evalsi_watermarks"
    datasets: str = "evalsi_datasets"
    judge_ledger: str = "evalsi_judge_ledger"
    session_activity: str = "evalsi_session_activity"


TableKeys = dict[str, str]
"""The sorting key of each table of the store's database, by name (`system.tables`), as a migration finds them."""


@dataclass(frozen=True)
class Migration:
    """One step of the schema. Its statements are idempotent (IF NOT EXISTS), or chosen from the tables as the step
    finds them: two replicas starting at once, or a step interrupted half-way, run them again safely."""

    version: int
    description: str
    statements: Callable[[Tables, TableKeys], list[str]]


RUNS_COLUMNS = "Timestamp, Project, RunId, Name, Status, Manifest, Summary"


def runs_by_project(t: Tables, keys: TableKeys) -> list[str]:
    """Migration 5: `evalsi_runs` keyed by (project, run id) instead of the run id alone, under which a run recorded
    by one project replaced another project's run of the same id. A sorting key cannot be changed in place: the
    table keyed by run id is renamed `<runs>_by_run_id`, the table is made again with the new key, the rows are
    copied (each keeps its `Project`, `default` for runs recorded before projects) and the old table is dropped.
    Which of these steps are left is read from the tables: a step interrupted half-way, or a second replica, copies
    again (the same rows, the same key and version: one row each once read with FINAL) and drops the old table."""
    old = f"{t.runs}_by_run_id"
    found = keys.get(t.runs)
    keyed_by_run_id = found is not None and not found.startswith("Project")
    out = []
    if keyed_by_run_id and old in keys:  # an earlier attempt's, and the table made again with the old key since
        out += [f"INSERT INTO {old} ({RUNS_COLUMNS}) SELECT {RUNS_COLUMNS} FROM {t.runs}", f"DROP TABLE {t.runs}"]
    elif keyed_by_run_id:
        out.append(f"RENAME TABLE {t.runs} TO {old}")
    out += runs_ddl(t.runs)
    if keyed_by_run_id or old in keys:
        out += [
            f"INSERT INTO {t.runs} ({RUNS_COLUMNS}) SELECT {RUNS_COLUMNS} FROM {old}",
            f"DROP TABLE IF EXISTS {old}",
        ]
    return out


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "otel_traces (with <traces>_trace_id_ts and its view), otel_logs, evalsi_scores, evalsi_runs",
        lambda t, _: traces_ddl(t.traces, t.extra_settings) + logs_ddl(t.logs, t.extra_settings)
        + scores_ddl(t.scores) + runs_ddl(t.runs),
    ),
    Migration(
        2,
        "evalsi_runs.Project: the project of the credential that recorded the run",
        lambda t, _: [
            f"ALTER TABLE {t.runs} ADD COLUMN IF NOT EXISTS Project LowCardinality(String) DEFAULT 'default'"
        ],
    ),
    Migration(3, "evalsi_alerts: the policy alerts that fired, and resolved", lambda t, _: alerts_ddl(t.alerts)),
    Migration(
        4, "evalsi_watermarks: how far each pull receiver read its source", lambda t, _: watermarks_ddl(t.watermarks)
    ),
    Migration(5, "evalsi_runs keyed by (Project, RunId): one run per project and run id", runs_by_project),
    Migration(
        6, "evalsi_datasets: promoted traces, one row per project, dataset and row id",
        lambda t, _: datasets_ddl(t.datasets),
    ),
    Migration(
        7, "evalsi_judge_ledger and evalsi_session_activity: what replicas share",
        lambda t, _: judge_ledger_ddl(t.judge_ledger) + session_activity_ddl(t.session_activity),
    ),
)  # fmt: skip
SCHEMA_VERSION = MIGRATIONS[-1].version


def schema_versions_ddl() -> str:
    """Which migrations a store has run, per traces table (two evalsi deployments may share a database)."""
    return """CREATE TABLE IF NOT EXISTS evalsi_schema (
    TracesTable String,
    Version UInt32,
    Description String,
    AppliedAt DateTime64(3) DEFAULT now64(3)
) ENGINE = ReplacingMergeTree(AppliedAt)
ORDER BY (TracesTable, Version)"""


def schema_version_sql() -> str:
    """The newest migration run for a traces table. Parameter: {traces:String}."""
    return "SELECT max(Version) AS version, count() AS n FROM evalsi_schema FINAL WHERE TracesTable = {traces:String}"


def record_migration_sql(traces: str, migration: Migration) -> str:
    """The traces table name is an identifier checked by the config; the description is ours."""
    return (
        "INSERT INTO evalsi_schema (TracesTable, Version, Description) "
        f"VALUES ('{traces}', {migration.version}, '{migration.description}')"
    )


def ttl_targets(t: Tables) -> list[tuple[str, str]]:
    """The tables that `ttl` expires, each with its time column."""
    return [
        (t.traces, "Timestamp"), (f"{t.traces}_trace_id_ts", "Start"), (t.logs, "Timestamp"), (t.scores, "Timestamp"),
        (t.alerts, "Timestamp"), (t.judge_ledger, "Timestamp"), (t.session_activity, "Timestamp"),
    ]  # fmt: skip


def ttl_expression(column: str, ttl_s: int) -> str:
    """As ClickHouse writes it back in `create_table_query`, so a table already at this TTL is left alone."""
    return f"toDateTime({column}) + toIntervalSecond({ttl_s})"


def table_keys_sql() -> str:
    """Each table of the database with its sorting key (`TableKeys`)."""
    return "SELECT name, sorting_key FROM system.tables WHERE database = currentDatabase()"


def table_definitions_sql(tables: list[str]) -> str:
    """Names checked by the config: safe to inline."""
    names = ", ".join(f"'{t}'" for t in tables)
    return (
        f"SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase() AND name IN ({names})"
    )


STRING_MAP = pa.map_(pa.string(), pa.string())
TIMESTAMP = pa.timestamp("ns")

# Column order and Arrow types of an insert into the traces table (nested columns flattened as ClickHouse does).
TRACES_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("Timestamp", TIMESTAMP),
    ("TraceId", pa.string()),
    ("SpanId", pa.string()),
    ("ParentSpanId", pa.string()),
    ("TraceState", pa.string()),
    ("SpanName", pa.string()),
    ("SpanKind", pa.string()),
    ("ServiceName", pa.string()),
    ("ResourceAttributes", STRING_MAP),
    ("ScopeName", pa.string()),
    ("ScopeVersion", pa.string()),
    ("SpanAttributes", STRING_MAP),
    ("Duration", pa.uint64()),
    ("StatusCode", pa.string()),
    ("StatusMessage", pa.string()),
    ("Events.Timestamp", pa.list_(TIMESTAMP)),
    ("Events.Name", pa.list_(pa.string())),
    ("Events.Attributes", pa.list_(STRING_MAP)),
    ("Links.TraceId", pa.list_(pa.string())),
    ("Links.SpanId", pa.list_(pa.string())),
    ("Links.TraceState", pa.list_(pa.string())),
    ("Links.Attributes", pa.list_(STRING_MAP)),
    ("StepType", pa.string()),
    ("Model", pa.string()),
    ("Provider", pa.string()),
    ("InputTokens", pa.uint64()),
    ("OutputTokens", pa.uint64()),
    ("ToolName", pa.string()),
    ("SessionId", pa.string()),
    ("AgentName", pa.string()),
    ("UserId", pa.string()),
    ("CostUsd", pa.float64()),
    ("ErrorType", pa.string()),
    ("Input", pa.string()),
    ("Output", pa.string()),
    ("ContentCaptured", pa.bool_()),
    ("Convention", pa.string()),
    ("Unparsed", pa.list_(pa.string())),
    ("Details", pa.string()),
]
TRACES_SCHEMA = pa.schema(TRACES_COLUMNS)

LOGS_SCHEMA = pa.schema(
    [
        ("Timestamp", TIMESTAMP),
        ("TraceId", pa.string()),
        ("SpanId", pa.string()),
        ("TraceFlags", pa.uint32()),
        ("SeverityText", pa.string()),
        ("SeverityNumber", pa.int32()),
        ("ServiceName", pa.string()),
        ("Body", pa.string()),
        ("ResourceAttributes", STRING_MAP),
        ("ScopeName", pa.string()),
        ("ScopeVersion", pa.string()),
        ("LogAttributes", STRING_MAP),
        ("EventName", pa.string()),
    ]
)


SCORES_SCHEMA = pa.schema(
    [
        ("Timestamp", TIMESTAMP),
        ("Project", pa.string()),
        ("TraceId", pa.string()),
        ("SpanId", pa.string()),
        ("SessionId", pa.string()),
        ("Policy", pa.string()),
        ("Evaluator", pa.string()),
        ("EvaluatorVersion", pa.string()),
        ("Name", pa.string()),
        ("Value", pa.float64()),
        ("Passed", pa.bool_()),
        ("Label", pa.string()),
        ("Explanation", pa.string()),
        ("Outcome", pa.string()),
        ("Reason", pa.string()),
        ("Source", pa.string()),
        ("JudgeCostUsd", pa.float64()),
        ("RunId", pa.string()),
        ("Trial", pa.uint32()),
        ("TaskId", pa.string()),
        ("Metadata", pa.string()),
    ]
)


SPAN_PROJECT = (
    "(ResourceAttributes['evalsi.project'] = {project:String}"
    " OR ({project:String} = 'default' AND ResourceAttributes['evalsi.project'] = ''))"
)
"""A span's project: the `evalsi.project` resource attribute the receiver sets from the sender's credential (none:
`default`). Parameter: {project:String}."""
SCORE_PROJECT = "Project = {project:String}"


_SCORE_COLUMNS = """toUnixTimestamp64Nano(Timestamp) AS timestamp_unix_nano, Project AS project, TraceId AS trace_id,
    SpanId AS span_id, SessionId AS session_id, Policy AS policy, Evaluator AS evaluator,
    EvaluatorVersion AS evaluator_version, Name AS name, Value AS value, Passed AS passed, Label AS label,
    Explanation AS explanation, Outcome AS outcome, Reason AS reason, Source AS source,
    JudgeCostUsd AS judge_cost_usd, RunId AS run_id, Trial AS trial, TaskId AS task_id"""


def list_scores_sql(table: str, *, with_trace: bool, with_policy: bool, with_project: bool = False) -> str:
    """Scores newest first, each key once (FINAL). Parameters: {limit:UInt32}, {trace_id:String} (hex, checked),
    {policy_hex:String} (see `store.hex_param`), {project:String}."""
    where = [SCORE_PROJECT] if with_project else []
    if with_trace:
        where.append("TraceId = {trace_id:String}")
    if with_policy:
        where.append("Policy = unhex({policy_hex:String})")
    clause = ("WHERE " + " AND ".join(where)) if where else ""
    return f"""
SELECT {_SCORE_COLUMNS}
FROM {table} FINAL
{clause}
ORDER BY Timestamp DESC
LIMIT {{limit:UInt32}}
"""


def insert_sql(table: str, schema: pa.Schema, source: str) -> str:
    cols = ", ".join(f"`{name}`" for name in schema.names)
    return f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {source}"


def delete_spans_sql(table: str, keys: list[tuple[str, str]]) -> str:
    """Keys are (trace id, span id) in hex, checked by the caller: safe to inline."""
    pairs = ", ".join(f"('{t}', '{s}')" for t, s in keys)
    return f"DELETE FROM {table} WHERE (TraceId, SpanId) IN ({pairs})"


_TRACE_ROW = """    TraceId AS trace_id,
    toUnixTimestamp64Nano(min(Timestamp)) AS start_time_unix_nano,
    toInt64(max(toUnixTimestamp64Nano(Timestamp) + Duration)) - toInt64(min(toUnixTimestamp64Nano(Timestamp)))
        AS duration_ns,
    count() AS span_count,
    countIf(StatusCode = 'STATUS_CODE_ERROR') AS error_count,
    argMinIf(SpanName, Timestamp, ParentSpanId = '') AS root_name,
    argMin(SpanName, Timestamp) AS first_name,
    argMinIf(ServiceName, Timestamp, ParentSpanId = '') AS root_service,
    argMin(ServiceName, Timestamp) AS first_service,
    argMinIf(SessionId, Timestamp, SessionId != '') AS session_id,
    countIf(StepType = 'llm') AS llm_calls,
    sum(ifNull(InputTokens, 0)) AS input_tokens,
    sum(ifNull(OutputTokens, 0)) AS output_tokens,
    sum(CostUsd) AS cost_usd
"""
"""The columns of a trace's summary row, aggregated over its spans (GROUP BY TraceId)."""


def list_traces_sql(table: str, with_service: bool, with_project: bool = False) -> str:
    """One row per trace, newest first. Parameters: {limit:UInt32}, optionally {service_hex:String} (see
    `store.hex_param`) and {project:String}."""
    conditions = (["ServiceName = unhex({service_hex:String})"] if with_service else []) + (
        [SPAN_PROJECT] if with_project else []
    )
    where = ("WHERE " + " AND ".join(conditions)) if conditions else ""
    return f"""
SELECT
{_TRACE_ROW}FROM {table}
{where}
GROUP BY TraceId
ORDER BY start_time_unix_nano DESC
LIMIT {{limit:UInt32}}
"""


_SPAN_COLUMNS = """    TraceId, SpanId, ParentSpanId, TraceState, SpanName, SpanKind, ServiceName,
    toUnixTimestamp64Nano(Timestamp) AS StartNs, Duration, StatusCode, StatusMessage,
    ScopeName, ScopeVersion, SpanAttributes, ResourceAttributes,
    arrayMap(t -> toUnixTimestamp64Nano(t), `Events.Timestamp`) AS EventTimes, `Events.Name` AS EventNames,
    `Events.Attributes` AS EventAttributes,
    `Links.TraceId` AS LinkTraceIds, `Links.SpanId` AS LinkSpanIds, `Links.TraceState` AS LinkTraceStates,
    `Links.Attributes` AS LinkAttributes,
    StepType, Model, Provider, InputTokens, OutputTokens, ToolName, SessionId, AgentName, UserId, CostUsd, ErrorType,
    Input, Output,
    ContentCaptured, Convention, Unparsed, Details
"""


def trace_spans_sql(table: str, with_project: bool = False) -> str:
    """Every span of one trace, in start order; the trace_id_ts table narrows the time range as Grafana does.
    Parameters: {trace_id:String}, optionally {project:String}."""
    project = f"\n  AND {SPAN_PROJECT}" if with_project else ""
    return f"""
WITH
    (SELECT min(Start) FROM {table}_trace_id_ts WHERE TraceId = {{trace_id:String}}) AS t_start,
    (SELECT max(End) FROM {table}_trace_id_ts WHERE TraceId = {{trace_id:String}}) AS t_end
SELECT
{_SPAN_COLUMNS}FROM {table}
WHERE TraceId = {{trace_id:String}}
  AND Timestamp >= t_start AND Timestamp <= t_end{project}
ORDER BY Timestamp, SpanId
"""


def _one_trace(table: str, with_project: bool) -> tuple[str, str]:
    """The WITH clause and the conditions of `trace_spans_sql`: one trace's spans, in its stored time range."""
    project = f" AND {SPAN_PROJECT}" if with_project else ""
    with_ = f"""WITH
    (SELECT min(Start) FROM {table}_trace_id_ts WHERE TraceId = {{trace_id:String}}) AS t_start,
    (SELECT max(End) FROM {table}_trace_id_ts WHERE TraceId = {{trace_id:String}}) AS t_end"""
    where = f"TraceId = {{trace_id:String}} AND Timestamp >= t_start AND Timestamp <= t_end{project}"
    return with_, where


def trace_page_sql(table: str, with_project: bool = False) -> str:
    """A page of one trace's spans in start order: {limit:UInt32} spans from {offset:UInt64}. Only the sort keys of
    the whole trace are sorted (a trace may hold 500,000 spans); the page's columns are read for its spans alone.
    Parameters: {trace_id:String}, optionally {project:String}. Columns as `trace_spans_sql`."""
    with_, where = _one_trace(table, with_project)
    return f"""
{with_}
SELECT
{_SPAN_COLUMNS}FROM {table}
WHERE {where}
  AND (Timestamp, SpanId) IN (
    SELECT Timestamp, SpanId FROM {table} WHERE {where}
    ORDER BY Timestamp, SpanId LIMIT {{limit:UInt32}} OFFSET {{offset:UInt64}}
  )
ORDER BY Timestamp, SpanId
LIMIT {{limit:UInt32}}
"""


def trace_span_count_sql(table: str, with_project: bool = False) -> str:
    """How many spans one trace holds. Parameters as `trace_spans_sql`."""
    with_, where = _one_trace(table, with_project)
    return f"""
{with_}
SELECT count() AS n FROM {table} WHERE {where}
"""


def _spans_matching(table: str, condition: str, with_project: bool) -> str:
    """`TraceId IN (...)`: traces with a span matching `condition` (in the project), so the trace's row still sums
    every span of it."""
    project = f" AND {SPAN_PROJECT}" if with_project else ""
    return f"TraceId IN (SELECT TraceId FROM {table} WHERE {condition}{project})"


def search_traces_sql(table: str, scores_table: str, given: Collection[str], *, oldest_first: bool = False) -> str:
    """Trace rows as `list_traces_sql`, narrowed by each filter whose parameter is in `given` (values only ever
    travel as parameters; strings as hex, see `store.hex_param`): {service_hex:String} (spans of that service),
    {project:String}, {since_ns:Int64} / {until_ns:Int64} (the trace started then), {error:UInt8} (a span with
    status ERROR), {model_hex:String}, {session_hex:String}, {attr_key_hex_N:String} = {attr_value_hex_N:String}
    for N from 0 (a span or its resource has that attribute), {min_duration_ns:Int64}, {failed_hex:String} (the
    trace has a scored score of that evaluator that did not pass). Newest first (else oldest first), at most
    {limit:UInt32}."""
    with_project = "project" in given
    where = []
    if "service_hex" in given:
        where.append("ServiceName = unhex({service_hex:String})")
    if with_project:
        where.append(SPAN_PROJECT)
    if "model_hex" in given:
        where.append(_spans_matching(table, "Model = unhex({model_hex:String})", with_project))
    if "session_hex" in given:
        where.append(_spans_matching(table, "SessionId = unhex({session_hex:String})", with_project))
    n = 0
    while f"attr_key_hex_{n}" in given:
        key, value = f"unhex({{attr_key_hex_{n}:String}})", f"unhex({{attr_value_hex_{n}:String}})"
        condition = " OR ".join(f"(mapContains({m}, {key}) AND {m}[{key}] = {value})"
                                for m in ("SpanAttributes", "ResourceAttributes"))  # fmt: skip
        where.append(_spans_matching(table, f"({condition})", with_project))
        n += 1
    if "failed_hex" in given:
        project = f" AND {SCORE_PROJECT}" if with_project else ""
        where.append(
            f"TraceId IN (SELECT TraceId FROM {scores_table} FINAL WHERE Evaluator = unhex({{failed_hex:String}})"
            f" AND Outcome = 'scored' AND Passed = false{project})"
        )
    having = []
    if "since_ns" in given:
        having.append("start_time_unix_nano >= {since_ns:Int64}")
    if "until_ns" in given:
        having.append("start_time_unix_nano <= {until_ns:Int64}")
    if "error" in given:
        having.append("(error_count > 0) = {error:UInt8}")
    if "min_duration_ns" in given:
        having.append("duration_ns >= {min_duration_ns:Int64}")
    return f"""
SELECT
{_TRACE_ROW}FROM {table}
{("WHERE " + " AND ".join(where)) if where else ""}
GROUP BY TraceId
{("HAVING " + " AND ".join(having)) if having else ""}
ORDER BY start_time_unix_nano {"ASC" if oldest_first else "DESC"}, trace_id
LIMIT {{limit:UInt32}}
"""


def list_sessions_sql(table: str, given: Collection[str]) -> str:
    """One row per session (the session id of a trace: its earliest span's that has one), the most recently active
    first: its traces, first start, last end and sums over its spans. Parameters: {limit:UInt32}, optionally
    {project:String}, {since_ns:Int64} / {until_ns:Int64} (the session's last trace started then)."""
    project = f" AND {SPAN_PROJECT}" if "project" in given else ""
    having = []
    if "since_ns" in given:
        having.append("last_trace_start_unix_nano >= {since_ns:Int64}")
    if "until_ns" in given:
        having.append("last_trace_start_unix_nano <= {until_ns:Int64}")
    return f"""
SELECT session_id, count() AS trace_count, min(start) AS start_time_unix_nano, max(end) AS end_time_unix_nano,
    max(start) AS last_trace_start_unix_nano, sum(spans) AS span_count, sum(errors) AS error_count,
    sum(llm) AS llm_calls, sum(tokens_in) AS input_tokens, sum(tokens_out) AS output_tokens, sum(cost) AS cost_usd,
    argMinIf(user, start, user != '') AS user_id
FROM (
    SELECT TraceId, argMinIf(SessionId, Timestamp, SessionId != '') AS session_id,
        toInt64(min(toUnixTimestamp64Nano(Timestamp))) AS start,
        toInt64(max(toUnixTimestamp64Nano(Timestamp) + Duration)) AS end,
        count() AS spans, countIf(StatusCode = 'STATUS_CODE_ERROR') AS errors, countIf(StepType = 'llm') AS llm,
        sum(ifNull(InputTokens, 0)) AS tokens_in, sum(ifNull(OutputTokens, 0)) AS tokens_out, sum(CostUsd) AS cost,
        argMinIf(UserId, Timestamp, UserId != '') AS user
    FROM {table}
    WHERE TraceId IN (SELECT TraceId FROM {table} WHERE SessionId != ''{project}){project}
    GROUP BY TraceId
)
WHERE session_id != ''
GROUP BY session_id
{("HAVING " + " AND ".join(having)) if having else ""}
ORDER BY last_trace_start_unix_nano DESC, session_id
LIMIT {{limit:UInt32}}
"""


def session_scores_sql(scores_table: str, table: str, with_project: bool = False) -> str:
    """Scores of a session, oldest first, each key once (FINAL): those of the session itself and of its traces.
    Parameters: {session_hex:String} (see `store.hex_param`), {limit:UInt32}, optionally {project:String}. Columns
    as `list_scores_sql`."""
    traces = _spans_matching(table, "SessionId = unhex({session_hex:String})", with_project)
    project = f" AND {SCORE_PROJECT}" if with_project else ""
    return f"""
SELECT {_SCORE_COLUMNS}
FROM {scores_table} FINAL
WHERE (SessionId = unhex({{session_hex:String}}) OR {traces}){project}
ORDER BY Timestamp, TraceId, Name
LIMIT {{limit:UInt32}}
"""


def score_window_stats_sql(
    table: str, *, with_policy: bool, with_project: bool = False, with_until: bool = False, with_run: bool = False
) -> str:
    """Per (policy, evaluator, name): scored scores since {since_ns:Int64}, each key once (FINAL): n, the values'
    count, mean, sample sd and p50/p95 (linear interpolation, as numpy), and pass counts. Optional
    {policy_hex:String} (see `store.hex_param`), {until_ns:Int64} (before it) and {run_id_hex:String} (one offline
    run's scores)."""
    policy = "AND Policy = unhex({policy_hex:String})" if with_policy else ""
    if with_project:
        policy += f" AND {SCORE_PROJECT}"
    if with_until:
        policy += " AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})"
    if with_run:
        policy += " AND RunId = unhex({run_id_hex:String})"
    return f"""
SELECT Policy AS policy, Evaluator AS evaluator, Name AS name, count() AS n,
    count(Value) AS value_n, avg(Value) AS value_mean, stddevSamp(Value) AS value_sd,
    min(Value) AS value_min, max(Value) AS value_max, countIf(Value = 0 OR Value = 1) AS value_binary,
    quantileExactInclusive(0.5)(Value) AS p50, quantileExactInclusive(0.95)(Value) AS p95,
    count(Passed) AS pass_n, countIf(Passed) AS passed
FROM {table} FINAL
WHERE Outcome = 'scored' AND Timestamp >= fromUnixTimestamp64Nano({{since_ns:Int64}}) {policy}
GROUP BY Policy, Evaluator, Name
ORDER BY Policy, Evaluator, Name
"""


def judge_pairs_sql(table: str, *, with_policy: bool, with_project: bool = False) -> str:
    """Judge calibration: per (policy, evaluator, name) of scored verdicts since {since_ns:Int64} (each trace's
    latest; not human or external scores) and per human feedback name on the same trace (its latest, any time), the
    judge's verdict and the person's passed, value and label. Optional {policy_hex:String}, {project:String};
    {limit:UInt32} rows at most."""
    where = "AND Policy = unhex({policy_hex:String})" if with_policy else ""
    project = f" AND {SCORE_PROJECT}" if with_project else ""
    return f"""
SELECT j.policy AS policy, j.evaluator AS evaluator, j.name AS name, h.feedback AS feedback, j.passed AS judge,
    h.latest.1 AS human_passed, h.latest.2 AS human_value, h.latest.3 AS human_label
FROM (
    SELECT Project, TraceId, Policy AS policy, Evaluator AS evaluator, Name AS name,
        argMax(assumeNotNull(Passed), Timestamp) AS passed
    FROM {table} FINAL
    WHERE Outcome = 'scored' AND Passed IS NOT NULL AND Source NOT IN ('human', 'external')
        AND Timestamp >= fromUnixTimestamp64Nano({{since_ns:Int64}}) {where}{project}
    GROUP BY Project, TraceId, Policy, Evaluator, Name
) AS j
INNER JOIN (
    SELECT Project, TraceId, Name AS feedback, argMax(tuple(Passed, Value, Label), Timestamp) AS latest
    FROM {table} FINAL
    WHERE Outcome = 'scored' AND Source = 'human'{project}
    GROUP BY Project, TraceId, Name
) AS h ON j.Project = h.Project AND j.TraceId = h.TraceId
ORDER BY policy, evaluator, name, feedback
"""


def policy_window_sql(table: str) -> str:
    """One policy's window from every replica's scores, each key once (FINAL): per (project, evaluator, name) in
    [{start_ns:Int64}, {end_ns:Int64}) the scored scores' n, the values' count, mean, sample sd, bounds, 0/1 count and
    p50/p90/p95/p99 (linear interpolation, as numpy), pass counts, skipped and error counts, a few trace ids (failures
    first); and per project (`evaluator` = '') the traces with any score of the policy. Parameter {policy:String}."""
    return f"""
SELECT Project AS project, Evaluator AS evaluator, Name AS name, countIf(Outcome = 'scored') AS n,
    countIf(Value, Outcome = 'scored') AS value_n, avgIf(Value, Outcome = 'scored') AS value_mean,
    stddevSampIf(Value, Outcome = 'scored') AS value_sd, minIf(Value, Outcome = 'scored') AS value_min,
    maxIf(Value, Outcome = 'scored') AS value_max,
    countIf(Outcome = 'scored' AND (Value = 0 OR Value = 1)) AS value_binary,
    quantilesExactInclusiveIf(0.5, 0.9, 0.95, 0.99)(Value, Outcome = 'scored' AND Value IS NOT NULL) AS quantiles,
    countIf(Passed, Outcome = 'scored') AS pass_n, countIf(Outcome = 'scored' AND Passed) AS passed,
    countIf(Outcome = 'skipped') AS skipped, countIf(Outcome NOT IN ('scored', 'skipped')) AS errors,
    groupArrayIf(5)(TraceId, Outcome = 'scored' AND Passed = false) AS failures,
    groupArrayIf(5)(TraceId, Outcome = 'scored') AS examples, 0 AS traces
FROM {table} FINAL
WHERE Policy = {{policy:String}} AND Timestamp >= fromUnixTimestamp64Nano({{start_ns:Int64}})
    AND Timestamp < fromUnixTimestamp64Nano({{end_ns:Int64}})
GROUP BY Project, Evaluator, Name
UNION ALL
SELECT Project AS project, '' AS evaluator, '' AS name, 0, 0, NULL, NULL, NULL, NULL, 0, [], 0, 0, 0, 0, [], [],
    uniqExact(TraceId) AS traces
FROM {table} FINAL
WHERE Policy = {{policy:String}} AND Timestamp >= fromUnixTimestamp64Nano({{start_ns:Int64}})
    AND Timestamp < fromUnixTimestamp64Nano({{end_ns:Int64}})
GROUP BY Project
"""


def datasets_ddl(table: str) -> list[str]:
    """Promoted traces (`promote`): one row per project, dataset and row id (the trace id), the first promotion kept
    (ReplacingMergeTree on the negated promotion time, read with FINAL), so replicas promoting one trace, or one
    replica promoting it again after a restart, leave one row. `Record` is the dataset row (JSON)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
    Project LowCardinality(String) CODEC(ZSTD(1)),
    Dataset String CODEC(ZSTD(1)),
    RowId String CODEC(ZSTD(1)),
    PromotedAt DateTime64(9) CODEC(Delta, ZSTD(1)),
    Version UInt64 CODEC(ZSTD(1)),
    Policy LowCardinality(String) CODEC(ZSTD(1)),
    Record String CODEC(ZSTD(3))
) ENGINE = ReplacingMergeTree(Version)
ORDER BY (Project, Dataset, RowId)
SETTINGS index_granularity = 8192"""
    ]


def list_datasets_sql(table: str, *, with_project: bool) -> str:
    """Each dataset's rows and its first and last promotion (FINAL: each row once); optionally {project:String}."""
    where = f"WHERE {SCORE_PROJECT}" if with_project else ""
    return f"""
SELECT Project AS project, Dataset AS dataset, count() AS rows,
    toUnixTimestamp64Nano(min(PromotedAt)) AS first_unix_nano, toUnixTimestamp64Nano(max(PromotedAt)) AS last_unix_nano
FROM {table} FINAL
{where}
GROUP BY Project, Dataset
ORDER BY Project, Dataset
"""


def dataset_rows_sql(table: str, *, with_project: bool) -> str:
    """The rows of {dataset:String} in promotion order, at most {limit:UInt32}; optionally {project:String}."""
    project = f" AND {SCORE_PROJECT}" if with_project else ""
    return f"""
SELECT Project AS project, RowId AS row_id, Record AS record
FROM {table} FINAL
WHERE Dataset = {{dataset:String}}{project}
ORDER BY PromotedAt, Project, RowId
LIMIT {{limit:UInt32}}
"""


def judge_totals_sql(table: str, *, with_policy: bool, with_project: bool = False) -> str:
    """Per (policy, evaluator, name): the traces with a scored verdict since {since_ns:Int64} (each trace's latest)
    and how many passed: the judge's verdicts beside the few people labeled."""
    where = "AND Policy = unhex({policy_hex:String})" if with_policy else ""
    project = f" AND {SCORE_PROJECT}" if with_project else ""
    return f"""
SELECT policy, evaluator, name, count() AS n, countIf(passed) AS passed
FROM (
    SELECT Project, TraceId, Policy AS policy, Evaluator AS evaluator, Name AS name,
        argMax(assumeNotNull(Passed), Timestamp) AS passed
    FROM {table} FINAL
    WHERE Outcome = 'scored' AND Passed IS NOT NULL AND Source NOT IN ('human', 'external')
        AND Timestamp >= fromUnixTimestamp64Nano({{since_ns:Int64}}) {where}{project}
    GROUP BY Project, TraceId, Policy, Evaluator, Name
)
GROUP BY policy, evaluator, name
ORDER BY policy, evaluator, name
"""


def runs_ddl(table: str) -> list[str]:
    """Offline runs (`evalsi run`): one row per project and run id, the newest write kept (ReplacingMergeTree, read
    with FINAL): its manifest and, once finished, its summary (aggregates, gates, counts), both JSON. Two projects
    recording one run id keep two runs."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    Project LowCardinality(String) DEFAULT 'default' CODEC(ZSTD(1)),
    RunId String CODEC(ZSTD(1)),
    Name LowCardinality(String) CODEC(ZSTD(1)),
    Status LowCardinality(String) CODEC(ZSTD(1)),
    Manifest String CODEC(ZSTD(3)),
    Summary String CODEC(ZSTD(3))
) ENGINE = ReplacingMergeTree(Timestamp)
ORDER BY (Project, RunId)
SETTINGS index_granularity = 8192"""
    ]


def list_runs_sql(table: str, *, with_id: bool, with_project: bool = False) -> str:
    """Runs newest first, each once (FINAL). Parameters: {limit:UInt32}, optionally {run_id_hex:String} (see
    `store.hex_param`) and {project:String}."""
    conditions = (["RunId = unhex({run_id_hex:String})"] if with_id else []) + ([SCORE_PROJECT] if with_project else [])
    where = ("WHERE " + " AND ".join(conditions)) if conditions else ""
    return f"""
SELECT toUnixTimestamp64Nano(Timestamp) AS timestamp_unix_nano, Project AS project, RunId AS run_id, Name AS name,
    Status AS status, Manifest AS manifest, Summary AS summary
FROM {table} FINAL
{where}
ORDER BY Timestamp DESC, Project
LIMIT {{limit:UInt32}}
"""


def alerts_ddl(table: str) -> list[str]:
    """Policy alerts (`evalsi alerts list`): a row when one fires and one when it resolves. `ConditionValues` holds the
    aggregates its condition read (JSON), `Aggregates` every series of the window (JSON, firing only)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    Project LowCardinality(String) CODEC(ZSTD(1)),
    Policy LowCardinality(String) CODEC(ZSTD(1)),
    Alert String CODEC(ZSTD(1)),
    State LowCardinality(String) CODEC(ZSTD(1)),
    Condition String CODEC(ZSTD(1)),
    WindowStart DateTime64(3) CODEC(Delta, ZSTD(1)),
    WindowEnd DateTime64(3) CODEC(Delta, ZSTD(1)),
    TraceCount UInt64 CODEC(ZSTD(1)),
    ConditionValues String CODEC(ZSTD(3)),
    Aggregates String CODEC(ZSTD(3)),
    ExampleTraceIds Array(String) CODEC(ZSTD(1)),
    Labels Map(LowCardinality(String), String) CODEC(ZSTD(1))
) ENGINE = MergeTree
ORDER BY (Project, Policy, Alert, Timestamp)
SETTINGS index_granularity = 8192"""
    ]


def list_alerts_sql(table: str, *, with_policy: bool, with_project: bool = False) -> str:
    """Alert rows newest first, since {since_ns:Int64}, at most {limit:UInt32}; optionally {policy_hex:String} (see
    `store.hex_param`) and {project:String}."""
    conditions = ["Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64})"]
    conditions += (["Policy = unhex({policy_hex:String})"] if with_policy else []) + (
        [SCORE_PROJECT] if with_project else []
    )
    return f"""
SELECT toUnixTimestamp64Nano(Timestamp) AS timestamp_unix_nano, Project AS project, Policy AS policy, Alert AS alert,
    State AS state, Condition AS condition, toUnixTimestamp64Milli(WindowStart) AS window_start_unix_ms,
    toUnixTimestamp64Milli(WindowEnd) AS window_end_unix_ms, TraceCount AS count, ConditionValues AS condition_values,
    Aggregates AS aggregates, ExampleTraceIds AS example_trace_ids, Labels AS labels
FROM {table}
WHERE {" AND ".join(conditions)}
ORDER BY Timestamp DESC
LIMIT {{limit:UInt32}}
"""


def watermarks_ddl(table: str) -> list[str]:
    """Pull receivers' watermarks (`receivers: {mlflow: ...}`): one row per receiver and source, the newest kept."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    Source String CODEC(ZSTD(1)),
    Watermark String CODEC(ZSTD(3))
) ENGINE = ReplacingMergeTree(Timestamp)
ORDER BY Source"""
    ]


def watermark_sql(table: str) -> str:
    """The newest watermark of {source:String} (JSON), if any."""
    return f"SELECT Watermark AS watermark FROM {table} FINAL WHERE Source = {{source:String}} LIMIT 1"


def judge_ledger_ddl(table: str) -> list[str]:
    """Judge budget claims and spend, one row per (project, budget, period, replica), the newest kept: a replica
    writes its cumulative claims and spend (`evalsi.store.LedgerRow`) when it claims a slice and as it spends."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    Project LowCardinality(String) CODEC(ZSTD(1)),
    Budget LowCardinality(String) CODEC(ZSTD(1)),
    Period Int64 CODEC(ZSTD(1)),
    Replica LowCardinality(String) CODEC(ZSTD(1)),
    ClaimedCalls UInt64 CODEC(ZSTD(1)),
    ClaimedTokens UInt64 CODEC(ZSTD(1)),
    ClaimedUsd Float64 CODEC(ZSTD(1)),
    Calls UInt64 CODEC(ZSTD(1)),
    Tokens UInt64 CODEC(ZSTD(1)),
    Usd Float64 CODEC(ZSTD(1))
) ENGINE = ReplacingMergeTree(Timestamp)
ORDER BY (Project, Budget, Period, Replica)"""
    ]


JUDGE_LEDGER_COLUMNS = (
    "Timestamp, Project, Budget, Period, Replica, ClaimedCalls, ClaimedTokens, ClaimedUsd, Calls, Tokens, Usd"
)


def judge_ledger_sql(table: str) -> str:
    """Every replica's row of one budget period. Parameters: {project:String}, {budget_hex:String}, {period:Int64}."""
    return f"""
SELECT Replica AS replica, ClaimedCalls AS claimed_calls, ClaimedTokens AS claimed_tokens, ClaimedUsd AS claimed_usd,
    Calls AS calls, Tokens AS tokens, Usd AS usd
FROM {table} FINAL
WHERE Project = {{project:String}} AND Budget = unhex({{budget_hex:String}}) AND Period = {{period:Int64}}
"""


def session_activity_ddl(table: str) -> list[str]:
    """Sessions' activity, a row per write: a replica's rows say when it last completed a trace of the session and how
    many stored traces of it it completed since its previous row (`Traces`); the rows of replica '' record the
    `LastSeen` each evaluation of the session covered."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    Project LowCardinality(String) CODEC(ZSTD(1)),
    SessionId String CODEC(ZSTD(1)),
    Replica LowCardinality(String) CODEC(ZSTD(1)),
    LastSeen DateTime64(9) CODEC(Delta, ZSTD(1)),
    Traces UInt32 CODEC(ZSTD(1))
) ENGINE = MergeTree
ORDER BY (Project, SessionId, Replica, Timestamp)"""
    ]


def quiet_sessions_sql(table: str) -> str:
    """Sessions some replica saw since {active_since_ns:Int64} and none since {quiet_since_ns:Int64}, whose newest
    evaluation covers less than what was seen, with the stored traces the replicas completed of each."""
    return f"""
SELECT Project AS project, SessionId AS session_id,
    toUnixTimestamp64Nano(maxIf(LastSeen, Replica != '')) AS seen_ns,
    toUnixTimestamp64Nano(maxIf(LastSeen, Replica = '')) AS evaluated_ns, sumIf(Traces, Replica != '') AS traces
FROM {table}
WHERE (Project, SessionId) IN (
    SELECT Project, SessionId FROM {table}
    WHERE Replica != '' AND LastSeen >= fromUnixTimestamp64Nano({{active_since_ns:Int64}})
)
GROUP BY Project, SessionId
HAVING seen_ns <= {{quiet_since_ns:Int64}} AND seen_ns > evaluated_ns
ORDER BY seen_ns
LIMIT 10000
"""


def session_spans_sql(table: str) -> str:
    """Every span of the traces of a session, of one project. Parameters: {session_hex:String}, {project:String}.
    Columns as `trace_spans_sql`."""
    traces = _spans_matching(table, "SessionId = unhex({session_hex:String})", True)
    return f"""
SELECT
{_SPAN_COLUMNS}FROM {table}
WHERE {traces} AND {SPAN_PROJECT}
ORDER BY TraceId, Timestamp, SpanId
"""


def _ids(trace_ids: list[str]) -> str:
    """Trace ids in hex, checked by the caller: safe to inline (a parameter array is spelled differently by chDB
    and by clickhouse-connect)."""
    return ", ".join(f"'{t}'" for t in trace_ids)


def span_counts_sql(table: str, trace_ids: list[str], with_project: bool = False) -> str:
    """Stored spans per trace, for traces started since a time. Parameters: {since:Int64}, optionally
    {project:String}."""
    project = f" AND {SPAN_PROJECT}" if with_project else ""
    return f"""
SELECT TraceId AS trace_id, count() AS spans
FROM {table}
WHERE TraceId IN ({_ids(trace_ids)}) AND Timestamp >= fromUnixTimestamp64Nano({{since:Int64}}){project}
GROUP BY TraceId
"""


def span_keys_sql(table: str, trace_ids: list[str], with_project: bool = False) -> str:
    """The trace and span id of every stored span of some traces (of one project: parameter {project:String})."""
    project = f" AND {SPAN_PROJECT}" if with_project else ""
    return f"SELECT DISTINCT TraceId, SpanId FROM {table} WHERE TraceId IN ({_ids(trace_ids)}){project}"


def traces_spans_sql(table: str, trace_ids: list[str], with_project: bool = False) -> str:
    """Every span of several traces started since a time, by trace and start. Parameters: {since:Int64}, optionally
    {project:String}. Columns as `trace_spans_sql`."""
    project = f" AND {SPAN_PROJECT}" if with_project else ""
    return f"""
SELECT
{_SPAN_COLUMNS}FROM {table}
WHERE TraceId IN ({_ids(trace_ids)}) AND Timestamp >= fromUnixTimestamp64Nano({{since:Int64}}){project}
ORDER BY TraceId, Timestamp, SpanId
"""


def run_scores_sql(table: str, with_project: bool = False) -> str:
    """Every score of a run, each key once (FINAL). Parameters: {run_id_hex:String} (see `store.hex_param`),
    optionally {project:String}."""
    project = f" AND {SCORE_PROJECT}" if with_project else ""
    return f"""
SELECT toUnixTimestamp64Nano(Timestamp) AS timestamp_unix_nano, Project AS project, TraceId AS trace_id,
    SpanId AS span_id, Policy AS policy, Evaluator AS evaluator, EvaluatorVersion AS evaluator_version, Name AS name,
    Value AS value, Passed AS passed, Label AS label, Explanation AS explanation, Outcome AS outcome, Reason AS reason,
    Source AS source, JudgeCostUsd AS judge_cost_usd, RunId AS run_id, Trial AS trial, TaskId AS task_id
FROM {table} FINAL
WHERE RunId = unhex({{run_id_hex:String}}){project}
ORDER BY TaskId, Trial, Name
"""
