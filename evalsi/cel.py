"""Compiling and evaluating CEL expressions over spans and traces, with CEL-C++ (cel-expr-python); and what an
expression reads (`Read`), checked at compile time against the shapes of its variables (`Fields`, `SCHEMA`), so
that `trace.llm_cals` is an error with a did-you-mean, not a condition that never holds."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from cel_expr_python import cel as _cel

from evalsi.model.span import Span
from evalsi.model.trajectory import aggregate_usage, call_usage, counted_once

__all__ = [
    "ITEM", "SCHEMA", "SPAN_FIELDS", "SPAN_SHAPE", "TRACE_SHAPE", "VARIABLES", "Entries", "FieldError", "Fields",
    "Items", "Program", "Read", "Shape", "closed", "compile", "field_problems", "span_activation", "trace_activation",
]  # fmt: skip

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

    __slots__ = ("_expression", "_leaves", "_reads", "fields", "names", "source", "trace_spans", "variables")

    def __init__(self, source: str, expression: Any, variables: Iterable[str] = VARIABLES) -> None:
        self.source = source
        self._expression = expression
        self.variables = frozenset(variables)
        self._reads: list[Read] | None = None
        self._leaves: tuple[tuple[str, ...], ...] | bool | None = False  # False: not worked out yet
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

    @property
    def reads(self) -> list[Read]:
        """The chains of field accesses from the variables (`trace.llm_calls`, `scores['x'].passed`), from the
        checked AST (string literals are not reads); worked out on first use, for compile-time checks only."""
        if self._reads is None:
            self._walk()
        assert self._reads is not None
        return self._reads

    @property
    def leaves(self) -> tuple[tuple[str, ...], ...] | None:
        """Every path the expression reads a value at and uses as a whole (`trace.service_name`,
        `span.attributes['app.route']`; `size(span.attributes)` uses `span.attributes`), when each is a chain of
        constant field or key steps from a variable; None when it loops (`exists`, `all`, ...), indexes a list or a
        map by a computed key, or has no such path. Its value then depends on those values alone, once the
        activation converts (see `conditions.Condition`)."""
        if self._leaves is False:
            self._walk()
        return self._leaves  # type: ignore[return-value]

    def _walk(self) -> None:
        walk = _Walk(self.variables)
        checked = _message_fields(_one(_message_fields(self._expression.serialize()), 2))  # Any.value
        root = _one(checked, 4)  # CheckedExpr.expr
        if root is not None:
            walk.consume(walk.expr(root, {}))
        self._reads = walk.reads
        paths = tuple(dict.fromkeys(read.path for read in walk.leaves))
        simple = not walk.loops and paths and all(ITEM not in path for path in paths)
        self._leaves = paths if simple else None

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


def compile(expr: str, variables: Iterable[str] = VARIABLES, schema: Mapping[str, Shape] | None = None) -> Program:
    """Parse and type-check `expr`; raises `ValueError` with CEL's message (position and caret included). With a
    `schema` (variable name to `Shape`, e.g. `SCHEMA`), a field its variables do not have raises `FieldError`."""
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError("empty CEL expression")
    variables = tuple(sorted(set(variables)))
    env = _env(variables)
    try:
        expression = env.compile(expr)
    except Exception as e:
        raise ValueError(f"invalid CEL expression: {_message(e)}") from None
    returns = expression.return_type()
    if returns != _BOOL and returns != _DYN:
        raise ValueError(f"CEL expression {expr!r} must be a condition (bool), not {returns.name().lower()}")
    program = Program(expr, expression, variables)
    if schema is not None:
        problems = field_problems(program.reads, schema)
        if problems:
            raise FieldError(problems)
    return program


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
    (sums over the spans, a model call recorded twice counted once: see `trajectory.counted_once`; an agent span whose
    usage sums the calls below it left out: `trajectory.aggregate_usage`), `models` and `tool_names` (distinct, in
    first-seen order).
    """
    ordered = sorted(spans, key=lambda s: s.start_time_unix_nano)
    root_at = next((i for i, s in enumerate(ordered) if not s.parent_span_id), 0)
    root = ordered[root_at] if ordered else None
    if keys is not None and not span_maps and keys.isdisjoint(_COUNTED_KEYS):
        return {"trace": _uncounted(ordered, root, trace_id, keys)}
    if fields is not None:
        fields = tuple(fields)
    canonical = [_span_map(s, fields) for s in ordered] if span_maps else []
    models: dict[str, None] = {}
    tools: dict[str, None] = {}
    errors = llm = tool = tokens_in = tokens_out = 0
    cost = 0.0
    # with `keys`, the sums over the spans are made only when some key needs them (the rest costs little)
    counted = keys is None or not keys.isdisjoint(_COUNTED_KEYS)
    used = keys is None or not keys.isdisjoint(_USAGE_KEYS)
    if counted:
        folded, usage = counted_once(ordered)
        aggregates = aggregate_usage(ordered, folded) if used else set()
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
            if not used or s.span_id in aggregates:  # its usage is that of the calls below it, counted there
                continue
            used_in, used_out, used_usd = call_usage(s, usage.get(s.span_id))
            tokens_in += used_in or 0
            tokens_out += used_out or 0
            cost += used_usd or 0.0
    timed = keys is None or "start_time_unix_nano" in keys or "duration_ns" in keys
    start = min((s.start_time_unix_nano for s in ordered), default=0) if timed else 0
    end = max((s.end_time_unix_nano for s in ordered), default=0) if timed else 0

    def first(field: str) -> Any:  # (a key left out below is not looked for)
        return _first(ordered, root, field) if keys is None or field in keys else None

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


