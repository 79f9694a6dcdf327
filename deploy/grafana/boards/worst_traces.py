"""The worst recent traces dashboard: the traces with the lowest scores, each linked to its trace view."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.models import dashboard

from boards.panels import ch_variable, grid, new_dashboard
from boards.sql import ONLINE, Sql, sql_in, trace_explore_url

WORST_TRACES_SQL = f"""
    WITH worst AS (
        SELECT
            TraceId, max(Timestamp) AS scored_at,
            countIf(Passed = false) AS failed,
            minIf(Value, Value >= 0 AND Value <= 1) AS lowest,
            arrayStringConcat(groupUniqArrayIf(concat(Policy, '/', Name), Passed = false), ', ') AS failed_checks,
            argMinIf(Explanation, ifNull(Value, 2), Passed = false OR (Value >= 0 AND Value <= 1)) AS why
        FROM evalsi_scores FINAL
        WHERE $__timeFilter(Timestamp) AND {ONLINE} AND Outcome = 'scored' AND TraceId != ''
            AND {sql_in("Policy", "policy")} AND {sql_in("Evaluator", "evaluator")} AND {sql_in("Name", "name")}
        GROUP BY TraceId
        HAVING failed > 0 OR lowest IS NOT NULL
        ORDER BY failed DESC, lowest ASC, scored_at DESC
        LIMIT 50
    )
    SELECT
        s.TraceId AS TraceId, t.start AS started, t.service AS service, t.root AS root_span,
        s.failed AS failed, s.lowest AS lowest_score, s.failed_checks AS failed_checks, s.why AS explanation,
        t.duration_ms AS duration_ms, t.spans AS spans, t.errors AS errors, t.model AS model,
        t.tokens AS tokens, s.scored_at AS scored_at
    FROM worst AS s
    INNER JOIN (
        SELECT
            TraceId, min(Timestamp) AS start,
            argMinIf(SpanName, Timestamp, ParentSpanId = '') AS root,
            argMinIf(ServiceName, Timestamp, ParentSpanId = '') AS service,
            (max(toUnixTimestamp64Nano(Timestamp) + Duration) - min(toUnixTimestamp64Nano(Timestamp))) / 1e6
                AS duration_ms,
            count() AS spans, countIf(StatusCode = 'STATUS_CODE_ERROR') AS errors,
            anyIf(Model, Model != '') AS model,
            sum(ifNull(InputTokens, 0) + ifNull(OutputTokens, 0)) AS tokens
        FROM otel_traces
        WHERE TraceId IN (SELECT TraceId FROM worst)
            AND Timestamp >= $__fromTime - INTERVAL 1 DAY AND Timestamp <= $__toTime
        GROUP BY TraceId
    ) AS t ON t.TraceId = s.TraceId
    ORDER BY failed DESC, lowest_score ASC, scored_at DESC"""


def worst_traces() -> dashboard_b.Dashboard:
    link = {"title": "Open the trace", "url": trace_explore_url(), "targetBlank": True}
    return (
        new_dashboard(
            "evalsi-worst-traces",
            "evalsi · worst traces",
            "The recent traces online policies scored worst, with their spans' summary; a trace id opens the trace "
            "in Explore's trace view.",
        )
        .time("now-24h", "now")
        .variables(
            [
                ch_variable(
                    "policy",
                    "Policy",
                    f"SELECT DISTINCT Policy FROM evalsi_scores WHERE $__timeFilter(Timestamp) AND {ONLINE} "
                    "ORDER BY Policy",
                ),
                ch_variable(
                    "evaluator",
                    "Evaluator",
                    f"""
                    SELECT DISTINCT Evaluator FROM evalsi_scores
                    WHERE $__timeFilter(Timestamp) AND {ONLINE} AND {sql_in("Policy", "policy")}
                    ORDER BY Evaluator""",
                ),
                ch_variable(
                    "name",
                    "Score",
                    f"""
                    SELECT DISTINCT Name FROM evalsi_scores
                    WHERE $__timeFilter(Timestamp) AND {ONLINE} AND {sql_in("Policy", "policy")}
                        AND {sql_in("Evaluator", "evaluator")}
                    ORDER BY Name""",
                ),
            ]
        )
        .with_panel(
            grid(
                "Worst recent traces",
                "The 50 traces with the most failed scores, then the lowest score between 0 and 1 (judges, "
                "similarity, ...; a latency in ms is ranked by its verdict, not its value), joined to their spans in "
                "otel_traces (traces scored but not stored are left out). Click a trace id to open the trace.",
                [Sql(WORST_TRACES_SQL)],
                height=20,
            )
            .override_by_name(
                "TraceId",
                [
                    dashboard.DynamicConfigValue("links", [link]),
                    dashboard.DynamicConfigValue("custom.width", 290),
                ],
            )
            .override_by_name("duration_ms", [dashboard.DynamicConfigValue("unit", "ms")])
            .override_by_name("lowest_score", [dashboard.DynamicConfigValue("decimals", 3)])
        )
    )
