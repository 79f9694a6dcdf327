"""The offline commands of the CLI: `evalsi run`, `evalsi runs list|show`, `evalsi compare`."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

# the CLI imports this module to list its commands: everything heavier is imported by the command that needs it
if TYPE_CHECKING:
    from rich.progress import Progress as Bar

    from evalsi.run_harness.cassette import Cassette
    from evalsi.run_harness.collector import CollectorLink, InProcessCollector
    from evalsi.run_harness.runner import Progress
    from evalsi.run_harness.spec import RunSpec

out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True)
runs_app = typer.Typer(help="Offline runs stored in the collector: their manifests, aggregates and gates.",
                       no_args_is_help=True)  # fmt: skip

USAGE, GATE_FAILED = 2, 1


def _fail(message: str, code: int = USAGE) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


CollectorOpt = Annotated[
    str | None,
    typer.Option("--collector", help="A running collector's API URL (e.g. http://127.0.0.1:8080); default: the "
                 "`evalsi serve` serving the config's store, else an in-process collector on that store."),
]  # fmt: skip
ConfigOpt = Annotated[Path | None, typer.Option("-c", "--config", help="Collector config (YAML); default: defaults.")]


def _load_config(config: Path | None) -> Any:
    from evalsi.collector.config import ConfigError, load_config
    from evalsi.run_harness.collector import CollectorError

    try:
        return load_config(config)
    except ConfigError as e:
        raise CollectorError(str(e)) from None


def link_to_collector(collector: str | None, config: Path | None) -> tuple[CollectorLink, InProcessCollector | None]:
    """`--collector`; else the `evalsi serve` serving the store the config names (never a collector that merely
    answers on the config's API port: it may serve another store); else a collector started in this process on
    that store. A collector another `evalsi run` started is never used: it stops when its run ends."""
    from evalsi.collector.query import serving_api
    from evalsi.run_harness.collector import CollectorError, InProcessCollector, remote
    from evalsi.store import StoreBusy

    if collector:
        return remote(collector), None
    try:
        served = serving_api(_load_config(config), runs=False)
    except StoreBusy as e:
        raise CollectorError(str(e)) from None
    if served is not None:
        return remote(served), None
    local = InProcessCollector(config)
    return local.start(), local


class _Display:
    """A progress bar on a terminal; plain lines every 5 s (and at the end) otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeRemainingColumn

        self.enabled = enabled and total > 0
        self.tty = err.is_terminal
        self._last = 0.0
        self._bar: Bar | None = None
        if self.enabled and self.tty:
            self._bar = Bar(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[errors]} infra errors · {task.fields[cost]}"), TimeRemainingColumn(),
                console=err, transient=True,
            )  # fmt: skip
            self._task = self._bar.add_task("attempts", total=total, errors=0, cost="")
            self._bar.start()

    def update(self, p: Progress) -> None:
        if not self.enabled:
            return
        cost = f"{p.cost_usd:.4f} USD" if p.cost_usd else f"{p.tokens:,} tokens" if p.tokens else ""
        if self._bar is not None:
            self._bar.update(self._task, completed=p.done, errors=p.infra_errors, cost=cost)
        elif time.monotonic() - self._last >= 5 or p.done == p.total:
            self._last = time.monotonic()
            err.print(f"{p.done}/{p.total} attempts, {p.infra_errors} infra errors {cost}".rstrip(), highlight=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def run_command(
    file: Annotated[Path, typer.Option("-f", "--file", help="The EvalRun file (YAML).")],
    collector: CollectorOpt = None,
    config: ConfigOpt = None,
    resume: Annotated[
        str | None, typer.Option("--resume", help="Continue this run id, skipping finished attempts.")
    ] = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="Compare with this run id (paired).")] = None,
    report: Annotated[list[Path] | None, typer.Option("--report", help="Write a report: out.md or out.html.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N tasks.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Another model for an openai or http target.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (every aggregate).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress display.")] = False,
    record: Annotated[
        Path | None, typer.Option("--record", help="Keep every model and tool call in this cassette directory.")
    ] = None,
    replay: Annotated[
        Path | None, typer.Option("--replay", help="Answer model and tool calls from this cassette (no network).")
    ] = None,
    from_step: Annotated[
        int | None,
        typer.Option("--from-step", min=0, help="With --replay: replay the first N calls, make the rest live."),
    ] = None,
) -> None:
    """Run an agent over a dataset for N trials; its traces go through the collector, which scores them with the
    run's evaluators. Exit 0 when every gate holds, 1 when one fails, 2 when the run could not be done."""
    import asyncio

    from evalsi.run_harness.cassette import Cassette
    from evalsi.run_harness.collector import CollectorError
    from evalsi.run_harness.dataset import DatasetError, load_dataset
    from evalsi.run_harness.report import print_summary
    from evalsi.run_harness.runner import RunFailed
    from evalsi.run_harness.spec import RunSpecError, load_run
    from evalsi.run_harness.targets.base import TargetError

    try:
        spec = load_run(file)
        if model:
            spec = spec.with_model(model)
        dataset = load_dataset(
            spec.path(spec.body.dataset.path), limit or spec.body.dataset.limit, spec.body.dataset.format
        )
        cassette = (
            Cassette(record_dir=record, replay_dir=replay, from_step=from_step)
            if record or replay or from_step is not None
            else None
        )
    except (RunSpecError, DatasetError, ValueError) as e:
        raise _fail(str(e)) from None
    for path in report or []:
        if path.suffix not in (".md", ".html"):
            raise _fail(f"--report {path}: use a .md or .html file")
    try:
        link, local = link_to_collector(collector, config)
    except CollectorError as e:
        raise _fail(str(e)) from None
    err.print(f"run {spec.name}: {link.where}, {link.store}", highlight=False, soft_wrap=True)
    display = _Display(len(dataset.tasks) * spec.body.trials, not quiet and not as_json)
    try:
        try:
            result = asyncio.run(_run(spec, dataset, link, resume, baseline, display, cassette))
        finally:
            display.close()
        run = result.to_dict()
        if report:
            trajectories = _report_trajectories(link.api_url, result.scores)
            for path in report:
                _write_report(path, run, result.scores, trajectories, report_tasks(dataset.tasks))
    except (RunFailed, TargetError, CollectorError) as e:
        raise _fail(str(e)) from None
    finally:
        if local is not None:
            local.stop()
    if as_json:
        out.print_json(json.dumps(run, default=str))
    else:
        print_summary(out, run)
        if local is not None:
            out.print(f"traces and scores stored in the {link.where}; `evalsi runs show {result.run_id}` reads them")
    if not result.passed:
        raise typer.Exit(GATE_FAILED)


