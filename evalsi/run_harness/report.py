"""What a finished run shows: the summary table in the terminal, and the same as Markdown (`--report out.md`) with
the task x trial outcomes and the failing examples (expected against actual output, the evaluators' explanations)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from rich.console import Console
from rich.table import Table

from evalsi.run_harness.gates import gate_reading


def _num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if v and abs(v) < 0.01:
        return f"{v:.{digits}g}"  # a cost per call: 1.4e-05, not 0.000
    return f"{v:.{digits}f}" if abs(v) < 1000 else f"{v:,.0f}"


def _interval(m: dict[str, Any]) -> str:
    return "-" if m.get("low") is None else f"[{_num(m['low'])}, {_num(m['high'])}]"


def _k(m: dict[str, Any], key: str) -> str:
    values = m.get(key) or {}
    return " ".join(f"{k}:{_num(v, 2)}" for k, v in values.items()) or "-"


def metric_rows(run: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, m in run["metrics"].items():
        numeric = m["kind"] == "numeric"
        rows.append([
            name, m["kind"].replace("_", "/"), _num(m["n"]), _num(m["mean"]), _interval(m), _num(m.get("pass_rate")),
            _num(m.get("p50")) if numeric else "-", _num(m.get("p95")) if numeric else "-",
            _k(m, "pass_at_k"), _k(m, "pass_hat_k"), _num(m.get("errors", 0)), _num(m.get("skipped", 0)),
        ])  # fmt: skip
    return rows


HEADERS = [
    "metric", "kind", "n", "mean", "95% interval", "pass rate", "p50", "p95", "pass@k", "pass^k", "errors", "skipped"
]  # fmt: skip
"""`mean` averages the scores' values (an error rate for `tool-call-error-rate`), as online `mean(...)`; `pass rate`
is the share that passed, as online `rate(...)`; for a pass/fail metric they are the same."""


def gate_line(g: dict[str, Any]) -> str:
    """A gate's value and threshold, then why it could not be answered: `saw 0.3333, needs >= 0.9`."""
    saw, needs = gate_reading(g)
    parts = [f"saw {saw}" if saw else "", f"needs {needs}" if needs else "", g.get("detail") or ""]
    return "; ".join(p for p in parts if p)


def faults_text(faults: dict[str, int]) -> str:
    """Injected faults by kind: `12 (error 9, latency 3)`."""
    return f"{sum(faults.values())} (" + ", ".join(f"{k} {n}" for k, n in sorted(faults.items())) + ")"


def print_summary(console: Console, run: dict[str, Any]) -> None:
    table = Table(title=f"run {run['run_id']}", title_justify="left")
    for h in HEADERS:
        table.add_column(h, justify="left" if h in ("metric", "kind", "pass@k", "pass^k") else "right")
    for row in metric_rows(run):
        table.add_row(*row)
    console.print(table)
    console.print(
        f"{run['attempts']} attempts ({run['skipped_resumed']} done before --resume, {run['not_run']} not run), "
        f"{len(run['infra_errors'])} infrastructure errors (left out of the metrics); "
        f"wall {run['wall_s']:.1f}s, agent {run['agent_s']:.1f}s",
        highlight=False,
    )
    if run.get("faults"):
        console.print(f"injected faults: {faults_text(run['faults'])}", highlight=False)
    for e in run["infra_errors"][:10]:
        console.print(f"  infra {e['kind']}: task {e['task_id']} trial {e['trial']}: {e['message']}", highlight=False)
    if len(run["infra_errors"]) > 10:
        console.print(f"  ... and {len(run['infra_errors']) - 10} more (--json lists them all)", highlight=False)
    if run.get("comparison"):
        console.print(comparison_table(run["comparison"], "compared with the baseline"))
    if run.get("judge_calibration"):
        judges = Table(title="judge calibration (against the dataset's labels)", title_justify="left")
        for h in CALIBRATION_HEADERS:
            judges.add_column(h)
        for row in calibration_rows(run["judge_calibration"]):
            judges.add_row(*row)
        console.print(judges)
    for g in run["gates"]:
        mark = "[green]PASS[/]" if g["passed"] else "[red]FAIL[/]"
        line = gate_line(g)
        console.print(f"{mark} {g['gate']}" + (f"  ({line})" if line else ""), highlight=False)


CALIBRATION_HEADERS = [
    "evaluator", "metric", "labeled", "agree / disagree", "kappa (95%)", "sensitivity (95%)", "specificity (95%)",
    "pass rate: PPI (95%)", "labels alone (95%)", "judge alone",
]  # fmt: skip


