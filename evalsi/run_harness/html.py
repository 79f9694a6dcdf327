"""The run as one self-contained HTML page (`--report out.html`): summary, metrics, gates, comparison, judge
calibration (when the dataset carries people's labels), a task x trial
grid of outcomes, every attempt with expected and actual output side by side (the difference marked), its scores and
trajectory (failed ones open, passed ones folded, identical trials shown once), infrastructure errors and the
manifest; inline CSS and a small inline script (filter and sort; the page reads the same without it), nothing
loaded from the network."""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Iterable
from typing import Any

from evalsi.run_harness.examples import (
    FAILING,
    Attempt,
    attempts_of,
    by_task,
    difference,
    expected_of,
    first_difference,
    grouped,
    score_outcome,
    trials_text,
)
from evalsi.run_harness.report import CALIBRATION_HEADERS, HEADERS, _num, calibration_rows, faults_text, metric_rows

MAX_EXAMPLES = 200
"""Attempts shown in detail, failed ones first; the rest are counted (the grid shows every attempt)."""
MAX_INFRA_ERRORS = 500
MAX_STEPS = 100
"""Steps shown per trajectory."""
MAX_TEXT = 2000
"""Characters shown of one piece of content (an output, tool arguments, a result)."""
MAX_DOCUMENTS = 5

CSS = """
:root { --ok: #1a7f37; --ok-bg: #dafbe1; --bad: #cf222e; --bad-bg: #ffebe9; --muted: #59636e; --line: #d1d9e0;
  --zebra: #f6f8fa; --accent: #0969da; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; color: #1f2328; background: #fff;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
h1 { font-size: 22px; margin: 0 0 4px; word-break: break-all; }
h2 { font-size: 17px; margin: 32px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 20px 0 6px; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
  font-size: 12.5px; }
pre { white-space: pre-wrap; word-break: break-word; margin: 4px 0; padding: 6px 8px; background: var(--zebra);
  border-radius: 4px; max-width: 100%; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { padding: 4px 10px; text-align: left; vertical-align: top; border-bottom: 1px solid var(--line); }
th { background: #eef1f4; font-weight: 600; white-space: nowrap; }
tbody tr:nth-child(even) { background: var(--zebra); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.muted { color: var(--muted); }
.banner { display: inline-block; margin: 10px 0 6px; padding: 8px 16px; border-radius: 6px; font-size: 18px;
  font-weight: 700; }
.banner.pass { background: var(--ok-bg); color: var(--ok); border: 1px solid var(--ok); }
.banner.fail { background: var(--bad-bg); color: var(--bad); border: 1px solid var(--bad); }
.banner.none { background: var(--zebra); color: var(--muted); border: 1px solid var(--line); }
.badge { display: inline-block; padding: 0 6px; border-radius: 10px; font-size: 12px; font-weight: 600;
  white-space: nowrap; }
.pass, .improved { color: var(--ok); }
.fail, .regressed { color: var(--bad); }
.badge.pass, .badge.improved { background: var(--ok-bg); }
.badge.fail, .badge.regressed, .badge.error { background: var(--bad-bg); color: var(--bad); }
.badge.same { background: var(--zebra); color: var(--muted); }
.badge.step { background: #ddf4ff; color: #0550ae; }
.facts { display: flex; flex-wrap: wrap; gap: 4px 24px; color: var(--muted); }
.facts b { color: #1f2328; font-weight: 600; }
dl.manifest { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 6px 0; }
dl.manifest dt { color: var(--muted); }
dl.manifest dd { margin: 0; word-break: break-all; }
.task { border: 1px solid var(--line); border-radius: 6px; padding: 4px 14px 10px; margin: 14px 0; }
.trace { margin: 10px 0 4px; }
.tid { user-select: all; }
details > summary { cursor: pointer; color: var(--accent); margin: 6px 0; }
ol.steps { list-style: none; padding: 0; margin: 4px 0; }
ol.steps > li { border-left: 3px solid var(--line); padding: 2px 0 4px 10px; margin: 6px 0; }
ol.steps > li.error { border-left-color: var(--bad); background: #fff8f7; }
.errtext { color: var(--bad); font-weight: 600; }
.more { color: var(--muted); font-style: italic; }
.label { color: var(--muted); font-size: 12px; margin-top: 4px; }
svg.whisker { vertical-align: middle; }
[hidden] { display: none !important; }
.small { font-size: 12px; }
.toolbar { display: flex; flex-wrap: wrap; align-items: center; gap: 6px 18px; margin: 8px 0; padding: 8px 12px;
  background: var(--zebra); border: 1px solid var(--line); border-radius: 6px; }
.toolbar label { color: var(--muted); }
.toolbar input, .toolbar select { font: inherit; color: #1f2328; padding: 2px 6px; margin-left: 4px; }
table.grid th, table.grid td { border: 1px solid #fff; }
table.grid td.cell { padding: 0; min-width: 56px; text-align: center; font-weight: 700; }
table.grid td.cell a, table.grid td.cell span { display: block; padding: 3px 10px; color: inherit;
  text-decoration: none; }
table.grid td.cell a:hover { outline: 2px solid var(--accent); }
.cell.pass, .cell-key.pass { background: var(--ok-bg); color: var(--ok); }
.cell.fail, .cell-key.fail { background: var(--bad-bg); color: var(--bad); }
.cell.error, .cell-key.error { background: #fff1e5; color: #bc4c00; }
.cell.scored, .cell-key.scored { background: #ddf4ff; color: #0550ae; }
.cell.infra, .cell-key.infra { background: #eaeef2; color: var(--muted); }
.cell.none { color: var(--line); }
.cell.dim { opacity: 0.2; }
.cell-key { display: inline-block; min-width: 22px; text-align: center; border-radius: 3px; font-weight: 700; }
details.attempt { border-left: 4px solid var(--line); padding: 0 0 4px 12px; margin: 10px 0; color: #1f2328; }
details.attempt.fail { border-left-color: var(--bad); }
details.attempt.error { border-left-color: #bc4c00; }
details.attempt.pass { border-left-color: var(--ok); }
details.attempt > summary { color: #1f2328; }
details.attempt:target, details.attempt:has(:target) { background: #fff8c5; }
.versus { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 12px; margin: 6px 0 2px; }
mark.want { background: #aceebb; color: #116329; border-radius: 2px; }
mark.got { background: #ffcecb; color: #82071e; border-radius: 2px; }
"""


