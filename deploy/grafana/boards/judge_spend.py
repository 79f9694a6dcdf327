"""The judge spend dashboard: what LLM judges cost by policy and evaluator, calls, cache hits and budgets by judge and
model, and the judged scores in the store."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dashboard_b
from grafana_foundation_sdk.models import dashboard

from boards.panels import RATE, grid, new_dashboard, prom, prom_variable, row, single, ts
from boards.sql import CLICKHOUSE, Sql, sql_in

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
