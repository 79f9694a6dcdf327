"""What the policies test: CEL conditions over a trace or session (selectors, `sampling.always`, a cascade stage's
`when` and span filter, `promote.when`) and alert conditions over a policy's window. A new kind of condition goes here.

Trace conditions see the variables a `TraceView` builds; `SCHEMA` is their shape, made from the views themselves,
so a condition that reads a field they do not have is refused as it compiles (`Condition`), never at evaluation.
Alert conditions see one variable, `window`, built from the window's aggregates (`window_variable`); `mean('x')`
and friends are shorthand for its maps.
"""

from __future__ import annotations

import ast
import bisect
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from evalsi import cel
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.policies.baseline import Regression, parse_regressed
from evalsi.policies.intervals import percentile
from evalsi.policies.trace_view import SessionView, TraceView

__all__ = [
    "AGGREGATES", "ALWAYS_VARIABLES", "LATENCY", "SCHEMA", "SCORE_SHAPE", "SPAN_VARIABLES", "TRACE_VARIABLES",
    "WHEN_VARIABLES", "AlertRule", "Condition", "LatencyAbove", "compile_alert", "score_summary", "spelled_values",
    "window_variable",
]  # fmt: skip

TRACE_VARIABLES = ("trace", "span", "resource", "session")
"""What selectors see."""
ALWAYS_VARIABLES = (*TRACE_VARIABLES, "feedback")
"""What `always` conditions see: the trace and its late feedback."""
WHEN_VARIABLES = (*ALWAYS_VARIABLES, "scores")
"""What cascade `when` and `promote.when` see."""
SPAN_VARIABLES = ("span",)

LATENCY = re.compile(r"\s*latency\s*>\s*p(\d{1,2}(?:\.\d+)?)\s*")
"""`latency > p95` in `sampling.always`: a `LatencyAbove`, not CEL."""
_LATENCY_MIN_TRACES = 20
_LATENCY_RECENT = 1000


# --- conditions over a trace -------------------------------------------------------------------------------------


def _uses(source: str, variables: Iterable[str]) -> tuple[str, ...]:
    return tuple(v for v in variables if re.search(rf"(?<![\w.]){v}\b", source))


MEMO_SIZE = 4096
"""Distinct inputs a condition remembers its result for (`Condition.matches`); past it the memo starts afresh."""
_MISSING = object()
_MAX_DEPTH = 32
_SCALARS = frozenset({str, int, bool, bytes, type(None)})


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: CEL refuses the whole activation
        return False
    return True


def _converts(value: Any, depth: int = 0) -> bool:
    """Whether CEL takes `value` as it is (a conservative check: False also for some values CEL would take). CEL
    converts the whole activation before it evaluates, so one value it refuses anywhere makes the condition false,
    whatever the values it reads."""
    t = type(value)
    if t is dict:
        if depth >= _MAX_DEPTH:
            return False
        for k, v in value.items():
            if type(k) is not str or not (k.isascii() or _utf8(k)):
                return False
            if not _plain(v, depth):
                return False
        return True
    if t is list:
        if depth >= _MAX_DEPTH:
            return False
        return all(_plain(v, depth) for v in value)
    return _plain(value, depth)


def _plain(value: Any, depth: int) -> bool:
    t = type(value)
    if t is str:
        return value.isascii() or _utf8(value)
    if t is bool or t is float or t is bytes or value is None:
        return True
    if t is int:
        return -(2**63) <= value < 2**64
    if t is dict or t is list:
        return _converts(value, depth + 1)
    return False


