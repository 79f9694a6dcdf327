"""`evalsi sessions list|show`: the traces of one conversation or task, together."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.markup import escape

from evalsi.cli.config import ApiOpt, ConfigOpt, JsonOpt, SinceOpt, UntilOpt
from evalsi.cli.render import cost, fail, ms, out, score_line, time_utc
from evalsi.cli.source import open_source, read

app = typer.Typer(help="Read stored sessions: the traces of one conversation or task.", no_args_is_help=True)


@app.command("list")
def sessions_list(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many sessions, most recent first.")] = 20,
    since: SinceOpt = None,
    until: UntilOpt = None,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """List sessions, the most recently active first (--since/--until: its latest trace started then)."""
    given = {"limit": limit, "since": since, "until": until}
    source = open_source(config, api)
    rows = read(source.reader, "list_sessions", {k: v for k, v in given.items() if v is not None})
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        return
    if not rows:
        out.print(f"no sessions in {source.named}", highlight=False, soft_wrap=True)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("SESSION", "TRACES", "FIRST START (UTC)", "LAST END (UTC)", "SPANS", "ERRORS", "TOKENS IN/OUT", "COST",
                "USER"):  # fmt: skip
        table.add_column(col, no_wrap=col != "SESSION")
    for r in rows:
        table.add_row(
            escape(r["session_id"]), str(r["trace_count"]), time_utc(r["start_time_unix_nano"]),
            time_utc(r["end_time_unix_nano"]), str(r["span_count"]), str(r["error_count"] or ""),
            f"{r['input_tokens']}/{r['output_tokens']}", cost(r["cost_usd"]), escape(r["user_id"] or ""),
        )  # fmt: skip
    out.print(table)


@app.command("show")
def sessions_show(
    session_id: Annotated[str, typer.Argument(help="The session id (gen_ai.conversation.id, session.id, ...).")],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Show at most this many traces.")] = 1000,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """Show one session: its traces in the order they started, and its scores (of the session and its traces)."""
    source = open_source(config, api)
    doc = read(source.reader, "show_session", session_id, limit=limit)
    if not doc:
        raise fail(f"session {session_id!r} not found in {source.named}")
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return
    from rich.table import Table

    traces = doc["traces"]
    out.print(f"session [bold]{escape(session_id)}[/]  {len(traces)} traces", highlight=False, soft_wrap=True)
    table = Table(box=None, header_style="bold")
    for col in ("#", "TRACE ID", "START (UTC)", "ROOT", "SPANS", "ERRORS", "LLM", "TOKENS IN/OUT", "COST", "DURATION"):
        table.add_column(col, no_wrap=col != "ROOT")
    for n, r in enumerate(traces, 1):
        table.add_row(
            str(n), r["trace_id"], time_utc(r["start_time_unix_nano"]), escape(r["root_name"]), str(r["span_count"]),
            str(r["error_count"] or ""), str(r["llm_calls"] or ""), f"{r['input_tokens']}/{r['output_tokens']}",
            cost(r["cost_usd"]), ms(r["duration_ns"]),
        )  # fmt: skip
    out.print(table)
    scores = doc["scores"]
    out.print(f"scores: {len(scores)}" if scores else "scores: none yet", highlight=False)
    for r in scores:
        of = f"trace {r['trace_id']}" if r["trace_id"] else "session"
        out.print(f"  {of}  {score_line(r)}", highlight=False)