def _e(value: Any) -> str:
    """Any value as escaped text."""
    return html.escape("" if value is None else str(value), quote=True)


def _clip(value: Any, limit: int = MAX_TEXT) -> str:
    """Escaped text, cut at `limit` characters with a visible marker of what was left out."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(text) <= limit:
        return _e(text)
    rest = len(text) - limit
    return f'{_e(text[:limit])}<span class="more">… ({rest:,} more characters)</span>'


def _pre(value: Any, limit: int = MAX_TEXT) -> str:
    return f"<pre>{_clip(value, limit)}</pre>"


def _f(value: Any, fmt: str) -> str:
    """A number in `fmt`, or "-" when it is missing or not a number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return format(value, fmt)
    return "-"


def _seconds(value: Any) -> str:
    return _f(value, ".1f") + " s" if isinstance(value, int | float) else "-"


def _started(nanos: Any) -> str:
    if not isinstance(nanos, int | float) or isinstance(nanos, bool) or nanos <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(nanos / 1e9))


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], numeric: Iterable[int] = ()) -> str:
    """A table of already-escaped cells; columns in `numeric` are right-aligned."""
    right = set(numeric)

    def cell(tag: str, i: int, content: str) -> str:
        return f'<{tag} class="num">{content}</{tag}>' if i in right else f"<{tag}>{content}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _whisker(m: dict[str, Any]) -> str:
    """The mean as a dot and its interval as a whisker on a 0..1 axis (pass/fail metrics only)."""
    mean, low, high = m.get("mean"), m.get("low"), m.get("high")
    if m.get("kind") != "pass_fail" or not isinstance(mean, int | float) or not math.isfinite(mean):
        return ""
    w, pad, y = 140, 6, 9

    def x(v: float) -> float:
        return round(pad + max(0.0, min(1.0, v)) * (w - 2 * pad), 1)

    parts = [
        f'<svg class="whisker" width="{w}" height="18" viewBox="0 0 {w} 18" role="img">',
        f"<title>mean {_e(_num(mean))}, 95% interval {_e(_num(low))} to {_e(_num(high))}</title>",
        f'<line x1="{x(0)}" y1="{y}" x2="{x(1)}" y2="{y}" stroke="#d1d9e0" stroke-width="2"/>',
        f'<line x1="{x(0)}" y1="4" x2="{x(0)}" y2="14" stroke="#afb8c1"/>',
        f'<line x1="{x(0.5)}" y1="6" x2="{x(0.5)}" y2="12" stroke="#afb8c1"/>',
        f'<line x1="{x(1)}" y1="4" x2="{x(1)}" y2="14" stroke="#afb8c1"/>',
    ]
    if isinstance(low, int | float) and isinstance(high, int | float):
        parts += [
            f'<rect x="{x(low)}" y="5" width="{max(1.0, x(high) - x(low))}" height="8" fill="#54aeff" '
            'fill-opacity="0.45"/>',
            f'<line x1="{x(low)}" y1="3" x2="{x(low)}" y2="15" stroke="#0969da" stroke-width="1.5"/>',
            f'<line x1="{x(high)}" y1="3" x2="{x(high)}" y2="15" stroke="#0969da" stroke-width="1.5"/>',
        ]
    parts.append(f'<circle cx="{x(mean)}" cy="{y}" r="3.5" fill="#0550ae"/></svg>')
    return "".join(parts)


# --- sections -----------------------------------------------------------------------------------------------------


