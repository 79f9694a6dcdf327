"""evalsi's Grafana dashboards, built as code with the Grafana Foundation SDK and checked in as JSON.

    python deploy/grafana/dashboards.py           # rewrite deploy/grafana/dashboards/*.json
    python deploy/grafana/dashboards.py --check   # exit 1 naming the files that differ from what this builds

Queries name only what evalsi writes: the tables of evalsi/exporters/clickhouse/schema.py and the metrics of the
collector's own /metrics (`service.telemetry.metrics`) and of the `prometheus` exporter. docs/grafana.md says what
each dashboard shows; tests/deploy/test_dashboards.py runs every query against a store and a Prometheus that a
real `evalsi serve` filled.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

from grafana_foundation_sdk.builders import (
    common as common_b,
    dashboard as dashboard_b,
    prometheus as prometheus_b,
    stat,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog import builder as cogbuilder, runtime as cogruntime, variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, dashboard
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from evalsi.policies.intervals import t_quantile, z_quantile

OUT = Path(__file__).resolve().parent / "dashboards"

CLICKHOUSE_TYPE = "grafana-clickhouse-datasource"
CLICKHOUSE = dashboard.DataSourceRef(type_val=CLICKHOUSE_TYPE, uid="evalsi-clickhouse")
PROMETHEUS = dashboard.DataSourceRef(type_val="prometheus", uid="evalsi-prometheus")
TAG = "evalsi"


# --- the ClickHouse data source's query (the SDK has no types for this plugin) -----------------------------------

# the `format` the plugin's SQL editor saves with a query (sqlds' format options)
FORMAT_TIME_SERIES, FORMAT_TABLE, FORMAT_TRACE = 0, 1, 3
_QUERY_TYPES = {FORMAT_TIME_SERIES: "timeseries", FORMAT_TABLE: "table", FORMAT_TRACE: "traces"}


class SqlQuery(cogvariants.Dataquery):
    """A grafana-clickhouse-datasource query written in its SQL editor: raw SQL with the plugin's macros."""

    def __init__(self, raw_sql: str = "", ref_id: str = "A", format_val: int = FORMAT_TABLE) -> None:
        self.raw_sql = raw_sql
        self.ref_id = ref_id
        self.format_val = format_val

    def to_json(self) -> dict[str, object]:
        return {
            "datasource": CLICKHOUSE,
            "editorType": "sql",
            "format": self.format_val,
            "queryType": _QUERY_TYPES[self.format_val],
            "rawSql": self.raw_sql,
            "refId": self.ref_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        return cls(data.get("rawSql", ""), data.get("refId", "A"), int(data.get("format", FORMAT_TABLE)))


# so Dashboard.from_json reads ClickHouse targets back as SqlQuery rather than as an untyped bag
cogruntime.register_dataquery_variant(cogruntime.DataqueryConfig(CLICKHOUSE_TYPE, SqlQuery.from_json))


class Sql(cogbuilder.Builder[SqlQuery]):
    def __init__(self, raw_sql: str, *, series: bool = False) -> None:
        self._internal = SqlQuery(textwrap.dedent(raw_sql).strip(), "A", FORMAT_TIME_SERIES if series else FORMAT_TABLE)

    def ref_id(self, ref_id: str) -> Self:
        self._internal.ref_id = ref_id
        return self

    def build(self) -> SqlQuery:
        return self._internal


def prom(expr: str, legend: str = "__auto", *, instant: bool = False) -> prometheus_b.Dataquery:
    """A PromQL query; panels name their queries A, B, C... in order."""
    query = prometheus_b.Dataquery().expr(expr).legend_format(legend).ref_id("A").datasource(PROMETHEUS)
    return query.instant() if instant else query.range()


def promql_table(expr: str) -> prometheus_b.Dataquery:
    return prom(expr, instant=True).format(PromQueryFormat.TABLE)


# --- statistics in SQL, the same as the policy windows' (evalsi.policies.intervals) ----------------------------

Z = z_quantile(0.975)
_T_TABLE_UP_TO = 30


def t975_sql(df: str) -> str:
    """SQL for t(0.975, df): exact for df <= 30, beyond it the Cornish-Fisher expansion in 1/df (A&S 26.7.5) to the
    third order, off by less than 2e-6 at df = 31 and less after."""
    table_ = ", ".join(f"{t_quantile(0.975, df_):.6f}" for df_ in range(1, _T_TABLE_UP_TO + 1))
    z2 = Z * Z
    g1 = (z2 + 1) * Z / 4
    g2 = ((5 * z2 + 16) * z2 + 3) * Z / 96
    g3 = (((3 * z2 + 19) * z2 + 17) * z2 - 15) * Z / 384
    return (
        f"if({df} <= {_T_TABLE_UP_TO}, arrayElement([{table_}], toUInt32({df})), "
        f"{Z:.6f} + {g1:.6f} / {df} + {g2:.6f} / pow({df}, 2) + {g3:.6f} / pow({df}, 3))"
    )


def wilson_sql(k: str, n: str, side: str) -> str:
    """SQL for the lower or upper bound of the 95% Wilson interval of k successes in n."""
    z2 = f"{Z * Z:.6f}"
    center = f"({k} / {n} + {z2} / (2 * {n})) / (1 + {z2} / {n})"
    half = f"{Z:.6f} * sqrt({k} / {n} * (1 - {k} / {n}) / {n} + {z2} / (4 * {n} * {n})) / (1 + {z2} / {n})"
    return f"greatest(0, {center} - {half})" if side == "lower" else f"least(1, {center} + {half})"


# --- the trace view: Explore with the ClickHouse data source, query type traces -----------------------------------


def trace_view_sql(trace_id: str) -> str:
    """One trace's spans in the columns Grafana's trace view reads (the plugin's own trace-ID query for the OTel
    schema), the trace's time span taken from otel_traces_trace_id_ts; evalsi's canonical GenAI columns are added
    to each span's tags."""
    attrs = "arrayMap(key -> map('key', key, 'value', {0}[key]), mapKeys({0}))"
    genai = (
        "arrayFilter(t -> t['value'] != '', ["
        "map('key', 'evalsi.step_type', 'value', StepType), map('key', 'evalsi.model', 'value', Model), "
        "map('key', 'evalsi.input_tokens', 'value', toString(ifNull(InputTokens, 0))), "
        "map('key', 'evalsi.output_tokens', 'value', toString(ifNull(OutputTokens, 0))), "
        "map('key', 'evalsi.cost_usd', 'value', ifNull(toString(CostUsd), ''))])"
    )
    return textwrap.dedent(f"""\
        WITH '{trace_id}' AS trace_id,
            (SELECT min(Start) FROM otel_traces_trace_id_ts WHERE TraceId = trace_id) AS trace_start,
            (SELECT max(End) + 1 FROM otel_traces_trace_id_ts WHERE TraceId = trace_id) AS trace_end
        SELECT
            TraceId AS traceID, SpanId AS spanID, ParentSpanId AS parentSpanID, ServiceName AS serviceName,
            SpanName AS operationName, multiply(toUnixTimestamp64Nano(Timestamp), 0.000001) AS startTime,
            multiply(Duration, 0.000001) AS duration,
            arrayConcat({attrs.format("SpanAttributes")}, {genai}) AS tags,
            {attrs.format("ResourceAttributes")} AS serviceTags,
            if(StatusCode IN ('Error', 'STATUS_CODE_ERROR'), 2, 0) AS statusCode,
            arrayMap((name, timestamp, attributes) -> tuple(name, toString(toUnixTimestamp64Milli(timestamp)),
                {attrs.format("attributes")})::Tuple(name String, timestamp String, fields Array(Map(String, String))),
                `Events.Name`, `Events.Timestamp`, `Events.Attributes`) AS logs,
            arrayMap((traceID, spanID, attributes) -> tuple(traceID, spanID,
                {attrs.format("attributes")})::Tuple(traceID String, spanID String, tags Array(Map(String, String))),
                `Links.TraceId`, `Links.SpanId`, `Links.Attributes`) AS references,
            SpanKind AS kind, StatusMessage AS statusMessage, ScopeName AS instrumentationLibraryName,
            ScopeVersion AS instrumentationLibraryVersion, TraceState AS traceState
        FROM otel_traces
        WHERE TraceId = trace_id AND Timestamp >= trace_start AND Timestamp <= trace_end
        ORDER BY startTime""")


def trace_explore_url(trace_id: str = "${__value.raw}") -> str:
    """A link that opens the trace in Explore's trace view: the ClickHouse data source, query type traces, the
    trace id (a Grafana data link variable by default). Grafana fills `${...}` in before it follows the link."""
    query = {
        "refId": "A",
        "datasource": CLICKHOUSE.to_json(),
        "editorType": "sql",
        "queryType": "traces",
        "format": FORMAT_TRACE,
        "rawSql": trace_view_sql(trace_id),
    }
    panes = {"trace": {"datasource": CLICKHOUSE.uid, "queries": [query], "range": {"from": "now-7d", "to": "now"}}}
    encoded = quote(json.dumps(panes, separators=(",", ":")), safe="")
    # Grafana's link variables must reach it as written, not percent-encoded
    return "/explore?schemaVersion=1&panes=" + encoded.replace(quote(trace_id, safe=""), trace_id)


# --- panels --------------------------------------------------------------------------------------------------------

Target = cogbuilder.Builder[Any]


def _common(panel: Any, title: str, description: str, ds: dashboard.DataSourceRef, targets: list[Target]) -> Any:
    for i, target in enumerate(targets):
        target.ref_id(chr(ord("A") + i))
    return panel.title(title).description(description).datasource(ds).targets(targets)


def ts(
    title: str,
    description: str,
    targets: list[Target],
    *,
    ds: dashboard.DataSourceRef = PROMETHEUS,
    unit: str = "short",
    span: int = 12,
    height: int = 8,
    min_val: float | None = None,
    max_val: float | None = None,
    bars: bool = False,
    points: bool = False,
) -> timeseries.Panel:
    panel = _common(timeseries.Panel(), title, description, ds, targets).unit(unit).span(span).height(height)
    panel = panel.legend(
        common_b.VizLegendOptions()
        .display_mode(common.LegendDisplayMode.LIST)
        .placement(common.LegendPlacement.BOTTOM)
        .show_legend(True)
    ).fill_opacity(10 if not bars else 80)
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS)
    if points:
        panel = panel.show_points(common.VisibilityMode.ALWAYS).point_size(6)
    if min_val is not None:
        panel = panel.min(min_val)
    if max_val is not None:
        panel = panel.max(max_val)
    return panel


