"""`evalsi evaluators list`: the evaluators this evalsi knows."""

from __future__ import annotations

import json
import sys

import typer

from evalsi.cli.config import JsonOpt
from evalsi.cli.render import out

app = typer.Typer(help="The evaluators this evalsi knows.", no_args_is_help=True)


@app.command("list")
def evaluators_list(as_json: JsonOpt = False) -> None:
    """List every evaluator ref with its scope, requirements, version and params."""
    from evalsi.evaluators import load_evaluators

    rows = [
        {
            "ref": ev.name,
            "scope": ev.scope,
            "requires": list(ev.requires),
            "version": ev.version,
            "description": ev.description,
            "params": ev.params.model_json_schema().get("properties", {}),
        }
        for ev in sorted(load_evaluators().values(), key=lambda e: e.name)
    ]
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("REF", "SCOPE", "REQUIRES", "VERSION", "PARAMS", "DESCRIPTION"):
        table.add_column(col, no_wrap=col in ("REF", "SCOPE"))
    for r in rows:
        table.add_row(
            r["ref"], r["scope"], ", ".join(r["requires"]) or "-", r["version"], ", ".join(r["params"]) or "-",
            r["description"],
        )  # fmt: skip
    out.print(table)
