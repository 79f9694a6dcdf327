"""`evalsi traces list|show`: stored traces, listed by filters or one shown as a tree of its steps."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from evalsi.cli.config import ApiOpt, ConfigOpt, JsonOpt, SinceOpt, UntilOpt
from evalsi.cli.render import err, fail, label, ms, out, score_line, time_utc, tokens, trace_summary
from evalsi.cli.source import open_source, read

if TYPE_CHECKING:
    from rich.tree import Tree

app = typer.Typer(help="Read stored traces.", no_args_is_help=True)

_MIN_DURATION_HELP = "Only traces lasting at least this long (500ms, 2s, 1m)."
_ATTR_HELP = "KEY=VALUE: only traces with a span or resource attribute of that value; repeat: all must hold."
_FAILED_HELP = "Only traces with a score of this evaluator (e.g. builtin/tool_error) that did not pass."
_WHERE_HELP = "A CEL condition over the trace as policy selectors see it (trace, span, resource, session)."
_SCAN_HELP = "With --where: over how many of the newest traces the other filters match to evaluate it (1000)."


@app.command("list")
def traces_list(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many traces, newest first.")] = 20,
    service: Annotated[str | None, typer.Option("--service", help="Only traces of this service.")] = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    error: Annotated[bool, typer.Option("--error", help="Only traces with a span whose status is ERROR.")] = False,
    model: Annotated[str | None, typer.Option("--model", help="Only traces with a span of this model.")] = None,
    session: Annotated[str | None, typer.Option("--session", help="Only traces of this session id.")] = None,
    min_duration: Annotated[str | None, typer.Option("--min-duration", help=_MIN_DURATION_HELP)] = None,
    attr: Annotated[list[str] | None, typer.Option("--attr", help=_ATTR_HELP)] = None,
    failed: Annotated[str | None, typer.Option("--failed", help=_FAILED_HELP)] = None,
    where: Annotated[str | None, typer.Option("--where", help=_WHERE_HELP)] = None,
    scan: Annotated[int | None, typer.Option("--scan", min=1, max=10_000, help=_SCAN_HELP)] = None,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """List recent traces, newest first, narrowed by the filters given (all must hold)."""
    given = {
        "limit": limit, "service": service, "since": since, "until": until, "error": "true" if error else None,
        "model": model, "session": session, "min_duration": min_duration, "attr": attr or None, "failed": failed,
        "where": where, "scan": scan,
    }  # fmt: skip
    source = open_source(config, api)
    doc = read(source.reader, "search_traces", {k: v for k, v in given.items() if v is not None})
    rows = doc["traces"]
    if doc.get("skipped"):
        err.print(f"[yellow]warning:[/] --where was not evaluated over {len(doc['skipped'])} trace(s) too big to "
                  f"read at once: {', '.join(doc['skipped'][:5])}", highlight=False, soft_wrap=True)  # fmt: skip
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    if not rows:
        filters = ", ".join(f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None and k != "limit")
        of = f" matching {filters}" if filters else " yet"
        out.print(f"no traces{of} in {source.named}", highlight=False, soft_wrap=True)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in (
        "TRACE ID",
        "START (UTC)",
        "SERVICE",
        "ROOT",
        "SPANS",
        "ERRORS",
        "LLM",
        "TOKENS IN/OUT",
        "DURATION",
    ):
        table.add_column(col, no_wrap=col != "ROOT")
    for r in rows:
        table.add_row(
            r["trace_id"], time_utc(r["start_time_unix_nano"]), r["service_name"], r["root_name"],
            str(r["span_count"]), str(r["error_count"] or ""), str(r["llm_calls"] or ""),
            tokens(r["input_tokens"], r["output_tokens"]), ms(r["duration_ns"]),
        )  # fmt: skip
    out.print(table)


@app.command("show")
def traces_show(
    trace_id: Annotated[str, typer.Argument(help="32-hex trace id.")],
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, max=100_000, help="Show at most this many spans, in start order.")
    ] = 10_000,
    offset: Annotated[int, typer.Option("--offset", min=0, help="Skip this many spans first (the next page).")] = 0,
    full: Annotated[
        bool,
        typer.Option("--full", help="Every message of each step, whole (default: its last 3, one line each)."),
    ] = False,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """Show one trace: its steps as a tree (tools, tokens, cost, errors) with each step's conversation (the messages
    in and out, tool arguments and results; redacted values marked), a summary and its scores; every canonical
    field with --json. A trace with more spans than --limit is shown in part, and says so."""
    trace_id = trace_id.strip().lower()
    if len(trace_id) != 32 or any(ch not in "0123456789abcdef" for ch in trace_id):
        raise fail(f"invalid trace id {trace_id!r}: expected 32 hex digits")
    source = open_source(config, api)
    doc = read(source.reader, "read_trace", trace_id, limit=limit, offset=offset)
    if not doc:
        raise fail(f"trace {trace_id} not found in {source.named}")
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return
    spans: list[dict[str, Any]] = doc["spans"]
    total: int = doc["span_count"]
    if not spans:
        raise fail(f"trace {trace_id} holds {total:,} spans: none from --offset {offset:,}")
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        parent = s["parent_span_id"] if s["parent_span_id"] in ids else ""
        children.setdefault(parent, []).append(s)
    from rich.tree import Tree

    count = f"{total:,} spans" if not doc["truncated"] else f"spans {offset + 1:,}-{offset + len(spans):,} of {total:,}"
    tree = Tree(f"trace [bold]{trace_id}[/]  {count}  {escape(spans[0]['service_name'])}")

    from evalsi.cli.transcript import conversation

    def add(node: Tree, parent: str) -> None:
        for s in children.get(parent, []):
            cost = f"  ${s['cost_usd']:.4g}" if s.get("cost_usd") else ""
            step = node.add(label(s) + cost)
            for line in conversation(s, full=full):
                step.add(line)
            add(step, s["span_id"])

    add(tree, "")
    out.print(tree)
    out.print(trace_summary(spans, shown=" (of the spans shown)" if doc["truncated"] else ""), highlight=False)
    scores = doc.get("scores") or []
    out.print(f"scores: {len(scores)}" if scores else "scores: none yet", highlight=False)
    for r in scores:
        out.print("  " + score_line(r), highlight=False)
    if doc["truncated"]:
        more = f"; the next {limit:,}: --offset {doc['next_offset']}" if doc.get("next_offset") else ""
        err.print(f"[yellow]note:[/] the trace holds {total:,} spans; this shows {len(spans):,} of them, from "
                  f"offset {offset:,}{more}", highlight=False, soft_wrap=True)  # fmt: skip