def single(
    title: str,
    description: str,
    target: Target,
    *,
    ds: dashboard.DataSourceRef = PROMETHEUS,
    unit: str = "short",
    span: int = 4,
    bad_above: float | None = None,
    mappings: list[Any] | None = None,
) -> stat.Panel:
    steps = [dashboard.Threshold(color="green", value=None)]
    if bad_above is not None:
        steps.append(dashboard.Threshold(color="red", value=bad_above))
    panel = (
        _common(stat.Panel(), title, description, ds, [target])
        .unit(unit)
        .span(span)
        .height(4)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.AREA)
        .thresholds(dashboard_b.ThresholdsConfig().mode(dashboard.ThresholdsMode.ABSOLUTE).steps(steps))
    )
    if mappings:
        panel = panel.mappings(mappings)
    return panel


def grid(
    title: str,
    description: str,
    targets: list[Target],
    *,
    ds: dashboard.DataSourceRef = CLICKHOUSE,
    span: int = 24,
    height: int = 9,
) -> table.Panel:
    return _common(table.Panel(), title, description, ds, targets).span(span).height(height).show_header(True)


def band(panel: timeseries.Panel) -> timeseries.Panel:
    """Fields named mean, lower, upper and n: a line with its 95% interval shaded, and n as bars on the right."""
    blue = dashboard.DynamicConfigValue("color", {"mode": "fixed", "fixedColor": "blue"})
    no_line = dashboard.DynamicConfigValue("custom.lineWidth", 0)
    no_points = dashboard.DynamicConfigValue("custom.showPoints", "never")
    return (
        panel.override_by_name("mean", [blue, dashboard.DynamicConfigValue("custom.lineWidth", 2)])
        .override_by_name("lower", [blue, no_line, no_points, dashboard.DynamicConfigValue("custom.fillOpacity", 0)])
        .override_by_name(
            "upper",
            [
                blue,
                no_line,
                no_points,
                dashboard.DynamicConfigValue("custom.fillOpacity", 20),
                dashboard.DynamicConfigValue("custom.fillBelowTo", "lower"),
            ],
        )
        .override_by_name(
            "n",
            [
                dashboard.DynamicConfigValue("custom.axisPlacement", "right"),
                dashboard.DynamicConfigValue("custom.drawStyle", "bars"),
                dashboard.DynamicConfigValue("custom.fillOpacity", 30),
                dashboard.DynamicConfigValue("unit", "short"),
                dashboard.DynamicConfigValue("decimals", 0),
                dashboard.DynamicConfigValue("color", {"mode": "fixed", "fixedColor": "text"}),
            ],
        )
    )