async def _run(
    spec: RunSpec,
    dataset: Any,
    link: CollectorLink,
    resume: str | None,
    baseline: str | None,
    display: _Display,
    cassette: Cassette | None = None,
) -> Any:
    from evalsi.run_harness.runner import Runner
    from evalsi.run_harness.targets import build_target

    target = build_target(spec, link)
    runner = Runner(spec, dataset, target, link, run_id=resume, resume=resume is not None, baseline=baseline,
                    progress=display.update, cassette=cassette)  # fmt: skip
    return await runner.run()


MAX_REPORTED_TRAJECTORIES = 200
"""Trajectories a report loads: failed and errored attempts first, then passed ones."""


def report_tasks(tasks: list[Any]) -> dict[str, dict[str, Any]]:
    """The dataset's tasks as a report shows them (by id, in the dataset's order): input and reference."""
    return {t.id: {"input": t.input, "reference": t.reference} for t in tasks}


def _report_trajectories(api: str, scores: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The trajectories of the run's traces, those with a failed or errored score first (at most
    MAX_REPORTED_TRAJECTORIES)."""
    import httpx

    from evalsi.auth.keys import api_headers
    from evalsi.model.span import span_from_canonical
    from evalsi.model.trajectory import build_trajectory

    failing = [s["trace_id"] for s in scores if s.get("passed") is False or s.get("outcome") == "error"]
    wanted = list(dict.fromkeys([*failing, *(s["trace_id"] for s in scores)]))
    out: dict[str, dict[str, Any]] = {}
    with httpx.Client(base_url=api, timeout=30, headers=api_headers()) as client:
        for trace_id in wanted[:MAX_REPORTED_TRAJECTORIES]:
            resp = client.get(f"/api/v1/traces/{trace_id}")
            if resp.status_code == 200:
                spans = [span_from_canonical(c) for c in resp.json()["spans"]]
                out[trace_id] = build_trajectory(spans)
    return out


def _write_report(
    path: Path,
    run: dict[str, Any],
    scores: list[dict[str, Any]],
    trajectories: dict[str, dict[str, Any]],
    tasks: dict[str, dict[str, Any]],
) -> None:
    from evalsi.run_harness.html import html_report
    from evalsi.run_harness.report import markdown

    if path.suffix == ".md":
        path.write_text(markdown(run, scores, trajectories, tasks))
    else:
        path.write_text(html_report(run, scores, trajectories, tasks))
    err.print(f"report written to {path}", highlight=False)


# --- runs as data -------------------------------------------------------------------------------------------------


class _Runs:
    """Where the reading commands (`runs list|show`, `compare`) read runs: a collector's API (`--collector`, or the
    collector serving the config's store, a run's own included), else the store itself, opened for the command
    alone: no pipelines, no listeners."""

    def __init__(self, api: str | None = None, store: Any = None, where: str = "") -> None:
        self.api, self.store, self.where = api, store, where

    def _get(self, path: str) -> Any:
        import httpx

        from evalsi.auth.keys import api_headers

        assert self.api is not None
        try:
            resp = httpx.get(self.api + path, timeout=60, headers=api_headers())
        except httpx.HTTPError as e:
            raise _fail(f"cannot reach the collector at {self.api}: {e}") from None
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise _fail(f"{self.api}{path} answered {resp.status_code}: {resp.text[:300]}")
        return resp.json()

    def _query(self, fn: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.store, fn)(*args, **kwargs)
        except Exception as e:
            if "UNKNOWN_TABLE" in str(e):  # a store that has never recorded a run
                return []
            raise _fail(f"reading from the {self.where} failed: {e}") from None

    def list(self, limit: int) -> list[dict[str, Any]]:
        if self.api is not None:
            return self._get(f"/api/v1/runs?limit={limit}")["runs"]
        return self._query("list_runs", limit=limit)

    def run(self, run_id: str) -> dict[str, Any]:
        """The run record; exit 1 when no run has that id."""
        if self.api is not None:
            found = self._get(f"/api/v1/runs/{run_id}")
        else:
            found = next(iter(self._query("list_runs", limit=1, run_id=run_id)), None)
        if found is None:
            raise _fail(f"run {run_id} not found", 1)
        return found

    def scores(self, run_id: str) -> list[dict[str, Any]]:
        if self.api is not None:
            return (self._get(f"/api/v1/runs/{run_id}/scores") or {"scores": []})["scores"]
        return self._query("run_scores", run_id)

    def measures(self, scores: list[dict[str, Any]]) -> list[Any]:
        """The run-added measures (`duration_ms`, `tokens`, `cost_usd`) of the attempts behind `scores`, rebuilt
        from their stored traces, read where the runs are read."""
        from evalsi.run_harness.run_metrics import stored_measures

        if self.api is not None:
            return stored_measures(self._get, scores)
        from evalsi.collector.query import read_trace

        def get(path: str) -> Any:  # `/api/v1/traces/{id}?offset=N`, answered from the store
            trace_id, _, offset = path.removeprefix("/api/v1/traces/").partition("?offset=")
            return read_trace(self.store, trace_id, offset=int(offset or 0))

        return stored_measures(get, scores)


@contextlib.contextmanager
def _runs(collector: str | None, config: Path | None) -> Iterator[_Runs]:
    """The runs of the store the config names (or of `--collector`): see `_Runs`."""
    from evalsi.collector.config import type_of
    from evalsi.collector.query import serving_api, store_of
    from evalsi.component import REGISTRY
    from evalsi.run_harness.collector import CollectorError
    from evalsi.store import StoreBusy, StoreError

    if collector:
        yield _Runs(api=collector.rstrip("/"))
        return
    try:
        cfg = _load_config(config)
        served = serving_api(cfg)
    except (CollectorError, StoreBusy) as e:
        raise _fail(str(e)) from None
    if served is not None:
        yield _Runs(api=served)
        return
    found = store_of(cfg)
    if found is None:
        raise _fail("the config has no store exporter (clickhouse) to read runs from; give --collector URL")
    eid, c = found
    store_type = REGISTRY[("exporter", type_of(eid))].store
    assert store_type is not None
    try:
        store = store_type.open_queries(c)
    except StoreError as e:
        raise _fail(str(e)) from None
    try:
        yield _Runs(store=store, where=store.description)
    finally:
        store.close()


@runs_app.command("list")
def runs_list(
    limit: Annotated[int, typer.Option("--limit", "-n", min=1)] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    collector: CollectorOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Runs, newest first: when each started, its target, model, dataset, tasks x trials, headline metric and
    gates. A rescore run shows the target, dataset and tasks of the run it re-scored."""
    with _runs(collector, config) as source:
        runs = source.list(limit)
        known = {r["run_id"]: r for r in runs}
        sources: dict[str, dict[str, Any] | None] = {}
        for r in runs:
            rescored = ((r.get("manifest") or {}).get("rescore") or {}).get("run")
            if rescored and rescored not in sources:
                try:
                    sources[rescored] = known.get(rescored) or source.run(rescored)
                except typer.Exit:
                    sources[rescored] = None  # the re-scored run is gone (or in another project)
    if as_json:
        out.print_json(json.dumps(runs, default=str))
        return
    from rich.table import Table

    from evalsi.run_harness.report import RUNS_HEADERS, run_row

    if not runs:
        out.print("no runs yet: `evalsi run -f run.yaml` records one")
        return
    table = Table()
    # one project's runs with `auth`; every project's without (a run id is one run per project: say whose)
    projects = len({r.get("project", "default") for r in runs}) > 1
    for h in ("project",) * projects + tuple(RUNS_HEADERS):
        table.add_column(h)
    for r in runs:
        rescored = ((r.get("manifest") or {}).get("rescore") or {}).get("run")
        row = run_row(r, sources.get(rescored) if rescored else None)
        table.add_row(*(r.get("project", "default"),) * projects, *row)
    out.print(table)


