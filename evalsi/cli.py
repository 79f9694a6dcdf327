"""The `evalsi` command: serve, validate, read traces. Thin: each command calls into the packages.

It starts fast: only typer (and rich's console, through the harness commands) load at start; the collector, the
store, the exporters and their libraries load in the command that needs them (`evalsi --help` touches none)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer
from rich.console import Console
from rich.markup import escape

from evalsi import __version__
from evalsi.run_harness import commands

if TYPE_CHECKING:
    from rich.tree import Tree

    from evalsi.collector.config import Config
    from evalsi.collector.query import TraceReader

# plain help (rich_markup_mode=None): typer's rich help formatter alone takes longer to import than the whole CLI
app = typer.Typer(help="evalsi: an OpenTelemetry collector that turns GenAI traces into evaluations.",
                  no_args_is_help=True, add_completion=True, rich_markup_mode=None)  # fmt: skip
traces_app = typer.Typer(help="Read stored traces.", no_args_is_help=True)
app.add_typer(traces_app, name="traces")
sessions_app = typer.Typer(help="Read stored sessions: the traces of one conversation or task.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")
scores_app = typer.Typer(help="Read stored scores.", no_args_is_help=True)
app.add_typer(scores_app, name="scores")
evaluators_app = typer.Typer(help="The evaluators this evalsi knows.", no_args_is_help=True)
app.add_typer(evaluators_app, name="evaluators")
policies_app = typer.Typer(help="Online evaluation policies: their window aggregates.", no_args_is_help=True)
app.add_typer(policies_app, name="policies")
alerts_app = typer.Typer(help="Policy alerts: when each fired and resolved.", no_args_is_help=True)
app.add_typer(alerts_app, name="alerts")

# piped output gets a wide console so ids are never cut
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True)

CONFIG_ENV = "EVALSI_CONFIG"
LOCAL_CONFIG = "evalsi.yaml"
KEY_ENV = "EVALSI_API_KEY"  # evalsi.auth.KEY_ENV, named here so `--api` need not import auth (grpc, pydantic)


class Found(NamedTuple):
    """The config a command uses and how it was found."""

    path: Path | None  # None: the built-in default
    source: str  # `-c x.yaml`, `EVALSI_CONFIG=x.yaml`, `./evalsi.yaml` or `the built-in default`

    def origin(self, key: str) -> str:
        """Where a setting came from, for messages: `from ./evalsi.yaml: service.api.endpoint`."""
        if self.path is None:
            return f"from the built-in default {key}; no -c, {CONFIG_ENV} or ./{LOCAL_CONFIG}"
        return f"from {self.source}: {key}"


def find_config(path: Path | None) -> Found:
    """The config a command uses: `-c`, else `EVALSI_CONFIG`, else `./evalsi.yaml`, else the built-in default."""
    if path is not None:
        return Found(path, f"-c {path}")
    env = os.environ.get(CONFIG_ENV, "").strip()
    if env:
        return Found(Path(env), f"{CONFIG_ENV}={env}")
    if Path(LOCAL_CONFIG).is_file():
        return Found(Path(LOCAL_CONFIG), f"./{LOCAL_CONFIG}")
    return Found(None, "the built-in default")


def _discovering(command: Callable[..., Any]) -> Callable[..., Any]:
    """A harness command whose `config` is found like every other command's (it takes `-c` or the default)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        kwargs["config"] = find_config(kwargs.get("config")).path
        return command(*args, **kwargs)

    return run


def _discover_group(group: typer.Typer) -> typer.Typer:
    for info in group.registered_commands:
        if info.callback is not None:
            info.callback = _discovering(info.callback)
    return group


