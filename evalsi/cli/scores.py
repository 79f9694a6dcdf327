"""`evalsi scores list`: stored scores, newest first."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from evalsi.cli.config import ApiOpt, ConfigOpt, JsonOpt
from evalsi.cli.render import out, time_utc
from evalsi.cli.source import open_source, read

app = typer.Typer(help="Read stored scores.", no_args_is_help=True)


@app.command("list")
def scores_list(
    trace: Annotated[str | None, typer.Option("--trace", help="Only scores of this trace id.")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Only scores of this policy.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many, newest first.")] = 100,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """List scores, newest first; each (trace, span, policy, evaluator, name, run, trial) once."""
    source = open_source(config, api)
    rows = read(source.reader, "list_scores", limit=limit, trace_id=trace, policy=policy)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        return
    if not rows:
        of = " and".join(f" {what} {v}" for what, v in (("of trace", trace), ("of policy", policy)) if v)
        out.print(f"no scores{of} yet in {source.named}", highlight=False, soft_wrap=True)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    columns = ("TIME (UTC)", "TRACE ID", "POLICY", "EVALUATOR", "NAME", "OUTCOME", "VALUE", "PASSED", "REASON / LABEL")
    for col in columns:
        table.add_column(col, no_wrap=col != "REASON / LABEL")
    for r in rows:
        value = "" if r["value"] is None else f"{r['value']:.4g}"
        passed = "" if r["passed"] is None else ("yes" if r["passed"] else "[red]no[/]")
        table.add_row(
            time_utc(r["timestamp_unix_nano"]), r["trace_id"], r["policy"], r["evaluator"], r["name"], r["outcome"],
            value, passed, r["reason"] or r["label"] or "",
        )  # fmt: skip
    out.print(table)
