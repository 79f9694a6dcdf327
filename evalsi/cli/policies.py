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


def _policy_stats(
    reader: TraceReader, window: str, policy: str | None, baseline: str | None, margin: float, worse: str
) -> dict[str, Any]:
    import time

    from evalsi.collector.score_api import check_comparison
    from evalsi.duration import parse_duration

    try:
        seconds = parse_duration(window)
    except ValueError as e:
        raise fail(f"--window: {e}") from None
    try:
        check_comparison(baseline, margin, worse)
    except ValueError as e:
        raise fail(f"--{e}") from None
    try:
        url = getattr(reader, "url", None)  # an API reader (ours for --api, or the query module's)
        if url is not None:
            return Api(url).get(
                "/api/v1/policies/stats", window=window, policy=policy, baseline=baseline, margin=margin, worse=worse
            )
        from evalsi.collector.query import StoreReader
        from evalsi.collector.score_api import policy_stats

        assert isinstance(reader, StoreReader)
        since_ns = time.time_ns() - int(seconds * 1e9)
        return policy_stats(  # no collector runs: read the store
            reader.store, window=window, since_ns=since_ns, policy=policy, baseline=baseline, margin=margin,
            worse=worse,
        )  # fmt: skip
    except typer.Exit:
        raise
    except Exception as e:  # a store error from the engine: say where, not a traceback
        raise fail(f"reading from the {reader.where} failed: {e}") from None
    finally:
        reader.close()


def _interval(low: Any, high: Any) -> str:
    return f"{num(low)} .. {num(high)}" if low is not None and high is not None else ""


@app.command("stats")
def policies_stats(
    window: Annotated[str, typer.Option("--window", help="How far back: the last 5m, 1h, ...")] = "5m",
    policy: Annotated[str | None, typer.Option("--policy", help="Only this policy.")] = None,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="Compare with the period before the window (7d) or an offline run (run:ID)."),
    ] = None,
    margin: Annotated[float, typer.Option("--margin", help="With --baseline: a drop beyond it regresses.")] = 0.0,
    worse: Annotated[
        str, typer.Option("--worse", help="With --baseline: lower (default) or higher is worse.")
    ] = "lower",
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """Scored scores of the last window per policy, evaluator and name: n, mean with a 95% interval, p50/p95; with
    --baseline, the difference with it (95% interval, Newcombe or Welch); and how far judges agree with people."""
    source = open_source(config, api)
    doc = _policy_stats(source.reader, window, policy, baseline, margin, worse)
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return
    if not doc["stats"]:
        of = f" of policy {policy}" if policy else ""
        out.print(f"no scored scores{of} in the last {window} in {source.named}", highlight=False, soft_wrap=True)
        return
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    columns = ["POLICY", "EVALUATOR", "NAME", "N", "MEAN", "95% INTERVAL", "METHOD", "P50", "P95"]
    if baseline:
        columns += [f"VS {baseline.upper()}", "95% INTERVAL", "TEST", "REGRESSED"]
    for col in columns:
        table.add_column(col, no_wrap=True)
    for r in doc["stats"]:
        mean = num(r["mean"]) + (" pass" if r["kind"] == "pass_fail" else "")
        interval = f"{num(r['interval'][0])} .. {num(r['interval'][1])}" if r["interval"] else ""
        row = [
            r["policy"], r["evaluator"], r["name"], str(r["n"]), mean, interval, r.get("method") or "",
            num(r["p50"]), num(r["p95"]),
        ]  # fmt: skip
        if baseline:
            c = r.get("comparison")
            row += (
                [
                    f"{c['difference']:+.4g}",
                    _interval(c["low"], c["high"]),
                    c["method"],
                    "yes" if c["regressed"] else "no",
                ]
                if c
                else ["", "", "", "no baseline"]
            )
        table.add_row(*row)
    out.print(table)
    if doc.get("calibration"):
        judges = Table(box=None, header_style="bold", title="judges against people", title_justify="left")
        for col in ("POLICY", "EVALUATOR", "NAME", "FEEDBACK", "N", "KAPPA (95%)", "SENSITIVITY", "SPECIFICITY",
                    "RATE (PPI, 95%)", "JUDGE'S RATE"):  # fmt: skip
            judges.add_column(col, no_wrap=True)
        for c in doc["calibration"]:
            k, sens, spec, ppi = c["kappa"], c["sensitivity"], c["specificity"], c["ppi"]
            judges.add_row(
                c["policy"], c["evaluator"], c["name"], c["feedback"], str(c["n"]),
                f"{num(k['kappa'])} ({_interval(k['low'], k['high'])})" if k else "",
                f"{num(sens[0])} ({_interval(sens[1], sens[2])})" if sens else "",
                f"{num(spec[0])} ({_interval(spec[1], spec[2])})" if spec else "",
                f"{num(ppi['estimate'])} ({_interval(ppi['low'], ppi['high'])})" if ppi else "",
                num(ppi["judge_mean"]) if ppi else "",
            )  # fmt: skip
        out.print(judges)