def _header(run: dict[str, Any], failing: int) -> str:
    gates = run.get("gates") or []
    failed = [g for g in gates if not g.get("passed")]
    if not gates:
        banner = '<div class="banner none">no gates</div>'
    elif failed:
        banner = f'<div class="banner fail">FAIL: {len(failed)} of {len(gates)} gates failed</div>'
    else:
        banner = f'<div class="banner pass">PASS: all {len(gates)} gates hold</div>'
    manifest = run.get("manifest") or {}
    infra = run.get("infra_errors") or []
    facts = [
        ("started", _started(manifest.get("started_unix_nano"))),
        ("wall", _seconds(run.get("wall_s"))),
        ("agent", _seconds(run.get("agent_s"))),
        ("attempts", _num(run.get("attempts"))),
        ("done before --resume", _num(run.get("skipped_resumed"))),
        ("not run", _num(run.get("not_run"))),
        ("infrastructure errors", _num(len(infra))),
        ("failing scores", _num(failing)),
    ]
    if run.get("faults"):
        facts.append(("injected faults", faults_text(run["faults"])))
    facts_html = "".join(f"<span>{_e(k)}: <b>{_e(v)}</b></span>" for k, v in facts)
    return (
        f'<header><h1>Run <span class="mono">{_e(run.get("run_id"))}</span></h1>'
        f'<div class="muted">name: <b>{_e(run.get("name"))}</b></div>{banner}'
        f'<div class="facts">{facts_html}</div></header>'
    )


def _manifest(manifest: dict[str, Any]) -> str:
    dataset = manifest.get("dataset") or {}
    judge = manifest.get("judge") or {}
    evaluators = manifest.get("evaluators") or []
    evaluator_list = ", ".join(
        f'<code>{_e(ev.get("ref"))}</code> <span class="muted">v{_e(ev.get("version"))}</span>'
        if isinstance(ev, dict)
        else f"<code>{_e(ev)}</code>"
        for ev in evaluators
    )
    labels = manifest.get("labels") or {}
    rows = [
        ("evalsi version", _e(manifest.get("evalsi_version"))),
        ("spec sha256", f"<code>{_e(manifest.get('spec_hash'))}</code>"),
        ("dataset", f"<code>{_e(dataset.get('path'))}</code>"),
        ("dataset sha256", f"<code>{_e(dataset.get('hash'))}</code>"),
        ("tasks", _e(_num(dataset.get("tasks")))),
        ("target", f"<code>{_e(manifest.get('target'))}</code>"),
        ("trials", _e(_num(manifest.get("trials")))),
        ("evaluators", evaluator_list or "-"),
        ("judge model", _e(judge.get("model")) if judge.get("model") else "-"),
        ("seed", _e(manifest.get("seed"))),
    ]
    if judge.get("endpoint"):
        rows.insert(9, ("judge endpoint", f"<code>{_e(judge.get('endpoint'))}</code>"))
    if labels:
        rows.append(("labels", ", ".join(f"<code>{_e(k)}={_e(v)}</code>" for k, v in labels.items())))
    items = "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in rows)
    return f'<section><h2>Manifest</h2><dl class="manifest">{items}</dl></section>'


def _metrics(run: dict[str, Any]) -> str:
    metrics = run.get("metrics") or {}
    if not metrics:
        return '<section><h2>Metrics</h2><p class="muted">No metrics: nothing was scored.</p></section>'
    cut = HEADERS.index("95% interval") + 1
    headers = [_e(h) for h in HEADERS[:cut]] + ["0 … 1"] + [_e(h) for h in HEADERS[cut:]]
    rows = []
    for m, row in zip(metrics.values(), metric_rows(run), strict=True):
        cells = [f"<b>{_e(row[0])}</b>"] + [_e(c) for c in row[1:]]
        rows.append([*cells[:cut], _whisker(m), *cells[cut:]])
    right = ("n", "mean", "95% interval", "pass rate", "p50", "p95", "errors", "skipped")
    numeric = [i for i, h in enumerate(headers) if h in right]
    note = (
        '<p class="muted">Pass/fail metrics: mean is the pass rate with its Wilson 95% interval. Numeric metrics: mean '
        "of the values (an error rate is an error rate) with the bootstrap 95% interval. Pass rate, pass@k and pass^k "
        "count the verdicts, whenever the scores have them.</p>"
    )
    return f"<section><h2>Metrics</h2>{_table(headers, rows, numeric)}{note}</section>"


def _gates(gates: list[dict[str, Any]]) -> str:
    from evalsi.run_harness.gates import gate_reading

    if not gates:
        return '<section><h2>Gates</h2><p class="muted">The spec defines no gates.</p></section>'
    rows = [
        [
            '<span class="badge pass">PASS</span>' if g.get("passed") else '<span class="badge fail">FAIL</span>',
            f"<code>{_e(g.get('gate'))}</code>",
            *(_e(text or "-") for text in gate_reading(g)),
            _e(g.get("detail") or ""),
        ]
        for g in gates
    ]
    return f"<section><h2>Gates</h2>{_table(['result', 'gate', 'value seen', 'threshold', 'detail'], rows)}</section>"


