"""The Score API's logic: evaluating records a caller already has (`POST /v1/evaluate`), taking late human
feedback as scores (`POST /v1/feedback`), and summing stored scores into window aggregates (policy stats).

Aggregates count `scored` outcomes only: a numeric score gets its mean with a Student t interval, a pass/fail
score its pass rate with a Wilson interval (the same choice the policy windows make).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalsi.evaluators import Evaluator, Params, Target, load_evaluators, parse_params, run
from evalsi.evaluators.judge_client import Judges
from evalsi.json_codec import not_text_at
from evalsi.model.ids import is_span_id, is_trace_id
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.model.trajectory import build_trajectory
from evalsi.policies.baseline import parse_baseline
from evalsi.policies.calibration import judge_calibrations
from evalsi.policies.compare import Sample, compare
from evalsi.policies.intervals import mean_interval, wilson_interval

MAX_RECORDS = 1000
MAX_EVALUATORS = 50
CONFIDENCE = 0.95
MAX_WINDOW_S = 10 * 365 * 86400
"""The longest policy stats window: ten years back is still after 1970, where stored times start."""


class RequestError(Exception):
    """A request the API refuses: `status` is the HTTP status, the message says what to fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EvaluateRecord(_Body):
    input: str | None = None
    output: str | None = None
    reference: str | dict[str, Any] | None = None
    context: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)


class EvaluatorSpec(_Body):
    ref: str
    params: dict[str, Any] = Field(default_factory=dict)


class EvaluateRequest(_Body):
    records: list[EvaluateRecord]
    evaluators: list[EvaluatorSpec] = Field(min_length=1)


class FeedbackRequest(_Body):
    trace_id: str
    name: str = Field(min_length=1)
    # bool first: JSON true must stay a verdict, not become 1.0
    value: bool | int | float | str
    comment: str | None = None
    span_id: str | None = None


def _validation_message(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(body)'}: {err['msg'].removeprefix('Value error, ')}"
        for err in e.errors()
    )


def _parse(model: type[_Body], body: Any) -> Any:
    where = not_text_at(body)
    if where is not None:
        raise RequestError(400, f"{where}: a lone UTF-16 surrogate is not text: send valid Unicode") from None
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise RequestError(400, _validation_message(e)) from None


# --- POST /v1/evaluate ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvaluationPlan:
    """A validated request: the records and each evaluator with its parsed params."""

    records: list[EvaluateRecord]
    evaluators: list[tuple[Evaluator, Params]]


def plan_evaluation(body: Any) -> EvaluationPlan:
    """Validate an evaluate request; RequestError (400, or 413 past MAX_RECORDS) names the offending key."""
    if isinstance(body, dict) and isinstance(body.get("records"), list) and len(body["records"]) > MAX_RECORDS:
        raise RequestError(
            413, f"records: {len(body['records'])} records in one request; at most {MAX_RECORDS}, split the batch"
        )
    request: EvaluateRequest = _parse(EvaluateRequest, body)
    if len(request.evaluators) > MAX_EVALUATORS:
        raise RequestError(400, f"evaluators: at most {MAX_EVALUATORS} per request, not {len(request.evaluators)}")
    known = load_evaluators()
    evaluators = []
    for i, spec in enumerate(request.evaluators):
        ev = known.get(spec.ref)
        if ev is None:
            raise RequestError(
                400, f"evaluators.{i}.ref: unknown evaluator {spec.ref!r}; `evalsi evaluators list` shows the refs"
            )
        if ev.scope == "session":
            raise RequestError(400, f"evaluators.{i}.ref: {spec.ref} is session-scoped; records have no sessions")
        try:
            params = parse_params(ev, spec.params)
        except ValueError as e:
            problems = "; ".join(
                f"evaluators.{i}.params" + (p.removeprefix("(params)") if p.startswith("(params)") else f".{p}")
                for p in str(e).split("; ")
            )
            raise RequestError(400, problems) from None
        evaluators.append((ev, params))
    return EvaluationPlan(request.records, evaluators)


