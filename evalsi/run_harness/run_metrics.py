"""The metrics a run adds to its evaluators' scores (`duration_ms`, `tokens`, `cost_usd`): measured on each attempt,
carried on its trace's root span (`evalsi.attempt.*`), and rebuilt from the stored traces when the attempts are not
in memory (`--resume` of earlier attempts, `rescore`, `compare` and `--baseline`), so the same data gives the same
metrics, and gates the same verdict, however the run is read."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from evalsi.run_harness.model import Attempt
from evalsi.run_harness.stats import Observation

RUN_ADDED = ("duration_ms", "tokens", "cost_usd")
"""The run-added metrics: lower is better for each (time, tokens, cost)."""
ROOT_ATTRIBUTE = "evalsi.attempt."
"""The prefix of the root span attributes that carry an attempt's measures (`evalsi.attempt.duration_ms`)."""

Measures = dict[str, float]
"""An attempt's run-added measures by metric name: `duration_ms` always; `tokens` when the attempt made model
calls, `cost_usd` when one of them was priced."""
Measured = tuple[str, int, Measures]
"""(task id, trial, measures) of one attempt."""


def attempt_measures(attempt: Attempt) -> Measures:
    """What the run adds for one attempt: its wall time, and its model calls' tokens and cost when it made any."""
    calls = attempt.llm_calls()
    out: Measures = {"duration_ms": (attempt.end_ns - attempt.start_ns) / 1e6}
    if calls:
        out["tokens"] = attempt.tokens
    if any(c.cost_usd is not None for c in calls):
        out["cost_usd"] = attempt.cost_usd
    return out


def root_attributes(measures: Measures) -> dict[str, float]:
    """The measures as the root span carries them."""
    return {ROOT_ATTRIBUTE + name: value for name, value in measures.items()}


def trace_measures(spans: list[dict[str, Any]]) -> Measures:
    """An attempt's measures from its stored spans (canonical dicts): the root span's `evalsi.attempt.*` attributes;
    for a trace without them (recorded before they existed, or not by a run), the root span's duration (the trace's
    extent when it has no single root) and its model calls' tokens and cost."""
    roots = [s for s in spans if not s.get("parent_span_id")]
    if len(roots) == 1:
        carried = roots[0].get("attributes") or {}
        out = {name: carried[ROOT_ATTRIBUTE + name] for name in RUN_ADDED if ROOT_ATTRIBUTE + name in carried}
        if "duration_ms" in out:
            return {k: float(v) if k != "tokens" else int(v) for k, v in out.items()}
    timed = roots if len(roots) == 1 else spans
    start = min(int(s["start_time_unix_nano"]) for s in timed)
    end = max(int(s["start_time_unix_nano"]) + int(s.get("duration_ns") or 0) for s in timed)
    found: Measures = {"duration_ms": max(0, end - start) / 1e6}
    calls = [s for s in spans if s.get("step_type") == "llm"]
    if calls:
        found["tokens"] = sum((s.get("input_tokens") or 0) + (s.get("output_tokens") or 0) for s in calls)
    if any(s.get("cost_usd") is not None for s in calls):
        found["cost_usd"] = sum(s.get("cost_usd") or 0.0 for s in calls)
    return found


def stored_measures(get: Callable[[str], Any], scores: Iterable[dict[str, Any]]) -> list[Measured]:
    """The measures of the attempts behind stored scores (one trace per task and trial, read through
    `get(path) -> JSON` from the collector's API); an attempt whose trace is gone is left out."""
    traces: dict[tuple[str, int], str] = {}
    for s in scores:
        traces.setdefault((str(s["task_id"]), int(s["trial"])), s["trace_id"])
    out: list[Measured] = []
    for (task_id, trial), trace_id in sorted(traces.items()):
        spans: list[dict[str, Any]] = []
        offset: int | None = 0
        while offset is not None:
            page = get(f"/api/v1/traces/{trace_id}?offset={offset}")
            if page is None:
                break
            spans += page.get("spans", [])
            offset = page.get("next_offset") if page.get("spans") else None
        if spans:
            out.append((task_id, trial, trace_measures(spans)))
    return out


def measured_observations(measured: list[Measured]) -> dict[str, list[Observation]]:
    """Each run-added metric's observations: `duration_ms` for every attempt; `tokens` (`cost_usd`) for every attempt
    when one of them made model calls (was priced), 0 for the others."""
    out: dict[str, list[Observation]] = {}
    for name in RUN_ADDED:
        if any(name in m for _, _, m in measured):
            out[name] = [Observation(task, trial, m.get(name, 0), None, "scored") for task, trial, m in measured]
    return out


def with_measures(scores: list[dict[str, Any]], measured: list[Measured]) -> list[dict[str, Any]]:
    """Scores with the run-added metrics as numeric scores (what `compare` pairs), except a name an evaluator
    scored already."""
    scored = {s["name"] for s in scores}
    added = [
        {"name": name, "task_id": o.task_id, "trial": o.trial, "value": o.value, "passed": None, "outcome": "scored"}
        for name, obs in measured_observations(measured).items()
        if name not in scored
        for o in obs
    ]
    return [*scores, *added]
