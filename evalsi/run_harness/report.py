"""What a finished run shows: the summary table in the terminal, and the same as Markdown (`--report out.md`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


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
            name, m["kind"].replace("_", "/"), _num(m["n"]), _num(m["mean"]), _interval(m),
            _num(m.get("p50")) if numeric else "-", _num(m.get("p95")) if numeric else "-",
            _k(m, "pass_at_k"), _k(m, "pass_hat_k"), _num(m.get("errors", 0)), _num(m.get("skipped", 0)),
        ])  # fmt: skip
    return rows


HEADERS = ["metric", "kind", "n", "mean", "95% interval", "p50", "p95", "pass@k", "pass^k", "errors", "skipped"]


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
    for g in run["gates"]:
        mark = "[green]PASS[/]" if g["passed"] else "[red]FAIL[/]"
        console.print(f"{mark} {g['gate']}" + (f"  ({g['detail']})" if g["detail"] else ""), highlight=False)


def comparison_table(comparison: dict[str, dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for h in ("metric", "n", "delta", "95% interval", "p", "test", "verdict"):
        table.add_column(h, justify="left" if h in ("metric", "test", "verdict") else "right")
    for name, c in comparison.items():
        verdict = "[red]regressed[/]" if c["regressed"] else "[green]improved[/]" if c["improved"] else "no change"
        table.add_row(
            name, _num(c["n"]), f"{c['delta']:+.3f}", f"[{c['low']:+.3f}, {c['high']:+.3f}]", f"{c['pValue']:.3g}",
            c["test"], verdict,
        )  # fmt: skip
    return table


def markdown(run: dict[str, Any]) -> str:
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
    lines += [f"- {'PASS' if g['passed'] else 'FAIL'} `{g['gate']}` {g['detail']}".rstrip() for g in run["gates"]]
    if run.get("comparison"):
        lines += ["", "## Compared with the baseline", "", "| metric | n | delta | 95% interval | p | verdict |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for name, c in run["comparison"].items():
            verdict = "regressed" if c["regressed"] else "improved" if c["improved"] else "no change"
            lines.append(
                f"| {name} | {c['n']} | {c['delta']:+.3f} | [{c['low']:+.3f}, {c['high']:+.3f}] | {c['pValue']:.3g} "
                f"| {verdict} |"
            )
    if run.get("faults"):
        lines += ["", f"Injected faults: {faults_text(run['faults'])}"]
    if run["infra_errors"]:
        lines += ["", f"## Infrastructure errors ({len(run['infra_errors'])})", ""]
        lines += [
            f"- `{e['kind']}` task {e['task_id']} trial {e['trial']}: {e['message']}" for e in run["infra_errors"]
        ]
    return "\n".join(lines) + "\n"
