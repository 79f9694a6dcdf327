"""The core pack: checks on the answer's text (exact match, contains, regex, JSON, length) and on what a trace
cost (latency, tokens, USD). Deterministic and cheap: they run per trace on the ingest path.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import Field, PrivateAttr, field_validator, model_validator

from evalsi.evaluators.base import Params, Target, evaluator
from evalsi.evaluators.schema import compiled, json_type, violations
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.model.trajectory import call_usage
from evalsi.pattern import Pattern, compile_pattern

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

# --- text checks ---------------------------------------------------------------------------------------------

_SPACES = re.compile(r"\s+")


class MatchParams(Params):
    expected: str | None = Field(
        None, description="the expected output when the target's reference has no expected_output"
    )
    strip: bool = Field(True, description="ignore leading and trailing whitespace")
    case_insensitive: bool = False
    collapse_whitespace: bool = Field(False, description="treat every run of whitespace as one space")


def _normalized(text: str, p: MatchParams) -> str:
    if p.collapse_whitespace:
        text = _SPACES.sub(" ", text)
    if p.strip:
        text = text.strip()
    return text.casefold() if p.case_insensitive else text


def _expected_output(target: Target, fallback: str | None) -> str | None:
    expected = target.reference.get("expected_output")
    if expected is None:
        return fallback
    return expected if isinstance(expected, str) else json.dumps(expected, ensure_ascii=False)


@evaluator("builtin/exact-match", requires=("output",), params=MatchParams)
def exact_match(target: Target, p: MatchParams) -> Score:
    """Passes when the output equals reference.expected_output (or params.expected), after normalization."""
    expected = _expected_output(target, p.expected)
    if expected is None:
        return Score.skipped("exact-match", "no reference")
    output = _normalized(target.output_text or "", p)
    want = _normalized(expected, p)
    if output == want:
        return Score("exact-match", passed=True, explanation="output equals the expected output")
    # where they part, never the texts themselves: explanations are stored and shown
    at = next((i for i, (a, b) in enumerate(zip(output, want, strict=False)) if a != b), min(len(output), len(want)))
    return Score(
        "exact-match",
        passed=False,
        explanation=f"output differs from the expected output at character {at} "
        f"(lengths {len(output)} and {len(want)}, after normalization)",
    )


class ContainsParams(Params):
    any: list[str] = Field(default_factory=list, description="passes only if at least one of these is in the output")
    all: list[str] = Field(default_factory=list, description="passes only if every one of these is in the output")
    none: list[str] = Field(default_factory=list, description="fails if any of these is in the output")
    case_insensitive: bool = False
    _any: tuple[str, ...] = PrivateAttr(())
    _all: tuple[str, ...] = PrivateAttr(())
    _none: tuple[str, ...] = PrivateAttr(())

    @field_validator("any", "all", "none")
    @classmethod
    def _no_empty(cls, v: list[str]) -> list[str]:
        if any(s == "" for s in v):
            raise ValueError("an empty string is in every output; remove it")
        return v

    @model_validator(mode="after")
    def _something(self) -> ContainsParams:
        if not (self.any or self.all or self.none):
            raise ValueError("set at least one of any, all, none (the strings to look for)")
        return self

    def model_post_init(self, context: Any) -> None:
        fold = str.casefold if self.case_insensitive else str
        self._any, self._all, self._none = (tuple(fold(s) for s in v) for v in (self.any, self.all, self.none))


def _quoted(strings: list[str]) -> str:
    return ", ".join(repr(s) for s in strings)


@evaluator("builtin/contains", requires=("output",), params=ContainsParams)
def contains(target: Target, p: ContainsParams) -> Score:
    """Passes when the output contains any/all of the given strings and none of the forbidden ones."""
    text = target.output_text or ""
    if p.case_insensitive:
        text = text.casefold()
    # one dict read for the folded strings: each `p._x` goes through pydantic's (slow) __getattr__
    private = p.__pydantic_private__ or {}
    any_, all_, none_ = private["_any"], private["_all"], private["_none"]
    problems = []
    if any_ and not any(s in text for s in any_):
        problems.append(f"none of {_quoted(p.any)}")
    missing = [orig for orig, s in zip(p.all, all_, strict=True) if s not in text]
    if missing:
        problems.append(f"missing {_quoted(missing)}")
    forbidden = [orig for orig, s in zip(p.none, none_, strict=True) if s in text]
    if forbidden:
        problems.append(f"contains forbidden {_quoted(forbidden)}")
    if problems:
        return Score("contains", passed=False, explanation="output has " + "; ".join(problems))
    return Score("contains", passed=True, explanation="output has what it must and nothing it must not")


class RegexParams(Params):
    pattern: str = Field(description="a regular expression, RE2 syntax (linear time: no backreferences, lookaround)")
    must_match: bool = Field(True, description="false: passes when the pattern is NOT found")
    full: bool = Field(False, description="the whole output must match, not just a part of it")
    ignore_case: bool = False
    multiline: bool = Field(False, description="^ and $ match at line boundaries")
    _re: Pattern = PrivateAttr()

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        compile_pattern(v)  # a PatternError (a ValueError) names the pattern and RE2's reason
        return v

    def model_post_init(self, context: Any) -> None:
        self._re = compile_pattern(self.pattern, ignore_case=self.ignore_case, multiline=self.multiline)


@evaluator("builtin/regex", requires=("output",), params=RegexParams)
def regex(target: Target, p: RegexParams) -> Score:
    """Passes when the output matches params.pattern (or, with must_match false, when it does not)."""
    text = target.output_text or ""
    found = (p._re.fullmatch(text) if p.full else p._re.search(text)) is not None
    how = "matches" if found else "does not match"
    return Score("regex", passed=found == p.must_match, explanation=f"output {how} {p.pattern!r}")


class LengthParams(Params):
    unit: Literal["chars", "words"] = "chars"
    min: int | None = Field(None, ge=0)
    max: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> LengthParams:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        return self


@evaluator("builtin/length", requires=("output",), params=LengthParams)
def length(target: Target, p: LengthParams) -> Score:
    """The output's length in chars or words (value); passes when within min..max."""
    text = target.output_text or ""
    n = len(text) if p.unit == "chars" else len(text.split())
    explanation = f"{n} {p.unit}"
    passed = None
    if p.min is not None or p.max is not None:
        passed = (p.min is None or n >= p.min) and (p.max is None or n <= p.max)
        bounds = f"{p.min if p.min is not None else 0}..{p.max if p.max is not None else '∞'}"
        explanation += f" ({'within' if passed else 'outside'} {bounds})"
    return Score("length", value=float(n), passed=passed, explanation=explanation)


