"""Compiling and evaluating CEL expressions over spans and traces, with CEL-C++ (cel-expr-python)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from cel_expr_python import cel as _cel

from evalsi.span import Span
from evalsi.trajectory import call_usage, counted_once

__all__ = ["SPAN_FIELDS", "VARIABLES", "Program", "compile", "span_activation", "trace_activation"]

VARIABLES = ("trace", "span")
"""The variables an expression may name by default."""

_BOOL = _cel.Type.BOOL
_DYN = _cel.Type.DYN
_ENVS: dict[tuple[str, ...], Any] = {}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `trace` used as a whole (size(trace), trace.exists(k, ...), trace[k], trace == {...}): any key may matter;
# `trace.name` and `trace['name']` (not a macro) read one key
_TRACE_WHOLE = re.compile(
    r"(?<![\w.])trace\b(?!\s*(?:\.\s*(?!(?:all|exists|exists_one|map|filter)\b)[A-Za-z_]|\[\s*['\"]))"
)
_TRACE_SPAN_KEYS = re.compile(r"\b(?:spans|root)\b")

SPAN_FIELDS = frozenset(Span("", "", "", "", "", 0, 0).canonical())
"""The keys of a canonical span map."""


def _env(variables: tuple[str, ...]) -> Any:
    env = _ENVS.get(variables)
    if env is None:
        env = _ENVS[variables] = _cel.NewEnv(variables={v: _DYN for v in variables})
    return env


def _message(error: Exception) -> str:
    text = str(error).strip()
    for prefix in ("INVALID_ARGUMENT: ", "ERROR: "):
        text = text.removeprefix(prefix)
    return text.replace(" [INVALID_ARGUMENT]", "")


class Program:
    """A checked CEL expression, evaluated against activations (dicts of variable name to plain data).

    `matches` is true only for a boolean `true`: a missing key, a type mismatch or any other CEL error is "no
    match", never an exception. Activations: `trace_activation(spans)` gives `{"trace": ...}` and
    `span_activation(span)` gives `{"span": ...}`, in the canonical shape (`Span.canonical()`). Handing data to
    CEL-C++ costs far more than evaluating it (benchmarks/cel.py): build activations with `fields=program.fields`
    so span maps carry only the canonical fields the expression names.
    """

    __slots__ = ("_expression", "fields", "names", "source", "trace_spans")

    def __init__(self, source: str, expression: Any) -> None:
        self.source = source
        self._expression = expression
        # a name in the text (even inside a string, as in s["model"]) is enough to keep that field
        self.names: frozenset[str] = frozenset(_IDENTIFIER.findall(source))
        """Every name in the text, strings' words included."""
        self.fields: frozenset[str] = SPAN_FIELDS & self.names
        """The canonical span fields the expression names."""
        self.trace_spans: bool = bool(_TRACE_SPAN_KEYS.search(source) or _TRACE_WHOLE.search(source))
        """Whether a `trace` activation must carry `spans` and `root`: the text names either (even inside a
        string) or uses `trace` as a whole. When false, the expression reads `trace` only key by key (`trace.k`,
        `trace['k']`), so `trace_activation(..., span_maps=False, keys=program.names)` gives the same result for
        less."""

    def matches(self, activation: Mapping[str, Any]) -> bool:
        """True when the expression evaluates to boolean true; an evaluation error counts as no match."""
        try:
            value = self._expression.eval(data=activation)
        except Exception:  # data the runtime cannot convert: no match, like any other evaluation error
            return False
        # an error value's .value() is a truthy message string: check the type first
        return value.type() == _BOOL and value.value() is True

    def holds(self, activation: Mapping[str, Any]) -> bool:
        """Like `matches`, but an evaluation error (a missing key, a type mismatch) raises `ValueError` with CEL's
        message instead of counting as false: for conditions whose failure must be explained (run gates)."""
        try:
            value = self._expression.eval(data=activation)
        except Exception as e:
            raise ValueError(_message(e)) from None
        if value.type() != _BOOL:
            raise ValueError(_message(Exception(str(value.value()))))
        return value.value() is True

    def __repr__(self) -> str:
        return f"Program({self.source!r})"


