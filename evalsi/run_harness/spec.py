"""The EvalRun file (`apiVersion: evals.si/v1alpha1`, `kind: EvalRun`): what `evalsi run -f run.yaml` does, checked
whole before anything runs, every problem named by its key path."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from evalsi.duration import Duration
from evalsi.evaluators import Evaluator, Params, load_evaluators
from evalsi.run_harness.gates import compile_gate

API_VERSION = "evals.si/v1alpha1"
KIND = "EvalRun"
_NAME = re.compile(r"[a-z0-9]([a-z0-9._-]{0,251}[a-z0-9])?")
_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class RunSpecError(ValueError):
    """A run file that cannot be used; `errors` lists every problem as `<file>: <key.path>: message`."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Metadata(_Strict):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a run name: use lowercase letters, digits, '-', '_' and '.'")
        return value


def _function(value: str) -> str:
    if not _FUNCTION.fullmatch(value):
        raise ValueError(f"{value!r} is not `module:function` (e.g. `my_agent.main:answer`)")
    return value


class PythonTarget(_Strict):
    """A callable `module:function(input)` (sync or async) returning the output: a string, a JSON object, or
    `{"output": ..., "trajectory": [...]}`. It may take `traceparent=` to join the attempt's trace."""

    function: str
    path: list[str] = Field(default_factory=list)
    """Directories put on `sys.path` first (relative to the run file, whose own directory is searched too)."""

    @field_validator("function")
    @classmethod
    def _check(cls, value: str) -> str:
        return _function(value)


class CommandTarget(_Strict):
    """A process per attempt: the input on stdin (a string as is, an object as JSON), the output on stdout. A
    non-zero exit is an infrastructure error (`crash`), with stderr's tail. `TRACEPARENT` is set for it. It runs in a
    process group of its own, which a timeout ends whole (`stop_grace`)."""

    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    stop_grace: Duration = 5.0
    """At the attempt's timeout its process group gets SIGTERM; whatever still runs this long after gets SIGKILL."""


class McpServerSpec(_Strict):
    """An MCP tool server whose tools the built-in agent may call: a local process over stdio (`command`) or a
    streamable HTTP endpoint (`url`)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    command: list[str] | None = Field(None, min_length=1)
    """argv of a stdio server, e.g. `[python, -m, my_server]` (relative paths are the run file's; `python` is the
    Python evalsi runs on)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of a stdio server, on top of PATH and HOME (`env:VAR` reads the variable)."""
    cwd: str | None = None
    url: str | None = None
    """A streamable HTTP endpoint, e.g. `http://127.0.0.1:8000/mcp`."""
    headers: dict[str, str] = Field(default_factory=dict)
    tools: list[str] | None = None
    """Only these of the server's tools (default: all)."""
    timeout: Duration = 30.0
    """Per tool call, and for starting the server."""

    @model_validator(mode="after")
    def _one(self) -> McpServerSpec:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (a stdio server) or `url` (streamable HTTP)")
        return self


class OpenAITarget(_Strict):
    """The built-in reference agent: a tool-calling loop over an OpenAI-compatible chat endpoint."""

    base_url: str
    """The endpoint's base (`https://api.openai.com/v1`), or `stub`: the bundled stub model, for examples and tests."""
    model: str
    api_key: str | None = Field(None, repr=False)
    """`env:VAR` reads the variable; None sends no key (local servers)."""
    system: str | None = None
    tools: list[str] = Field(default_factory=list)
    """Python functions `module:function`; each one's JSON schema comes from its type hints and docstring."""
    mcp: list[McpServerSpec] = Field(default_factory=list)
    """MCP tool servers; their tools join `tools`."""
    mock_tools: bool = False
    """Answer tool calls from the task's `metadata.tool_results` (`{tool name: result}`) instead of running them."""
    max_steps: int = Field(8, ge=1, le=100)
    max_tokens: int | None = Field(None, ge=1)
    """Per attempt, over every call."""
    temperature: float = Field(0.0, ge=0, le=2)
    price: dict[str, float] = Field(default_factory=dict)
    """USD per million tokens: `{input: 0.15, output: 0.6}`, for cost and the run's USD budget."""

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[str]) -> list[str]:
        return [_function(v) for v in value]


class HttpTarget(_Strict):
    """An agent behind the agent harness HTTP contract v1 (`docs/harness.md`)."""

    url: str
    api_key: str | None = Field(None, repr=False)
    """`env:VAR` reads the variable; sent as `x-api-key`."""
    poll_interval: Duration = 0.5
    stop_grace: Duration = 120.0
    """After `stop` on a timeout, how long to keep polling for a terminal status."""
    model: str | None = None
    """A model override, sent when the agent accepts one."""


class TargetSpec(_Strict):
    python: PythonTarget | None = None
    command: CommandTarget | None = None
    openai: OpenAITarget | None = None
    http: HttpTarget | None = None

    @model_validator(mode="after")
    def _one(self) -> TargetSpec:
        given = [k for k in ("python", "command", "openai", "http") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one target kind (python, command, openai or http), not {len(given)}"
                + (f" ({', '.join(given)})" if given else "")
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("python", "command", "openai", "http") if getattr(self, k) is not None)