def _comparison(comparison: dict[str, dict[str, Any]] | None) -> str:
    if not comparison:
        return ""
    rows = []
    for name, c in comparison.items():
        if c.get("regressed"):
            verdict = '<span class="badge regressed">regressed</span>'
        elif c.get("improved"):
            verdict = '<span class="badge improved">improved</span>'
        else:
            verdict = '<span class="badge same">no change</span>'
        interval = f"[{_f(c.get('low'), '+.3f')}, {_f(c.get('high'), '+.3f')}]"
        changed = ""
        if c.get("regressions") is not None or c.get("fixes") is not None:
            changed = f"{_num(c.get('regressions'))} / {_num(c.get('fixes'))}"
        rows.append([
            f"<b>{_e(name)}</b>", _e(_num(c.get("n"))), _e(_f(c.get("delta"), "+.3f")), _e(interval),
            _e(_f(c.get("pValue"), ".3g")), _e(c.get("test")), _e(changed or "-"), verdict,
        ])  # fmt: skip
    headers = ["metric", "n", "delta", "95% interval", "p", "test", "lost / gained", "verdict"]
    note = '<p class="muted">delta is this run minus the baseline, over the records both runs scored.</p>'
    return f"<section><h2>Compared with the baseline</h2>{_table(headers, rows, (1, 2, 3, 4, 6))}{note}</section>"


def _calibration(calibration: list[dict[str, Any]] | None) -> str:
    """The `judge-calibration` section, as in the Markdown report: each evaluator against people's labels."""
    if not calibration:
        return ""
    rows = [[_e(cell.strip("`")) for cell in row] for row in calibration_rows(calibration)]
    note = (
        '<p class="muted">Each evaluator\'s verdicts against the labels people gave the dataset\'s tasks '
        "(<code>reference.labels</code>); failing is the positive class. The prediction-powered rate corrects the "
        "evaluator's pass rate on the unlabeled tasks by its error on the labeled ones (valid when the labeled tasks "
        "are a uniform sample).</p>"
    )
    table = _table(CALIBRATION_HEADERS, rows, (2,))
    return f'<section id="judge-calibration"><h2>Judge calibration</h2>{note}{table}</section>'


def _infra(errors: list[dict[str, Any]]) -> str:
    if not errors:
        return ""
    rows = [
        [_e(e.get("task_id")), _e(_num(e.get("trial"))), f'<span class="badge error">{_e(e.get("kind"))}</span>',
         f'<span class="mono">{_clip(e.get("message"), 500)}</span>',
         f'<code class="tid">{_e(e.get("trace_id"))}</code>']
        for e in errors[:MAX_INFRA_ERRORS]
    ]  # fmt: skip
    more = ""
    if len(errors) > MAX_INFRA_ERRORS:
        more = f'<p class="more">… {len(errors) - MAX_INFRA_ERRORS:,} more infrastructure errors are not shown.</p>'
    return (
        f"<section><h2>Infrastructure errors ({len(errors):,})</h2>"
        '<p class="muted">Attempts the harness could not carry out; they are left out of the metrics.</p>'
        f"{_table(['task', 'trial', 'kind', 'message', 'trace id'], rows, (1,))}{more}</section>"
    )


# --- failing examples and their trajectories ----------------------------------------------------------------------