# --- template variables --------------------------------------------------------------------------------------------


def ch_variable(name: str, label: str, sql_text: str, *, multi: bool = True) -> dashboard_b.QueryVariable:
    """Values from a ClickHouse query. Multi-valued ones offer All: SQL filters on them are wrapped in the plugin's
    $__conditionalAll (All: no filter), and PromQL matches them with allValue `.+` (every series with the label)."""
    variable = (
        dashboard_b.QueryVariable(name)
        .label(label)
        .datasource(CLICKHOUSE)
        .query({"editorType": "sql", "rawSql": textwrap.dedent(sql_text).strip()})
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(multi)
    )
    return variable.all_value(".+") if multi else variable


def prom_variable(name: str, label: str, query: str) -> dashboard_b.QueryVariable:
    return (
        dashboard_b.QueryVariable(name)
        .label(label)
        .datasource(PROMETHEUS)
        .query(query)
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".+")
    )


def sql_in(column: str, variable: str) -> str:
    """A filter on a multi-valued variable that drops out when All is selected (or the variable has no values)."""
    return f"$__conditionalAll({column} IN (${{{variable}:singlequote}}), ${variable})"


def new_dashboard(uid: str, title: str, description: str) -> dashboard_b.Dashboard:
    return (
        dashboard_b.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .editable()
        .timezone("browser")
        .time("now-6h", "now")
        .refresh("1m")
        .tooltip(dashboard.DashboardCursorSync.CROSSHAIR)
        .link(
            dashboard_b.DashboardLink("evalsi dashboards")
            .type(dashboard.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .keep_time(True)
            .include_vars(False)
        )
    )


def row(title: str) -> dashboard_b.Row:
    return dashboard_b.Row(title).collapsed(False)


RATE = "[$__rate_interval]"


# --- pipeline health (Prometheus: the collector's own metrics) ------------------------------------------------------


def pipeline_health() -> dashboard_b.Dashboard:
    dropped_parts = [
        "otelcol_exporter_enqueue_failed_spans_total",
        "otelcol_exporter_send_failed_spans_total",
        "evalsi_tail_sampling_spans_lost_total",
    ]
    dropped = " + ".join(f"(sum(increase({m}[$__range])) or vector(0))" for m in dropped_parts)
    store_state = [
        dashboard.ValueMap(
            options={
                "0": dashboard.ValueMappingResult(text="available", color="green"),
                "1": dashboard.ValueMappingResult(text="refusing writes", color="red"),
            },
        )
    ]
    return (
        new_dashboard(
            "evalsi-pipeline-health",
            "evalsi · pipeline health",
            "The collector's own metrics (service.telemetry.metrics): what the receivers took and refused, what was "
            "dropped, what waits in queues and buffers, evictions, redaction, pipeline workers and the store.",
        )
        .with_row(row("Ingest"))
        .with_panel(
            single(
                "Spans accepted /s",
                "Spans the OTLP receivers pushed into the pipelines (otelcol_receiver_accepted_spans_total).",
                prom(f"sum(rate(otelcol_receiver_accepted_spans_total{RATE}))"),
                unit="cps",
                span=6,
            )
        )
        .with_panel(
            single(
                "Spans refused /s",
                "Spans answered with an error (invalid, or refused by a full or unavailable pipeline: the sender "
                "keeps them and retries). otelcol_receiver_refused_spans_total.",
                prom(f"sum(rate(otelcol_receiver_refused_spans_total{RATE}))"),
                unit="cps",
                span=6,
                bad_above=0,
            )
        )
        .with_panel(
            single(
                "Spans dropped or lost in the range",
                "Accepted spans that were not stored: an exporter queue full (otelcol_exporter_enqueue_failed_spans), "
                "an exporter that gave up (otelcol_exporter_send_failed_spans), spans tail sampling could not hand on "
                "(evalsi_tail_sampling_spans_lost).",
                prom(dropped, instant=True),
                span=6,
                bad_above=0,
            )
        )
        .with_panel(
            single(
                "Store",
                "evalsi_exporter_store_unavailable: 1 while the store refuses writes for its availability (disk full, "
                "server down); the exporter's queue holds what was accepted meanwhile.",
                prom("max(evalsi_exporter_store_unavailable)"),
                span=6,
                bad_above=1,
                mappings=store_state,
            )
        )
        .with_panel(
            ts(
                "Spans accepted and refused /s",
                "By receiver and transport (grpc, http).",
                [
                    prom(
                        f"sum by (receiver, transport) (rate(otelcol_receiver_accepted_spans_total{RATE}))",
                        "accepted {{receiver}} {{transport}}",
                    ),
                    prom(
                        f"sum by (receiver, transport) (rate(otelcol_receiver_refused_spans_total{RATE}))",
                        "refused {{receiver}} {{transport}}",
                    ),
                ],
                unit="cps",
            )
        )
        .with_panel(
            ts(
                "Log records accepted, refused and stored /s",
                "GenAI content often arrives as log records, joined to their spans by normalize; stored: "
                "otelcol_exporter_sent_log_records_total.",
                [
                    prom(
                        f"sum by (receiver, transport) (rate(otelcol_receiver_accepted_log_records_total{RATE}))",
                        "accepted {{receiver}} {{transport}}",
                    ),
                    prom(
                        f"sum by (receiver, transport) (rate(otelcol_receiver_refused_log_records_total{RATE}))",
                        "refused {{receiver}} {{transport}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_sent_log_records_total{RATE}))",
                        "stored by {{exporter}}",
                    ),
                ],
                unit="cps",
            )
        )
        .with_panel(
            ts(
                "Spans stored and sampled /s",
                "Spans the exporters sent (otelcol_exporter_sent_spans_total), and the sampling decisions: "
                "not_sampled spans of tail sampling are evaluated but not stored; the probabilistic sampler's are "
                "dropped.",
                [
                    prom(f"sum by (exporter) (rate(otelcol_exporter_sent_spans_total{RATE}))", "sent by {{exporter}}"),
                    prom(
                        f"sum by (processor, decision) (rate(evalsi_tail_sampling_spans_total{RATE}))",
                        "{{processor}} {{decision}}",
                    ),
                    prom(
                        f"sum by (processor, decision) (rate(evalsi_sampler_spans_total{RATE}))",
                        "{{processor}} {{decision}}",
                    ),
                ],
                unit="cps",
            )
        )
        .with_panel(
            ts(
                "Spans dropped or lost /s",
                "Queue full (enqueue_failed), given up after retries (send_failed), refused by the store for their "
                "data (evalsi_exporter_items_refused, the rest of their batch went on), lost by tail sampling.",
                [
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_enqueue_failed_spans_total{RATE}))",
                        "queue full {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_send_failed_spans_total{RATE}))",
                        "gave up {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter, kind, reason) (rate(evalsi_exporter_items_refused_total{RATE}))",
                        "refused {{exporter}} {{kind}} {{reason}}",
                    ),
                    prom(
                        f"sum by (processor) (rate(evalsi_tail_sampling_spans_lost_total{RATE}))",
                        "lost in {{processor}}",
                    ),
                ],
                unit="cps",
            )
        )
        .with_row(row("Queues and buffers"))
        .with_panel(
            ts(
                "Exporter queue fill",
                "otelcol_exporter_queue_size / otelcol_exporter_queue_capacity: a store exporter refuses (429/503) "
                "when full, a score exporter drops its oldest.",
                [
                    prom(
                        "sum by (exporter) (otelcol_exporter_queue_size) "
                        "/ sum by (exporter) (otelcol_exporter_queue_capacity)",
                        "{{exporter}}",
                    )
                ],
                unit="percentunit",
                min_val=0,
                max_val=1,
                span=8,
            )
        )
        .with_panel(
            ts(
                "Held by processors",
                "Traces tail sampling buffers undecided, decided spans waiting for the next consumer, traces waiting "
                "for evaluation, open sessions, completed traces kept for late feedback.",
                [
                    prom("sum by (processor) (evalsi_tail_sampling_traces_buffered)", "traces buffered {{processor}}"),
                    prom(
                        "sum by (processor) (evalsi_tail_sampling_outbox_spans)",
                        "spans waiting {{processor}}",
                    ),
                    prom(
                        "sum by (processor) (evalsi_evaluate_queue_size)",
                        "traces waiting for {{processor}}",
                    ),
                    prom("sum by (processor) (evalsi_tail_sampling_sessions_open)", "sessions open"),
                    prom(
                        "sum by (processor) (evalsi_late_signals_buffered_traces)",
                        "traces kept for late feedback",
                    ),
                ],
                span=8,
            )
        )
        .with_panel(
            ts(
                "Tail sampling buffer",
                "Estimated bytes of buffered spans (evalsi_tail_sampling_buffered_bytes).",
                [prom("sum by (processor) (evalsi_tail_sampling_buffered_bytes)", "{{processor}}")],
                unit="bytes",
                span=8,
            )
        )
        .with_row(row("Evictions, shedding and redaction"))
        .with_panel(
            ts(
                "Evicted /s",
                "Traces and sessions handed on before they were complete because a buffer limit was reached.",
                [
                    prom(
                        f"sum by (processor, reason) (rate(evalsi_traces_evicted_total{RATE}))",
                        "traces {{reason}}",
                    ),
                    prom(
                        f"sum by (processor, reason) (rate(evalsi_sessions_evicted_total{RATE}))",
                        "sessions {{reason}}",
                    ),
                ],
                unit="cps",
                span=8,
            )
        )
        .with_panel(
            ts(
                "Traces completed and evaluated /s",
                "Traces tail sampling completed, by why: quiet (decision_wait passed), max_trace_duration, evicted, "
                "shutdown; traces the evaluate processor looked at, left out (overload: shed), or whose scores no "
                "pipeline took.",
                [
                    prom(
                        f"sum by (reason) (rate(evalsi_tail_sampling_traces_completed_total{RATE}))",
                        "completed {{reason}}",
                    ),
                    prom(
                        f"sum by (processor) (rate(evalsi_evaluate_traces_total{RATE}))", "evaluated by {{processor}}"
                    ),
                    prom(
                        f"sum by (processor) (rate(evalsi_evaluate_traces_shed_total{RATE}))",
                        "shed by {{processor}}",
                    ),
                    prom(
                        f"sum by (processor) (rate(evalsi_evaluate_scores_dropped_total{RATE}))",
                        "scores dropped by {{processor}}",
                    ),
                ],
                unit="cps",
                span=8,
            )
        )
        .with_panel(
            ts(
                "Redaction /s",
                "Values masked per rule, attributes removed (not in allowed_keys), and failures by what on_error did.",
                [
                    prom(f"sum by (rule) (rate(evalsi_redaction_masked_total{RATE}))", "masked {{rule}}"),
                    prom(
                        f"sum by (processor) (rate(evalsi_redaction_removed_total{RATE}))",
                        "removed by {{processor}}",
                    ),
                    prom(
                        f"sum by (signal, action) (rate(evalsi_redaction_failures_total{RATE}))",
                        "failed {{signal}}: {{action}}",
                    ),
                ],
                unit="cps",
                span=8,
            )
        )
        .with_row(row("Pipeline workers (service.workers)"))
        .with_panel(
            single(
                "Worker restarts in the range",
                "Pipeline worker processes restarted after they died (evalsi_worker_restarts_total).",
                prom("sum(increase(evalsi_worker_restarts_total[$__range])) or vector(0)", instant=True),
                span=6,
                bad_above=1,
            )
        )
        .with_panel(
            single(
                "Requests lost with a worker",
                "Accepted requests a worker died holding (evalsi_worker_lost_requests_total), in the range.",
                prom("sum(increase(evalsi_worker_lost_requests_total[$__range])) or vector(0)", instant=True),
                span=6,
                bad_above=1,
            )
        )
        .with_panel(
            ts(
                "Spans decoded per worker /s",
                "How evenly the traces spread over the workers (evalsi_worker_spans_total); empty in one process.",
                [prom(f"sum by (worker) (rate(evalsi_worker_spans_total{RATE}))", "worker {{worker}}")],
                unit="cps",
            )
        )
        .with_row(row("Exporters and the store"))
        .with_panel(
            ts(
                "Store unavailable and write retries",
                "1 while the store refuses writes (evalsi_exporter_store_unavailable), and the writes retried, by "
                "reason (e.g. NOT_ENOUGH_SPACE).",
                [
                    prom("max by (exporter) (evalsi_exporter_store_unavailable)", "unavailable {{exporter}}"),
                    prom(
                        f"sum by (exporter, reason) (rate(evalsi_exporter_write_retries_total{RATE}))",
                        "retries {{exporter}} {{reason}}",
                    ),
                ],
                span=8,
            )
        )
        .with_panel(
            ts(
                "Export failures /s",
                "Items exporters gave up on, scores dropped from a full queue, and unexpected errors of senders and "
                "background tasks (each logged, the task restarted).",
                [
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_send_failed_log_records_total{RATE}))",
                        "log records {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_send_failed_scores_total{RATE}))",
                        "scores {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(evalsi_exporter_send_failed_scores_total{RATE}))",
                        "scores {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_enqueue_failed_scores_total{RATE}))",
                        "scores, queue full {{exporter}}",
                    ),
                    prom(
                        f"sum by (exporter) (rate(evalsi_exporter_sender_errors_total{RATE}))",
                        "sender errors {{exporter}}",
                    ),
                    prom(f"sum by (task) (rate(evalsi_task_failures_total{RATE}))", "task {{task}}"),
                ],
                unit="cps",
                span=8,
            )
        )
        .with_panel(
            ts(
                "Scores written /s",
                "Scores each exporter delivered (evalsi_exporter_sent_scores_total: clickhouse, prometheus; "
                "otelcol_exporter_sent_scores_total: exporters that send to a backend).",
                [
                    prom(f"sum by (exporter) (rate(evalsi_exporter_sent_scores_total{RATE}))", "{{exporter}}"),
                    prom(
                        f"sum by (exporter) (rate(otelcol_exporter_sent_scores_total{RATE}))",
                        "{{exporter}}",
                    ),
                ],
                unit="cps",
                span=8,
            )
        )
    )