class Condition:
    """A compiled CEL condition; only the variables it names are built and handed to CEL. A field its variables do
    not have (`SCHEMA`) is refused here, at load, with a did-you-mean (`cel.FieldError`).

    When the expression reads only values at fixed paths (`cel.Program.leaves`) and the variables handed over all
    convert, its result depends on those values alone: it is remembered for each distinct tuple of them (with
    their types), at most `MEMO_SIZE`, so a selector that sees the same service or route again skips CEL."""

    __slots__ = ("_memo", "program", "source", "uses")

    def __init__(self, source: str, variables: Iterable[str]) -> None:
        variables = tuple(variables)
        self.source = source
        self.program = cel.compile(source, variables, SCHEMA)  # ValueError with CEL's message, or FieldError
        self.uses = _uses(source, variables)
        self._memo: dict[tuple[Any, ...], bool] | None = {} if self.program.leaves is not None else None

    @property
    def fields(self) -> frozenset[str]:
        return self.program.fields

    @property
    def reads_feedback(self) -> bool:
        return "feedback" in self.uses

    def matches(self, view: TraceView, scores: dict[str, Any] | None = None) -> bool:
        data = {v: (scores if scores is not None else {}) if v == "scores" else view.variable(v) for v in self.uses}
        memo = self._memo
        if memo is None:
            return self.program.matches(data)
        key = self._key(data)
        if key is None:
            return self.program.matches(data)
        found = memo.get(key)
        if found is None:
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            found = memo[key] = self.program.matches(data)
        return found

    def _key(self, data: dict[str, Any]) -> tuple[Any, ...] | None:
        """The values the expression reads, each with its type (1, 1.0 and true differ in CEL; so do 0.0 and -0.0
        under division); None when one is not a plain scalar or some value of `data` would not convert."""
        parts: list[Any] = []
        for path in self.program.leaves or ():
            value = data
            for step in path:
                if type(value) is not dict:
                    return None  # CEL errs on a step into a non-map: no memo, CEL says so itself
                value = value.get(step, _MISSING)
                if value is _MISSING:
                    break
            if value is _MISSING:
                parts.append(_MISSING)
                continue
            t = type(value)
            if t is float:
                parts += (t, value if value else repr(value))
            elif t in _SCALARS:
                parts += (t, value)
            else:
                return None
        if not all(_converts(value) for value in data.values()):
            return None
        return tuple(parts)

    def matches_span(self, span: Span) -> bool:
        return self.program.matches(cel.span_activation(span, self.program.fields))

    def __repr__(self) -> str:
        return f"Condition({self.source!r})"


class LatencyAbove:
    """`always: [latency > p95]`: the trace took longer than the given percentile of the policy's last 1,000
    selected traces (false until 20 have been seen)."""

    __slots__ = ("_ordered", "_recent", "q", "source")
    uses = ()

    def __init__(self, source: str, q: float) -> None:
        self.source = source
        self.q = q
        self._recent: deque[int] = deque()
        self._ordered: list[int] = []

    def matches(self, view: TraceView, scores: dict[str, Any] | None = None) -> bool:
        if len(self._ordered) < _LATENCY_MIN_TRACES:
            return False
        threshold = percentile(self._ordered, self.q)  # type: ignore[arg-type]
        return threshold is not None and view.duration_ns > threshold

    def observe(self, duration_ns: int) -> None:
        if len(self._recent) >= _LATENCY_RECENT:
            old = self._recent.popleft()
            del self._ordered[bisect.bisect_left(self._ordered, old)]
        self._recent.append(duration_ns)
        bisect.insort(self._ordered, duration_ns)


# --- what they see -----------------------------------------------------------------------------------------------


def score_summary(scores: list[Score]) -> dict[str, Any]:
    """What a later `when` sees of one score name: the score itself, or for several (span scope) their summary:
    scored if any is, passed only if every scored verdict passed, the mean scored value."""
    if len(scores) == 1:
        s = scores[0]
        return {"passed": s.passed, "value": s.value, "label": s.label, "outcome": s.outcome, "reason": s.reason,
                "n": 1}  # fmt: skip
    scored = [s for s in scores if s.outcome == "scored"]
    if not scored:
        first = scores[0]
        return {"passed": None, "value": None, "label": None, "outcome": first.outcome, "reason": first.reason,
                "n": len(scores)}  # fmt: skip
    verdicts = [s.passed for s in scored if s.passed is not None]
    values = [s.value for s in scored if s.value is not None]
    return {
        "passed": all(verdicts) if verdicts else None,
        "value": sum(values) / len(values) if values else None,
        "label": next((s.label for s in scored if s.label is not None), None),
        "outcome": "scored",
        "reason": None,
        "n": len(scores),
    }


def _schema() -> dict[str, cel.Shape]:
    """The shapes of what conditions see, from the views and summaries built over a one-span trace (so they are
    what the code builds): `trace` (with `error` and `steps`), `session` (a trace's and a session's keys), `feedback`
    and each `scores` entry are closed; `resource`, attribute maps, `trace.steps` and `feedback.scores` are open."""
    span = Span("", "", "", "", "", 0, 0)
    trace, session = TraceView([span]), SessionView([span])
    return {
        "trace": cel.closed("trace", trace.variable("trace"), cel.TRACE_SHAPE.fields),
        "span": cel.SPAN_SHAPE,
        "resource": None,
        "session": cel.closed("session", {**trace.variable("session"), **session.variable("session")}),
        "feedback": cel.closed("feedback", trace.variable("feedback")),
        "scores": cel.Entries(SCORE_SHAPE),
    }


SCORE_SHAPE = cel.closed("a score", score_summary([Score("", 0.0)]))
"""What `scores[name]` holds in a `when` (`score_summary`)."""
SCHEMA = _schema()
"""The shapes of the variables policy conditions (and `--where`) see, checked when a condition compiles."""