def _message(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def record_target(record: EvaluateRecord, judges: Judges | None = None) -> Target:
    """A one-span trace standing for the record: an LLM call whose input and output are the record's texts;
    judge-based evaluators use `judges`."""
    now = time.time_ns()
    span = Span(
        trace_id=os.urandom(16).hex(), span_id=os.urandom(8).hex(), parent_span_id="", name="evaluate",
        kind="INTERNAL", start_time_unix_nano=now, end_time_unix_nano=now, step_type="llm",
        input=[_message("user", record.input)] if record.input is not None else [],
        output=[{**_message("assistant", record.output), "finish_reason": "stop"}] if record.output is not None else [],
        content_captured=True,
    )  # fmt: skip
    reference = record.reference
    if isinstance(reference, str):
        reference = {"expected_output": reference}
    return Target(
        spans=[span], span=span, trajectory=build_trajectory([span]), reference=reference or {},
        context=list(record.context), judges=judges,
    )  # fmt: skip


def _score_dict(s: Score) -> dict[str, Any]:
    return {
        "name": s.name, "evaluator": s.evaluator, "evaluator_version": s.evaluator_version, "outcome": s.outcome,
        "value": s.value, "passed": s.passed, "label": s.label, "explanation": s.explanation, "reason": s.reason,
    }  # fmt: skip


def score_record(s: Score) -> dict[str, Any]:
    """A stored score as the API shows it: the verdict and where it belongs."""
    return {
        **_score_dict(s), "trace_id": s.trace_id, "span_id": s.span_id, "policy": s.policy, "source": s.source,
        "timestamp_unix_nano": s.timestamp_unix_nano,
    }  # fmt: skip


def summarize(
    *,
    n: int,
    value_n: int,
    value_mean: float | None,
    value_sd: float | None,
    pass_n: int,
    passed: int,
    value_min: float | None = None,
    value_max: float | None = None,
    value_binary: int = 0,
) -> dict[str, Any]:
    """The headline of one score series: numeric → mean with an interval within what the values can be
    (`intervals.mean_interval`: Wilson for 0/1 values, t clamped to [0, 1] for rates, log-t for non-negative
    measures, t otherwise; `method` names it); pass/fail → rate with Wilson."""
    rate = passed / pass_n if pass_n else None
    method: str | None
    if value_n:
        kind, mean = "numeric", value_mean
        interval, method = mean_interval(
            value_n,
            value_mean or 0.0,
            value_sd or 0.0,
            minimum=value_min,
            maximum=value_max,
            binary=value_binary,
            confidence=CONFIDENCE,
        )
    elif pass_n:
        kind, mean, method = "pass_fail", rate, "wilson"
        interval = wilson_interval(passed, pass_n, CONFIDENCE)
    else:
        kind, mean, interval, method = "label", None, None, None
    return {
        "kind": kind, "n": n, "mean": mean, "interval": list(interval) if interval else None, "method": method,
        "confidence": CONFIDENCE, "pass_n": pass_n, "passed": passed, "pass_rate": rate,
    }  # fmt: skip


def aggregate(scores: list[Score]) -> list[dict[str, Any]]:
    """Per (evaluator, score name): scored n, mean and interval; skipped and errors counted beside them."""
    groups: dict[tuple[str, str], list[Score]] = {}
    for s in scores:
        groups.setdefault((s.evaluator, s.name), []).append(s)
    out = []
    for (evaluator, name), group in groups.items():
        scored = [s for s in group if s.outcome == "scored"]
        values = [float(s.value) for s in scored if s.value is not None]
        verdicts = [s.passed for s in scored if s.passed is not None]
        mean = math.fsum(values) / len(values) if values else None
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        out.append(
            {
                "evaluator": evaluator, "name": name,
                **summarize(n=len(scored), value_n=len(values), value_mean=mean, value_sd=sd,
                            pass_n=len(verdicts), passed=sum(verdicts), value_min=min(values, default=None),
                            value_max=max(values, default=None), value_binary=sum(v in (0.0, 1.0) for v in values)),
                "skipped": sum(s.outcome == "skipped" for s in group),
                "errors": sum(s.outcome == "error" for s in group),
            }
        )  # fmt: skip
    return out


EVALUATE_DEADLINE_S = 30.0
"""How long one `POST /v1/evaluate` may run: evaluators not started by then are error scores (`deadline exceeded`),
and the request is answered 504 if one evaluator alone runs past it (its thread is one of `EVALUATE_THREADS`)."""
EVALUATE_THREADS = 2
"""The threads `/v1/evaluate` runs on, apart from the ones serving OTLP, health checks and queries: while this many
evaluations run (a runaway one included), another request is refused 429 instead of queueing behind them."""


def evaluate(plan: EvaluationPlan, judges: Judges | None, deadline: float | None = None) -> dict[str, Any]:
    """Run every evaluator on every record, judge-based ones with the service's `judges`; blocking (the API runs
    it on its own threads). An evaluator not started by `deadline` (monotonic) is an error score instead."""
    results = []
    every: list[Score] = []
    for i, record in enumerate(plan.records):
        target = record_target(record, judges)
        scores = []
        for ev, params in plan.evaluators:
            if deadline is not None and time.monotonic() > deadline:
                late = Score.error(ev.name.rsplit("/", 1)[-1], "deadline exceeded",
                                   f"not run: the request passed its {EVALUATE_DEADLINE_S:g} s deadline")  # fmt: skip
                late.evaluator, late.evaluator_version = ev.name, ev.version
                scores.append(late)
            else:
                scores += run(ev, target, params)
        every.extend(scores)
        results.append({"index": i, "metadata": record.metadata, "scores": [_score_dict(s) for s in scores]})
    return {"results": results, "aggregates": aggregate(every)}


# --- POST /v1/feedback ----------------------------------------------------------------------------------------


def feedback_score(body: Any) -> Score:
    """A human's verdict on a trace as a Score: bool → passed, number → value, string → label."""
    request: FeedbackRequest = _parse(FeedbackRequest, body)
    if not is_trace_id(request.trace_id):
        raise RequestError(400, f"trace_id: invalid trace id {request.trace_id[:80]!r}: expected 32 hex digits")
    if request.span_id is not None and not is_span_id(request.span_id):
        raise RequestError(400, f"span_id: invalid span id {request.span_id[:80]!r}: expected 16 hex digits")
    if not request.name.strip():
        raise RequestError(400, "name: must not be blank")
    score = Score(
        request.name.strip(), explanation=request.comment, trace_id=request.trace_id.lower(),
        span_id=(request.span_id or "").lower(), policy="feedback", evaluator="feedback", source="human",
    )  # fmt: skip
    value = request.value
    if isinstance(value, bool):
        score.passed = value
    elif isinstance(value, int | float):
        try:
            number = float(value)  # an integer past a double's range overflows
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise RequestError(400, "value: must be a finite number (within a double's range)")
        score.value = number
    else:
        score.label = value
    return score


# --- policy stats ---------------------------------------------------------------------------------------------


def window_stats(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Store rows (see TraceStore.score_window_stats) as aggregates with intervals."""
    out = []
    for r in rows:
        value_n = int(r["value_n"])
        out.append(
            {
                "policy": r["policy"], "evaluator": r["evaluator"], "name": r["name"],
                **summarize(n=int(r["n"]), value_n=value_n, value_mean=r["value_mean"], value_sd=r["value_sd"],
                            pass_n=int(r["pass_n"]), passed=int(r["passed"]), value_min=r.get("value_min"),
                            value_max=r.get("value_max"), value_binary=int(r.get("value_binary") or 0)),
                "p50": r["p50"] if value_n else None, "p95": r["p95"] if value_n else None,
            }
        )  # fmt: skip
    return out


def compared_stats(
    stats: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    baseline_rows: list[dict[str, Any]],
    *,
    by_name: bool,
    margin: float,
    worse: str,
) -> None:
    """Each of `stats` (made from `rows`) gets `comparison`: its difference with the same series of `baseline_rows`
    (Newcombe for rates, Welch for means; None without both sides), matched by (policy, evaluator, name), or by name
    alone for an offline run's scores (`by_name`)."""
    if by_name:
        base: dict[Any, dict[str, Any]] = {}
        for r in sorted(baseline_rows, key=lambda r: -int(r["n"])):
            base.setdefault(r["name"], r)
    else:
        base = {(r["policy"], r["evaluator"], r["name"]): r for r in baseline_rows}
    for stat, row in zip(stats, rows, strict=True):
        found = base.get(row["name"] if by_name else (row["policy"], row["evaluator"], row["name"]))
        comparison = None
        if found is not None:
            comparison = compare(Sample.from_row(row), Sample.from_row(found), margin=margin, worse=worse)
        stat["comparison"] = comparison.as_dict() if comparison is not None else None


def check_comparison(baseline: str | None, margin: float, worse: str) -> tuple[float | None, str | None] | None:
    """The baseline's (seconds, run id), None without one; ValueError naming the parameter that is wrong."""
    if worse not in ("lower", "higher"):
        raise ValueError(f"worse: must be 'lower' or 'higher', not {worse[:20]!r}")
    if not math.isfinite(margin) or margin < 0:
        raise ValueError(f"margin: must be a number >= 0, not {margin}")
    if not baseline:
        return None
    try:
        return parse_baseline(baseline)
    except ValueError as e:
        raise ValueError(f"baseline: {e}") from None


def policy_stats(
    store: Any,
    *,
    window: str,
    since_ns: int,
    policy: str | None = None,
    project: str | None = None,
    baseline: str | None = None,
    margin: float = 0.0,
    worse: str = "lower",
) -> dict[str, Any]:
    """`GET /api/v1/policies/stats` and `evalsi policies stats`: the scored scores since `since_ns` per policy,
    evaluator and name with their intervals; with `baseline` (a period before `since_ns`, or `run:<id>`), each
    one's difference with it; and the calibration of every judge people gave feedback on. Raises ValueError for a
    bad `baseline` or `worse`."""
    period = check_comparison(baseline, margin, worse)
    rows = store.score_window_stats(since_ns=since_ns, policy=policy, project=project)
    stats = window_stats(rows)
    doc: dict[str, Any] = {"window": window, "since_unix_nano": since_ns, "stats": stats}
    if period is not None:
        seconds, run_id = period
        if run_id is not None:
            base = store.score_window_stats(since_ns=0, run_id=run_id, project=project)
        else:
            assert seconds is not None
            start = max(0, since_ns - int(seconds * 1e9))
            base = store.score_window_stats(since_ns=start, until_ns=since_ns, policy=policy, project=project)
        compared_stats(stats, rows, base, by_name=run_id is not None, margin=margin, worse=worse)
        doc["baseline"] = {"baseline": baseline, "margin": margin, "worse": worse}
    doc["calibration"] = judge_calibrations(store.judge_agreement(since_ns=since_ns, policy=policy, project=project))
    return doc
