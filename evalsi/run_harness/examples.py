"""The examples a report shows, for the HTML and the Markdown report alike: each attempt (a task's trial) with its
outcome from its scores, the expected output from the task's reference, the actual output from its trajectory, the
word-level difference of the two, and a task's attempts with the same trajectory and verdicts grouped."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["pass", "fail", "error", "scored", "infra"]
"""An attempt's outcome: a score failed (`fail`) or errored (`error`), every pass/fail score passed (`pass`), only
numeric scores (`scored`), or no scores because the harness could not carry the attempt out (`infra`)."""

FAILING: frozenset[str] = frozenset({"fail", "error"})
RUN_ADDED = frozenset({"duration_ms", "tokens", "cost_usd"})
"""Metrics the run measures itself: they differ between identical attempts, so grouping leaves them out."""
_VOLATILE = frozenset({"span_id", "parent_span_id", "trace_id", "session_id", "id", "call_id", "duration_ns",
                       "start_time_unix_nano", "cost_usd"})  # fmt: skip
"""Trajectory fields that differ between attempts that did the same thing."""


def score_outcome(score: Mapping[str, Any]) -> Outcome:
    if score.get("outcome") == "error":
        return "error"
    if score.get("passed") is False:
        return "fail"
    if score.get("passed") is True:
        return "pass"
    return "scored"


def outcome_of(scores: list[Mapping[str, Any]]) -> Outcome:
    """The attempt's outcome: the worst of its scores' (error, then fail, then pass; only numeric: scored)."""
    found = {score_outcome(s) for s in scores}
    for outcome in ("error", "fail", "pass"):
        if outcome in found:
            return outcome  # type: ignore[return-value]
    return "scored"


def _trial(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


@dataclass
class Attempt:
    """One task's trial as a report shows it."""

    task_id: str
    trial: int
    trace_id: str = ""
    scores: list[dict[str, Any]] = field(default_factory=list)
    trajectory: dict[str, Any] | None = None
    infra: dict[str, Any] | None = None
    """The infrastructure error that stopped it, if any (then it has no scores)."""

    @property
    def outcome(self) -> Outcome:
        return "infra" if self.infra is not None and not self.scores else outcome_of(self.scores)

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING

    @property
    def actual(self) -> str | None:
        """The final output, from the trajectory (None when it was not loaded)."""
        if self.trajectory is None:
            return None
        final = self.trajectory.get("final_output")
        return None if final is None else final if isinstance(final, str) else json.dumps(final, ensure_ascii=False)

    def by_metric(self) -> dict[str, Outcome]:
        """Each metric's outcome in this attempt (the worst, if a metric was scored twice)."""
        names: dict[str, list[dict[str, Any]]] = {}
        for s in self.scores:
            names.setdefault(str(s.get("name")), []).append(s)
        return {name: outcome_of(group) for name, group in names.items()}

    def verdicts(self) -> tuple[tuple[str, str, str], ...]:
        """What the evaluators said, without what differs between identical attempts."""
        return tuple(sorted(
            (str(s.get("name")), score_outcome(s), json.dumps([s.get("value"), s.get("explanation")], default=str))
            for s in self.scores if s.get("name") not in RUN_ADDED
        ))  # fmt: skip


def attempts_of(
    scores: list[Mapping[str, Any]],
    trajectories: Mapping[str, dict[str, Any]] | None = None,
    infra_errors: list[Mapping[str, Any]] | None = None,
) -> list[Attempt]:
    """The run's attempts, by task and trial, from its scores and infrastructure errors."""
    found: dict[tuple[str, int], Attempt] = {}
    for s in scores:
        key = (str(s.get("task_id") or ""), _trial(s.get("trial")))
        a = found.setdefault(key, Attempt(*key, trace_id=str(s.get("trace_id") or "")))
        a.scores.append(dict(s))
    for e in infra_errors or []:
        key = (str(e.get("task_id") or ""), _trial(e.get("trial")))
        a = found.setdefault(key, Attempt(*key, trace_id=str(e.get("trace_id") or "")))
        a.infra = dict(e)
    for a in found.values():
        if trajectories is not None and a.trace_id:
            a.trajectory = trajectories.get(a.trace_id)
    return sorted(found.values(), key=lambda a: (a.task_id, a.trial))


def expected_of(reference: Any) -> str | None:
    """The expected output a task's reference gives (`expected_output`, as exact-match reads it), or None."""
    if not isinstance(reference, Mapping):
        return None if reference is None else str(reference)
    expected = reference.get("expected_output")
    if expected is None:
        return None
    return expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)


def _stable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def fingerprint(trajectory: Mapping[str, Any] | None) -> str | None:
    """What the attempt did (steps, their contents, the final output), without ids and timings; None when the
    trajectory was not loaded."""
    if trajectory is None:
        return None
    body = {"steps": trajectory.get("steps"), "final_output": trajectory.get("final_output")}
    return json.dumps(_stable(body), sort_keys=True, default=str)


def grouped(attempts: list[Attempt]) -> list[list[Attempt]]:
    """One task's attempts with the same trajectory and the same verdicts together, in trial order; attempts whose
    trajectory was not loaded stay alone."""
    groups: dict[Any, list[Attempt]] = {}
    for a in sorted(attempts, key=lambda a: a.trial):
        print_ = fingerprint(a.trajectory)
        key = (print_, a.verdicts(), a.outcome) if print_ is not None else ("alone", a.trial)
        groups.setdefault(key, []).append(a)
    return list(groups.values())


def trials_text(group: list[Attempt]) -> str:
    """`trial 1`, or `trials 0, 2, 3: same trajectory`."""
    if len(group) == 1:
        return f"trial {group[0].trial}"
    return "trials " + ", ".join(str(a.trial) for a in group) + ": same trajectory"


# --- expected against actual --------------------------------------------------------------------------------------

_TOKENS = re.compile(r"\s+|\w+|[^\w\s]")

Piece = tuple[str, bool]
"""A run of text and whether it differs from the other side."""


def difference(expected: str, actual: str) -> tuple[list[Piece], list[Piece]]:
    """Expected and actual cut into runs, word by word, each marked when the other side does not have it."""
    a, b = _TOKENS.findall(expected), _TOKENS.findall(actual)
    left: list[Piece] = []
    right: list[Piece] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if i2 > i1:
            left.append(("".join(a[i1:i2]), tag != "equal"))
        if j2 > j1:
            right.append(("".join(b[j1:j2]), tag != "equal"))
    return left, right


def first_difference(expected: str, actual: str) -> int | None:
    """Where the two texts part (a character index), or None when they are equal."""
    if expected == actual:
        return None
    return next((i for i, (x, y) in enumerate(zip(expected, actual, strict=False)) if x != y),
                min(len(expected), len(actual)))  # fmt: skip


def by_task(attempts: list[Attempt], tasks: Mapping[str, Any] | None = None) -> dict[str, list[Attempt]]:
    """The attempts of each task, tasks in the dataset's order when it is known (else by id)."""
    order = {task_id: i for i, task_id in enumerate(tasks or {})}
    out: dict[str, list[Attempt]] = {}
    for a in sorted(attempts, key=lambda a: (order.get(a.task_id, len(order)), a.task_id, a.trial)):
        out.setdefault(a.task_id, []).append(a)
    return out