class DatasetSpec(_Strict):
    path: str
    """JSONL, JSON, CSV or Parquet (by extension), or a directory of task folders; relative to the run file."""
    format: Literal["auto", "tau"] = "auto"
    """`tau`: a τ-bench-style task file (`instruction`, `actions`, `outputs`): conversations with the simulated user."""
    limit: int | None = Field(None, ge=1)
    """Run only the first N tasks."""


class EvaluatorSpec(_Strict):
    ref: str
    params: dict[str, Any] = Field(default_factory=dict)


class GateSpec(_Strict):
    when: str
    """CEL over the aggregates: `metric('task-success').passHatK(3) >= 0.8`, `metric('latency').p95 < 3000`."""
    name: str | None = None


class FaultSpec(_Strict):
    """Faults injected into the built-in agent's tool calls, by rate (seeded: the same calls fail on every run with
    the same seed) or by call number (1-based, counted per tool and attempt)."""

    tool: str = "*"
    """A tool name, or `*` for every tool."""
    kind: Literal["error", "timeout", "malformed", "latency"]
    """`error`: the call fails with `message`; `timeout`: it fails as timed out after `latency`; `malformed`: it
    returns a result that is not what the tool returns; `latency`: it succeeds `latency` later."""
    rate: float | None = Field(None, gt=0, le=1)
    calls: list[int] | None = Field(None, min_length=1)
    latency: Duration = 0.0
    message: str | None = None

    @model_validator(mode="after")
    def _when(self) -> FaultSpec:
        if (self.rate is None) == (self.calls is None):
            raise ValueError("give exactly one of `rate` (0 < rate <= 1) or `calls` (call numbers, from 1)")
        if self.calls is not None and min(self.calls) < 1:
            raise ValueError("calls: call numbers start at 1")
        if self.kind == "latency" and self.latency <= 0:
            raise ValueError("latency: a `latency` fault needs a delay, e.g. `latency: 500ms`")
        return self


class LlmUserSpec(_Strict):
    """A simulated user played by a model over an OpenAI-compatible endpoint (or `base_url: stub`)."""

    base_url: str
    model: str
    api_key: str | None = Field(None, repr=False)
    persona: str | None = None
    """Who the user is; a task's `metadata.user.persona` wins."""
    temperature: float = Field(0.0, ge=0, le=2)
    price: dict[str, float] = Field(default_factory=dict)


