"""`evalsi alerts list`: when each policy alert fired and resolved, and the values its condition read."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from evalsi.cli.api import Api
from evalsi.cli.config import ApiOpt, ConfigOpt, JsonOpt
from evalsi.cli.render import fail, num, out, time_utc
from evalsi.cli.source import open_source, read

app = typer.Typer(help="Policy alerts: when each fired and resolved.", no_args_is_help=True)


@app.command("list")
def alerts_list(
    policy: Annotated[str | None, typer.Option("--policy", help="Only alerts of this policy.")] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="Since: a duration back from now (30m, 1d) or an ISO-8601 time (default: ever)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many, newest first.")] = 100,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """List policy alerts, newest first: each firing (once per window whose condition held) and each resolution
    (a window closed without it holding), with the values its condition read."""
    if since is not None:
        from evalsi.collector.query import alerts_since_ns

        try:
            alerts_since_ns(since)
        except ValueError as e:
            raise fail(f"--since: {e}") from None
    source = open_source(config, api)
    url = getattr(source.reader, "url", None)  # an API reader (ours for --api, or the query module's)
    if url is not None:
        try:
            rows = Api(url).get("/api/v1/alerts", "alerts", limit=limit, policy=policy, since=since)
        finally:
            source.reader.close()
    else:
        rows = read(source.reader, "list_alerts", limit=limit, policy=policy, since=since)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        return
    if not rows:
        of = f" of policy {policy}" if policy else ""
        when = ""
        if since:
            from evalsi.duration import parse_duration

            try:
                parse_duration(since)
                when = f" in the last {since}"
            except ValueError:  # an ISO-8601 time
                when = f" since {since}"
        out.print(f"no alerts{of}{when} in {source.named}", highlight=False, soft_wrap=True)
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("TIME (UTC)", "POLICY", "ALERT", "STATE", "CONDITION", "VALUES", "WINDOW (UTC)", "TRACES"):
        table.add_column(col, no_wrap=col not in ("CONDITION", "VALUES"))
    for r in rows:
        state = "[red]firing[/]" if r["state"] == "firing" else r["state"]
        values = ", ".join(f"{k} = {num(v) if isinstance(v, float) else v}" for k, v in r["values"].items())
        window = (
            f"{time_utc(r['window_start_unix_ms'] * 10**6)[:-4]} .. {time_utc(r['window_end_unix_ms'] * 10**6)[11:-4]}"
        )
        table.add_row(
            time_utc(r["timestamp_unix_nano"]), escape(r["policy"]), escape(r["alert"]), state,
            escape(r["condition"]), escape(values), window, str(r["count"]),
        )  # fmt: skip
    out.print(table)