def _first(ordered: list[Span], root: Span | None, field: str) -> Any:
    """The root's `field`, else the first span's that has one."""
    if root is not None and getattr(root, field):
        return getattr(root, field)
    return next((getattr(s, field) for s in ordered if getattr(s, field)), None)


def _uncounted(ordered: list[Span], root: Span | None, trace_id: str | None, keys: frozenset[str]) -> dict[str, Any]:
    """`trace_activation`'s `trace` with only `keys`, none of them counted over the spans (`_COUNTED_KEYS`),
    `spans` and `root` left out: the same values, made without the counting or a full map to cut down (a selector
    on `trace.service_name` takes 8.6 µs a trace this way, 10.9 through the general path: benchmarks/evaluate_path.py;
    tests/policies/test_condition_memo.py checks both give the same)."""
    trace: dict[str, Any] = {}
    if "trace_id" in keys:
        trace["trace_id"] = trace_id if trace_id is not None else (root.trace_id if root else "")
    if "start_time_unix_nano" in keys or "duration_ns" in keys:
        start = min((s.start_time_unix_nano for s in ordered), default=0)
        if "start_time_unix_nano" in keys:
            trace["start_time_unix_nano"] = start
        if "duration_ns" in keys:
            trace["duration_ns"] = max(0, max((s.end_time_unix_nano for s in ordered), default=0) - start)
    if "span_count" in keys:
        trace["span_count"] = len(ordered)
    for field in ("session_id", "user_id"):
        if field in keys:
            trace[field] = _first(ordered, root, field)
    if "service_name" in keys:
        trace["service_name"] = _first(ordered, root, "service_name") or ""
    return trace


_USAGE_KEYS = frozenset({"input_tokens", "output_tokens", "cost_usd"})
"""`trace` keys `trace_activation` sums from each call's usage."""
_COUNTED_KEYS = _USAGE_KEYS | {"error_count", "llm_calls", "tool_calls", "models", "tool_names"}
"""`trace` keys `trace_activation` counts over the spans, each model call once."""


# --- what an expression reads, and the schema it is checked against ------------------------------------------------


class Fields:
    """The shape of a map whose keys are known (a closed map): reading any other key is a typo. `fields` maps each
    key to the shape of its value (`None`: anything, not checked further); `noun` names the map in messages."""

    __slots__ = ("fields", "noun")

    def __init__(self, noun: str, fields: Mapping[str, Shape]) -> None:
        self.noun = noun
        self.fields = dict(fields)

    def __repr__(self) -> str:
        return f"Fields({self.noun!r}, {list(self.fields)})"


class Items:
    """The shape of a list whose elements have one shape (`trace.spans`)."""

    __slots__ = ("item",)

    def __init__(self, item: Shape) -> None:
        self.item = item


class Entries:
    """The shape of a map whose keys are open but whose values have one shape (`scores`: any name, each a score)."""

    __slots__ = ("value",)

    def __init__(self, value: Shape) -> None:
        self.value = value


Shape = Fields | Items | Entries | None
"""What may be read of a value; `None`: an open map (attributes), a scalar or anything else left unchecked."""

