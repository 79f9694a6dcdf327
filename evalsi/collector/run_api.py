"""The run API's logic: scoring an offline run's stored traces with the run's evaluators (`POST /v1/runs/{id}/score`)
with the same evaluator code and into the same scores table as online policies, and recording runs.

The harness sends each attempt's trace over OTLP like any app; here the collector waits until the trace is stored
(the expected span count), reads it back, and evaluates it. A score's key carries the run id and the trial, so
scoring a trace again replaces its scores instead of adding to them.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalsi import cel
from evalsi.collector.score_api import score_record
from evalsi.evaluators import Evaluator, Params, Target, load_evaluators, run
from evalsi.evaluators.judge_client import Judges
from evalsi.json_codec import not_text_at
from evalsi.model.ids import is_trace_id
from evalsi.model.score import Score
from evalsi.model.span import Span, span_from_canonical
from evalsi.model.trajectory import build_trajectory
from evalsi.store import TraceQueries

MAX_TRACES = 1000
RUN_ID = re.compile(r"^[A-Za-z0-9._-]{1,200}$")  # use fullmatch: re's $ also matches before a final newline
MAX_WAIT_S = 300.0
MAX_UNIX_NANO = 2**63 - 1
"""The last time the store's nanosecond clock holds (2262): a later `since_unix_nano` is refused."""


class RunRequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EvaluatorRef(_Body):
    ref: str
    params: dict[str, Any] = Field(default_factory=dict)


class GivenScoreBody(_Body):
    """A score the harness brings along for a trace: a task checker's verdict, an imported harness's scorer."""

    name: str = Field(min_length=1, max_length=200)
    value: float | None = None
    passed: bool | None = None
    label: str | None = Field(None, max_length=1000)
    explanation: str | None = Field(None, max_length=20_000)
    source: Literal["checker", "imported"] = "checker"


class TraceToScore(_Body):
    trace_id: str
    task_id: str
    trial: int = Field(ge=0, le=2**32 - 1)
    spans: int = Field(1, ge=1)
    """How many spans the harness sent: the trace is scored once that many are stored."""
    reference: dict[str, Any] = Field(default_factory=dict)
    context: list[str] = Field(default_factory=list)
    scores: list[GivenScoreBody] = Field(default_factory=list, max_length=100)
    """Stored as they are, keyed like the evaluators' scores (the run, the trial, the task)."""


class ScoreRunRequest(_Body):
    name: str = Field(min_length=1, max_length=200)
    evaluators: list[EvaluatorRef] = Field(default_factory=list, max_length=50)
    judge: dict[str, Any] = Field(default_factory=dict)
    traces: list[TraceToScore] = Field(min_length=1, max_length=MAX_TRACES)
    since_unix_nano: int = Field(0, ge=0, le=MAX_UNIX_NANO)
    """The run's start: traces are looked up from there."""
    wait_s: float = Field(30.0, ge=0, le=MAX_WAIT_S)


class RunRecord(_Body):
    run_id: str = Field(pattern=RUN_ID.pattern)
    name: str = Field(min_length=1)
    status: str = Field(pattern="^(running|finished|interrupted|failed)$")
    manifest: dict[str, Any] = Field(default_factory=dict)
    summary: dict[str, Any] = Field(default_factory=dict)


@dataclass
class RunScoring:
    run_id: str
    request: ScoreRunRequest
    evaluators: list[tuple[str, Evaluator, Params]]

    @property
    def policy(self) -> str:
        return f"run:{self.request.name}"


def _parse(model: type[_Body], body: Any) -> Any:
    where = not_text_at(body)
    if where is not None:
        raise RunRequestError(400, f"{where}: a lone UTF-16 surrogate is not text: send valid Unicode") from None
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        raise RunRequestError(400, f"{where}: {msg}") from None


def plan_scoring(run_id: str, body: Any) -> RunScoring:
    """Check a scoring request: every evaluator exists and takes its params (with the run's judge params merged
    into judge-based ones), every trace id is one."""
    if not RUN_ID.fullmatch(run_id):
        raise RunRequestError(400, f"run_id: invalid run id {run_id[:80]!r}: 1 to 200 letters, digits, '.', '_' or '-'")
    request: ScoreRunRequest = _parse(ScoreRunRequest, body)
    known = load_evaluators()
    evaluators = []
    for i, spec in enumerate(request.evaluators):
        ev = known.get(spec.ref)
        if ev is None:
            raise RunRequestError(400, f"evaluators.{i}.ref: unknown evaluator {spec.ref!r}")
        if ev.scope != "trace":
            raise RunRequestError(400, f"evaluators.{i}.ref: {spec.ref} has scope {ev.scope!r}; runs score traces")
        raw = {**request.judge, **spec.params} if "judge" in ev.requires else spec.params
        try:
            evaluators.append((spec.ref, ev, ev.params.model_validate(raw)))
        except ValidationError as e:
            err = e.errors()[0]
            raise RunRequestError(400, f"evaluators.{i}.params: {err['msg']}") from None
    if not request.evaluators and not any(t.scores for t in request.traces):
        raise RunRequestError(400, "evaluators: give at least one evaluator, or scores with the traces")
    for i, t in enumerate(request.traces):
        if not is_trace_id(t.trace_id):
            raise RunRequestError(400, f"traces.{i}.trace_id: not a trace id: {t.trace_id[:80]!r}")
    return RunScoring(run_id, request, evaluators)


