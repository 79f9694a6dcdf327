"""`evalsi policies stats`: each online policy's scores over the last window, with their intervals."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from evalsi.cli.api import Api
from evalsi.cli.config import ApiOpt, ConfigOpt, JsonOpt
from evalsi.cli.render import fail, num, out
from evalsi.cli.source import open_source

if TYPE_CHECKING:
    from evalsi.collector.query import TraceReader

app = typer.Typer(help="Online evaluation policies: their window aggregates.", no_args_is_help=True)


def _policy_stats(reader: TraceReader, window: str, policy: str | None) -> dict[str, Any]:
    import time

    from evalsi.duration import parse_duration

    try:
        seconds = parse_duration(window)
    except ValueError as e:
        raise fail(f"--window: {e}") from None
    try:
        url = getattr(reader, "url", None)  # an API reader (ours for --api, or the query module's)
        if url is not None:
            return Api(url).get("/api/v1/policies/stats", window=window, policy=policy)
        from evalsi.collector.query import StoreReader
        from evalsi.collector.score_api import window_stats

        assert isinstance(reader, StoreReader)
        since_ns = time.time_ns() - int(seconds * 1e9)
        rows = reader.store.score_window_stats(since_ns=since_ns, policy=policy)  # no collector runs: read the store
        return {"window": window, "since_unix_nano": since_ns, "stats": window_stats(rows)}
    except typer.Exit:
        raise
    except Exception as e:  # a store error from the engine: say where, not a traceback
        raise fail(f"reading from the {reader.where} failed: {e}") from None
    finally:
        reader.close()


@app.command("stats")
def policies_stats(
    window: Annotated[str, typer.Option("--window", help="How far back: the last 5m, 1h, ...")] = "5m",
    policy: Annotated[str | None, typer.Option("--policy", help="Only this policy.")] = None,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """Scored scores of the last window per policy, evaluator and name: n, mean with a 95% interval, p50/p95."""
    source = open_source(config, api)
    doc = _policy_stats(source.reader, window, policy)
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return
    if not doc["stats"]:
        of = f" of policy {policy}" if policy else ""
        out.print(f"no scored scores{of} in the last {window} in {source.named}", highlight=False, soft_wrap=True)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("POLICY", "EVALUATOR", "NAME", "N", "MEAN", "95% INTERVAL", "METHOD", "P50", "P95"):
        table.add_column(col, no_wrap=True)
    for r in doc["stats"]:
        mean = num(r["mean"]) + (" pass" if r["kind"] == "pass_fail" else "")
        interval = f"{num(r['interval'][0])} .. {num(r['interval'][1])}" if r["interval"] else ""
        table.add_row(
            r["policy"], r["evaluator"], r["name"], str(r["n"]), mean, interval, r.get("method") or "",
            num(r["p50"]), num(r["p95"]),
        )  # fmt: skip
    out.print(table)
