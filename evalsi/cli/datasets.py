"""`evalsi datasets list/export`: the datasets policies promoted into the store (`promote_to: store`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import typer

from evalsi.cli.api import Api
from evalsi.cli.config import ApiOpt, ConfigOpt, JsonOpt
from evalsi.cli.render import fail, out, time_utc
from evalsi.cli.source import open_source, read

app = typer.Typer(help="Datasets policies promoted into the store.", no_args_is_help=True)


@app.command("list")
def datasets_list(as_json: JsonOpt = False, config: ConfigOpt = None, api: ApiOpt = None) -> None:
    """List the promoted datasets: rows, first and last promotion."""
    source = open_source(config, api)
    url = getattr(source.reader, "url", None)  # an API reader (ours for --api, or the query module's)
    if url is not None:
        try:
            rows = Api(url).get("/api/v1/datasets", "datasets")
        finally:
            source.reader.close()
    else:
        rows = read(source.reader, "list_datasets")
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        return
    if not rows:
        out.print(f"no promoted datasets in {source.named}", highlight=False, soft_wrap=True)
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("PROJECT", "DATASET", "ROWS", "FIRST (UTC)", "LAST (UTC)"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(
            escape(r["project"]), escape(r["dataset"]), str(r["rows"]), time_utc(r["first_unix_nano"]),
            time_utc(r["last_unix_nano"]),
        )  # fmt: skip
    out.print(table)


@app.command("export")
def datasets_export(
    dataset: Annotated[str, typer.Argument(help="The dataset, as the policy's `promote.dataset` names it.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the JSONL here (default: standard output).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=1_000_000, help="Rows at most.")] = 100_000,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """Write a promoted dataset as JSONL, one row a line in promotion order: what `evalsi run --dataset` reads."""
    source = open_source(config, api)
    url = getattr(source.reader, "url", None)
    if url is not None:
        try:
            path = f"/api/v1/datasets/{quote(dataset, safe='')}/rows"
            rows = Api(url).get(path, "rows", missing=[], limit=limit) or None
        finally:
            source.reader.close()
    else:
        rows = read(source.reader, "dataset_rows", dataset, limit=limit)
    if rows is None:
        raise fail(f"dataset {dataset!r} has no rows in {source.named}")
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if output is None:
        sys.stdout.write(text)
        return
    output.write_text(text, encoding="utf-8")
    out.print(f"{len(rows)} rows of {dataset} written to {output}", highlight=False, soft_wrap=True)
