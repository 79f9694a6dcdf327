"""`evalsi import mlflow|phoenix|langfuse`: a time range of another tool's traces through the pipeline, once.

(`evalsi import atif|inspect`, of offline runs, are the harness's: `evalsi.run_harness.commands`.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from evalsi.cli.render import err, fail, out
from evalsi.run_harness import commands

SinceOpt = Annotated[str, typer.Option("--since", help="From: a duration back from now (2h, 7d) or ISO-8601 time.")]
UntilOpt = Annotated[
    str | None, typer.Option("--until", help="Up to (not including): a duration back or a time; default: now.")
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Count what would be imported; send nothing.")]
PageSizeOpt = Annotated[int, typer.Option("--page-size", min=1, max=500, help="Traces a listing request returns.")]
ImportJsonOpt = Annotated[bool, typer.Option("--json", help="Print the counts as JSON.")]


def _import_traces(
    tool: str,
    address: str,
    make_sources: Any,
    *,
    since: str,
    until: str | None,
    dry_run: bool,
    page_size: int,
    collector: str | None,
    config: Path | None,
    as_json: bool,
) -> None:
    """What every `evalsi import <tool>` of traces does: the range, the pull receiver's sources
    (`make_sources()` -> (sources, their HTTP client)), the backfill into a collector (or a count on a dry run),
    a progress bar, and what it did."""
    import dataclasses
    import time

    import httpx

    from evalsi.collector.query import SearchError, parse_time
    from evalsi.receivers.pull.backfill import CollectorTarget, backfill
    from evalsi.receivers.pull.poll import SourceError
    from evalsi.run_harness.collector import CollectorError

    now = time.time_ns()
    try:
        since_ms = parse_time("since", since, now) // 1_000_000
        until_ms = parse_time("until", until, now) // 1_000_000 if until else now // 1_000_000 + 1
    except SearchError as e:
        raise fail(str(e), 2) from None
    if until_ms <= since_ms:
        raise fail(f"--until ({until}) is not after --since ({since})", 2)
    sources, client = make_sources()
    local = None
    target = None
    if not dry_run:
        try:
            link, local = commands.link_to_collector(collector, config)
        except CollectorError as e:
            raise fail(str(e)) from None
        target = CollectorTarget(link.otlp_url, link.api_url)
    bar = None
    progress = None
    if err.is_terminal and not as_json:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeRemainingColumn

        bar = Bar(
            TextColumn("[bold]traces"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err,
            transient=True,
        )  # fmt: skip
        task = bar.add_task("traces", total=None)
        bar.start()

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

    try:
        result = backfill(
            sources, since_ms, until_ms, page_size=page_size, target=target, progress=progress, clients=[client]
        )
    except SourceError as e:
        raise fail(str(e)) from None
    except httpx.HTTPError as e:
        raise fail(f"cannot reach {tool} at {address}: {e}; is the server running?") from None
    finally:
        if bar is not None:
            bar.stop()
        if target is not None:
            target.close()
        if local is not None:
            local.stop()  # drains every buffer into the store and the scores' exporters
    counts = dataclasses.asdict(result)
    counts["dry_run"] = dry_run
    if as_json:
        out.print_json(json.dumps(counts))
        return
    verb = "would import" if dry_run else "imported"
    out.print(
        f"{verb} {result.traces:,} traces ({result.spans:,} spans) from {', '.join(result.sources)}"
        + (f"; {result.stored_already:,} spans were stored already" if result.stored_already else "")
        + (f"; {result.running:,} traces still running, left out" if result.running else ""),
        highlight=False,
    )


def import_mlflow(
    tracking_uri: Annotated[str, typer.Option("--tracking-uri", help="The MLflow tracking server (http://host:port).")],
    experiment: Annotated[
        list[str], typer.Option("--experiment", "-e", help="An experiment to read, by name or id (repeatable).")
    ],
    since: SinceOpt,
    until: UntilOpt = None,
    dry_run: DryRunOpt = False,
    page_size: PageSizeOpt = 100,
    collector: commands.CollectorOpt = None,
    config: commands.ConfigOpt = None,
    as_json: ImportJsonOpt = False,
) -> None:
    """Import the traces of MLflow experiments started in a time range through the pipeline (normalize, evaluate,
    the store, the scores' exporters: those of the config or of the running collector), as the `mlflow` receiver
    does online. Spans the store holds already are left out: a trace is stored and scored once."""
    import httpx

    from evalsi.receivers.pull.mlflow import MlflowReceiverConfig, MlflowSource

    try:
        cfg = MlflowReceiverConfig(tracking_uri=tracking_uri, experiments=experiment, page_size=page_size)
    except ValueError as e:
        raise fail(f"--tracking-uri / --experiment: {e}", 2) from None

    def sources() -> tuple[list[Any], httpx.AsyncClient]:
        client = httpx.AsyncClient(base_url=cfg.tracking_uri, headers=cfg.headers, timeout=cfg.timeout)
        return [MlflowSource(client, cfg.tracking_uri, e) for e in cfg.experiments], client

    _import_traces(
        "MLflow", cfg.tracking_uri, sources, since=since, until=until, dry_run=dry_run, page_size=page_size,
        collector=collector, config=config, as_json=as_json,
    )  # fmt: skip


def import_phoenix(
    endpoint: Annotated[str, typer.Option("--endpoint", help="The Phoenix server (http://host:port).")],
    project: Annotated[
        list[str], typer.Option("--project", "-p", help="A project to read, by name or id (repeatable).")
    ],
    since: SinceOpt,
    until: UntilOpt = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", envvar="PHOENIX_API_KEY", help="Phoenix's API key, when it has auth on.", show_default=False
        ),
    ] = None,
    settle: Annotated[
        str,
        typer.Option("--settle", help="Leave out traces that started this recently (Phoenix may still lack spans)."),
    ] = "30s",
    dry_run: DryRunOpt = False,
    page_size: PageSizeOpt = 100,
    collector: commands.CollectorOpt = None,
    config: commands.ConfigOpt = None,
    as_json: ImportJsonOpt = False,
) -> None:
    """Import the traces of Phoenix projects started in a time range through the pipeline (normalize, evaluate,
    the store, the scores' exporters: those of the config or of the running collector), as the `phoenix` receiver
    does online. Spans the store holds already are left out: a trace is stored and scored once."""
    import httpx

    from evalsi.receivers.pull.phoenix import PhoenixReceiverConfig, PhoenixSource

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        cfg = PhoenixReceiverConfig(
            endpoint=endpoint, projects=project, headers=headers, settle=settle, page_size=page_size
        )
    except ValueError as e:
        raise fail(f"--endpoint / --project / --settle: {e}", 2) from None

    def sources() -> tuple[list[Any], httpx.AsyncClient]:
        client = httpx.AsyncClient(
            base_url=cfg.endpoint, headers={**cfg.headers, "Accept": "application/json"}, timeout=cfg.timeout
        )
        return [PhoenixSource(client, cfg.endpoint, p, cfg.settle) for p in cfg.projects], client

    _import_traces(
        "Phoenix", cfg.endpoint, sources, since=since, until=until, dry_run=dry_run, page_size=page_size,
        collector=collector, config=config, as_json=as_json,
    )  # fmt: skip


def import_langfuse(
    host: Annotated[str, typer.Option("--host", help="The Langfuse server (https://cloud.langfuse.com).")],
    since: SinceOpt,
    until: UntilOpt = None,
    public_key: Annotated[
        str, typer.Option("--public-key", envvar="LANGFUSE_PUBLIC_KEY", help="The project's public key.")
    ] = "",
    secret_key: Annotated[
        str,
        typer.Option(
            "--secret-key", envvar="LANGFUSE_SECRET_KEY", help="The project's secret key.", show_default=False
        ),
    ] = "",
    service_name: Annotated[
        str, typer.Option("--service-name", help="The imported spans' service.name (trace.service_name).")
    ] = "langfuse",
    settle: Annotated[
        str, typer.Option("--settle", help="Leave out traces that started this recently (Langfuse may lag).")
    ] = "30s",
    dry_run: DryRunOpt = False,
    page_size: PageSizeOpt = 100,
    collector: commands.CollectorOpt = None,
    config: commands.ConfigOpt = None,
    as_json: ImportJsonOpt = False,
) -> None:
    """Import the traces of a Langfuse project (the one its keys choose) started in a time range through the
    pipeline (normalize, evaluate, the store, the scores' exporters: those of the config or of the running
    collector), as the `langfuse` receiver does online. Spans the store holds already are left out: a trace is
    stored and scored once."""
    import base64

    import httpx

    from evalsi.receivers.pull.langfuse import LangfuseReceiverConfig, LangfuseSource

    try:
        cfg = LangfuseReceiverConfig(
            host=host, public_key=public_key, secret_key=secret_key, service_name=service_name, settle=settle,
            page_size=page_size,
        )  # fmt: skip
    except ValueError as e:
        raise fail(f"--host / --public-key / --secret-key / --settle: {e}", 2) from None

    def sources() -> tuple[list[Any], httpx.AsyncClient]:
        auth = base64.b64encode(f"{cfg.public_key}:{cfg.secret_key}".encode()).decode()
        client = httpx.AsyncClient(base_url=cfg.host, headers={"Authorization": f"Basic {auth}"}, timeout=cfg.timeout)
        return [LangfuseSource(client, cfg.host, cfg.settle, cfg.service_name)], client

    _import_traces(
        "Langfuse", cfg.host, sources, since=since, until=until, dry_run=dry_run, page_size=page_size,
        collector=collector, config=config, as_json=as_json,
    )  # fmt: skip
