"""How the commands print: the two consoles, an error, and the pieces of a table or a trace tree (times, durations,
tokens, costs, a span's label, a trace's summary, a score's line)."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

# piped output gets a wide console so ids are never cut
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `error: <message>` to stderr; the `typer.Exit` to raise, with `code`."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)  # `[x]` in it is text
    return typer.Exit(code)


def time_utc(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def ms(ns: int) -> str:
    return f"{ns / 1e6:,.1f} ms"


def tokens(tokens_in: int | None, tokens_out: int | None) -> str:
    """`in/out`, or `-` for a trace no span of which counted tokens (not an LLM trace, or not instrumented so)."""
    return f"{tokens_in or 0}/{tokens_out or 0}" if tokens_in or tokens_out else "-"


def cost(usd: float | None) -> str:
    return "" if not usd else f"${usd:.4g}"


def num(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


def label(s: dict[str, Any]) -> str:
    """A span as one tree node: name, step type, model, tool, tokens, duration, error, and whether content was kept."""
    parts = [f"[bold]{s['name']}[/]", f"[cyan]{s['step_type']}[/]"]
    if s.get("model"):
        parts.append(s["model"])
    if s.get("tool_name"):
        parts.append(f"tool={s['tool_name']}")
    if s.get("input_tokens") is not None or s.get("output_tokens") is not None:
        parts.append(f"tokens {s.get('input_tokens') or 0}/{s.get('output_tokens') or 0}")
    parts.append(ms(s["duration_ns"]))
    if s["status_code"] == "ERROR":
        parts.append(f"[red]ERROR {s['status_message']}[/]")
    if not s.get("content_captured") and s["step_type"] != "other":
        parts.append("[dim](no content)[/]")
    return "  ".join(parts)


def trace_summary(spans: list[dict[str, Any]], shown: str) -> str:
    """One line over a trace's spans: steps by type, tools called, tokens, cost, errors."""
    steps: dict[str, int] = {}
    tools: dict[str, None] = {}
    for s in spans:
        steps[s["step_type"]] = steps.get(s["step_type"], 0) + 1
        if s.get("tool_name"):
            tools[s["tool_name"]] = None
    tokens_in = sum(s.get("input_tokens") or 0 for s in spans)
    tokens_out = sum(s.get("output_tokens") or 0 for s in spans)
    usd = sum(s.get("cost_usd") or 0.0 for s in spans)
    errors = sum(s["status_code"] == "ERROR" for s in spans)
    parts = [
        "steps " + (", ".join(f"{kind} {n}" for kind, n in steps.items() if kind != "other") or "none"),
        "tools " + (", ".join(escape(t) for t in tools) or "none"),
        f"tokens {tokens_in}/{tokens_out}",
        f"cost ${usd:.4g}",
        f"errors {errors}",
    ]
    return "  ".join(parts) + shown


def score_line(r: dict[str, Any]) -> str:
    """A score as one line: where it came from, its value, whether it passed, and why."""
    value = "" if r["value"] is None else f" {r['value']:.4g}"
    passed = "" if r["passed"] is None else (" passed" if r["passed"] else " [red]failed[/]")
    outcome = "" if r["outcome"] == "scored" else f" [yellow]{r['outcome']}[/]"
    why = r.get("reason") or r.get("label") or ""
    where = "/".join(escape(x) for x in (r["policy"], r["evaluator"]) if x)
    return f"{where} [bold]{escape(r['name'])}[/]{value}{passed}{outcome}" + (f"  {escape(why)}" if why else "")