def wait_for_traces(
    store: TraceQueries, plan: RunScoring, project: str | None = None
) -> tuple[dict[str, list[Span]], dict[str, str]]:
    """The traces once stored whole (each with at least the spans the harness sent), and why each other one is
    missing after `wait_s` (only `project`'s traces, when given)."""
    wanted = {t.trace_id.lower(): t.spans for t in plan.request.traces}
    since = plan.request.since_unix_nano
    deadline = time.monotonic() + plan.request.wait_s
    pause = 0.05
    counts: dict[str, int] = {}
    while True:
        counts = store.span_counts(list(wanted), since_ns=since, project=project)
        pending = [t for t, n in wanted.items() if counts.get(t, 0) < n]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.5)
    complete = [t for t, n in wanted.items() if counts.get(t, 0) >= n]
    missing = {
        t: f"{counts.get(t, 0)} of {n} spans stored after {plan.request.wait_s:g}s (sampled out by the collector's "
        "pipeline, or it is behind)"
        for t, n in wanted.items()
        if counts.get(t, 0) < n
    }
    traces = store.get_traces(complete, since_ns=since, project=project) if complete else {}
    return {t: [span_from_canonical(c) for c in rows] for t, rows in traces.items()}, missing


def score_traces(
    plan: RunScoring, traces: dict[str, list[Span]], judges: Judges | None, project: str = "default"
) -> list[Score]:
    """Every evaluator over every stored trace, each score keyed by the project, the run, the trial and the task."""
    out: list[Score] = []
    for item in plan.request.traces:
        spans = traces.get(item.trace_id.lower())
        if not spans:
            continue
        root = next((s for s in spans if not s.parent_span_id), spans[0])
        target = Target(
            spans, span=root, trajectory=build_trajectory(spans), reference=item.reference,
            context=item.context or None, judges=judges,
        )  # fmt: skip
        found: list[Score] = []
        for _ref, ev, params in plan.evaluators:
            for s in run(ev, target, params):
                s.source = "llm_judge" if "judge" in ev.requires else "code"
                found.append(s)
        for given in item.scores:
            found.append(Score(
                given.name, value=given.value, passed=given.passed, label=given.label, explanation=given.explanation,
                evaluator=given.source, source=given.source,
            ))  # fmt: skip
        for s in found:
            s.trace_id, s.span_id = root.trace_id, root.span_id
            s.session_id = root.session_id or ""
            s.policy = plan.policy
            s.run_id, s.trial, s.task_id = plan.run_id, item.trial, item.task_id
            s.project = project
        out.extend(found)
    return out


def score_dict(s: Score) -> dict[str, Any]:
    """A run's score as the API answers it: the stored score's record, with the task, the trial and the judge's cost."""
    return {**score_record(s), "task_id": s.task_id, "trial": s.trial, "judge_cost_usd": s.judge_cost_usd}


def parse_run_record(body: Any) -> RunRecord:
    record: RunRecord = _parse(RunRecord, body)
    return record


class SelectRequest(_Body):
    where: str = Field(min_length=1, max_length=10_000)
    """CEL over `trace` (as in policy selectors), e.g. `trace.service_name == "chat" && trace.error_count > 0`."""
    since_unix_nano: int = Field(0, ge=0, le=MAX_UNIX_NANO)
    limit: int = Field(1000, ge=1, le=10_000)
    """At most this many matching traces, newest first."""
    scan: int = Field(10_000, ge=1, le=100_000)
    """At most this many recent traces looked at."""


def select_traces(store: TraceQueries, body: Any, project: str | None = None) -> list[str]:
    """Stored traces matching a CEL condition over `trace`, newest first (for `evalsi rescore --traces`)."""
    request: SelectRequest = _parse(SelectRequest, body)
    try:
        program = cel.compile(request.where, variables=("trace",), schema=cel.SCHEMA)
    except ValueError as e:
        raise RunRequestError(400, f"where: {e}") from None
    recent = [t["trace_id"] for t in store.list_traces(limit=request.scan, project=project)
              if t["start_time_unix_nano"] >= request.since_unix_nano]  # fmt: skip
    found: list[str] = []
    for at in range(0, len(recent), 500):
        chunk = recent[at : at + 500]
        traces = store.get_traces(chunk, since_ns=request.since_unix_nano, project=project)
        for trace_id in chunk:
            spans = [span_from_canonical(c) for c in traces.get(trace_id, [])]
            if spans and program.matches(cel.trace_activation(spans, trace_id)):
                found.append(trace_id)
                if len(found) >= request.limit:
                    return found
    return found