# --- online quality (evalsi_scores and the prometheus exporter) ------------------------------------------------------

ONLINE = "RunId = ''"  # scores of online policies and feedback; offline runs have their own dashboard
POLICY_VARIABLE = ch_variable(
    "policy",
    "Policy",
    f"SELECT DISTINCT Policy FROM evalsi_scores WHERE $__timeFilter(Timestamp) AND {ONLINE} ORDER BY Policy",
    multi=False,
)
EVALUATOR_VARIABLE = ch_variable(
    "evaluator",
    "Evaluator",
    f"""
    SELECT DISTINCT Evaluator FROM evalsi_scores
    WHERE $__timeFilter(Timestamp) AND {ONLINE} AND Policy = ${{policy:singlequote}}
    ORDER BY Evaluator""",
)
NAME_VARIABLE = ch_variable(
    "name",
    "Score",
    f"""
    SELECT DISTINCT Name FROM evalsi_scores
    WHERE $__timeFilter(Timestamp) AND {ONLINE} AND Policy = ${{policy:singlequote}}
        AND {sql_in("Evaluator", "evaluator")}
    ORDER BY Name""",
)
SCORE_LABELS = 'policy="$policy", evaluator=~"$evaluator", name=~"$name"'


def mean_band_sql(side: str) -> str:
    """SQL for one bound of a mean's 95% interval within what the values can be, as `intervals.mean_interval`:
    Wilson when every value is 0 or 1, Student t clamped to [0, 1] when all lie in [0, 1], log-t (mean times or
    divided by exp(t·sd/(mean·√n))) when none is negative, plain t otherwise. Reads nv, vmean, sd, vmin, vmax,
    nbinary and t."""
    sign = "-" if side == "lower" else "+"
    plain = f"vmean {sign} t * sd / sqrt(nv)"
    clamped = f"greatest(0, {plain})" if side == "lower" else f"least(1, {plain})"
    log_t = f"if(vmean <= 0, 0, vmean * exp({sign}least(700, t * sd / (vmean * sqrt(nv)))))"
    wilson = wilson_sql("round(vmean * nv)", "nv", side)
    return (
        f"if(nv < 2, NULL, if(vmin >= 0 AND vmax <= 1, if(nbinary >= nv, {wilson}, {clamped}), "
        f"if(vmin >= 0, {log_t}, {plain})))"
    )