def failing(scores: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scores that failed (passed false) or errored, in the order given."""
    return [s for s in scores if s.get("passed") is False or s.get("outcome") == "error"]


def _messages(messages: Any) -> str:
    """Canonical messages ({role, parts}) as text blocks and tool calls."""
    if not messages:
        return ""
    if not isinstance(messages, list):
        return _pre(messages)
    out = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(_pre(m))
            continue
        role = _e(m.get("role") or "message")
        for p in m.get("parts") or []:
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text":
                out.append(f'<div class="label">{role}</div>{_pre(p.get("content"))}')
            elif kind == "tool_call":
                out.append(
                    f'<div class="label">{role} calls tool <code>{_e(p.get("name"))}</code>'
                    f' <span class="muted">{_e(p.get("id") or "")}</span></div>{_pre(p.get("arguments"))}'
                )
            elif kind == "tool_call_response":
                out.append(f'<div class="label">{role}: tool result</div>{_pre(p.get("response"))}')
            elif kind == "reasoning":
                out.append(f'<div class="label">{role}: reasoning</div>{_pre(p.get("content"))}')
            else:
                out.append(f'<div class="label">{role}: {_e(kind or "part")}</div>{_pre(p)}')
    return "".join(out)


def _step(step: dict[str, Any]) -> str:
    kind = step.get("type") or "step"
    head = [f'<span class="badge step">{_e(kind)}</span> <b>{_e(step.get("name"))}</b>']
    if kind == "llm" and step.get("model"):
        head.append(f'<span class="muted">model <code>{_e(step["model"])}</code></span>')
    if kind == "tool" and step.get("tool_name"):
        head.append(f"<span>tool <code>{_e(step['tool_name'])}</code></span>")
    if kind == "agent" and step.get("agent_name"):
        head.append(f"<span>agent <code>{_e(step['agent_name'])}</code></span>")
    if isinstance(step.get("duration_ns"), int | float):
        head.append(f'<span class="muted">{_e(_f(step["duration_ns"] / 1e6, ",.0f"))} ms</span>')
    if kind == "llm" and (step.get("input_tokens") is not None or step.get("output_tokens") is not None):
        head.append(
            f'<span class="muted">tokens {_e(_num(step.get("input_tokens")))} in, '
            f"{_e(_num(step.get('output_tokens')))} out</span>"
        )
    body = []
    if step.get("error"):
        why = ": ".join(_e(v) for v in (step.get("error_type"), step.get("status_message")) if v)
        body.append(f'<div class="errtext">error{": " + why if why else ""}</div>')
    if kind == "llm":
        inputs = step.get("input") or []
        if isinstance(inputs, list) and inputs:
            earlier = len(inputs) - 1
            note = f" (the last of {len(inputs)} messages)" if earlier else ""
            body.append(f"<details><summary>input{_e(note)}</summary>{_messages(inputs[-1:])}</details>")
        body.append(_messages(step.get("output")) or '<div class="muted">no output recorded</div>')
    elif kind == "tool":
        body.append(f'<div class="label">arguments</div>{_pre(step.get("arguments"))}')
        body.append(f'<div class="label">result</div>{_pre(step.get("result"))}')
    elif kind == "agent":
        inputs = step.get("input") or []
        if isinstance(inputs, list) and inputs:
            body.append(f"<details><summary>input</summary>{_messages(inputs[-1:])}</details>")
        body.append(_messages(step.get("output")))
    elif kind == "retriever":
        documents = step.get("documents") or []
        body.append(f'<div class="label">{len(documents)} documents</div>')
        for d in documents[:MAX_DOCUMENTS]:
            body.append(_pre(d.get("content") if isinstance(d, dict) else d, 500))
        if len(documents) > MAX_DOCUMENTS:
            body.append(f'<div class="more">… ({len(documents) - MAX_DOCUMENTS} more documents)</div>')
    indent = min(int(step.get("depth") or 0), 8) * 18
    css = ' class="error"' if step.get("error") else ""
    return f'<li{css} style="margin-left: {indent}px">{" · ".join(head)}{"".join(body)}</li>'


def _trajectory(t: dict[str, Any], open_: bool) -> str:
    steps = t.get("steps") or []
    errors = t.get("errors") or 0
    facts = (
        f"{len(steps)} steps, {_num(t.get('llm_calls'))} LLM calls, {len(t.get('tool_calls') or [])} tool calls, "
        f"tokens {_num(t.get('input_tokens'))} in / {_num(t.get('output_tokens'))} out"
    )
    err = f', <span class="errtext">{_e(_num(errors))} with errors</span>' if errors else ""
    items = "".join(_step(s) for s in steps[:MAX_STEPS])
    more = ""
    if len(steps) > MAX_STEPS:
        more = f'<div class="more">… ({len(steps) - MAX_STEPS} more steps)</div>'
    final = ""
    if t.get("final_output") is not None:
        final = f'<div class="label">final output</div>{_pre(t["final_output"])}'
    return (
        f"<details{' open' if open_ else ''}><summary>trajectory: {_e(facts)}{err}</summary>"
        f'<ol class="steps">{items}</ol>{more}{final}</details>'
    )


# --- outcomes: the task x trial grid, the filter and sort -------------------------------------------------------

MARK = {"pass": "✓", "fail": "✗", "error": "!", "scored": "#", "infra": "∅"}
"""The grid's cell text for each outcome (the cell's colour says it too)."""
WORD = {"pass": "pass", "fail": "fail", "error": "evaluator error", "scored": "numeric scores only",
        "infra": "infrastructure error"}  # fmt: skip


def _anchor(task_index: int, trial: int) -> str:
    """The id of a task's trial in the page (task ids are untrusted text; the index is not)."""
    return f"a{task_index}-{trial}"


def _json_attr(value: Any) -> str:
    return _e(json.dumps(value, separators=(",", ":"), default=str))


def _means(attempts: list[Attempt]) -> dict[str, float]:
    """A task's mean per metric (the pass rate for pass/fail scores), and under "" its attempts' pass rate."""
    values: dict[str, list[float]] = {}
    for a in attempts:
        for s in a.scores:
            v = (1.0 if s["passed"] else 0.0) if isinstance(s.get("passed"), bool) else s.get("value")
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                values.setdefault(str(s.get("name")), []).append(float(v))
    out = {name: sum(vs) / len(vs) for name, vs in values.items()}
    judged = [a for a in attempts if a.outcome in ("pass", "fail", "error")]
    if judged:
        out[""] = sum(a.outcome == "pass" for a in judged) / len(judged)
    return out


def _cell_title(a: Attempt) -> str:
    why = next((s for s in a.scores if score_outcome(s) in FAILING), None)
    text = f"{a.task_id} · trial {a.trial}: {WORD[a.outcome]}"
    if why is not None:
        text += f" ({why.get('name')}: {why.get('explanation') or why.get('reason') or ''})".replace(": )", ")")
    elif a.infra is not None:
        text += f" ({a.infra.get('kind')}: {a.infra.get('message')})"
    return text[:300]