def calibration_rows(calibration: list[dict[str, Any]]) -> list[list[str]]:
    """Each evaluator against people's labels: how many tasks' attempts, the confusion, kappa, sensitivity and
    specificity (failing is the positive class), and the prediction-powered pass rate beside the labels' and the
    judge's own."""
    rows = []
    for c in calibration:
        k, sens, spec, ppi, m = c["kappa"], c["sensitivity"], c["specificity"], c["ppi"], c["confusion"]
        agree = m["both_pass"] + m["both_fail"]
        rows.append([
            _code(c["evaluator"]) if c["evaluator"] else "-", c["name"], _num(c["n"]),
            f"{agree} / {c['n'] - agree}",
            f"{_num(k['kappa'])} [{_num(k['low'])}, {_num(k['high'])}]" if k else "-",
            f"{_num(sens[0])} [{_num(sens[1])}, {_num(sens[2])}]" if sens else "-",
            f"{_num(spec[0])} [{_num(spec[1])}, {_num(spec[2])}]" if spec else "-",
            f"{_num(ppi['estimate'])} [{_num(ppi['low'])}, {_num(ppi['high'])}]" if ppi else "-",
            f"{_num(ppi['classical'])} [{_num(ppi['classical_low'])}, {_num(ppi['classical_high'])}]" if ppi else "-",
            _num(ppi["judge_mean"]) if ppi else "-",
        ])  # fmt: skip
    return rows


COMPARISON_HEADERS = ["metric", "better", "n", "delta", "95% interval", "p", "test", "lost / gained", "verdict"]


