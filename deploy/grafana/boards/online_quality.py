"""The online quality dashboard (evalsi_scores and the prometheus exporter): each policy's scores over time with
their intervals, pass rates and outcomes, and freshness."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b, table
from grafana_foundation_sdk.models import dashboard

from boards.panels import PROMETHEUS, RATE, band, ch_variable, grid, new_dashboard, prom, promql_table, row, ts
from boards.sql import CLICKHOUSE, ONLINE, Sql, sql_in, t975_sql, wilson_sql

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


def metrics_table(title: str, description: str, by: str, fields: list[tuple[str, str]], labels: str) -> table.Panel:
    """One row per `by` labels, a column per (field, metric): gauges read at once and merged."""
    targets = [promql_table(f"max by ({by}) ({metric}{{{labels}}})") for _, metric in fields]
    organize = dashboard.DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True},
            "renameByName": {f"Value #{chr(ord('A') + i)}": field for i, (field, _) in enumerate(fields)},
            "indexByName": {label.strip(): i for i, label in enumerate(by.split(","))},
        },
    )
    panel = (
        grid(title, description, targets, ds=PROMETHEUS, height=8)
        .with_transformation(dashboard.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(organize)
    )
    for field, _ in fields:
        panel = panel.override_by_name(field, [dashboard.DynamicConfigValue("decimals", 3)])
    return panel


def regression_table() -> table.Panel:
    return metrics_table(
        "regressed(...): the window against its baseline",
        "For each `regressed(...)` alert of the policy (docs/policies.md): the score's mean (or pass rate) in the "
        "current window minus its baseline's (evalsi_policy_difference), the 95% interval of that difference "
        "(Newcombe for rates, Welch for means; a confidence sequence in an anytime window) and whether it lies "
        "wholly beyond the margin on the worse side (evalsi_policy_regressed, with the test that decided).",
        "policy, score, baseline",
        [
            ("difference", "evalsi_policy_difference"),
            ("low", "evalsi_policy_difference_low"),
            ("high", "evalsi_policy_difference_high"),
            ("regressed", "evalsi_policy_regressed"),
        ],
        'policy=~"$policy"',
    )


def calibration_table() -> table.Panel:
    return metrics_table(
        "Judges against people",
        "Where people's feedback and a judge's verdicts exist for the same traces (docs/policies.md, judges "
        "against people): Cohen's kappa and its 95% interval, the judge's sensitivity and specificity against "
        "people, the pass rate by prediction-powered inference with its interval, and how many traces both "
        "labeled. Read from the store every calibration.every.",
        "policy, evaluator, score, feedback",
        [
            ("kappa", "evalsi_judge_kappa"),
            ("kappa low", "evalsi_judge_kappa_low"),
            ("kappa high", "evalsi_judge_kappa_high"),
            ("sensitivity", "evalsi_judge_sensitivity"),
            ("specificity", "evalsi_judge_specificity"),
            ("rate (PPI)", "evalsi_judge_rate_ppi"),
            ("rate low", "evalsi_judge_rate_ppi_low"),
            ("rate high", "evalsi_judge_rate_ppi_high"),
            ("labeled", "evalsi_judge_labeled"),
        ],
        'policy=~"$policy"',
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
        .with_row(row("Policy $policy: against its baseline, and judges against people"))
        .with_panel(regression_table().span(12))
        .with_panel(calibration_table().span(12))
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
