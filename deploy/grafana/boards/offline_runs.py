"""The offline runs dashboard (evalsi_runs): runs, their gates and metrics with intervals."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.models import dashboard

from boards.panels import band, ch_variable, grid, new_dashboard, row, ts
from boards.sql import CLICKHOUSE, Sql, sql_in

GATES_TEXT = (
    "arrayStringConcat(arrayMap(g -> concat(if(JSONExtractBool(g, 'passed'), '✓ ', '✗ '), "
    "JSONExtractString(g, 'gate')), JSONExtractArrayRaw(Summary, 'gates')), '; ')"
)
RUNS_SQL = f"""
    SELECT
        Timestamp AS time, RunId AS run_id, Name AS run, Status AS status,
        JSONExtractBool(Summary, 'passed') AS gates_passed, {GATES_TEXT} AS gates,
        JSONExtractUInt(Summary, 'attempts') AS attempts,
        JSONLength(Summary, 'infra_errors') AS infra_errors,
        JSONExtractUInt(Summary, 'not_run') AS not_run,
        JSONExtractFloat(Summary, 'wall_s') AS wall_s
    FROM evalsi_runs FINAL
    WHERE $__timeFilter(Timestamp)
    ORDER BY Timestamp DESC
    LIMIT 200"""
RUN_FILTER = "$__timeFilter(Timestamp) AND Name = ${run:singlequote} AND Status = 'finished'"
GATES_SERIES_SQL = f"""
    SELECT
        Timestamp AS time,
        toUInt8(JSONExtractBool(Summary, 'passed')) AS all_gates_passed,
        arrayCount(g -> JSONExtractBool(g, 'passed'), JSONExtractArrayRaw(Summary, 'gates')) AS gates_passed,
        JSONLength(Summary, 'gates') AS gates
    FROM evalsi_runs FINAL
    WHERE {RUN_FILTER}
    ORDER BY time"""
METRIC_BAND_SQL = f"""
    SELECT
        Timestamp AS time,
        JSONExtract(Summary, 'metrics', ${{metric:singlequote}}, 'mean', 'Nullable(Float64)') AS mean,
        JSONExtract(Summary, 'metrics', ${{metric:singlequote}}, 'low', 'Nullable(Float64)') AS lower,
        JSONExtract(Summary, 'metrics', ${{metric:singlequote}}, 'high', 'Nullable(Float64)') AS upper,
        JSONExtractUInt(Summary, 'metrics', ${{metric:singlequote}}, 'n') AS n
    FROM evalsi_runs FINAL
    WHERE {RUN_FILTER} AND JSONHas(Summary, 'metrics', ${{metric:singlequote}})
    ORDER BY time"""
RUN_GATES_SQL = f"""
    SELECT
        Timestamp AS time, RunId AS run_id, JSONExtractString(g, 'gate') AS gate,
        JSONExtractBool(g, 'passed') AS passed, JSONExtractString(g, 'detail') AS detail
    FROM evalsi_runs FINAL
    ARRAY JOIN JSONExtractArrayRaw(Summary, 'gates') AS g
    WHERE {RUN_FILTER}
    ORDER BY time DESC, gate
    LIMIT 500"""
RUN_METRICS_SQL = f"""
    SELECT
        Timestamp AS time, RunId AS run_id, m.1 AS metric, JSONExtractString(m.2, 'kind') AS kind,
        JSONExtractUInt(m.2, 'n') AS n,
        JSONExtract(m.2, 'mean', 'Nullable(Float64)') AS mean,
        JSONExtract(m.2, 'low', 'Nullable(Float64)') AS lower,
        JSONExtract(m.2, 'high', 'Nullable(Float64)') AS upper,
        JSONExtract(m.2, 'p50', 'Nullable(Float64)') AS p50,
        JSONExtract(m.2, 'p95', 'Nullable(Float64)') AS p95,
        JSONExtractUInt(m.2, 'errors') AS errors, JSONExtractUInt(m.2, 'skipped') AS skipped
    FROM evalsi_runs FINAL
    ARRAY JOIN JSONExtractKeysAndValuesRaw(Summary, 'metrics') AS m
    WHERE {RUN_FILTER} AND {sql_in("m.1", "metric")}
    ORDER BY time DESC, metric
    LIMIT 1000"""


def offline_runs() -> dashboard_b.Dashboard:
    return (
        new_dashboard(
            "evalsi-offline-runs",
            "evalsi · offline runs",
            "`evalsi run` records each run in evalsi_runs with its summary: gates and metric aggregates with their "
            "intervals. Runs of one spec over time, its gates and its metrics.",
        )
        .time("now-30d", "now")
        .refresh("5m")
        .variables(
            [
                ch_variable(
                    "run",
                    "Run",
                    "SELECT DISTINCT Name FROM evalsi_runs WHERE $__timeFilter(Timestamp) ORDER BY Name",
                    multi=False,
                ),
                ch_variable(
                    "metric",
                    "Metric",
                    """
                    SELECT DISTINCT arrayJoin(JSONExtractKeys(Summary, 'metrics')) AS metric FROM evalsi_runs FINAL
                    WHERE $__timeFilter(Timestamp) AND Name = ${run:singlequote} AND Status = 'finished'
                    ORDER BY metric""",
                ),
            ]
        )
        .with_row(row("Every run"))
        .with_panel(
            grid(
                "Latest runs",
                "Every run in the range, newest first: its status (running, finished), whether all its gates "
                "passed, each gate (✓ passed, ✗ failed), attempts, infrastructure errors and wall time.",
                [Sql(RUNS_SQL)],
                height=8,
            ).override_by_name("wall_s", [dashboard.DynamicConfigValue("unit", "s")])
        )
        .with_row(row("$run over time"))
        .with_panel(
            ts(
                "Gates",
                "For each finished run: how many of its gates passed, out of how many, and 1 when all did.",
                [Sql(GATES_SERIES_SQL, series=True)],
                ds=CLICKHOUSE,
                points=True,
                min_val=0,
            )
        )
        .with_panel(
            grid(
                "Gates of each run",
                "Each gate of each finished run, with why a gate could not be answered.",
                [Sql(RUN_GATES_SQL)],
                span=12,
                height=8,
            )
        )
        .with_panel(
            band(
                ts(
                    "$metric",
                    "The metric's mean in each run with its 95% interval (Wilson for pass/fail metrics, percentile "
                    "bootstrap for numeric ones) and n, the scored observations.",
                    [Sql(METRIC_BAND_SQL, series=True)],
                    ds=CLICKHOUSE,
                    points=True,
                    span=8,
                )
                .repeat("metric")
                .repeat_direction("h")
            )
        )
        .with_panel(
            grid(
                "Metrics of each run",
                "Every metric aggregate of each finished run (`summary.metrics`).",
                [Sql(RUN_METRICS_SQL)],
                height=10,
            )
        )
    )