def compile(expr: str, variables: Iterable[str] = VARIABLES) -> Program:
    """Parse and type-check `expr`; raises `ValueError` with CEL's message (position and caret included)."""
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError("empty CEL expression")
    env = _env(tuple(sorted(set(variables))))
    try:
        expression = env.compile(expr)
    except Exception as e:
        raise ValueError(f"invalid CEL expression: {_message(e)}") from None
    returns = expression.return_type()
    if returns != _BOOL and returns != _DYN:
        raise ValueError(f"CEL expression {expr!r} must be a condition (bool), not {returns.name().lower()}")
    return Program(expr, expression)


def _span_map(span: Span, fields: Iterable[str] | None) -> dict[str, Any]:
    if fields is None:
        return span.canonical()
    return {f: getattr(span, f) for f in fields}


def span_activation(span: Span, fields: Iterable[str] | None = None) -> dict[str, Any]:
    """`{"span": canonical span}` for span-level conditions; `fields` limits the map to those keys."""
    return {"span": _span_map(span, fields)}


def trace_activation(
    spans: list[Span],
    trace_id: str | None = None,
    fields: Iterable[str] | None = None,
    *,
    span_maps: bool = True,
    keys: frozenset[str] | None = None,
) -> dict[str, Any]:
    """`{"trace": ...}` for trace-level conditions; `fields` limits each span map to those keys,
    `span_maps=False` leaves out `spans` and `root`, and `keys` keeps only those keys of `trace` (both for
    expressions whose `Program.trace_spans` is false).

    `trace` has `trace_id`, `spans` (canonical span dicts in start order), `root` (the span with no parent, else
    the earliest; a canonical span dict), `duration_ns` (latest end minus earliest start), `start_time_unix_nano`,
    `span_count`, `error_count` (spans with status ERROR), `session_id` / `user_id` / `service_name` (the root's,
    else the first span's that has one), `llm_calls`, `tool_calls`, `input_tokens`, `output_tokens`, `cost_usd`
    (sums over the spans, a model call recorded twice counted once: see `trajectory.counted_once`), `models` and
    `tool_names` (distinct, in first-seen order).
    """
    ordered = sorted(spans, key=lambda s: s.start_time_unix_nano)
    root_at = next((i for i, s in enumerate(ordered) if not s.parent_span_id), 0)
    root = ordered[root_at] if ordered else None
    if fields is not None:
        fields = tuple(fields)
    canonical = [_span_map(s, fields) for s in ordered] if span_maps else []
    models: dict[str, None] = {}
    tools: dict[str, None] = {}
    errors = llm = tool = tokens_in = tokens_out = 0
    cost = 0.0
    folded, usage = counted_once(ordered)
    for s in ordered:
        if s.span_id in folded:  # a vendor SDK's record of a call an instrumentation's span records too
            continue
        if s.status_code == "ERROR":
            errors += 1
        if s.step_type == "llm":
            llm += 1
        elif s.step_type == "tool":
            tool += 1
        if s.model:
            models[s.model] = None
        if s.tool_name:
            tools[s.tool_name] = None
        used_in, used_out, used_usd = call_usage(s, usage.get(s.span_id))
        tokens_in += used_in or 0
        tokens_out += used_out or 0
        cost += used_usd or 0.0
    start = min((s.start_time_unix_nano for s in ordered), default=0)
    end = max((s.end_time_unix_nano for s in ordered), default=0)

    def first(field: str) -> Any:
        if root is not None and getattr(root, field):
            return getattr(root, field)
        return next((getattr(s, field) for s in ordered if getattr(s, field)), None)

    trace: dict[str, Any] = {"trace_id": trace_id if trace_id is not None else (root.trace_id if root else "")}
    if span_maps:
        trace["spans"] = canonical
        trace["root"] = canonical[root_at] if ordered else None
    trace.update(
        {
            "start_time_unix_nano": start,
            "duration_ns": max(0, end - start),
            "span_count": len(ordered),
            "error_count": errors,
            "session_id": first("session_id"),
            "user_id": first("user_id"),
            "service_name": first("service_name") or "",
            "llm_calls": llm,
            "tool_calls": tool,
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "cost_usd": cost,
            "models": list(models),
            "tool_names": list(tools),
        }
    )
    if keys is not None:
        trace = {k: v for k, v in trace.items() if k in keys}
    return {"trace": trace}
