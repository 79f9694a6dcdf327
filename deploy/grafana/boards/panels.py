"""The panel builders the dashboards share: time series, stats, tables, interval bands, template variables, a
dashboard's frame, and PromQL queries against the Prometheus data source."""

from __future__ import annotations

import textwrap
from typing import Any

from grafana_foundation_sdk.builders import (
    common as common_b,
    dashboard as dashboard_b,
    prometheus as prometheus_b,
    stat,
    table,
    timeseries,
)
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common, dashboard
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from boards.sql import CLICKHOUSE

PROMETHEUS = dashboard.DataSourceRef(type_val="prometheus", uid="evalsi-prometheus")
TAG = "evalsi"


def prom(expr: str, legend: str = "__auto", *, instant: bool = False) -> prometheus_b.Dataquery:
    """A PromQL query; panels name their queries A, B, C... in order."""
    query = prometheus_b.Dataquery().expr(expr).legend_format(legend).ref_id("A").datasource(PROMETHEUS)
    return query.instant() if instant else query.range()


def promql_table(expr: str) -> prometheus_b.Dataquery:
    return prom(expr, instant=True).format(PromQueryFormat.TABLE)


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