# --- conditions over a window ------------------------------------------------------------------------------------

# `mean('x')` and friends are shorthand for `window.<map>["x"]`; string literals are matched first so that a
# name inside a string is never rewritten.
AGGREGATES = {
    "mean": "mean", "rate": "rate", "count": "n", "p50": "p50", "p90": "p90", "p95": "p95", "p99": "p99", "low": "low",
    "high": "high",
}  # fmt: skip
_SPELLED = {key: fn for fn, key in AGGREGATES.items()}  # how `values` names an aggregate: "n" -> count('x')
_STRING = r"""[rRbB]{0,2}(?:'''[\s\S]*?'''|\"\"\"[\s\S]*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")"""
_ALERT_TOKEN = re.compile(
    rf"(?P<string>{_STRING})"
    rf"|(?<![\w.])regressed\s*\((?P<regressed>(?:{_STRING}|[^()'\"])*)\)"
    rf"|(?<![\w.])(?P<fn>{'|'.join(AGGREGATES)})\s*\(\s*(?P<arg>'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\")\s*\)"
    r"|(?<![\w.])(?P<count>count)\b"
    r"|(?<![\w.])(?P<window>window)\b"
)


@dataclass(frozen=True)
class AlertRule:
    """A compiled alert: the condition as written, the CEL program over `window`, and which aggregates it reads."""

    name: str
    condition: str
    program: cel.Program
    uses: tuple[tuple[str, str], ...]  # (window map, score name) pairs, e.g. ("rate", "contains")
    whole: bool  # names `window` itself: hand over every aggregate
    notify: str | None = None
    regressions: tuple[Regression, ...] = ()
    """Its `regressed(...)` terms, each read as `window.regressed[<key>]`."""


def compile_alert(when: str, *, name: str | None = None, notify: str | None = None) -> AlertRule:
    """Compile an alert condition; raises ValueError with CEL's message. `mean('x')` becomes `window.mean["x"]`."""
    uses: dict[tuple[str, str], None] = {}
    regressions: dict[str, Regression] = {}
    whole = False

    def rewrite(m: re.Match[str]) -> str:
        nonlocal whole
        if m.group("string") is not None:
            return m.group(0)
        if m.group("regressed") is not None:
            found = parse_regressed(m.group("regressed"))
            regressions.setdefault(found.key, found)
            return f"window.regressed[{found.key!r}]"
        if m.group("fn") is not None:
            key = AGGREGATES[m.group("fn")]
            arg = m.group("arg")
            uses[(key, ast.literal_eval(arg))] = None
            return f"window.{key}[{arg}]"
        if m.group("count") is not None:
            return "window.count"
        whole = True
        return m.group(0)

    if not isinstance(when, str) or not when.strip():
        raise ValueError("empty alert condition")
    try:
        rewritten = _ALERT_TOKEN.sub(rewrite, when)
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"invalid alert condition: {e}") from None
    try:
        program = cel.compile(rewritten, variables=("window",))
    except ValueError as e:
        shown = "" if rewritten == when else f" (read as {rewritten!r})"
        raise ValueError(f"{e}{shown}") from None
    return AlertRule(name or when, when, program, tuple(uses), whole, notify, tuple(regressions.values()))


def window_variable(
    rule: AlertRule, count: int, shed: int, names: Iterable[str], aggregate: Callable[[str, str], float | int | None]
) -> dict[str, Any]:
    """The `window` an alert condition sees: the window's trace and shed counts, and each aggregate the rule reads
    (every one of every score name in `names` when it names `window` itself), from `aggregate(key, name)`; an
    aggregate without data is left out, so a condition on it cannot hold."""
    window: dict[str, Any] = {
        "count": count, "shed": shed, "regressed": {}, **{k: {} for k in AGGREGATES.values()}
    }  # fmt: skip
    if rule.whole:
        wanted = [(k, name) for name in names for k in AGGREGATES.values()]
    else:
        wanted = list(rule.uses)
    for key, name in wanted:
        value = aggregate(key, name)
        if value is not None:
            window[key][name] = value
    return window


def spelled_values(window: dict[str, Any]) -> dict[str, float | int | None]:
    """The aggregates a `window` variable holds, as an alert condition spells them (`mean('x')`, `count`)."""
    out: dict[str, float | int | None] = {"count": window["count"]}
    if window["shed"]:
        out["shed"] = window["shed"]
    for key in AGGREGATES.values():
        for name, value in window[key].items():
            out[f"{_SPELLED[key]}({name!r})"] = value
    return out
