"""Whether the task succeeded: a verdict a span attribute records, or a checker on the final output."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from evalsi.evaluators.base import Params, Target, evaluator
from evalsi.evaluators.packs.agent.calls import json_text, skip
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.pattern import compile_pattern

# --- builtin/task-success ----------------------------------------------------------------------------------------

_TRUE = frozenset(("true", "yes", "y", "1", "success", "succeeded", "successful", "pass", "passed", "ok", "done"))
_FALSE = frozenset(("false", "no", "n", "0", "failure", "failed", "fail", "error", "not ok"))


class TaskSuccessParams(Params):
    # span attributes that carry the verdict, looked for on the root span first, then on every other span
    attribute: str | list[str] = ["evalsi.task.success", "task.success"]
    # else a checker on the final output (every one given must pass)
    contains: str | None = None
    regex: str | None = None  # searched anywhere in the output (RE2 syntax: evalsi.pattern)
    ignore_case: bool = False

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            compile_pattern(value)  # a PatternError (a ValueError) names the pattern and RE2's reason
        return value

    @property
    def attributes(self) -> list[str]:
        return [self.attribute] if isinstance(self.attribute, str) else self.attribute


def _verdict(value: Any) -> bool | None:
    """A success attribute's value as a verdict: booleans, numbers (non-zero is success), or words such as
    "true", "yes", "success", "passed" / "false", "no", "failed"; None when it is none of these."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    return None


def _root_first(target: Target) -> list[Span]:
    if target.span is None:
        return target.spans
    return [target.span, *(s for s in target.spans if s is not target.span)]


@evaluator("builtin/task-success", params=TaskSuccessParams)
def task_success(target: Target, params: TaskSuccessParams) -> Score:
    """Task success from a span attribute (root span first) or a checker on the final output: 1 success, 0 not."""
    name = "task-success"
    unreadable: list[str] = []
    names = params.attributes
    for span in _root_first(target) if names else ():
        for attribute in names:
            if attribute not in span.attributes:
                continue
            raw = span.attributes[attribute]
            verdict = _verdict(raw)
            if verdict is None:
                unreadable.append(f"{attribute}={json_text(raw, 40)} on span {span.name!r} is not a verdict")
                continue
            return Score(
                name,
                value=float(verdict),
                passed=verdict,
                label="success" if verdict else "failure",
                explanation=f"{attribute}={json_text(raw, 40)} on span {span.name!r}",
            )
    if params.contains is None and params.regex is None:
        why = unreadable or [f"no span sets {' or '.join(names) or 'a success attribute'}"]
        return skip(name, "no success signal", "; ".join([*why, "no checker (contains, regex) is configured"]))
    output = target.output_text
    if output is None:
        why = unreadable or [f"no span sets {' or '.join(names) or 'a success attribute'}"]
        return skip(name, "no success signal", "; ".join([*why, "no final output to check"]))
    failures: list[str] = []
    checks: list[str] = []
    if params.contains is not None:
        if params.ignore_case:
            found = params.contains.casefold() in output.casefold()
        else:
            found = params.contains in output
        (checks if found else failures).append(f"{'contains' if found else 'does not contain'} {params.contains!r}")
    if params.regex is not None:
        found = compile_pattern(params.regex, ignore_case=params.ignore_case).search(output) is not None
        (checks if found else failures).append(f"{'matches' if found else 'does not match'} /{params.regex}/")
    return Score(
        name,
        value=0.0 if failures else 1.0,
        passed=not failures,
        label="failure" if failures else "success",
        explanation=f"final output {' and '.join(failures or checks)}",
    )