SCORE_BAND_SQL = f"""
    SELECT
        time,
        if(nv > 0, vmean, p) AS mean,
        if(nv > 0, {mean_band_sql("lower")}, wl) AS lower,
        if(nv > 0, {mean_band_sql("upper")}, wu) AS upper,
        if(nv > 0, nv, np) AS n
    FROM (
        SELECT
            time, nv, vmean, sd, vmin, vmax, nbinary, np,
            {t975_sql("(nv - 1)")} AS t,
            if(np > 0, passes / np, NULL) AS p,
            if(np > 0, {wilson_sql("passes", "np", "lower")}, NULL) AS wl,
            if(np > 0, {wilson_sql("passes", "np", "upper")}, NULL) AS wu
        FROM (
            SELECT
                $__timeInterval(Timestamp) AS time,
                count(Value) AS nv, avg(Value) AS vmean, stddevSamp(Value) AS sd,
                min(Value) AS vmin, max(Value) AS vmax, countIf(Value = 0 OR Value = 1) AS nbinary,
                count(Passed) AS np, countIf(Passed) AS passes
            FROM evalsi_scores FINAL
            WHERE $__timeFilter(Timestamp) AND {ONLINE} AND Outcome = 'scored'
                AND Policy = ${{policy:singlequote}} AND Name IN (${{name:singlequote}})
                AND {sql_in("Evaluator", "evaluator")}
            GROUP BY time
        )
    )
    ORDER BY time"""

PASS_RATES_SQL = f"""
    SELECT
        Evaluator AS evaluator, Name AS score, count(Passed) AS verdicts, countIf(Passed) AS passed,
        passed / verdicts AS pass_rate,
        {wilson_sql("passed", "verdicts", "lower")} AS lower,
        {wilson_sql("passed", "verdicts", "upper")} AS upper
    FROM evalsi_scores FINAL
    WHERE $__timeFilter(Timestamp) AND {ONLINE} AND Outcome = 'scored' AND Passed IS NOT NULL
        AND Policy = ${{policy:singlequote}} AND {sql_in("Evaluator", "evaluator")} AND {sql_in("Name", "name")}
    GROUP BY Evaluator, Name
    ORDER BY pass_rate, verdicts DESC"""

FRESHNESS_SQL = f"""
    SELECT
        $__timeInterval(s.Timestamp) AS time,
        quantile(0.5)(dateDiff('millisecond', t.end, s.Timestamp) / 1000) AS p50,
        quantile(0.95)(dateDiff('millisecond', t.end, s.Timestamp) / 1000) AS p95
    FROM (
        SELECT TraceId, Timestamp FROM evalsi_scores FINAL
        WHERE $__timeFilter(Timestamp) AND {ONLINE} AND TraceId != '' AND Policy = ${{policy:singlequote}}
            AND {sql_in("Evaluator", "evaluator")} AND {sql_in("Name", "name")}
    ) AS s
    INNER JOIN (
        SELECT TraceId, max(End) AS end FROM otel_traces_trace_id_ts
        WHERE Start >= $__fromTime - INTERVAL 1 DAY AND Start <= $__toTime
        GROUP BY TraceId
    ) AS t ON t.TraceId = s.TraceId
    GROUP BY time
    ORDER BY time"""