# --- JSON ----------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|json5)?[ \t]*\r?\n(.*?)```", re.DOTALL)


@lru_cache(maxsize=256)
def _parse_json(text: str, extract_fence: bool) -> tuple[bool, Any]:
    """(True, value) or (False, why). Cached: json-valid and json-schema in one cascade parse an output once.
    Callers must not mutate the value."""
    if extract_fence:
        m = _FENCE.search(text)
        if m is not None:
            text = m.group(1)
    try:
        return True, orjson.loads(text)
    except orjson.JSONDecodeError as e:
        return False, f"line {e.lineno} column {e.colno}: {e.msg}"


class JsonValidParams(Params):
    extract_fence: bool = Field(False, description="parse the first ```json fenced block when the output has one")


@evaluator("builtin/json-valid", requires=("output",), params=JsonValidParams)
def json_valid(target: Target, p: JsonValidParams) -> Score:
    """Passes when the output parses as JSON (optionally the content of its ```json fence)."""
    ok, value = _parse_json(target.output_text or "", p.extract_fence)
    if ok:
        return Score("json-valid", passed=True, explanation=f"valid JSON ({json_type(value)})")
    return Score("json-valid", passed=False, explanation=f"not valid JSON: {value}")


class JsonSchemaParams(Params):
    schema_: dict[str, Any] = Field(
        alias="schema", description="a JSON Schema (draft 2020-12, checked by the jsonschema library)"
    )
    extract_fence: bool = Field(False, description="validate the first ```json fenced block when the output has one")
    max_errors: int = Field(3, ge=1, description="how many violations the explanation lists")
    _validator: Draft202012Validator = PrivateAttr()

    @field_validator("schema_")
    @classmethod
    def _valid(cls, v: dict[str, Any]) -> dict[str, Any]:
        compiled(v)
        return v

    def model_post_init(self, context: Any) -> None:
        self._validator = compiled(self.schema_)


@evaluator("builtin/json-schema", requires=("output",), params=JsonSchemaParams)
def json_schema(target: Target, p: JsonSchemaParams) -> Score:
    """Passes when the output is JSON that validates against params.schema (JSON Schema draft 2020-12)."""
    ok, value = _parse_json(target.output_text or "", p.extract_fence)
    if not ok:
        return Score("json-schema", passed=False, label="invalid_json", explanation=f"not valid JSON: {value}")
    # a violation names the place and what the schema asks, never the output's values
    errors = [f"{path}: {what}" for path, what in violations(p._validator, value)]
    if not errors:
        return Score("json-schema", passed=True, explanation="output validates against the schema")
    shown = "; ".join(errors[: p.max_errors])
    more = f" (and {len(errors) - p.max_errors} more)" if len(errors) > p.max_errors else ""
    return Score("json-schema", passed=False, label="invalid", explanation=f"{len(errors)} violations: {shown}{more}")


# --- what a trace cost ---------------------------------------------------------------------------------------


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _innermost(spans: list[Span], has: Callable[[Span], bool]) -> list[Span]:
    """The spans for which `has(span)` holds, without those that enclose another such span: a wrapper (an agent
    or chain span) that reports its children's totals must not count them twice."""
    marked = [s for s in spans if has(s)]
    if len(marked) < 2:
        return marked
    # fast path: a span encloses another only if some span names it as parent; usually no marked span does
    parents = {s.parent_span_id for s in spans}
    if not any(s.span_id in parents for s in marked):
        return marked
    by_id = {s.span_id: s for s in spans}
    enclosing: set[str] = set()
    for s in marked:
        parent, seen = by_id.get(s.parent_span_id), 0
        while parent is not None and seen < len(spans):  # `seen` guards against a cycle in a malformed trace
            enclosing.add(parent.span_id)
            parent, seen = by_id.get(parent.parent_span_id), seen + 1
    return [s for s in marked if s.span_id not in enclosing]