ITEM = "[]"
"""A step of a read path that goes into a list's element: `trace.spans[0]`, or the `s` of `trace.spans.exists(s,
...)`."""


class Read:
    """One chain of field accesses from a variable, as the expression says it (`trace.llm_calls`,
    `scores['x'].passed`, `s.model` inside `trace.spans.exists(s, ...)`): `path` is its steps from the variable
    (field names, or `ITEM`), `shown[i]` the text of its first i + 1 steps."""

    __slots__ = ("path", "shown")

    def __init__(self, path: tuple[str, ...], shown: tuple[str, ...]) -> None:
        self.path = path
        self.shown = shown

    def then(self, step: str, text: str) -> Read:
        return Read((*self.path, step), (*self.shown, self.shown[-1] + text))

    def __repr__(self) -> str:
        return f"Read({self.shown[-1]!r})"


class FieldError(ValueError):
    """Fields an expression reads that its variables do not have; `problems` lists each, with a did-you-mean."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _message_fields(buf: bytes) -> dict[int, list[Any]]:
    """A protobuf message's fields by number (varints as ints, everything else as bytes): the checked AST that
    CEL-C++ serializes (`cel.expr.CheckedExpr`, cel-spec's checked.proto and syntax.proto)."""
    out: dict[int, list[Any]] = {}
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        out.setdefault(key >> 3, []).append(value)
    return out


def _one(fields: dict[int, list[Any]], number: int) -> Any:
    values = fields.get(number)
    return values[-1] if values else None


def _text(value: bytes | None) -> str:
    return value.decode() if value else ""


# cel.expr.Expr: id 2, const_expr 3, ident_expr 4, select_expr 5, call_expr 6, list_expr 7, struct_expr 8,
# comprehension_expr 9; Constant: int64_value 3, uint64_value 4, string_value 6
_CONST, _IDENT, _SELECT, _CALL, _LIST, _STRUCT, _COMPREHENSION = 3, 4, 5, 6, 7, 8, 9


class _Walk:
    """Collects the `Read`s of a checked expression: chains of `.field` and `[literal]` from a variable."""

    def __init__(self, variables: frozenset[str]) -> None:
        self.variables = variables
        self.reads: list[Read] = []
        self.leaves: list[Read] = []
        """Reads used as a whole (an operand, an argument, the result), not only stepped into."""
        self.loops = False
        """Whether the expression has a comprehension (`exists`, `all`, `map`, `filter`)."""

    def consume(self, read: Read | None) -> None:
        if read is not None:
            self.leaves.append(read)

    def expr(self, buf: bytes, scope: Mapping[str, Read | None]) -> Read | None:
        """Walk one Expr; returns the read it is (to extend by a select or an index around it), if any."""
        e = _message_fields(buf)
        if _IDENT in e:
            name = _text(_one(_message_fields(_one(e, _IDENT)), 1))
            if name in scope:
                return scope[name]
            return Read((name,), (name,)) if name in self.variables else None
        if _SELECT in e:
            s = _message_fields(_one(e, _SELECT))
            operand = _one(s, 1)
            base = self.expr(operand, scope) if operand is not None else None
            if base is None:
                return None
            field = _text(_one(s, 2))
            read = base.then(field, f".{field}")
            self.reads.append(read)
            return read
        if _CALL in e:
            c = _message_fields(_one(e, _CALL))
            args = c.get(3, [])
            if _text(_one(c, 2)) == "_[_]" and len(args) == 2:
                return self._index(args[0], args[1], scope)
            target = _one(c, 1)
            if target is not None:
                self.consume(self.expr(target, scope))
            for arg in args:
                self.consume(self.expr(arg, scope))
            return None
        if _LIST in e:
            for element in _message_fields(_one(e, _LIST)).get(1, []):
                self.consume(self.expr(element, scope))
            return None
        if _STRUCT in e:
            for entry in _message_fields(_one(e, _STRUCT)).get(2, []):
                parts = _message_fields(entry)
                for number in (3, 4):  # map_key, value
                    if number in parts:
                        self.consume(self.expr(_one(parts, number), scope))
            return None
        if _COMPREHENSION in e:
            self.loops = True
            self._comprehension(_message_fields(_one(e, _COMPREHENSION)), scope)
        return None

    def _index(self, operand: bytes, key: bytes, scope: Mapping[str, Read | None]) -> Read | None:
        base = self.expr(operand, scope)
        k = _message_fields(key)
        literal = _message_fields(_one(k, _CONST)) if _CONST in k else None
        if literal is None:
            self.consume(base)  # indexed by a computed key: any key of it may be read
            self.consume(self.expr(key, scope))
            return None
        if base is None:
            return None
        if 6 in literal:  # a string key: m['name'] reads the field `name`
            name = _text(_one(literal, 6))
            read = base.then(name, f"[{name!r}]")
        elif 3 in literal or 4 in literal:  # a number: l[0] reads an element
            read = base.then(ITEM, f"[{_one(literal, 3) if 3 in literal else _one(literal, 4)}]")
        else:
            self.consume(base)
            return None
        self.reads.append(read)
        return read

    def _comprehension(self, c: dict[int, list[Any]], scope: Mapping[str, Read | None]) -> None:
        over = _one(c, 2)
        base = self.expr(over, scope) if over is not None else None
        first, second = _text(_one(c, 1)), _text(_one(c, 8))
        # one variable: each element of a list (of a map: its keys); two: the index (key) and the element (value)
        element = second or first
        each = Read((*base.path, ITEM), (*base.shown, element)) if base is not None else None
        inner = dict(scope)
        inner[_text(_one(c, 3))] = None  # the accumulator
        if _one(c, 4) is not None:
            self.expr(_one(c, 4), scope)
        looped = dict(inner)
        looped[first] = None
        looped[element] = each
        for number in (5, 6):  # loop_condition, loop_step
            if _one(c, number) is not None:
                self.expr(_one(c, number), looped)
        if _one(c, 7) is not None:
            self.expr(_one(c, 7), inner)


def field_problems(reads: Iterable[Read], schema: Mapping[str, Shape]) -> list[str]:
    """Each read that names a field its map does not have, once, as `<shown>: <noun> has no field 'x': did you
    mean 'y'?` (difflib), else listing the fields there are."""
    out: dict[tuple[str, ...], str] = {}
    for read in reads:
        shape = schema.get(read.path[0])
        shown = read.shown[0]
        for i, step in enumerate(read.path[1:], 1):
            text, before = read.shown[i], read.shown[i - 1]
            if isinstance(shape, Entries) and step != ITEM:
                shown += f"[{step!r}]"  # `scores['name']`, as written or not
            elif text.startswith(before):
                shown += text[len(before) :]
            else:
                shown = text  # a comprehension's variable: `s.model`
            if isinstance(shape, Fields):
                if step == ITEM:
                    break  # a map's keys: strings
                if step not in shape.fields:
                    known = list(shape.fields)
                    close = difflib.get_close_matches(step, known, n=1)
                    hint = f"did you mean {close[0]!r}?" if close else f"{shape.noun} has {', '.join(known)}"
                    out.setdefault(read.path[: i + 1], f"{shown}: {shape.noun} has no field {step!r}: {hint}")
                    break
                shape = shape.fields[step]
            elif isinstance(shape, Items) and step == ITEM:
                shape = shape.item
            elif isinstance(shape, Entries) and step != ITEM:
                shape = shape.value
            else:
                break
    return list(out.values())


def closed(noun: str, built: Mapping[str, Any], nested: Mapping[str, Shape] | None = None) -> Fields:
    """The shape of a map the code builds, from one it built (so the schema cannot drift from the code): its keys,
    each of the shape `nested` gives (default None: not checked further). A key of `nested` the built map lacks is a
    bug, raised at import."""
    nested = nested or {}
    missing = set(nested) - set(built)
    if missing:
        raise AssertionError(f"{noun}: no such keys in the map built: {sorted(missing)}")
    return Fields(noun, {k: nested.get(k) for k in built})


SPAN_SHAPE = closed("a span", Span("", "", "", "", "", 0, 0).canonical())
"""A canonical span map (`span`, `trace.root`, each of `trace.spans`); its maps (`attributes`,
`resource_attributes`, `details`) are open."""
TRACE_SHAPE = closed("trace", trace_activation([])["trace"], {"spans": Items(SPAN_SHAPE), "root": SPAN_SHAPE})
"""`trace_activation`'s `trace`."""
SCHEMA: dict[str, Shape] = {"trace": TRACE_SHAPE, "span": SPAN_SHAPE}
"""The default variables' shapes: what the tail sampler's `cel` policy and span conditions may read."""