LAST_SCORE_SQL = f"""
    SELECT Evaluator AS evaluator, Name AS score, max(Timestamp) AS last_scored,
        dateDiff('second', max(Timestamp), now64(9)) AS age_s, count() AS scores
    FROM evalsi_scores FINAL
    WHERE $__timeFilter(Timestamp) AND {ONLINE} AND Policy = ${{policy:singlequote}}
        AND {sql_in("Evaluator", "evaluator")} AND {sql_in("Name", "name")}
    GROUP BY Evaluator, Name
    ORDER BY age_s DESC"""


def window_table() -> table.Panel:
    labels = 'policy!~"run:.*"'
    fields = [("n", "evalsi_policy_window_n"), ("mean", "evalsi_policy_window_mean")]
    fields += [("lower", "evalsi_policy_window_lower"), ("upper", "evalsi_policy_window_upper")]
    targets = [promql_table(f"max by (policy, evaluator, name) ({metric}{{{labels}}})") for _, metric in fields]
    organize = dashboard.DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True},
            "renameByName": {f"Value #{chr(ord('A') + i)}": field for i, (field, _) in enumerate(fields)},
            "indexByName": {"policy": 0, "evaluator": 1, "name": 2},
        },
    )
    return (
        grid(
            "Current window, every policy",
            "The prometheus exporter's tumbling window (its `window`, 5m by default) for every (policy, evaluator, "
            "score): n scored outcomes, the mean value (or the pass rate for pass/fail scores) and its 95% interval "
            "(for values within their bounds, as the policy windows: Wilson for 0/1 values, Student t clamped to "
            "[0, 1] for rates, log-t for non-negative measures, t otherwise; Wilson for pass rates). A window that "
            "closed shows n = 0 until the next score.",
            targets,
            ds=PROMETHEUS,
            height=8,
        )
        .with_transformation(dashboard.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(organize)
        .override_by_name("mean", [dashboard.DynamicConfigValue("decimals", 3)])
        .override_by_name("lower", [dashboard.DynamicConfigValue("decimals", 3)])
        .override_by_name("upper", [dashboard.DynamicConfigValue("decimals", 3)])
    )


def online_quality() -> dashboard_b.Dashboard:
    pass_rate = (
        f"sum by (name) (increase(evalsi_score_passed_total{{{SCORE_LABELS}}}{RATE})) / ("
        f"sum by (name) (increase(evalsi_score_passed_total{{{SCORE_LABELS}}}{RATE})) + "
        f"sum by (name) (increase(evalsi_score_failed_total{{{SCORE_LABELS}}}{RATE})))"
    )
    freshness = "histogram_quantile({q}, sum by (le) (rate(evalsi_evaluate_freshness_seconds_bucket" + RATE + ")))"
    quantile = (
        "histogram_quantile({q}, sum by (le) (rate(evalsi_score_value_bucket{{" + SCORE_LABELS + "}}" + RATE + ")))"
    )
    return (
        new_dashboard(
            "evalsi-online-quality",
            "evalsi · online quality",
            "What the online policies score: each score's mean and 95% interval over time (from the store) and in "
            "the current window (from the prometheus exporter), pass rates, outcomes and how fresh the scores are.",
        )
        .variables([POLICY_VARIABLE, EVALUATOR_VARIABLE, NAME_VARIABLE])
        .with_row(row("Overview"))
        .with_panel(window_table())
        .with_row(row("Policy $policy: each score's mean and 95% interval"))
        .with_panel(
            band(
                ts(
                    "$name over time",
                    "From evalsi_scores, per interval (at least 5m): the mean value with its interval within the "
                    "values' bounds (Wilson for 0/1 values, Student t clamped to [0, 1] for rates, log-t for "
                    "non-negative measures, t otherwise), or for pass/fail scores the pass rate with its Wilson "
                    "interval, the same statistics as the policy windows; n (right axis) is the scored outcomes.",
                    [Sql(SCORE_BAND_SQL, series=True)],
                    ds=CLICKHOUSE,
                    points=True,
                    span=8,
                )
                .interval("5m")
                .repeat("name")
                .repeat_direction("v")
            )
        )
        .with_panel(
            band(
                ts(
                    "$name in the current window",
                    "evalsi_policy_window_mean with evalsi_policy_window_lower/_upper and _n: the prometheus "
                    "exporter's current tumbling window, reset when it closes.",
                    [
                        prom(f"max(evalsi_policy_window_mean{{{SCORE_LABELS}}})", "mean"),
                        prom(f"max(evalsi_policy_window_lower{{{SCORE_LABELS}}})", "lower"),
                        prom(f"max(evalsi_policy_window_upper{{{SCORE_LABELS}}})", "upper"),
                        prom(f"sum(evalsi_policy_window_n{{{SCORE_LABELS}}})", "n"),
                    ],
                    span=8,
                )
                .repeat("name")
                .repeat_direction("v")
            )
        )
        .with_panel(
            ts(
                "$name values: median and p90, each dot a trace",
                "From the prometheus exporter's histogram evalsi_score_value (scores with a value; pass/fail-only "
                "scores have none). Its exemplars are drawn as dots: each is one scored trace, and its Open the trace "
                "link (the Prometheus data source's exemplar setting) opens it in the trace view.",
                [
                    prom(quantile.format(q="0.5"), "median").exemplar(True),
                    prom(quantile.format(q="0.9"), "p90"),
                ],
                span=8,
            )
            .repeat("name")
            .repeat_direction("v")
        )
        .with_row(row("Policy $policy: pass rates and outcomes"))
        .with_panel(
            grid(
                "Pass rates in the range",
                "Scored outcomes with a verdict, from evalsi_scores: the pass rate and its 95% Wilson interval; the "
                "lowest first.",
                [Sql(PASS_RATES_SQL)],
                span=12,
                height=8,
            )
            .override_by_name("pass_rate", [dashboard.DynamicConfigValue("unit", "percentunit")])
            .override_by_name("lower", [dashboard.DynamicConfigValue("unit", "percentunit")])
            .override_by_name("upper", [dashboard.DynamicConfigValue("unit", "percentunit")])
        )
        .with_panel(
            ts(
                "Pass rate over time",
                "From the prometheus exporter's counters (evalsi_score_passed_total, evalsi_score_failed_total), "
                "which survive the window's reset.",
                [prom(pass_rate, "{{name}}")],
                unit="percentunit",
                min_val=0,
                max_val=1,
            )
        )
        .with_panel(
            ts(
                "Scores /s by outcome",
                "evalsi_scores_total: scored, skipped (e.g. no content, budget exhausted) and error (an evaluator or "
                "a judge that failed).",
                [
                    prom(
                        f"sum by (name, outcome) (rate(evalsi_scores_total{{{SCORE_LABELS}}}{RATE}))",
                        "{{name}} {{outcome}}",
                    )
                ],
                unit="cps",
            )
        )
        .with_panel(
            ts(
                "Failures /s",
                "evalsi_score_failed_total: scored outcomes that failed their check.",
                [
                    prom(
                        f"sum by (name) (rate(evalsi_score_failed_total{{{SCORE_LABELS}}}{RATE}))",
                        "{{name}}",
                    )
                ],
                unit="cps",
            )
        )
        .with_panel(
            ts(
                "Alerts fired",
                "evalsi_alerts_fired_total: a policy's alert (spec.alerts) fires once per window in which its "
                "condition holds, over every worker's traces; the log line `alert fired` and the alert's webhook "
                "carry the window's aggregates.",
                [
                    prom(
                        'sum by (policy, alert) (increase(evalsi_alerts_fired_total{policy=~"$policy"}' + RATE + "))",
                        "{{policy}} {{alert}}",
                    )
                ],
                unit="short",
            )
        )
        .with_row(row("Freshness"))
        .with_panel(
            ts(
                "From trace completion to scores (collector)",
                "evalsi_evaluate_freshness_seconds: from tail sampling's decision on a trace to its scores handed to "
                "the scores pipeline, every policy; and the time to evaluate one trace (evalsi_evaluate_seconds).",
                [
                    prom(freshness.format(q="0.5"), "freshness p50"),
                    prom(freshness.format(q="0.95"), "freshness p95"),
                    prom(
                        "histogram_quantile(0.95, sum by (le) (rate(evalsi_evaluate_seconds_bucket" + RATE + ")))",
                        "evaluation p95",
                    ),
                ],
                unit="s",
                span=8,
            )
        )
        .with_panel(
            ts(
                "From a trace's last span to its score (store)",
                "Seconds from the trace's end (otel_traces_trace_id_ts) to each score's timestamp, per interval: "
                "decision_wait, the evaluation queue and the judges.",
                [Sql(FRESHNESS_SQL, series=True)],
                ds=CLICKHOUSE,
                unit="s",
                span=8,
            ).interval("1m")
        )
        .with_panel(
            grid(
                "Last score",
                "When each score of the policy was last written, and how long ago: a score that stopped arriving "
                "(its selector no longer matches, its traces stopped) ages here.",
                [Sql(LAST_SCORE_SQL)],
                span=8,
                height=8,
            ).override_by_name("age_s", [dashboard.DynamicConfigValue("unit", "s")])
        )
    )


# --- judge spend -------------------------------------------------------------------------------------------------

JUDGE_LABELS = 'policy=~"$policy", evaluator=~"$evaluator"'
JUDGE_STORE_SQL = f"""
    SELECT
        Policy AS policy, Evaluator AS evaluator, Name AS score,
        countIf(Outcome = 'scored') AS judgments,
        countIf(JSONExtractBool(Metadata, 'cached')) AS cache_hits,
        countIf(Reason = 'budget exhausted') AS budget_exhausted,
        countIf(Outcome = 'error') AS errors,
        sum(JSONExtractUInt(Metadata, 'input_tokens') + JSONExtractUInt(Metadata, 'output_tokens')) AS tokens,
        sum(ifNull(JudgeCostUsd, 0)) AS usd
    FROM evalsi_scores FINAL
    WHERE $__timeFilter(Timestamp) AND Source = 'llm_judge'
        AND {sql_in("Policy", "policy")} AND {sql_in("Evaluator", "evaluator")}
    GROUP BY Policy, Evaluator, Name
    ORDER BY usd DESC, judgments DESC"""
JUDGE_STORE_SERIES_SQL = f"""
    SELECT
        $__timeInterval(Timestamp) AS time,
        sumIf(ifNull(JudgeCostUsd, 0), RunId = '') AS online,
        sumIf(ifNull(JudgeCostUsd, 0), RunId != '') AS offline_runs
    FROM evalsi_scores FINAL
    WHERE $__timeFilter(Timestamp) AND Source = 'llm_judge'
        AND {sql_in("Policy", "policy")} AND {sql_in("Evaluator", "evaluator")}
    GROUP BY time
    ORDER BY time"""


def judge_spend() -> dashboard_b.Dashboard:
    calls = 'sum(increase(evalsi_judge_calls_total{result!="retry"}[$__range]))'
    hits = "sum(increase(evalsi_judge_cache_hits_total[$__range]))"
    return (
        new_dashboard(
            "evalsi-judge-spend",
            "evalsi · judge spend",
            "What LLM judges cost: tokens and USD by policy and evaluator (prometheus exporter), calls, cache hits "
            "and budgets by judge and model (the collector's own metrics), and the judged scores in the store.",
        )
        .variables(
            [
                prom_variable("policy", "Policy", "label_values(evalsi_judge_tokens_total, policy)"),
                prom_variable(
                    "evaluator", "Evaluator", 'label_values(evalsi_judge_tokens_total{policy=~"$policy"}, evaluator)'
                ),
            ]
        )
        .with_row(row("In the time range"))
        .with_panel(
            single(
                "USD",
                "evalsi_judge_cost_usd_total: the judges' price times their tokens (cache hits cost nothing).",
                prom(f"sum(increase(evalsi_judge_cost_usd_total{{{JUDGE_LABELS}}}[$__range]))", instant=True),
                unit="currencyUSD",
                span=6,
            )
        )
        .with_panel(
            single(
                "Tokens",
                "evalsi_judge_tokens_total: input + output tokens of judge calls.",
                prom(f"sum(increase(evalsi_judge_tokens_total{{{JUDGE_LABELS}}}[$__range]))", instant=True),
                span=6,
            )
        )
        .with_panel(
            single(
                "Skipped: budget spent",
                "evalsi_judge_budget_exhausted_total: judgments skipped because a judge budget (max_calls, "
                "max_tokens, max_usd per window) was spent.",
                prom(f"sum(increase(evalsi_judge_budget_exhausted_total{{{JUDGE_LABELS}}}[$__range]))", instant=True),
                span=6,
                bad_above=1,
            )
        )
        .with_panel(
            single(
                "Cache hit ratio",
                "Judgments answered from the content-hash cache, of all judgments (cache hits + calls that got an "
                "answer or gave up), every judge: evalsi_judge_cache_hits_total, evalsi_judge_calls_total.",
                prom(f"{hits} / ({hits} + {calls})", instant=True),
                unit="percentunit",
                span=6,
            )
        )
        .with_row(row("By policy and evaluator"))
        .with_panel(
            ts(
                "USD per hour",
                "evalsi_judge_cost_usd_total, as a rate per hour.",
                [
                    prom(
                        f"sum by (policy, evaluator) (rate(evalsi_judge_cost_usd_total{{{JUDGE_LABELS}}}{RATE}))"
                        " * 3600",
                        "{{policy}} {{evaluator}}",
                    )
                ],
                unit="currencyUSD",
                span=8,
            )
        )
        .with_panel(
            ts(
                "Tokens /s",
                "evalsi_judge_tokens_total.",
                [
                    prom(
                        f"sum by (policy, evaluator) (rate(evalsi_judge_tokens_total{{{JUDGE_LABELS}}}{RATE}))",
                        "{{policy}} {{evaluator}}",
                    )
                ],
                span=8,
            )
        )
        .with_panel(
            ts(
                "Budget exhausted /s",
                "evalsi_judge_budget_exhausted_total: each is a score skipped with reason `budget exhausted`.",
                [
                    prom(
                        f"sum by (policy, evaluator) "
                        f"(rate(evalsi_judge_budget_exhausted_total{{{JUDGE_LABELS}}}{RATE}))",
                        "{{policy}} {{evaluator}}",
                    )
                ],
                unit="cps",
                span=8,
            )
        )
        .with_row(row("By judge and model (every policy)"))
        .with_panel(
            ts(
                "Judge calls /s by result",
                "evalsi_judge_calls_total: ok, retry (a 5xx, 429 or timeout that was retried), unavailable (retries "
                "ran out), error (another 4xx).",
                [
                    prom(
                        f"sum by (judge, model, result) (rate(evalsi_judge_calls_total{RATE}))",
                        "{{judge}} {{model}} {{result}}",
                    )
                ],
                unit="cps",
                span=8,
            )
        )
        .with_panel(
            ts(
                "Cache hits /s",
                "evalsi_judge_cache_hits_total: the same judgment (template, model, content) answered from the cache.",
                [prom(f"sum by (judge, model) (rate(evalsi_judge_cache_hits_total{RATE}))", "{{judge}} {{model}}")],
                unit="cps",
                span=8,
            )
        )
        .with_panel(
            ts(
                "USD per hour and budget exhaustion by model",
                "The collector's own evalsi_judge_cost_usd_total and evalsi_judge_budget_exhausted_total, labelled "
                "by judge and model.",
                [
                    prom(
                        f'sum by (judge, model) (rate(evalsi_judge_cost_usd_total{{judge!=""}}{RATE})) * 3600',
                        "USD/h {{judge}} {{model}}",
                    ),
                    prom(
                        f'sum by (judge, model) (rate(evalsi_judge_budget_exhausted_total{{judge!=""}}{RATE}))',
                        "budget exhausted /s {{judge}} {{model}}",
                    ),
                ],
                span=8,
            )
        )
        .with_row(row("From the store"))
        .with_panel(
            grid(
                "Judged scores in the range",
                "evalsi_scores with source llm_judge, online and in offline runs: judgments, cache hits, budget "
                "skips, errors, tokens and USD per policy, evaluator and score.",
                [Sql(JUDGE_STORE_SQL)],
                span=16,
                height=8,
            ).override_by_name("usd", [dashboard.DynamicConfigValue("unit", "currencyUSD")])
        )
        .with_panel(
            ts(
                "USD per interval (store)",
                "Judge cost recorded on the scores (JudgeCostUsd), online policies and offline runs apart.",
                [Sql(JUDGE_STORE_SERIES_SQL, series=True)],
                ds=CLICKHOUSE,
                unit="currencyUSD",
                span=8,
                bars=True,
            ).interval("5m")
        )
    )


# --- offline runs (evalsi_runs) -------------------------------------------------------------------------------------

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


# --- the worst recent traces -------------------------------------------------------------------------------------

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


# --- writing -------------------------------------------------------------------------------------------------------

DASHBOARDS: dict[str, Callable[[], dashboard_b.Dashboard]] = {
    "pipeline-health.json": pipeline_health,
    "online-quality.json": online_quality,
    "judge-spend.json": judge_spend,
    "offline-runs.json": offline_runs,
    "worst-traces.json": worst_traces,
}


def build(builder: dashboard_b.Dashboard) -> dashboard.Dashboard:
    """The dashboard with every panel numbered (Grafana needs unique ids to repeat panels and to link to them)."""
    built = builder.build()
    next_id = 1
    for panel in built.panels or []:
        panel.id_val = next_id
        next_id += 1
        for inner in getattr(panel, "panels", None) or []:
            inner.id_val = next_id
            next_id += 1
    return built


def render(builder: dashboard_b.Dashboard) -> str:
    return json.dumps(build(builder), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


def rendered() -> dict[str, str]:
    return {name: render(make()) for name, make in DASHBOARDS.items()}


def stale(folder: Path) -> list[str]:
    """The dashboards in `folder` that differ from what this script builds, missing ones included."""
    return [n for n, text in rendered().items() if not (folder / n).is_file() or (folder / n).read_text() != text]


def strays(folder: Path) -> list[str]:
    """JSON files in `folder` that this script does not build (Grafana would load them too)."""
    return sorted(p.name for p in folder.glob("*.json") if p.name not in DASHBOARDS)


def write(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered().items():
        path = folder / name
        path.write_text(text)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    parser.add_argument("--dir", type=Path, default=OUT, help=f"where the JSON files are (default: {OUT})")
    args = parser.parse_args(argv)
    if args.check:
        found, extra = stale(args.dir), strays(args.dir)
        if found:
            print(
                f"stale dashboards in {args.dir}: {', '.join(found)}; run `python deploy/grafana/dashboards.py`",
                file=sys.stderr,
            )
        if extra:
            print(
                f"{args.dir} has dashboards this script does not build: {', '.join(extra)}; build them in "
                "deploy/grafana/dashboards.py (DASHBOARDS), or remove them",
                file=sys.stderr,
            )
        if found or extra:
            return 1
        print(f"{len(DASHBOARDS)} dashboards in {args.dir} are up to date")
        return 0
    for path in write(args.dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