def comparison_rows(comparison: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Each metric compared: which way is better, the pairs, the difference with its interval and p, the test, the
    records lost and gained, and the verdict (or why the metric could not be compared)."""
    rows = []
    for name, c in comparison.items():
        if c.get("unpaired"):
            rows.append([name, c.get("better", ""), "0", "-", "-", "-", "-", "-", c["unpaired"]])
            continue
        verdict = "regressed" if c["regressed"] else "improved" if c["improved"] else "no change"
        lost_gained = "-" if c.get("regressions") is None else f"{c['regressions']} / {c['fixes']}"
        rows.append([
            name, c.get("better", ""), _num(c["n"]), f"{c['delta']:+.3f}", f"[{c['low']:+.3f}, {c['high']:+.3f}]",
            f"{c['pValue']:.3g}", str(c["test"]), lost_gained, verdict,
        ])  # fmt: skip
    return rows


def comparison_table(comparison: dict[str, dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for h in COMPARISON_HEADERS:
        table.add_column(h, justify="left" if h in ("metric", "better", "test", "verdict") else "right")
    colors = {"regressed": "[red]regressed[/]", "improved": "[green]improved[/]"}
    for row in comparison_rows(comparison):
        table.add_row(*row[:-1], colors.get(row[-1], row[-1]))
    return table


MAX_MARKDOWN_EXAMPLES = 50
"""Failing examples (a task's identical trials count once) the Markdown report lists; the rest are counted."""
WORD = {"pass": "pass", "fail": "**FAIL**", "error": "**error**", "scored": "scored", "infra": "infra error"}


def _code(text: str) -> str:
    """Inline code that holds any text: a fence longer than its longest run of backticks, one line, no pipes."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _block(text: str, limit: int = 2000) -> list[str]:
    """A fenced block that holds any text, cut at `limit` characters with a note of what was left out."""
    more = f"\n… ({len(text) - limit:,} more characters)" if len(text) > limit else ""
    body = text[:limit] + more
    fence = "`" * max(3, max((len(r) for r in re.findall(r"`+", body)), default=0) + 1)
    return [f"{fence}text", body, fence]


def outcome_lines(
    scores: list[dict[str, Any]],
    infra_errors: list[dict[str, Any]],
    trials: int,
    tasks: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """The task x trial grid of outcomes as a Markdown table."""
    from evalsi.run_harness.examples import attempts_of, by_task

    per_task = by_task(attempts_of(scores, None, infra_errors), tasks)
    if not per_task:
        return []
    trials = max([trials, *(a.trial + 1 for v in per_task.values() for a in v)])
    lines = ["", "## Outcomes by task and trial", "",
             "| task | " + " | ".join(f"trial {t}" for t in range(trials)) + " | failing |",
             "|---|" + "---|" * (trials + 1)]  # fmt: skip
    for task_id, attempts in per_task.items():
        by_trial = {a.trial: a for a in attempts}
        cells = [WORD[by_trial[t].outcome] if t in by_trial else "-" for t in range(trials)]
        bad = sum(a.failing for a in attempts)
        lines.append(f"| {_code(task_id)} | " + " | ".join(cells) + f" | {bad} of {len(attempts)} |")
    return lines


def example_lines(
    scores: list[dict[str, Any]],
    trajectories: dict[str, dict[str, Any]] | None = None,
    tasks: dict[str, dict[str, Any]] | None = None,
) -> list[str]:
    """The failing examples: task, trials, each failing evaluator's explanation, expected against actual output."""
    from evalsi.run_harness.examples import FAILING, attempts_of, by_task, expected_of, grouped, score_outcome

    per_task = by_task([a for a in attempts_of(scores, trajectories) if a.failing], tasks)
    groups = [(task_id, g) for task_id, attempts in per_task.items() for g in grouped(attempts)]
    if not groups:
        return []
    count = sum(len(g) for _, g in groups)
    lines = ["", f"## Failing examples ({count} failed or errored attempts)"]
    for task_id, group in groups[:MAX_MARKDOWN_EXAMPLES]:
        first = group[0]
        trials = ", ".join(str(a.trial) for a in group)
        same = " (same trajectory)" if len(group) > 1 else ""
        lines += ["", f"### {_code(task_id)} trial{'s' if len(group) > 1 else ''} {trials}{same}", ""]
        for s in first.scores:
            outcome = score_outcome(s)
            if outcome in FAILING:
                why = "; ".join(str(w) for w in (s.get("reason"), s.get("explanation")) if w) or "no explanation"
                lines.append(f"- {_code(str(s.get('name')))} {outcome} ({s.get('evaluator') or s.get('name')}): "
                             + " ".join(why.split()))  # fmt: skip
        lines.append(f"- trace {', '.join(_code(a.trace_id) for a in group)}")
        task = (tasks or {}).get(task_id)
        expected = expected_of(task.get("reference")) if task is not None else None
        if expected is not None:
            lines += ["", "expected:", "", *_block(expected)]
        actual = first.actual
        lines += ["", "actual:", ""]
        lines += _block(actual) if actual is not None else ["(not loaded: trace not found or over the limit)"]
    if len(groups) > MAX_MARKDOWN_EXAMPLES:
        lines += ["", f"… {len(groups) - MAX_MARKDOWN_EXAMPLES} more failing examples are left out "
                  "(`evalsi runs show` lists every score)."]  # fmt: skip
    return lines


def markdown(
    run: dict[str, Any],
    scores: list[dict[str, Any]] | None = None,
    trajectories: dict[str, dict[str, Any]] | None = None,
    tasks: dict[str, dict[str, Any]] | None = None,
) -> str:
    """The run as Markdown; with its scores (and the trajectories and tasks, for the outputs) also the outcomes by
    task and trial and the failing examples."""
    lines = [f"# Run `{run['run_id']}`", ""]
    m = run["manifest"]
    lines += [
        f"- name: {run['name']}",
        f"- target: `{m.get('target')}`",
        f"- dataset: `{m.get('dataset', {}).get('path')}` (sha256 `{m.get('dataset', {}).get('hash', '')[:12]}`, "
        f"{m.get('dataset', {}).get('tasks')} tasks), trials: {m.get('trials')}",
        f"- evalsi {m.get('evalsi_version')}, spec sha256 `{str(m.get('spec_hash', ''))[:12]}`, seed {m.get('seed')}",
        f"- gates: {'all hold' if run['passed'] else 'FAILED'}",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    lines += ["| " + " | ".join(r) + " |" for r in metric_rows(run)]
    lines += ["", "## Gates", ""]
    lines += [f"- {'PASS' if g['passed'] else 'FAIL'} `{g['gate']}` {gate_line(g)}".rstrip() for g in run["gates"]]
    if run.get("comparison"):
        lines += ["", "## Compared with the baseline", "", "| " + " | ".join(COMPARISON_HEADERS) + " |",
                  "|" + "---|" * len(COMPARISON_HEADERS)]  # fmt: skip
        lines += ["| " + " | ".join(r) + " |" for r in comparison_rows(run["comparison"])]
    if run.get("judge_calibration"):
        lines += ["", '<a id="judge-calibration"></a>', "", "## Judge calibration", "",
                  "Each evaluator's verdicts against the labels people gave the dataset's tasks (`reference.labels`); "
                  "failing is the positive class. The prediction-powered rate corrects the evaluator's pass rate on "
                  "the unlabeled tasks by its error on the labeled ones (valid when the labeled tasks are a uniform "
                  "sample).", "", "| " + " | ".join(CALIBRATION_HEADERS) + " |",
                  "|" + "---|" * len(CALIBRATION_HEADERS)]  # fmt: skip
        lines += ["| " + " | ".join(r) + " |" for r in calibration_rows(run["judge_calibration"])]
    if run.get("faults"):
        lines += ["", f"Injected faults: {faults_text(run['faults'])}"]
    if run["infra_errors"]:
        lines += ["", f"## Infrastructure errors ({len(run['infra_errors'])})", ""]
        lines += [
            f"- `{e['kind']}` task {e['task_id']} trial {e['trial']}: {e['message']}" for e in run["infra_errors"]
        ]
    if scores is not None:
        trials = m.get("trials") if isinstance(m.get("trials"), int) else 0
        lines += outcome_lines(scores, run["infra_errors"], trials, tasks)
        lines += example_lines(scores, trajectories, tasks)
    return "\n".join(lines) + "\n"


# --- `evalsi runs list`: one line a run, enough to tell runs apart ------------------------------------------------

RUNS_HEADERS = ["run id", "started (UTC)", "status", "target", "model", "dataset", "tasks x trials", "headline",
                "gates"]  # fmt: skip
RUN_ADDED = frozenset({"duration_ms", "tokens", "cost_usd"})  # measured by the run itself, not scored
_GATE_METRIC = re.compile(r"metric\(\s*['\"]([^'\"]+)['\"]")


def _started(manifest: dict[str, Any]) -> str:
    ns = manifest.get("started_unix_nano")
    if not isinstance(ns, int) or ns <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def target_and_model(manifest: dict[str, Any]) -> tuple[str, str]:
    """The agent a run ran and its model: the manifest's `model`, else the `#model` an openai target's identity
    ends with (runs recorded before the manifest kept it apart)."""
    target = str(manifest.get("target") or "-")
    model = manifest.get("model")
    if target.startswith("openai:") and "#" in target:
        target, _, from_identity = target.rpartition("#")
        model = model or from_identity
    return target, str(model or "-")


def headline(summary: dict[str, Any]) -> str:
    """The metric a run is judged by and its mean: the first gate's metric, else the first scored metric."""
    metrics = summary.get("metrics") or {}
    gated = [m.group(1) for g in summary.get("gates") or [] for m in [_GATE_METRIC.search(str(g.get("gate", "")))] if m]
    name = next((n for n in gated if n in metrics), None)
    name = name or next((n for n in metrics if n not in RUN_ADDED), None) or next(iter(metrics), None)
    if name is None:
        return "-"
    return f"{name} {_num(metrics[name].get('mean'))}"


def gate_verdict(summary: dict[str, Any]) -> str:
    gates = summary.get("gates") or []
    if not gates:
        return "-"
    held = sum(bool(g.get("passed")) for g in gates)
    return f"{'pass' if held == len(gates) else 'FAIL'} {held}/{len(gates)}"


def run_row(run: dict[str, Any], source: dict[str, Any] | None = None) -> list[str]:
    """A row of `evalsi runs list`. A rescore run (`manifest.rescore.run`) takes its target, model, dataset and
    tasks from `source`, the run whose traces it scored, and says so in its target."""
    manifest, summary = run.get("manifest") or {}, run.get("summary") or {}
    of = manifest if source is None else source.get("manifest") or {}
    target, model = target_and_model(of)
    rescore = manifest.get("rescore") or {}
    if rescore.get("run"):
        target = f"rescore of {rescore['run']}" + (f": {target}" if target != "-" else "")
    elif rescore:
        target = f"rescore of traces where {rescore.get('traces', '?')}"
    dataset = of.get("dataset") or {}
    tasks = dataset.get("tasks")
    trials = manifest.get("trials") or of.get("trials")
    shape = f"{tasks if tasks is not None else '?'} x {trials if trials is not None else '?'}"
    path = str(dataset.get("path") or "")
    return [str(run.get("run_id", "")), _started(manifest), str(run.get("status", "")), target, model,
            path.rsplit("/", 1)[-1] or "-", shape, headline(summary), gate_verdict(summary)]  # fmt: skip