app.command("run")(_discovering(commands.run_command))
app.add_typer(_discover_group(commands.runs_app), name="runs")
app.command("compare")(_discovering(commands.compare_command))
app.command("rescore")(_discovering(commands.rescore_command))
app.add_typer(_discover_group(commands.import_app), name="import")
keys_app = typer.Typer(help="API keys for the `auth` section.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

ConfigOpt = Annotated[
    Path | None,
    typer.Option("-c", "--config", help=f"Config file (YAML); default: ${CONFIG_ENV}, else ./{LOCAL_CONFIG}, else "
                 "built-in defaults that serve a laptop."),
]  # fmt: skip
ApiOpt = Annotated[
    str | None, typer.Option("--api", help="Read through this collector API (e.g. http://127.0.0.1:8080).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)  # `[x]` in it is text
    return typer.Exit(code)


def _nested(config_error: str) -> str:
    """A config error's text with each problem's further lines (a policy file's own errors under its
    `processors.<id>:` key) indented beneath it rather than at the margin."""
    head, *lines = config_error.splitlines()
    return "\n".join([head, *(line if line.startswith("  ") else f"    {line}" for line in lines)])


def _config(found: Found) -> Config:
    from evalsi.collector.config import ConfigError, load_config

    try:
        return load_config(found.path)
    except ConfigError as e:
        how = "" if found.source.startswith("-c") or found.path is None else f"\n  (the config found as {found.source})"
        raise _fail(_nested(str(e)) + how) from None


@app.command()
def serve(config: ConfigOpt = None) -> None:
    """Run the collector until SIGTERM or Ctrl-C, then drain every buffer to the store."""
    import asyncio

    from evalsi.ports import claimed_in, taken

    found = find_config(config)
    busy = taken(claimed_in(found.path))  # before the imports and the config's components: a second serve fails at once
    if busy:
        raise _fail("cannot start: " + "\n  ".join(busy))

    from evalsi.collector.logs import configure
    from evalsi.collector.service import Service, StartError
    from evalsi.store import StoreError

    cfg = _config(found)
    logs = cfg.service.telemetry.logs
    configure(logs.level, logs.encoding)
    service = Service(cfg)
    try:
        asyncio.run(service.run())
    except (StartError, StoreError, OSError) as e:
        raise _fail(f"cannot start: {e}") from None
    except KeyboardInterrupt:
        pass
    lost = service.unstored
    if lost:
        what = ", ".join(f"{n} {kind}" for kind, n in lost.items())
        raise _fail(f"stopped with acknowledged data not stored: {what} (the log says why)")


@app.command()
def validate(
    config: Annotated[
        Path | None,
        typer.Option("-c", "--config", help=f"Config file to check; default: ${CONFIG_ENV}, else ./{LOCAL_CONFIG}."),
    ] = None,
    run_file: Annotated[Path | None, typer.Option("-f", "--file", help="EvalRun file to check.")] = None,
) -> None:
    """Check a config file (-c) or a run file (-f) without starting anything; print OK or every error."""
    from evalsi.collector.config import ConfigError, load_config, redact
    from evalsi.run_harness.dataset import DatasetError, load_dataset
    from evalsi.run_harness.runner import run_problems
    from evalsi.run_harness.spec import RunSpecError, load_run

    if config is None and run_file is None:
        config = find_config(None).path
        if config is None:
            raise _fail(
                f"give a config (-c evalsi.yaml, ${CONFIG_ENV} or ./{LOCAL_CONFIG}) or a run file (-f run.yaml) to "
                "check"
            )
    problems = []
    notes = []
    if config is not None:
        try:
            loaded = load_config(config)
            if loaded.workers_note:
                notes.append(loaded.workers_note)
        except ConfigError as e:
            problems.append(_nested(str(e)))
    if run_file is not None:
        try:
            spec = load_run(run_file)
            dataset = load_dataset(spec.path(spec.body.dataset.path), spec.body.dataset.limit, spec.body.dataset.format)
            problems.extend(f"{run_file}: {p}" for p in run_problems(spec, dataset.tasks))
        except (RunSpecError, DatasetError) as e:
            problems.append(str(e))
    if problems:
        # a config's errors are redacted already; a run file's are here, with the credentials it holds
        err.print(
            redact("\n".join(problems), _run_file_secrets(run_file)), highlight=False, soft_wrap=True, markup=False
        )
        raise typer.Exit(1)
    out.print(f"OK: {', '.join(str(p) for p in (config, run_file) if p is not None)}")
    for note in notes:
        out.print(f"  {note}", highlight=False)


@keys_app.command("new")
def keys_new(
    name: Annotated[str, typer.Option("--name", help="Whose key it is (shown in logs, never the key).")] = "",
    project: Annotated[
        str, typer.Option("--project", help="The project a request with this key is for (`api_keys[].project`).")
    ] = "default",
    as_json: JsonOpt = False,
    export: Annotated[
        bool,
        typer.Option(
            "--export",
            help="Print shell lines setting EVALSI_API_KEY_HASH (read by deploy/evalsi.yaml) and EVALSI_API_KEY "
            '(read by the CLI): eval "$(evalsi keys new --export)".',
        ),
    ] = False,
) -> None:
    """Make an API key: the key (give it to the sender, once) and its hash (for the config's `auth.api_keys`)."""
    import shlex

    from evalsi.auth import KEY_ENV, PROJECT_PATTERN, new_key

    if not PROJECT_PATTERN.fullmatch(project):
        raise typer.BadParameter(
            f"{project!r} is not a project name: lowercase letters, digits, `_` and `-`, starting with a letter or a "
            "digit, at most 63 characters",
            param_hint="--project",
        )
    key, digest = new_key()
    if export:
        sys.stdout.write(f"export {KEY_ENV}_HASH={shlex.quote(digest)}\nexport {KEY_ENV}={shlex.quote(key)}\n")
        return
    if as_json:
        out.print_json(json.dumps({"key": key, "hash": digest, "name": name, "project": project}))
        return
    out.print(f"key:  {key}", highlight=False)
    out.print(f"hash: {digest}", highlight=False)
    entry = f"{{hash: {digest}" + (f", name: {name}" if name else "") + f", project: {project}}}"
    err.print(
        "The key is shown once: give it to the sender (`Authorization: Bearer <key>`; `EVALSI_API_KEY` for the CLI)."
        f"\nIn the config:\n  auth:\n    api_keys:\n      - {entry}",
        highlight=False,
        soft_wrap=True,
    )


def _run_file_secrets(path: Path | None) -> set[str]:
    import yaml

    from evalsi.collector.config import secret_values

    try:
        return secret_values(yaml.safe_load(path.read_text())) if path is not None else set()
    except (OSError, yaml.YAMLError):
        return set()


@app.command()
def version() -> None:
    """Print the evalsi version."""
    out.print(f"evalsi {__version__}")


def _api_headers() -> dict[str, str]:
    """`evalsi.auth.api_headers`: the key in `EVALSI_API_KEY`, if set."""
    key = os.environ.get(KEY_ENV, "").strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


class _Api:
    """Reads through a collector's API, like `evalsi.collector.query.ApiReader` but on the standard library alone
    (httpx loads its own CLI, rich and pygments): `--api` loads neither the config nor the store."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.where = f"API at {self.url}"

    def get(self, path: str, key: str | None = None, missing: Any = None, **params: Any) -> Any:
        """GET `path` and return its JSON (or its `key`); `missing` on a 404 if given, else an error."""
        import urllib.error
        import urllib.parse
        import urllib.request

        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        request = urllib.request.Request(self.url + path + (f"?{query}" if query else ""), headers=_api_headers())
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            if e.code == 404 and missing is not None:
                return missing
            body = e.read().decode(errors="replace")
            try:
                detail = str(json.loads(body).get("detail", body))
            except (ValueError, AttributeError):
                detail = body
            if e.code == 401:
                detail += f"; set {KEY_ENV} to an API key of this collector"
            raise _fail(f"{self.where} answered {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            raise _fail(f"cannot reach the evalsi API at {self.url}: {reason}; is `evalsi serve` running?") from None
        return doc if key is None else doc[key]

    def list_scores(self, *, limit: int, trace_id: str | None, policy: str | None) -> list[dict[str, Any]]:
        return self.get("/api/v1/scores", "scores", limit=limit, trace_id=trace_id, policy=policy)

    def search_traces(self, params: dict[str, Any]) -> dict[str, Any]:
        return self.get("/api/v1/traces", **params)

    def read_trace(self, trace_id: str, *, limit: int, offset: int) -> dict[str, Any] | None:
        doc = self.get(f"/api/v1/traces/{trace_id}", missing={}, limit=limit, offset=offset)
        if doc:
            doc["scores"] = self.list_scores(limit=1000, trace_id=trace_id, policy=None)
        return doc or None

    def list_sessions(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        return self.get("/api/v1/sessions", "sessions", **params)

    def show_session(self, session_id: str, *, limit: int) -> dict[str, Any] | None:
        import urllib.parse

        return self.get(f"/api/v1/sessions/{urllib.parse.quote(session_id, safe='')}", missing={}, limit=limit) or None

    def close(self) -> None:
        pass


class Source(NamedTuple):
    """What a read command reads, and the words that say so: `the collector at URL (from ./evalsi.yaml: ...)`."""

    reader: TraceReader
    named: str


def _reader(config: Path | None, api: str | None) -> Source:
    """`--api`; else the collector serving the found config's store (it recorded its API); else that store."""
    if api:
        reader = _Api(api)
        return Source(reader, f"the collector at {reader.url} (from --api)")
    found = find_config(config)
    cfg = _config(found)
    from evalsi.collector.query import ApiReader, QueryError, open_reader, store_of
    from evalsi.store import StoreError

    try:
        reader = open_reader(cfg, None)
    except (QueryError, StoreError) as e:
        raise _fail(f"{e} (the config: {found.source})") from None
    store = (store_of(cfg) or ("",))[0]
    if isinstance(reader, ApiReader):
        return Source(reader, f"the collector at {reader.url} serving the store ({found.origin(f'exporters.{store}')})")
    return Source(reader, f"the {reader.where} ({found.origin(f'exporters.{store}')}; no collector serves it)")


def _read(reader: TraceReader, fn: str, *args: Any, **kwargs: Any) -> Any:
    try:
        return getattr(reader, fn)(*args, **kwargs)
    except typer.Exit:
        raise
    except Exception as e:
        query = sys.modules.get("evalsi.collector.query")  # loaded if the reader came from it
        if query is not None and isinstance(e, query.QueryError):
            raise _fail(str(e)) from None
        raise _fail(f"reading from the {reader.where} failed: {e}") from None  # a store error: where, no traceback
    finally:
        reader.close()


def _time(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.1f} ms"


SinceOpt = Annotated[
    str | None,
    typer.Option("--since", help="Started since: a duration back from now (15m, 2h, 7d) or an ISO-8601 time "
                 "(2026-05-01T12:00:00Z; UTC unless it says)."),
]  # fmt: skip
UntilOpt = Annotated[str | None, typer.Option("--until", help="Started until: as --since.")]
_MIN_DURATION_HELP = "Only traces lasting at least this long (500ms, 2s, 1m)."
_ATTR_HELP = "KEY=VALUE: only traces with a span or resource attribute of that value; repeat: all must hold."
_FAILED_HELP = "Only traces with a score of this evaluator (e.g. builtin/tool_error) that did not pass."
_WHERE_HELP = "A CEL condition over the trace as policy selectors see it (trace, span, resource, session)."
_SCAN_HELP = "With --where: over how many of the newest traces the other filters match to evaluate it (1000)."


@traces_app.command("list")
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
    source = _reader(config, api)
    doc = _read(source.reader, "search_traces", {k: v for k, v in given.items() if v is not None})
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
            r["trace_id"], _time(r["start_time_unix_nano"]), r["service_name"], r["root_name"],
            str(r["span_count"]), str(r["error_count"] or ""), str(r["llm_calls"] or ""),
            _tokens(r["input_tokens"], r["output_tokens"]), _ms(r["duration_ns"]),
        )  # fmt: skip
    out.print(table)


def _tokens(tokens_in: int | None, tokens_out: int | None) -> str:
    """`in/out`, or `-` for a trace no span of which counted tokens (not an LLM trace, or not instrumented so)."""
    return f"{tokens_in or 0}/{tokens_out or 0}" if tokens_in or tokens_out else "-"


def _label(s: dict[str, Any]) -> str:
    parts = [f"[bold]{s['name']}[/]", f"[cyan]{s['step_type']}[/]"]
    if s.get("model"):
        parts.append(s["model"])
    if s.get("tool_name"):
        parts.append(f"tool={s['tool_name']}")
    if s.get("input_tokens") is not None or s.get("output_tokens") is not None:
        parts.append(f"tokens {s.get('input_tokens') or 0}/{s.get('output_tokens') or 0}")
    parts.append(_ms(s["duration_ns"]))
    if s["status_code"] == "ERROR":
        parts.append(f"[red]ERROR {s['status_message']}[/]")
    if not s.get("content_captured") and s["step_type"] != "other":
        parts.append("[dim](no content)[/]")
    return "  ".join(parts)


@traces_app.command("show")
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
        raise _fail(f"invalid trace id {trace_id!r}: expected 32 hex digits")
    source = _reader(config, api)
    doc = _read(source.reader, "read_trace", trace_id, limit=limit, offset=offset)
    if not doc:
        raise _fail(f"trace {trace_id} not found in {source.named}")
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        return
    spans: list[dict[str, Any]] = doc["spans"]
    total: int = doc["span_count"]
    if not spans:
        raise _fail(f"trace {trace_id} holds {total:,} spans: none from --offset {offset:,}")
    ids = {s["span_id"] for s in spans}
    children: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        parent = s["parent_span_id"] if s["parent_span_id"] in ids else ""
        children.setdefault(parent, []).append(s)
    from rich.tree import Tree

    count = f"{total:,} spans" if not doc["truncated"] else f"spans {offset + 1:,}-{offset + len(spans):,} of {total:,}"
    tree = Tree(f"trace [bold]{trace_id}[/]  {count}  {escape(spans[0]['service_name'])}")

    from evalsi.transcript import conversation

    def add(node: Tree, parent: str) -> None:
        for s in children.get(parent, []):
            cost = f"  ${s['cost_usd']:.4g}" if s.get("cost_usd") else ""
            step = node.add(_label(s) + cost)
            for line in conversation(s, full=full):
                step.add(line)
            add(step, s["span_id"])

    add(tree, "")
    out.print(tree)
    out.print(_trace_summary(spans, shown=" (of the spans shown)" if doc["truncated"] else ""), highlight=False)
    scores = doc.get("scores") or []
    out.print(f"scores: {len(scores)}" if scores else "scores: none yet", highlight=False)
    for r in scores:
        out.print("  " + _score_line(r), highlight=False)
    if doc["truncated"]:
        more = f"; the next {limit:,}: --offset {doc['next_offset']}" if doc.get("next_offset") else ""
        err.print(f"[yellow]note:[/] the trace holds {total:,} spans; this shows {len(spans):,} of them, from "
                  f"offset {offset:,}{more}", highlight=False, soft_wrap=True)  # fmt: skip


def _trace_summary(spans: list[dict[str, Any]], shown: str) -> str:
    """One line over a trace's spans: steps by type, tools called, tokens, cost, errors."""
    steps: dict[str, int] = {}
    tools: dict[str, None] = {}
    for s in spans:
        steps[s["step_type"]] = steps.get(s["step_type"], 0) + 1
        if s.get("tool_name"):
            tools[s["tool_name"]] = None
    tokens_in = sum(s.get("input_tokens") or 0 for s in spans)
    tokens_out = sum(s.get("output_tokens") or 0 for s in spans)
    cost = sum(s.get("cost_usd") or 0.0 for s in spans)
    errors = sum(s["status_code"] == "ERROR" for s in spans)
    parts = [
        "steps " + (", ".join(f"{kind} {n}" for kind, n in steps.items() if kind != "other") or "none"),
        "tools " + (", ".join(escape(t) for t in tools) or "none"),
        f"tokens {tokens_in}/{tokens_out}",
        f"cost ${cost:.4g}",
        f"errors {errors}",
    ]
    return "  ".join(parts) + shown


def _score_line(r: dict[str, Any]) -> str:
    """A score as one line: where it came from, its value, whether it passed, and why."""
    value = "" if r["value"] is None else f" {r['value']:.4g}"
    passed = "" if r["passed"] is None else (" passed" if r["passed"] else " [red]failed[/]")
    outcome = "" if r["outcome"] == "scored" else f" [yellow]{r['outcome']}[/]"
    why = r.get("reason") or r.get("label") or ""
    where = "/".join(escape(x) for x in (r["policy"], r["evaluator"]) if x)
    return f"{where} [bold]{escape(r['name'])}[/]{value}{passed}{outcome}" + (f"  {escape(why)}" if why else "")


@sessions_app.command("list")
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
    source = _reader(config, api)
    rows = _read(source.reader, "list_sessions", {k: v for k, v in given.items() if v is not None})
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
            escape(r["session_id"]), str(r["trace_count"]), _time(r["start_time_unix_nano"]),
            _time(r["end_time_unix_nano"]), str(r["span_count"]), str(r["error_count"] or ""),
            f"{r['input_tokens']}/{r['output_tokens']}", _cost(r["cost_usd"]), escape(r["user_id"] or ""),
        )  # fmt: skip
    out.print(table)


def _cost(usd: float | None) -> str:
    return "" if not usd else f"${usd:.4g}"


@sessions_app.command("show")
def sessions_show(
    session_id: Annotated[str, typer.Argument(help="The session id (gen_ai.conversation.id, session.id, ...).")],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Show at most this many traces.")] = 1000,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """Show one session: its traces in the order they started, and its scores (of the session and its traces)."""
    source = _reader(config, api)
    doc = _read(source.reader, "show_session", session_id, limit=limit)
    if not doc:
        raise _fail(f"session {session_id!r} not found in {source.named}")
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
            str(n), r["trace_id"], _time(r["start_time_unix_nano"]), escape(r["root_name"]), str(r["span_count"]),
            str(r["error_count"] or ""), str(r["llm_calls"] or ""), f"{r['input_tokens']}/{r['output_tokens']}",
            _cost(r["cost_usd"]), _ms(r["duration_ns"]),
        )  # fmt: skip
    out.print(table)
    scores = doc["scores"]
    out.print(f"scores: {len(scores)}" if scores else "scores: none yet", highlight=False)
    for r in scores:
        of = f"trace {r['trace_id']}" if r["trace_id"] else "session"
        out.print(f"  {of}  {_score_line(r)}", highlight=False)


@scores_app.command("list")
def scores_list(
    trace: Annotated[str | None, typer.Option("--trace", help="Only scores of this trace id.")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="Only scores of this policy.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many, newest first.")] = 100,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """List scores, newest first; each (trace, span, policy, evaluator, name, run, trial) once."""
    source = _reader(config, api)
    rows = _read(source.reader, "list_scores", limit=limit, trace_id=trace, policy=policy)
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
            _time(r["timestamp_unix_nano"]), r["trace_id"], r["policy"], r["evaluator"], r["name"], r["outcome"],
            value, passed, r["reason"] or r["label"] or "",
        )  # fmt: skip
    out.print(table)


@evaluators_app.command("list")
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


def _policy_stats(reader: TraceReader, window: str, policy: str | None) -> dict[str, Any]:
    import time

    from evalsi.duration import parse_duration

    try:
        seconds = parse_duration(window)
    except ValueError as e:
        raise _fail(f"--window: {e}") from None
    try:
        url = getattr(reader, "url", None)  # an API reader (ours for --api, or the query module's)
        if url is not None:
            return _Api(url).get("/api/v1/policies/stats", window=window, policy=policy)
        from evalsi.collector.query import StoreReader
        from evalsi.collector.score_api import window_stats

        assert isinstance(reader, StoreReader)
        since_ns = time.time_ns() - int(seconds * 1e9)
        rows = reader.store.score_window_stats(since_ns=since_ns, policy=policy)  # no collector runs: read the store
        return {"window": window, "since_unix_nano": since_ns, "stats": window_stats(rows)}
    except typer.Exit:
        raise
    except Exception as e:  # a store error from the engine: say where, not a traceback
        raise _fail(f"reading from the {reader.where} failed: {e}") from None
    finally:
        reader.close()


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.4g}"


@policies_app.command("stats")
def policies_stats(
    window: Annotated[str, typer.Option("--window", help="How far back: the last 5m, 1h, ...")] = "5m",
    policy: Annotated[str | None, typer.Option("--policy", help="Only this policy.")] = None,
    as_json: JsonOpt = False,
    config: ConfigOpt = None,
    api: ApiOpt = None,
) -> None:
    """Scored scores of the last window per policy, evaluator and name: n, mean with a 95% interval, p50/p95."""
    source = _reader(config, api)
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
        mean = _num(r["mean"]) + (" pass" if r["kind"] == "pass_fail" else "")
        interval = f"{_num(r['interval'][0])} .. {_num(r['interval'][1])}" if r["interval"] else ""
        table.add_row(
            r["policy"], r["evaluator"], r["name"], str(r["n"]), mean, interval, r.get("method") or "",
            _num(r["p50"]), _num(r["p95"]),
        )  # fmt: skip
    out.print(table)


@alerts_app.command("list")
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
            raise _fail(f"--since: {e}") from None
    source = _reader(config, api)
    url = getattr(source.reader, "url", None)  # an API reader (ours for --api, or the query module's)
    if url is not None:
        try:
            rows = _Api(url).get("/api/v1/alerts", "alerts", limit=limit, policy=policy, since=since)
        finally:
            source.reader.close()
    else:
        rows = _read(source.reader, "list_alerts", limit=limit, policy=policy, since=since)
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
        values = ", ".join(f"{k} = {_num(v) if isinstance(v, float) else v}" for k, v in r["values"].items())
        window = f"{_time(r['window_start_unix_ms'] * 10**6)[:-4]} .. {_time(r['window_end_unix_ms'] * 10**6)[11:-4]}"
        table.add_row(
            _time(r["timestamp_unix_nano"]), escape(r["policy"]), escape(r["alert"]), state, escape(r["condition"]),
            escape(values), window, str(r["count"]),
        )  # fmt: skip
    out.print(table)


@app.command("normalize")
def normalize_command(
    files: Annotated[list[Path], typer.Argument(help="OTLP files: traces and logs, protobuf (.pb) or JSON.")],
    as_json: JsonOpt = False,
) -> None:
    """Show the canonical view of OTLP files, without a collector: how evalsi reads your instrumentation."""
    from rich.tree import Tree

    from evalsi.processors.normalize.files import normalize_files
    from evalsi.trajectory import build_trajectories

    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise _fail(
            f"no such file: {', '.join(missing)}; give the paths of OTLP files to read (traces and logs, protobuf "
            ".pb or JSON)",
            code=2,
        )
    result = normalize_files(files)
    for problem in result.problems:
        err.print(f"[yellow]warning:[/] {escape(problem)}", highlight=False, soft_wrap=True)
    if not result.spans and result.problems:
        raise typer.Exit(1)
    trajectories = build_trajectories(result.spans)
    if as_json:
        doc = {"spans": [s.canonical() for s in result.spans], "trajectories": trajectories}
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n")
        return
    for trajectory in trajectories:
        tree = Tree(f"trace [bold]{trajectory['trace_id']}[/]")
        spans = [s.canonical() for s in result.spans if s.trace_id == trajectory["trace_id"]]
        ids = {s["span_id"] for s in spans}
        children: dict[str, list[dict[str, Any]]] = {}
        for s in spans:
            children.setdefault(s["parent_span_id"] if s["parent_span_id"] in ids else "", []).append(s)

        def add(node: Tree, parent: str, children: dict[str, list[dict[str, Any]]] = children) -> None:
            for s in children.get(parent, []):
                label = _label(s) + (f"  [dim]{s['convention'] or 'unmapped'}[/]")
                add(node.add(label), s["span_id"])

        add(tree, "")
        out.print(tree)
        calls = ", ".join(c["name"] or "?" for c in trajectory["tool_calls"]) or "none"
        out.print(f"  steps {len(trajectory['steps'])}  llm calls {trajectory['llm_calls']}  tool calls: {calls}")
        if trajectory["final_output"]:
            out.print(f"  final output: {trajectory['final_output'][:200]}", highlight=False)


if __name__ == "__main__":
    app()


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
        raise _fail(str(e), 2) from None
    if until_ms <= since_ms:
        raise _fail(f"--until ({until}) is not after --since ({since})", 2)
    sources, client = make_sources()
    local = None
    target = None
    if not dry_run:
        try:
            link, local = commands.link_to_collector(collector, config)
        except CollectorError as e:
            raise _fail(str(e)) from None
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
        raise _fail(str(e)) from None
    except httpx.HTTPError as e:
        raise _fail(f"cannot reach {tool} at {address}: {e}; is the server running?") from None
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
        raise _fail(f"--tracking-uri / --experiment: {e}", 2) from None

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
        raise _fail(f"--endpoint / --project / --settle: {e}", 2) from None

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
        raise _fail(f"--host / --public-key / --secret-key / --settle: {e}", 2) from None

    def sources() -> tuple[list[Any], httpx.AsyncClient]:
        auth = base64.b64encode(f"{cfg.public_key}:{cfg.secret_key}".encode()).decode()
        client = httpx.AsyncClient(base_url=cfg.host, headers={"Authorization": f"Basic {auth}"}, timeout=cfg.timeout)
        return [LangfuseSource(client, cfg.host, cfg.settle, cfg.service_name)], client

    _import_traces(
        "Langfuse", cfg.host, sources, since=since, until=until, dry_run=dry_run, page_size=page_size,
        collector=collector, config=config, as_json=as_json,
    )  # fmt: skip


commands.import_app.command("mlflow")(_discovering(import_mlflow))
commands.import_app.command("phoenix")(_discovering(import_phoenix))
commands.import_app.command("langfuse")(_discovering(import_langfuse))
