"""The score: one evaluator's verdict on a span, trace or session, with an honest outcome."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal

from evalsi.model.span import DEFAULT_PROJECT  # the project of a score whose sender has none

Outcome = Literal["scored", "skipped", "error"]
Source = Literal["code", "llm_judge", "human", "external", "checker", "imported"]
"""Who gave a score: an evaluator's code or judge, a person, an app (external), a task checker script of an offline
run, or another harness whose results were imported."""


@dataclass(slots=True)
class Score:
    """A verdict. Only `outcome == "scored"` counts in aggregates; `reason` says why a score was skipped
    (`no content`, `no tool calls`, `budget exhausted`, ...) or what kind of error it was.

    An evaluator fills the verdict fields; the evaluation stage fills where it belongs (ids, policy, evaluator).
    """

    name: str
    value: float | None = None
    passed: bool | None = None
    label: str | None = None
    explanation: str | None = None
    outcome: Outcome = "scored"
    reason: str | None = None
    judge_cost_usd: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # where it belongs, set by the evaluation stage
    trace_id: str = ""
    span_id: str = ""
    session_id: str = ""
    policy: str = ""
    evaluator: str = ""
    evaluator_version: str = ""
    source: Source = "code"
    project: str = DEFAULT_PROJECT
    run_id: str = ""
    trial: int = 0
    task_id: str = ""
    timestamp_unix_nano: int = field(default_factory=time.time_ns)

    @classmethod
    def skipped(cls, name: str, reason: str) -> Score:
        return cls(name, outcome="skipped", reason=reason)

    @classmethod
    def error(cls, name: str, kind: str, explanation: str | None = None) -> Score:
        return cls(name, outcome="error", reason=kind, explanation=explanation)

    @property
    def key(self) -> tuple[str, str, str, str, str, str, str, int]:
        """The idempotency key: a replayed or retried write of the same key never counts twice."""
        return (
            self.project, self.trace_id, self.span_id, self.policy, self.evaluator, self.name, self.run_id, self.trial,
        )  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(slots=True)
class ScoreBatch:
    scores: list[Score] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.scores)

    def __iter__(self) -> Iterator[Score]:
        return iter(self.scores)


_FIELDS = tuple(Score.__dataclass_fields__)
_ROW = attrgetter(*_FIELDS)  # a score's fields as one tuple, in field order, made in C


def score_rows(scores: list[Score]) -> list[tuple[Any, ...]]:
    """Scores as plain tuples (field order): what crosses a process boundary, ~3x cheaper to pickle than objects."""
    return list(map(_ROW, scores))


def scores_from_rows(rows: list[tuple[Any, ...]]) -> list[Score]:
    return [Score(*row) for row in rows]