class UserSpec(_Strict):
    """The user of multi-turn tasks: scripted turns, a Python function, or a model. Each task's `metadata.user`
    (`instruction`, `persona`, `turns`) says what this user wants."""

    scripted: list[str] | None = None
    """Replies after the task's input, in order, for every task (a task's `metadata.user.turns` wins); the
    conversation ends when they run out."""
    python: str | None = None
    """`module:function(task, messages)` returning the next user message, or None to end the conversation."""
    llm: LlmUserSpec | None = None
    max_turns: int = Field(10, ge=1, le=100)
    """Agent replies at most; the conversation ends after this many."""
    stop_marker: str = Field("###STOP###", min_length=1)
    """A user message holding this ends the conversation."""

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        return value if value is None else _function(value)

    @model_validator(mode="after")
    def _one(self) -> UserSpec:
        given = [k for k in ("scripted", "python", "llm") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one kind of user (scripted, python or llm), not {', '.join(given)}")
        return self

    @property
    def kind(self) -> str:
        return next((k for k in ("scripted", "python", "llm") if getattr(self, k) is not None), "scripted")


class EnvironmentSpec(_Strict):
    """Task folders' scripts (setup, check, teardown): they run as local processes, so only with `trust: local`."""

    trust: Literal["none", "local"] = "none"
    """`local`: run task scripts as subprocesses of this machine (process isolation only: no container, no VM)."""
    setup_timeout: Duration = 120.0
    check_timeout: Duration = 120.0
    teardown_timeout: Duration = 60.0
    pass_env: list[str] = Field(default_factory=list)
    """Environment variables given to the scripts besides PATH, LANG and the task's own (the rest are scrubbed)."""
    keep_workdirs: bool = False
    """Keep each attempt's working directory (printed in the report) instead of deleting it."""


class BudgetSpec(_Strict):
    usd: float | None = Field(None, gt=0)
    tokens: int | None = Field(None, gt=0)


class RunBody(_Strict):
    target: TargetSpec
    dataset: DatasetSpec
    trials: int = Field(1, ge=1, le=100)
    evaluators: list[EvaluatorSpec] = Field(default_factory=list)
    """Scored on each attempt's trace; a run with none needs tasks whose `check` script scores them."""
    judge: dict[str, Any] = Field(default_factory=dict)
    """Judge params given to every judge-based evaluator (its own params win)."""
    gates: list[GateSpec] = Field(default_factory=list)
    concurrency: int = Field(4, ge=1, le=1024)
    timeout: Duration = 300.0
    """Per attempt."""
    budget: BudgetSpec = BudgetSpec()
    faults: list[FaultSpec] = Field(default_factory=list)
    """Faults injected into tool calls (the built-in `openai` agent's tools, MCP's included)."""
    user: UserSpec | None = None
    """Makes every task a conversation with this user (tasks with `metadata.user` are conversations anyway)."""
    environment: EnvironmentSpec = EnvironmentSpec()
    seed: int = 0
    """For bootstrap intervals (recorded in the manifest)."""

    @field_validator("dataset", mode="before")
    @classmethod
    def _dataset(cls, value: Any) -> Any:
        return {"path": value} if isinstance(value, str) else value

    @field_validator("gates", mode="before")
    @classmethod
    def _gates(cls, value: Any) -> Any:
        return [{"when": g} if isinstance(g, str) else g for g in value] if isinstance(value, list) else value


class EvalRun(_Strict):
    apiVersion: Literal["evals.si/v1alpha1"]
    kind: Literal["EvalRun"]
    metadata: Metadata
    spec: RunBody


class RunSpec:
    """A checked run file: the document, where it lives (paths in it are relative to it), its evaluators resolved
    with their parsed params, and its hash (for the manifest)."""

    def __init__(self, doc: EvalRun, base_dir: Path, evaluators: list[tuple[str, Evaluator, Params]], raw: Any) -> None:
        self.doc = doc
        self.base_dir = base_dir
        self.evaluators = evaluators
        self.hash = hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def name(self) -> str:
        return self.doc.metadata.name

    @property
    def body(self) -> RunBody:
        return self.doc.spec

    def with_model(self, model: str) -> RunSpec:
        """The same run with another model for the target (`evalsi run --model`): openai and http targets only."""
        target = self.body.target
        if target.openai is not None:
            target = target.model_copy(update={"openai": target.openai.model_copy(update={"model": model})})
        elif target.http is not None:
            target = target.model_copy(update={"http": target.http.model_copy(update={"model": model})})
        else:
            raise RunSpecError([f"--model: a {target.kind} target has no model to override"])
        doc = self.doc.model_copy(update={"spec": self.body.model_copy(update={"target": target})})
        out = RunSpec(doc, self.base_dir, self.evaluators, {})
        out.hash = self.hash  # the file's; the manifest records the target's model apart
        return out

    def path(self, relative: str) -> Path:
        p = Path(relative).expanduser()
        return p if p.is_absolute() else self.base_dir / p


def _path(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc) or "(document)"


def parse_run(raw: Any, label: str, base_dir: Path) -> RunSpec:
    """Check a run document; raises `RunSpecError` listing every problem."""
    if not isinstance(raw, dict):
        raise RunSpecError([f"{label}: expected an EvalRun mapping (apiVersion, kind, metadata, spec)"])
    try:
        doc = EvalRun.model_validate(raw)
    except ValidationError as e:
        errors = []
        for err in e.errors():
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
            errors.append(f"{label}: {_path(loc)}: {msg}")
        raise RunSpecError(errors) from None
    errors: list[str] = []
    known = load_evaluators()
    evaluators: list[tuple[str, Evaluator, Params]] = []
    names: dict[str, int] = {}
    for i, spec in enumerate(doc.spec.evaluators):
        where = f"{label}: spec.evaluators.{i}"
        ev = known.get(spec.ref)
        if ev is None:
            close = difflib.get_close_matches(spec.ref, list(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else " (`evalsi evaluators list` shows them)"
            errors.append(f"{where}.ref: unknown evaluator {spec.ref!r}{hint}")
            continue
        if ev.scope not in ("span", "trace"):
            errors.append(f"{where}.ref: {spec.ref} has scope {ev.scope!r}; a run scores each attempt's trace")
            continue
        params = {**doc.spec.judge, **spec.params} if "judge" in ev.requires else spec.params
        try:
            parsed = ev.params.model_validate(params)
        except ValidationError as e:
            for err in e.errors():
                msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
                loc = ".".join(str(p) for p in err["loc"])
                errors.append(f"{where}.params{'.' + loc if loc else ''}: {msg}")
            continue
        name = getattr(parsed, "name", None) or spec.ref.rsplit("/", 1)[-1]
        if name in names:
            errors.append(f"{where}: evaluator {names[name]} already scores {name!r}; give one a `name:` param")
        names[name] = i
        evaluators.append((spec.ref, ev, parsed))
    for i, gate in enumerate(doc.spec.gates):
        try:
            compile_gate(gate.when)
        except ValueError as e:
            errors.append(f"{label}: spec.gates.{i}.when: {e}")
    if errors:
        raise RunSpecError(errors)
    return RunSpec(doc, base_dir, evaluators, raw)


def load_run(path: str | Path) -> RunSpec:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as e:
        raise RunSpecError([f"{p}: cannot read: {e.strerror}"]) from None
    except yaml.YAMLError as e:
        raise RunSpecError([f"{p}: not YAML: {e}"]) from None
    return parse_run(raw, str(p), p.parent)