class LatencyParams(Params):
    max_ms: float | None = Field(None, gt=0, description="passes when the duration is at most this")


@evaluator("builtin/latency", params=LatencyParams)
def latency(target: Target, p: LatencyParams) -> Score:
    """Wall-clock duration in ms (value): first span start to last span end; passes when within params.max_ms."""
    timed = [s for s in target.spans if s.start_time_unix_nano > 0 and s.end_time_unix_nano > 0]
    if not timed:
        return Score.skipped("latency", "no timing")
    ms = (max(s.end_time_unix_nano for s in timed) - min(s.start_time_unix_nano for s in timed)) / 1e6
    if p.max_ms is None:
        return Score("latency", value=ms, explanation=f"{ms:.1f} ms")
    passed = ms <= p.max_ms
    verdict = "within" if passed else "over"
    return Score("latency", value=ms, passed=passed, explanation=f"{ms:.1f} ms ({verdict} the {p.max_ms:g} ms limit)")


class SessionTurnsParams(Params):
    max_turns: int | None = Field(None, ge=1, description="the most traces (turns) a session may take and pass")


@evaluator("builtin/session-turns", scope="session", params=SessionTurnsParams)
def session_turns(target: Target, p: SessionTurnsParams) -> Score:
    """Turns of a conversation (value): the traces of the session; passes when at most params.max_turns."""
    turns = len({s.trace_id for s in target.spans})
    if p.max_turns is None:
        return Score("session-turns", value=turns, explanation=f"{turns} turn(s)")
    passed = turns <= p.max_turns
    verdict = "within" if passed else "over"
    return Score("session-turns", value=turns, passed=passed,
                 explanation=f"{turns} turn(s) ({verdict} the limit of {p.max_turns})")  # fmt: skip


class TokensParams(Params):
    measure: Literal["total", "input", "output"] = Field("total", description="which count is the score's value")
    max_input: int | None = Field(None, ge=0)
    max_output: int | None = Field(None, ge=0)
    max_total: int | None = Field(None, ge=0)


_MODEL_CALLS = ("llm", "embedding")


@evaluator("builtin/tokens", params=TokensParams)
def tokens(target: Target, p: TokensParams) -> Score:
    """Input, output and total tokens over the trace's model calls (value: params.measure); passes within budgets."""
    spans, twins = target.calls_once
    # each model call's (input, output) tokens, by span (a malformed trace may repeat a span id)
    usage = {id(s): call_usage(s, twins.get(s.span_id))[:2] for s in spans if s.step_type in _MODEL_CALLS}
    counted = _innermost(spans, lambda s: (u := usage.get(id(s))) is not None and u != (None, None))
    if not counted:
        return Score.skipped("tokens", "no token usage" if usage else "no model calls")
    tokens = [usage[id(s)] for s in counted]
    used = {
        "input": sum(i or 0 for i, _ in tokens),
        "output": sum(o or 0 for _, o in tokens),
    }
    used["total"] = used["input"] + used["output"]
    budgets = {"input": p.max_input, "output": p.max_output, "total": p.max_total}
    over = [f"{k} {used[k]} > {b}" for k, b in budgets.items() if b is not None and used[k] > b]
    set_budgets = [b for b in budgets.values() if b is not None]
    explanation = (
        f"{used['total']} tokens ({used['input']} in, {used['output']} out) over {_count(len(counted), 'model call')}"
    )
    unrecorded = sum(1 for u in usage.values() if u == (None, None))
    if unrecorded:
        explanation += f" ({unrecorded} more recorded no usage)"
    if over:
        explanation += "; over budget: " + ", ".join(over)
    return Score(
        "tokens",
        value=float(used[p.measure]),
        passed=(not over) if set_budgets else None,
        explanation=explanation,
        metadata={**used, "calls": len(counted)},
    )


class CostParams(Params):
    max_usd: float | None = Field(None, ge=0, description="passes when the trace cost at most this")


@evaluator("builtin/cost", params=CostParams)
def cost(target: Target, p: CostParams) -> Score:
    """The trace's cost in USD (value): the sum of the cost its spans record; passes within params.max_usd."""
    spans, twins = target.calls_once

    def cost_of(s: Span) -> float | None:  # a call recorded twice: the instrumentation's cost, else the SDK's
        return call_usage(s, twins.get(s.span_id))[2]

    counted = _innermost(spans, lambda s: cost_of(s) is not None)
    if not counted:
        return Score.skipped("cost", "no cost recorded")
    usd = math.fsum(cost_of(s) or 0.0 for s in counted)
    explanation = f"${usd:.6g} over {_count(len(counted), 'span')}"
    passed = None
    if p.max_usd is not None:
        passed = usd <= p.max_usd
        explanation += f" ({'within' if passed else 'over'} the ${p.max_usd:g} budget)"
    return Score("cost", value=usd, passed=passed, explanation=explanation)