def _toolbar(metrics: list[str]) -> str:
    """Filter and sort; hidden until the script shows it, so a page read without scripts shows everything."""
    options = '<option value="">any metric</option>' + "".join(
        f'<option value="{_e(m)}">{_e(m)}</option>' for m in metrics
    )
    return (
        '<div class="toolbar" id="toolbar" hidden>'
        '<label>task <input id="f-task" type="search" placeholder="id or input text" size="22"></label>'
        '<label>outcome <select id="f-outcome"><option value="all">all</option>'
        '<option value="failing">failed or errored</option><option value="fail">failed</option>'
        '<option value="error">evaluator error</option><option value="pass">passed</option>'
        '<option value="infra">infrastructure error</option></select></label>'
        f'<label>metric <select id="f-metric">{options}</select></label>'
        '<label>sort <select id="f-sort"><option value="order">dataset order</option>'
        '<option value="failing">most failing trials first</option>'
        '<option value="mean">lowest mean first</option></select></label>'
        '<span class="muted" id="f-shown"></span></div>'
    )


def _outcomes(tasks: dict[str, list[Attempt]], inputs: dict[str, str], shown: set[tuple[str, int]], trials: int) -> str:
    if not tasks:
        return ""
    metrics = sorted({str(s.get("name")) for group in tasks.values() for a in group for s in a.scores})
    head = "".join(f'<th class="num">trial {t}</th>' for t in range(trials))
    rows = []
    for i, (task_id, attempts) in enumerate(tasks.items()):
        by_trial = {a.trial: a for a in attempts}
        cells = []
        for t in range(trials):
            a = by_trial.get(t)
            if a is None:
                cells.append('<td class="cell none" title="not run">-</td>')
                continue
            mark = MARK[a.outcome]
            inner = f'<a href="#{_anchor(i, t)}">{mark}</a>' if (task_id, t) in shown else f"<span>{mark}</span>"
            cells.append(
                f'<td class="cell {a.outcome}" data-outcome="{a.outcome}" data-by="{_json_attr(a.by_metric())}" '
                f'title="{_e(_cell_title(a))}">{inner}</td>'
            )
        bad = sum(a.failing for a in attempts)
        search = f"{task_id} {inputs.get(task_id, '')}".lower()[:500]
        rows.append(
            f'<tr data-task="{_e(task_id)}" data-order="{i}" data-failing="{bad}" data-search="{_e(search)}" '
            f'data-means="{_json_attr(_means(attempts))}"><th><code>{_e(task_id)}</code></th>{"".join(cells)}'
            f'<td class="num">{bad} of {len(attempts)}</td></tr>'
        )
    legend = " · ".join(f'<span class="cell-key {k}">{v}</span> {_e(WORD[k])}' for k, v in MARK.items())
    return (
        '<section id="outcomes"><h2>Outcomes by task and trial</h2>'
        f'<p class="muted">{legend}. A cell opens its attempt below; its tooltip says why it failed.</p>'
        f"{_toolbar(metrics)}"
        f'<table class="grid" id="grid"><thead><tr><th>task</th>{head}<th class="num">failing</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


# --- attempts: expected against actual, scores, trajectories ----------------------------------------------------


def _marked(pieces: list[tuple[str, bool]], css: str) -> str:
    return "".join(f'<mark class="{css}">{_e(text)}</mark>' if differs else _e(text) for text, differs in pieces)


def _cut(text: str) -> tuple[str, str]:
    """The text cut at MAX_TEXT, and the marker of what was left out."""
    if len(text) <= MAX_TEXT:
        return text, ""
    return text[:MAX_TEXT], f'<span class="more">… ({len(text) - MAX_TEXT:,} more characters)</span>'


def _versus(expected: str | None, actual: str | None, reference: Any, known: bool) -> str:
    """Expected and actual output side by side, where they differ marked."""
    if expected is None and actual is None and not reference:
        return ""
    if expected is not None and actual is not None:
        (want, want_more), (got, got_more) = _cut(expected), _cut(actual)
        left, right = difference(want, got)
        at = first_difference(expected, actual)
        note = (
            "the same text"
            if at is None
            else (
                f"first difference at character {at:,} (lengths {len(expected):,} and {len(actual):,}); "
                "marked: the words that differ"
            )
        )
        return (
            f'<div class="versus"><div class="expected"><div class="label">expected output</div>'
            f"<pre>{_marked(left, 'want')}{want_more}</pre></div>"
            f'<div class="actual"><div class="label">actual output</div>'
            f"<pre>{_marked(right, 'got')}{got_more}</pre></div></div>"
            f'<div class="muted small">{_e(note)}</div>'
        )
    if expected is not None:
        left_html = f'<div class="label">expected output</div>{_pre(expected)}'
    elif reference:
        left_html = f'<div class="label">reference (no expected output)</div>{_pre(reference)}'
    elif known:
        left_html = '<div class="label">expected output</div><div class="muted">the task gives none</div>'
    else:
        left_html = '<div class="label">expected output</div><div class="muted">not known to this report</div>'
    right_html = (
        f'<div class="label">actual output</div>{_pre(actual)}' if actual is not None
        else '<div class="label">actual output</div><div class="muted">not loaded (trace not found or over the '
        "limit)</div>"
    )  # fmt: skip
    return f'<div class="versus"><div class="expected">{left_html}</div><div class="actual">{right_html}</div></div>'


def _score_rows(scores: list[dict[str, Any]]) -> str:
    rows = []
    for s in sorted(scores, key=lambda s: (score_outcome(s) not in FAILING, str(s.get("name")))):
        outcome = score_outcome(s)
        badge = "error" if outcome == "error" else outcome
        why = [_clip(s.get("reason"), 500), _clip(s.get("explanation"))]
        rows.append([
            f"<b>{_e(s.get('name'))}</b>", f'<span class="badge {badge}">{_e(outcome)}</span>',
            _e(_num(s.get("value"))), "<br>".join(w for w in why if w) or "-", _e(s.get("evaluator") or ""),
        ])  # fmt: skip
    return _table(["metric", "result", "value", "reason / explanation", "evaluator"], rows, (2,))


def _group(task_index: int, group: list[Attempt], task: dict[str, Any] | None, loaded: bool) -> str:
    first = group[0]
    outcome = first.outcome
    ids = [_anchor(task_index, a.trial) for a in group]
    extra = "".join(f'<span id="{i}"></span>' for i in ids[1:])
    verdict = " ".join(
        f'<span class="badge {o if o != "scored" else "same"}">{_e(name)} {MARK[o]}</span>'
        for name, o in first.by_metric().items()
    )
    traces = " · ".join(f'trial {a.trial} <code class="tid">{_e(a.trace_id)}</code>' for a in group)
    reference = (task or {}).get("reference")
    body = [
        f'<div class="muted small">{traces} <span class="muted">(<code>evalsi traces show {_e(first.trace_id)}'
        "</code>)</span></div>",
        _score_rows(first.scores),
        _versus(expected_of(reference) if task is not None else None, first.actual, reference, task is not None),
    ]
    if loaded:
        if first.trajectory is None:
            body.append('<div class="muted">trajectory not loaded (trace not found or over the limit)</div>')
        else:
            body.append(_trajectory(first.trajectory, False))
    open_ = " open" if first.failing else ""
    return (
        f'<details class="attempt {outcome}" id="{ids[0]}"{open_} data-outcome="{outcome}" '
        f'data-by="{_json_attr(first.by_metric())}"><summary>{extra}<b>{_e(trials_text(group))}</b> '
        f'<span class="badge {outcome if outcome != "scored" else "same"}">{_e(WORD[outcome])}</span> '
        f"{verdict}</summary>{''.join(body)}</details>"
    )


def _attempts(
    tasks: dict[str, list[Attempt]],
    facts: dict[str, dict[str, Any]] | None,
    shown: set[tuple[str, int]],
    loaded: bool,
) -> str:
    total = sum(len(v) for v in tasks.values())
    scored = [a for v in tasks.values() for a in v if a.outcome != "infra"]
    if not scored:
        return '<section id="attempts"><h2>Attempts</h2><p class="muted">No attempt was scored.</p></section>'
    bad = sum(a.failing for a in scored)
    out = [
        f'<section id="attempts"><h2>Attempts ({len(scored):,} scored, {bad:,} failed or errored)</h2>'
        '<p class="muted">Failed attempts are open, passed ones folded; a task\'s trials that did the same thing '
        "and got the same verdicts are shown once.</p>"
    ]
    hidden = sum(1 for v in tasks.values() for a in v if a.outcome != "infra" and (a.task_id, a.trial) not in shown)
    if hidden:
        out.append(
            f'<p class="more">Showing {total - hidden:,} attempts, failed ones first; {hidden:,} more are left out '
            "(`evalsi runs show` lists every score).</p>"
        )
    for i, (task_id, attempts) in enumerate(tasks.items()):
        visible = [a for a in attempts if (task_id, a.trial) in shown]
        if not visible:
            continue
        task = facts.get(task_id) if facts is not None else None
        failing_n = sum(a.failing for a in attempts)
        head = (
            f'<h3>task <code>{_e(task_id)}</code> <span class="badge {"fail" if failing_n else "pass"}">'
            f"{failing_n} of {len(attempts)} failing</span></h3>"
        )
        given = ""
        if task is not None and task.get("input") is not None:
            given = f'<div class="label">input</div>{_pre(task["input"], 1000)}'
        ranked = sorted(grouped(visible), key=lambda g: (not g[0].failing, g[0].trial))  # failed ones first
        groups = "".join(_group(i, g, task, loaded) for g in ranked)
        out.append(f'<div class="task" data-task="{_e(task_id)}">{head}{given}{groups}</div>')
    out.append("</section>")
    return "".join(out)


def _shown(attempts: list[Attempt]) -> set[tuple[str, int]]:
    """The attempts shown in detail: failing first, then the rest, MAX_EXAMPLES in all."""
    ranked = sorted((a for a in attempts if a.outcome != "infra"), key=lambda a: not a.failing)
    return {(a.task_id, a.trial) for a in ranked[:MAX_EXAMPLES]}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _input_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


SCRIPT = """
(function () {
  var bar = document.getElementById("toolbar");
  if (!bar) return;
  bar.hidden = false;
  var q = document.getElementById("f-task"), oc = document.getElementById("f-outcome"),
      me = document.getElementById("f-metric"), so = document.getElementById("f-sort"),
      shown = document.getElementById("f-shown");
  var rows = Array.prototype.slice.call(document.querySelectorAll("#grid tbody tr"));
  var cards = Array.prototype.slice.call(document.querySelectorAll("#attempts .task"));
  function outcome(el, metric) {
    if (!metric) return el.getAttribute("data-outcome");
    var by = JSON.parse(el.getAttribute("data-by") || "{}");
    return by[metric] || "none";
  }
  function matches(o, want) {
    if (o === "none") return false;
    if (want === "all") return true;
    if (want === "failing") return o === "fail" || o === "error";
    return o === want;
  }
  function apply() {
    var text = q.value.trim().toLowerCase(), want = oc.value, metric = me.value, seen = {}, n = 0;
    rows.forEach(function (row) {
      var any = false;
      row.querySelectorAll("td.cell[data-outcome]").forEach(function (cell) {
        var ok = matches(outcome(cell, metric), want);
        cell.classList.toggle("dim", !ok);
        any = any || ok;
      });
      var show = any && row.getAttribute("data-search").indexOf(text) >= 0;
      row.hidden = !show;
      seen[row.getAttribute("data-task")] = show;
      if (show) n++;
    });
    cards.forEach(function (card) {
      card.hidden = seen[card.getAttribute("data-task")] !== true;
      card.querySelectorAll(".attempt").forEach(function (a) { a.hidden = !matches(outcome(a, metric), want); });
    });
    shown.textContent = n + " of " + rows.length + " tasks shown";
  }
  function rank(el) {
    var order = parseInt(el.getAttribute("data-order"), 10);
    if (so.value === "failing") return [-parseInt(el.getAttribute("data-failing"), 10), order];
    if (so.value === "mean") {
      var m = JSON.parse(el.getAttribute("data-means") || "{}")[me.value];
      return [typeof m === "number" ? m : Infinity, order];
    }
    return [order, 0];
  }
  function sortAll() {
    var keys = {};
    rows.forEach(function (row) { keys[row.getAttribute("data-task")] = rank(row); });
    function cmp(a, b) {
      var x = keys[a.getAttribute("data-task")], y = keys[b.getAttribute("data-task")];
      return x[0] - y[0] || x[1] - y[1];
    }
    [rows, cards].forEach(function (list) {
      list.slice().sort(cmp).forEach(function (el) { el.parentNode.appendChild(el); });
    });
  }
  function reveal() {
    var el = location.hash && document.getElementById(location.hash.slice(1));
    var box = el && el.closest("details");
    if (box) { box.open = true; box.scrollIntoView(); }
  }
  q.addEventListener("input", apply);
  oc.addEventListener("change", apply);
  me.addEventListener("change", function () { apply(); sortAll(); });
  so.addEventListener("change", sortAll);
  window.addEventListener("hashchange", reveal);
  reveal();
  apply();
})();
"""
"""Filter and sort of the grid and the attempts, and opening the attempt a cell links to: small, inline, and the
page reads the same without it."""


def html_report(
    run: dict[str, Any],
    scores: list[dict[str, Any]],
    trajectories: dict[str, dict[str, Any]] | None = None,
    tasks: dict[str, dict[str, Any]] | None = None,
) -> str:
    """The run (`RunResult.to_dict()`), its scores, the trajectories of its traces (by trace id; None: not loaded)
    and its tasks (by id: `input` and `reference`, in the dataset's order; None: not known) as one self-contained
    HTML page. Every value from the run is escaped: task inputs and model outputs are untrusted."""
    title = f"evalsi run {run.get('run_id', '')}"
    manifest = run.get("manifest") or {}
    infra = run.get("infra_errors") or []
    loaded = trajectories is not None
    attempts = attempts_of(scores, trajectories, infra)
    per_task = by_task(attempts, tasks)
    trials = max([_int(manifest.get("trials")), *(a.trial + 1 for a in attempts)])
    inputs = {k: _input_text(v.get("input"))[:300] for k, v in (tasks or {}).items()}
    shown = _shown(attempts)
    body = "".join([
        _header(run, len(failing(scores))),
        _metrics(run),
        _gates(run.get("gates") or []),
        _comparison(run.get("comparison")),
        _calibration(run.get("judge_calibration")),
        _outcomes(per_task, inputs, shown, trials),
        _attempts(per_task, tasks, shown, loaded),
        _infra(infra),
        _manifest(manifest),
    ])  # fmt: skip
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>{body}"
        f"<script>{SCRIPT}</script>"
        f'<footer class="muted"><p>evalsi {_e((run.get("manifest") or {}).get("evalsi_version"))} · '
        "this page is self-contained and loads nothing from the network.</p></footer></body></html>\n"
    )
