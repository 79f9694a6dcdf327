"""The SQL the dashboards share: the ClickHouse data source's query type (the SDK has none for this plugin), filters
on template variables, the policy windows' intervals computed in SQL, and the trace view's query and link."""

from __future__ import annotations

import json
import textwrap
from typing import Any, Self
from urllib.parse import quote

from grafana_foundation_sdk.cog import builder as cogbuilder, runtime as cogruntime, variants as cogvariants
from grafana_foundation_sdk.models import dashboard

from evalsi.policies.intervals import t_quantile, z_quantile

CLICKHOUSE_TYPE = "grafana-clickhouse-datasource"
CLICKHOUSE = dashboard.DataSourceRef(type_val=CLICKHOUSE_TYPE, uid="evalsi-clickhouse")


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


def sql_in(column: str, variable: str) -> str:
    """A filter on a multi-valued variable that drops out when All is selected (or the variable has no values)."""
    return f"$__conditionalAll({column} IN (${{{variable}:singlequote}}), ${variable})"


# scores of online policies and feedback; offline runs have their own dashboard
ONLINE = "RunId = ''"


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