@runs_app.command("show")
def runs_show(
    run_id: str,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    collector: CollectorOpt = None,
    config: ConfigOpt = None,
) -> None:
    """A run's manifest, aggregates and gates, as stored."""
    from evalsi.run_harness.report import print_summary

    with _runs(collector, config) as source:
        r = source.run(run_id)
    run = {"run_id": r["run_id"], "name": r["name"], "status": r["status"], "manifest": r["manifest"], **r["summary"]}
    if as_json:
        out.print_json(json.dumps(run, default=str))
    elif r["summary"]:
        print_summary(out, run)
    else:
        out.print(f"run {run_id} is {r['status']}: no summary yet (`evalsi run --resume {run_id}` continues it)")


def compare_command(
    run_a: str,
    run_b: str,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    collector: CollectorOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Compare run B with run A, record by record (task and trial): every metric of either run (the run-added
    `duration_ms`, `tokens`, `cost_usd` too, lower being better for them), McNemar for pass/fail, a paired bootstrap
    for numeric scores. Exit 1 when a metric regressed significantly."""
    from evalsi.run_harness.compare import compare_scores
    from evalsi.run_harness.report import comparison_table
    from evalsi.run_harness.run_metrics import with_measures
    from evalsi.run_harness.runner import RunFailed

    with _runs(collector, config) as source:
        scores = [[s for s in source.scores(r) if str(s.get("policy", "")).startswith("run:")] for r in (run_a, run_b)]
        seed = source.run(run_b)["manifest"].get("seed", 0)
        for r, found in zip((run_a, run_b), scores, strict=True):
            if not found:
                raise _fail(f"run {r} has no scores", 1)
        try:
            scores = [with_measures(found, source.measures(found)) for found in scores]
        except RunFailed as e:
            raise _fail(str(e)) from None
    result = compare_scores(scores[0], scores[1], seed=seed)
    if as_json:
        out.print_json(json.dumps(result))
    else:
        out.print(comparison_table(result, f"{run_b} compared with {run_a}"))
    if any(c["regressed"] for c in result.values()):
        raise typer.Exit(GATE_FAILED)


def rescore_command(
    run: Annotated[str | None, typer.Option("--run", help="Re-score this run's traces.")] = None,
    traces: Annotated[
        str | None, typer.Option("--traces", help="Re-score stored traces matching this CEL over `trace`.")
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "-f",
            "--file",
            help="Take evaluators, judge and gates from this EvalRun file (and references from its dataset).",
        ),
    ] = None,
    evaluator: Annotated[
        list[str] | None, typer.Option("--evaluator", "-e", help="An evaluator ref (repeatable).")
    ] = None,
    since: Annotated[str, typer.Option("--since", help="With --traces: how far back, e.g. 24h.")] = "24h",
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="With --traces: at most N traces.")] = 1000,
    name: Annotated[str | None, typer.Option("--name", help="The new run's name.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    collector: CollectorOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Score stored traces (a run's, or any matching --traces) with new evaluators, without running the agent;
    the scores are stored as a new run. Exit 0 when its gates hold, 1 when one fails, 2 when it could not be done."""
    from evalsi.duration import parse_duration
    from evalsi.run_harness.collector import CollectorError
    from evalsi.run_harness.dataset import DatasetError
    from evalsi.run_harness.report import print_summary
    from evalsi.run_harness.rescore import Rescore
    from evalsi.run_harness.runner import RunFailed
    from evalsi.run_harness.spec import EvaluatorSpec, load_run

    if (run is None) == (traces is None):
        raise _fail("give exactly one of --run RUN_ID and --traces CEL")
    if (file is None) == (not evaluator):
        raise _fail("give the evaluators: -f run.yaml, or --evaluator REF (repeatable), not both")
    spec = None
    try:
        seconds = parse_duration(since)
        if file is not None:
            spec = load_run(file)
    except ValueError as e:  # RunSpecError is a ValueError
        raise _fail(str(e)) from None
    evaluators = [EvaluatorSpec(ref=r) for r in evaluator or []] if spec is None else list(spec.body.evaluators)
    try:
        link, local = link_to_collector(collector, config)
    except CollectorError as e:
        raise _fail(str(e)) from None
    try:
        job = Rescore(
            link, evaluators=evaluators, judge=spec.body.judge if spec else {},
            gates=[g.when for g in spec.body.gates] if spec else [],
            name=name or (spec.name if spec else "rescore"), seed=spec.body.seed if spec else 0, spec=spec,
        )  # fmt: skip
        if run is not None:
            chosen, note = job.traces_of_run(run)
            source: dict[str, Any] = {"run": run}
        else:
            assert traces is not None
            chosen, note = job.traces_where(traces, time.time_ns() - int(seconds * 1e9), limit), ""
            source = {"traces": traces, "since": since}
        if note and not as_json:
            err.print(f"note: {note}", highlight=False)
        result = job.run(chosen, source)
    except (RunFailed, CollectorError, DatasetError) as e:
        raise _fail(str(e)) from None
    finally:
        if local is not None:
            local.stop()
    out_run = result.to_dict()
    if as_json:
        out.print_json(json.dumps(out_run, default=str))
    else:
        print_summary(out, out_run)
    if not result.passed:
        raise typer.Exit(GATE_FAILED)


# --- importing other harnesses' results ---------------------------------------------------------------------------

import_app = typer.Typer(
    help="Import other harnesses' results as runs, and traces from other tools (MLflow, Phoenix, Langfuse).",
    no_args_is_help=True,
)

EvaluatorOpt = Annotated[
    list[str] | None,
    typer.Option("--evaluator", "-e", help="Also score the imported traces with this evaluator (repeatable)."),
]


def _import(name: str, attempts: list[Any], evaluators: list[str], source: dict[str, Any], collector: str | None,
            config: Path | None, as_json: bool) -> None:  # fmt: skip
    from evalsi.run_harness.collector import CollectorError
    from evalsi.run_harness.importing import import_run
    from evalsi.run_harness.report import print_summary
    from evalsi.run_harness.runner import Progress, RunFailed

    try:
        link, local = link_to_collector(collector, config)
    except CollectorError as e:
        raise _fail(str(e)) from None
    total = len([a for a in attempts if a.error is None])
    display = _Display(total, not as_json)
    done = Progress(total=total)

    def step(n: int) -> None:
        done.done += n
        display.update(done)

    try:
        try:
            result = import_run(
                link, name, attempts, evaluators=[{"ref": r} for r in evaluators], source=source, progress=step
            )
        finally:
            display.close()
    except (RunFailed, CollectorError) as e:
        raise _fail(str(e)) from None
    finally:
        if local is not None:
            local.stop()
    run = result.to_dict()
    if as_json:
        out.print_json(json.dumps(run, default=str))
    else:
        print_summary(out, run)
        out.print(f"imported as run {result.run_id}; `evalsi runs show {result.run_id}` reads it")


@import_app.command("atif")
def import_atif(
    files: Annotated[list[Path], typer.Argument(help="ATIF trajectory files (JSON), one attempt each.")],
    evaluator: EvaluatorOpt = None,
    name: Annotated[str, typer.Option("--name", help="The run's name.")] = "atif-import",
    dataset: Annotated[
        Path | None, typer.Option("--dataset", help="Tasks whose ids match the files' session ids: references.")
    ] = None,
    collector: CollectorOpt = None,
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Import ATIF trajectories (subagents included) as a run scored by the given evaluators."""
    from evalsi.run_harness.dataset import DatasetError, load_dataset
    from evalsi.run_harness.importing import read_atif_files

    if not evaluator:
        raise _fail("give at least one --evaluator: ATIF trajectories carry no scores of their own")
    try:
        references = {t.id: t for t in load_dataset(dataset).tasks} if dataset else None
        _, attempts = read_atif_files(files, references)
    except DatasetError as e:
        raise _fail(str(e)) from None
    source = {"format": "atif", "files": [str(f) for f in files], "dataset": str(dataset) if dataset else None}
    _import(name, attempts, evaluator, source, collector, config, as_json)


@import_app.command("inspect")
def import_inspect(
    log: Annotated[Path, typer.Argument(help="An Inspect AI eval log (.eval or .json).")],
    evaluator: EvaluatorOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="The run's name (default: the Inspect task's).")] = None,
    collector: CollectorOpt = None,
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Import an Inspect AI eval log: samples become tasks, epochs trials, its scorers' verdicts scores."""
    from evalsi.run_harness.importers.inspect_log import InspectImportError, read_inspect_log

    try:
        imported = read_inspect_log(log)
    except InspectImportError as e:
        raise _fail(str(e)) from None
    source = imported.source
    _import(name or imported.name, imported.attempts, evaluator or [], source, collector, config, as_json)
