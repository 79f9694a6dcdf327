"""The `agent` pack: tool-call errors and recovery from them, tool selection, argument validity, loops, step
budgets, trajectory match, τ-bench-style expected actions and task success, judged from a trace's trajectory
(`evalsi/trajectory.py`) and its spans."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Literal

import orjson
from jsonschema import Draft202012Validator
from pydantic import AliasChoices, Field, TypeAdapter, ValidationError, field_validator, model_validator

from evalsi.evaluators.base import Params, Target, evaluator
from evalsi.evaluators.schema import compiled, json_type, violations
from evalsi.pattern import compile_pattern
from evalsi.score import Score
from evalsi.span import Span

_SHOWN = 3  # problems an explanation lists before "and N more"


def _tool_calls(target: Target) -> list[dict[str, Any]]:
    return (target.trajectory or {}).get("tool_calls") or []


def _steps(target: Target) -> list[dict[str, Any]]:
    return (target.trajectory or {}).get("steps") or []


def _skip(name: str, reason: str, explanation: str) -> Score:
    score = Score.skipped(name, reason)
    score.explanation = explanation
    return score


def _listing(items: list[str]) -> str:
    shown = "; ".join(items[:_SHOWN])
    return shown + (f"; and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def _counted(names: Counter[str]) -> str:
    return ", ".join(n if c == 1 else f"{n} (x{c})" for n, c in names.items())


def _json_text(value: Any, limit: int = 120) -> str:
    """A value as compact, key-sorted JSON, cut at `limit` characters."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str).decode()
    except TypeError:  # orjson.JSONEncodeError: e.g. an integer beyond 64 bits
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _arguments_text(arguments: Any, limit: int = 120) -> str:
    """Tool-call arguments as text: the identity used to compare calls, and how explanations show them. A string
    is kept as sent (it was not JSON, or never parsed)."""
    if isinstance(arguments, str):
        return arguments if len(arguments) <= limit else arguments[: limit - 1] + "…"
    return _json_text(arguments, limit)


# --- builtin/tool-call-error-rate --------------------------------------------------------------------------------


class ToolCallErrorRateParams(Params):
    max_rate: float = Field(0.0, ge=0.0, le=1.0)  # passed when the error rate is at most this


@evaluator("builtin/tool-call-error-rate", requires=("trajectory",), params=ToolCallErrorRateParams)
def tool_call_error_rate(target: Target, params: ToolCallErrorRateParams) -> Score:
    """Share of executed tool calls that failed (0..1, lower is better); passed when at most `max_rate`."""
    name = "tool-call-error-rate"
    calls = _tool_calls(target)
    if not calls:
        return Score.skipped(name, "no tool calls")
    # a call the LLM asked for that no tool span records has no known outcome: it is not counted either way
    executed = [c for c in calls if c.get("error") is not None]
    if not executed:
        return _skip(
            name, "no tool outcomes", f"{len(calls)} tool call(s) requested, but no tool span records how they ended"
        )
    failed = [c for c in executed if c["error"]]
    rate = len(failed) / len(executed)
    kinds: dict[str, str] = {}
    for step in _steps(target):
        if step.get("type") == "tool" and step.get("error"):
            kinds.setdefault(str(step.get("tool_name")), step.get("error_type") or step.get("status_message") or "")
    details = Counter(f"{c['name']} ({kinds[c['name']]})" if kinds.get(c["name"]) else str(c["name"]) for c in failed)
    explanation = f"{len(failed)} of {len(executed)} tool calls failed"
    if failed:
        explanation += f": {_counted(details)}"
    return Score(
        name,
        value=rate,
        passed=rate <= params.max_rate,
        label=f"{len(failed)}/{len(executed)} failed",
        explanation=explanation,
    )


# --- builtin/tool-selection --------------------------------------------------------------------------------------


class ToolSelectionParams(Params):
    expected_tools: list[str] | None = None  # else the reference's `expected_tools`
    mode: Literal["any", "all", "exact"] = "all"  # passed: any expected tool called / all of them / exactly them


def _string_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a list of tool names, got {_json_text(value)}")
    return value


@evaluator("builtin/tool-selection", requires=("trajectory",), params=ToolSelectionParams)
def tool_selection(target: Target, params: ToolSelectionParams) -> Score:
    """The tools called vs the expected tools: F1 of the two sets (0..1, higher is better); passed per `mode`."""
    name = "tool-selection"
    if params.expected_tools is not None:
        expected = set(params.expected_tools)
    elif target.reference.get("expected_tools") is not None:
        expected = set(_string_list(target.reference["expected_tools"], "reference.expected_tools"))
    else:
        return _skip(name, "no reference", "set params.expected_tools or the reference's expected_tools")
    called = {str(c.get("name")) for c in _tool_calls(target) if c.get("name")}
    hits = len(called & expected)
    # empty sets count as perfect on their side: calling nothing wrong is full precision
    precision = hits / len(called) if called else 1.0
    recall = hits / len(expected) if expected else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    if params.mode == "any":
        passed = hits > 0 if expected else not called
    elif params.mode == "all":
        passed = expected <= called
    else:
        passed = called == expected
    parts = [f"called: {', '.join(sorted(called)) or 'no tools'}"]
    if expected - called:
        parts.append(f"missing: {', '.join(sorted(expected - called))}")
    if called - expected:
        parts.append(f"unexpected: {', '.join(sorted(called - expected))}")
    return Score(
        name,
        value=f1,
        passed=passed,
        label=f"precision {precision:.2f} recall {recall:.2f}",
        explanation="; ".join(parts),
        metadata={"precision": precision, "recall": recall, "f1": f1, "mode": params.mode},
    )


# --- builtin/tool-arguments --------------------------------------------------------------------------------------


class ToolArgumentsParams(Params):
    # tool name -> JSON Schema (draft 2020-12) of its arguments; wins over the trace's
    schemas: dict[str, dict[str, Any]] = {}

    @field_validator("schemas")
    @classmethod
    def _valid(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for tool, schema in value.items():
            try:
                compiled(schema)
            except ValueError as e:
                raise ValueError(f"{tool}: {e}") from None
        return value


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return bool(a == b)


def _argument_problems(arguments: Any, validator: Draft202012Validator) -> list[str]:
    """What in the arguments breaks the schema, each as `location: what is wrong` (`arguments: …` for the whole)."""
    if isinstance(arguments, str):
        # mappers parse JSON arguments; a string here was not JSON when they tried, or came from elsewhere
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return ["arguments are not valid JSON"]
    if not isinstance(arguments, dict):
        return [f"arguments are a JSON {json_type(arguments)}, not an object"]
    return [
        f"{path.removeprefix('$').removeprefix('.') or 'arguments'}: {what}"
        for path, what in violations(validator, arguments, show_values=True)
    ]


def _declared_tools(declared: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, parameters schema) of tool definitions: {name, parameters}, OpenAI's {type, function: {...}}, or
    Anthropic's {name, input_schema}."""
    for tool in declared if isinstance(declared, list) else ():
        if not isinstance(tool, dict):
            continue
        fn = tool["function"] if isinstance(tool.get("function"), dict) else tool
        schema = fn.get("parameters", fn.get("input_schema"))
        if isinstance(fn.get("name"), str) and isinstance(schema, dict):
            yield fn["name"], schema


def _tool_schemas(spans: list[Span], configured: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Schemas by tool name: the params' first, then a tool span's own, then the tools declared to an LLM."""
    declared: dict[str, dict[str, Any]] = {}
    on_tool_spans: dict[str, dict[str, Any]] = {}
    for span in spans:
        details = span.details
        if not details:
            continue
        parameters = details.get("tool_parameters")
        if span.tool_name and isinstance(parameters, dict):
            on_tool_spans.setdefault(span.tool_name, parameters)
        for tool, schema in _declared_tools(details.get("tools_declared")):
            declared.setdefault(tool, schema)
    return {**declared, **on_tool_spans, **configured}


@evaluator("builtin/tool-arguments", requires=("trajectory",), params=ToolArgumentsParams)
def tool_arguments(target: Target, params: ToolArgumentsParams) -> Score:
    """Tool-call arguments valid against the tool's JSON schema: share of checked calls valid (0..1, higher better)."""
    name = "tool-arguments"
    calls = _tool_calls(target)
    if not calls:
        return Score.skipped(name, "no tool calls")
    schemas = _tool_schemas(target.spans, params.schemas)
    if not schemas:
        return _skip(name, "no tool schemas", "no span declares tool parameters and params.schemas is empty")
    checked = 0
    invalid: list[str] = []
    no_schema: Counter[str] = Counter()
    bad_schema: dict[str, str] = {}  # tool -> why its recorded schema cannot be used
    unrecorded = 0
    for i, call in enumerate(calls, 1):
        tool = str(call.get("name"))
        schema = schemas.get(tool)
        if schema is None:
            no_schema[tool] += 1
            continue
        if call.get("arguments") is None:
            unrecorded += 1
            continue
        try:
            problems = _argument_problems(call["arguments"], compiled(schema))
        except ValueError as e:  # a recorded schema that is not valid, or whose $ref cannot be resolved
            bad_schema.setdefault(tool, str(e))
            continue
        checked += 1
        if problems:
            invalid.append(f"call {i} {tool}: {', '.join(problems[:_SHOWN])}")
    notes = []
    if no_schema:
        notes.append(f"not checked, no schema: {_counted(no_schema)}")
    notes += [f"not checked, {tool}'s schema: {why}" for tool, why in bad_schema.items()]
    if unrecorded:
        notes.append(f"not checked, arguments not recorded: {unrecorded} call(s)")
    if not checked:
        if unrecorded:
            return _skip(name, "no tool arguments", "; ".join(notes))
        return _skip(name, "no tool schemas", "; ".join(notes))
    explanation = _listing(invalid) if invalid else f"{checked} call(s) match their schema"
    return Score(
        name,
        value=(checked - len(invalid)) / checked,
        passed=not invalid,
        label=f"{len(invalid)}/{checked} invalid",
        explanation="; ".join([explanation, *notes]),
    )


# --- builtin/loop-detection --------------------------------------------------------------------------------------


class LoopDetectionParams(Params):
    max_repeats: int = Field(3, ge=2)  # one tool with the same arguments this many times is a loop
    ignore_arguments: bool = False  # compare calls by tool name alone
    detect_cycles: bool = True
    cycle_repeats: int = Field(2, ge=2)  # a block of calls repeated back to back this many times (A-B-A-B) is a loop
    max_cycle_length: int = Field(3, ge=2)  # longest block looked for


def _cycle(keys: list[Any], max_length: int, repeats: int) -> tuple[int, int, int] | None:
    """(start, length, times) of the first block of 2..max_length calls repeated back to back `repeats` times."""
    n = len(keys)
    for length in range(2, max_length + 1):
        if n < length * repeats:
            break
        run = 0
        j = length
        while j < n:
            run = run + 1 if keys[j] == keys[j - length] else 0
            if run >= length * (repeats - 1):
                start = j - length * repeats + 1
                if len(set(keys[start : start + length])) > 1:  # one call repeated is a repeat, not a cycle
                    while j + 1 < n and keys[j + 1] == keys[j + 1 - length]:
                        j, run = j + 1, run + 1
                    return start, length, (run + length) // length
            j += 1
    return None


@evaluator("builtin/loop-detection", requires=("trajectory",), params=LoopDetectionParams)
def loop_detection(target: Target, params: LoopDetectionParams) -> Score:
    """Tool loops: one call repeated with the same arguments, or a cycle (A-B-A-B); value is the most repeats."""
    name = "loop-detection"
    calls = _tool_calls(target)
    if not calls:
        return Score.skipped(name, "no tool calls")
    keys: list[Any] = []
    unrecorded = 0
    for i, call in enumerate(calls):
        tool = str(call.get("name"))
        if params.ignore_arguments:
            keys.append((tool,))
        elif call.get("arguments") is None:
            unrecorded += 1
            keys.append((tool, None, i))  # unknown arguments never equal another call's
        else:
            keys.append((tool, _arguments_text(call["arguments"], 10_000)))
    (top, most), *_ = Counter(keys).most_common(1)
    problems = []
    if most >= params.max_repeats:
        same = " (arguments not compared)" if params.ignore_arguments else f" with arguments {_arguments_text(top[1])}"
        problems.append(f"{top[0]} called {most} times{same}")
    label = "repeated call" if problems else "no loop"
    if params.detect_cycles:
        cycle = _cycle(keys, params.max_cycle_length, params.cycle_repeats)
        if cycle is not None:
            start, length, times = cycle
            block = " → ".join(k[0] for k in keys[start : start + length])
            problems.append(f"cycle {block} repeated {times} times from tool call {start + 1}")
            label = "cycle" if label == "no loop" else "repeated call and cycle"
    if problems:
        explanation = "; ".join(problems)
    else:
        explanation = f"{len(calls)} tool call(s), no call repeated {params.max_repeats} times"
        if params.detect_cycles:
            explanation += " and no cycle"
    if unrecorded:
        explanation += f"; {unrecorded} call(s) without recorded arguments not compared (see ignore_arguments)"
    return Score(name, value=float(most), passed=not problems, label=label, explanation=explanation)


# --- builtin/step-efficiency -------------------------------------------------------------------------------------


class StepEfficiencyParams(Params):
    # any budget left unset is not judged
    max_steps: int | None = Field(None, ge=0)  # LLM, tool, retriever and embedding steps (not agent/chain spans)
    max_llm_calls: int | None = Field(None, ge=0)
    max_tool_calls: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=0)  # input + output tokens of every LLM call
    max_cost_usd: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _some_budget(self) -> StepEfficiencyParams:
        if all(getattr(self, f) is None for f in type(self).model_fields):
            raise ValueError(f"set at least one budget: {', '.join(type(self).model_fields)}")
        return self


_CONTAINERS = frozenset(("agent", "chain"))


def _total(llm_steps: list[dict[str, Any]], measure: Callable[[dict[str, Any]], float | None]) -> tuple[float, int]:
    """The sum over LLM calls of what they report, and how many report nothing."""
    values = [measure(s) for s in llm_steps]
    return sum(v for v in values if v is not None), sum(1 for v in values if v is None)


def _tokens(step: dict[str, Any]) -> float | None:
    if step.get("input_tokens") is None and step.get("output_tokens") is None:
        return None
    return (step.get("input_tokens") or 0) + (step.get("output_tokens") or 0)


@evaluator("builtin/step-efficiency", requires=("trajectory",), params=StepEfficiencyParams)
def step_efficiency(target: Target, params: StepEfficiencyParams) -> Score:
    """Steps, LLM calls, tool calls, tokens and cost vs budgets: share of budgets met (0..1, higher is better)."""
    name = "step-efficiency"
    steps = _steps(target)
    llm_steps = [s for s in steps if s.get("type") == "llm"]
    tokens, tokens_unknown = _total(llm_steps, _tokens)
    cost, cost_unknown = _total(llm_steps, lambda s: s.get("cost_usd"))
    measures: list[tuple[str, float, int, float | None]] = [
        # (measure, total, LLM calls that did not report it, budget)
        ("steps", sum(1 for s in steps if s.get("type") not in _CONTAINERS), 0, params.max_steps),
        ("llm_calls", len(llm_steps), 0, params.max_llm_calls),
        ("tool_calls", len(_tool_calls(target)), 0, params.max_tool_calls),
        ("tokens", tokens, tokens_unknown, params.max_tokens),
        ("cost_usd", cost, cost_unknown, params.max_cost_usd),
    ]
    met: list[str] = []
    exceeded: list[str] = []
    parts: list[str] = []
    unknown: list[str] = []
    for measure, total, missing, budget in measures:
        if budget is None:
            continue
        shown = f"{total:.6g}"
        if total > budget:  # even a partial sum over budget is over budget
            exceeded.append(measure)
            parts.append(f"{measure} {'at least ' if missing else ''}{shown} > {budget:g}")
        elif missing:
            unknown.append(measure)
            parts.append(f"{measure} not judged: {missing} of {len(llm_steps)} LLM calls report none")
        else:
            met.append(measure)
            parts.append(f"{measure} {shown} ≤ {budget:g}")
    judged = len(met) + len(exceeded)
    if not judged:
        return _skip(name, f"no {' or '.join(m.removesuffix('_usd') for m in unknown)} data", "; ".join(parts))
    return Score(
        name,
        value=len(met) / judged,
        passed=not exceeded,
        label=f"exceeded: {', '.join(exceeded)}" if exceeded else "within budget",
        explanation="; ".join(parts),
        metadata={m: total for m, total, missing, _ in measures if not missing},
    )


# --- builtin/trajectory-match ------------------------------------------------------------------------------------


class ExpectedCall(Params):
    name: str
    arguments: dict[str, Any] | None = None  # None: any arguments


Mode = Literal["strict", "unordered", "subset", "superset"]
ArgumentsMode = Literal["ignore", "exact", "subset", "superset"]


class TrajectoryMatchParams(Params):
    reference: list[str | ExpectedCall] | None = None  # else the reference's `expected_trajectory`
    # strict: same calls, same order; unordered: same calls, any order; subset: every call the trace made is in
    # the reference (no extras); superset: the trace made every reference call (extras allowed)
    mode: Mode = "strict"
    # when a reference call gives arguments: ignore them, or the trace's must equal them (exact), hold only
    # reference keys with reference values (subset), or hold at least every reference key and value (superset)
    match_arguments: ArgumentsMode = "ignore"


def _expected_calls(items: Any) -> list[tuple[str, dict[str, Any] | None]]:
    if not isinstance(items, list):
        raise ValueError(f"expected_trajectory must be a list of tool names or {{name, arguments}}, got {items!r}")
    expected: list[tuple[str, dict[str, Any] | None]] = []
    for item in items:
        if isinstance(item, str):
            expected.append((item, None))
        elif isinstance(item, ExpectedCall):
            expected.append((item.name, item.arguments))
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            arguments = item.get("arguments")
            expected.append((item["name"], arguments if isinstance(arguments, dict) else None))
        else:
            raise ValueError(f"expected_trajectory entry {item!r} is neither a tool name nor {{name, arguments}}")
    return expected


def _arguments_match(actual: Any, expected: dict[str, Any] | None, mode: ArgumentsMode) -> bool:
    if mode == "ignore" or expected is None:
        return True
    if not isinstance(actual, dict):
        return False
    if mode == "exact":
        return actual.keys() == expected.keys() and all(_same(actual[k], expected[k]) for k in expected)
    inner, outer = (actual, expected) if mode == "subset" else (expected, actual)
    return all(k in outer and _same(v, outer[k]) for k, v in inner.items())


def _unmatched(
    actual: list[tuple[str, Any]], expected: list[tuple[str, dict[str, Any] | None]], mode: ArgumentsMode
) -> tuple[list[int], list[int]]:
    """Pair actual calls with reference calls, each used once, as many as possible: the actual calls and the
    reference calls left over."""
    buckets: dict[str, tuple[list[int], list[int]]] = {}
    for i, (tool, _) in enumerate(actual):
        buckets.setdefault(tool, ([], []))[0].append(i)
    for j, (tool, _) in enumerate(expected):
        buckets.setdefault(tool, ([], []))[1].append(j)
    extra: list[int] = []
    missing: list[int] = []
    for lefts, rights in buckets.values():
        if mode == "ignore" or all(expected[j][1] is None for j in rights):
            # any call of the tool fits any reference call of it: only the counts matter
            extra += lefts[len(rights) :]
            missing += rights[len(lefts) :]
            continue
        owner: dict[int, int] = {}  # reference call -> actual call (Kuhn's augmenting paths)

        def place(i: int, seen: set[int], rights: list[int] = rights, owner: dict[int, int] = owner) -> bool:
            for j in rights:
                if j not in seen and _arguments_match(actual[i][1], expected[j][1], mode):
                    seen.add(j)
                    if j not in owner or place(owner[j], seen):
                        owner[j] = i
                        return True
            return False

        extra += [i for i in lefts if not place(i, set())]
        missing += [j for j in rights if j not in owner]
    return sorted(extra), sorted(missing)


def _shown(call: tuple[str, Any], with_arguments: bool) -> str:
    tool, arguments = call
    return f"{tool}({_arguments_text(arguments, 60)})" if with_arguments and arguments is not None else tool


def _strict_difference(
    actual: list[tuple[str, Any]], expected: list[tuple[str, dict[str, Any] | None]], mode: ArgumentsMode
) -> str | None:
    for i in range(max(len(actual), len(expected))):
        if i >= len(actual):
            made = f"the trace made only {len(actual)}" if actual else "the trace made none"
            return f"tool call {i + 1}: expected {expected[i][0]}, but {made}"
        if i >= len(expected):
            return f"tool call {i + 1}: {actual[i][0]} is beyond the reference's {len(expected)} call(s)"
        (tool, arguments), (want, want_arguments) = actual[i], expected[i]
        if tool != want:
            return f"tool call {i + 1}: expected {want}, got {tool}"
        if not _arguments_match(arguments, want_arguments, mode):
            return (
                f"tool call {i + 1} ({tool}): arguments {_arguments_text(arguments, 80)} do not match "
                f"{_arguments_text(want_arguments, 80)} ({mode})"
            )
    return None


@evaluator("builtin/trajectory-match", requires=("trajectory",), params=TrajectoryMatchParams)
def trajectory_match(target: Target, params: TrajectoryMatchParams) -> Score:
    """The trace's tool-call sequence vs a reference trajectory (strict, unordered, subset, superset): 1 or 0."""
    name = "trajectory-match"
    if params.reference is not None:
        expected = _expected_calls(params.reference)
    elif target.reference.get("expected_trajectory") is not None:
        expected = _expected_calls(target.reference["expected_trajectory"])
    else:
        return _skip(name, "no reference", "set params.reference or the reference's expected_trajectory")
    actual = [(str(c.get("name")), c.get("arguments")) for c in _tool_calls(target)]
    compare_arguments = params.match_arguments != "ignore" and any(a is not None for _, a in expected)
    if compare_arguments and any(a is None for _, a in actual):
        return _skip(name, "no tool arguments", "arguments are to be matched, but the trace does not record them")

    difference: str | None
    if params.mode == "strict":
        difference = _strict_difference(actual, expected, params.match_arguments)
    else:
        extra, missing = _unmatched(actual, expected, params.match_arguments)
        if params.mode == "subset":
            missing = []
        elif params.mode == "superset":
            extra = []
        parts = []
        if missing:
            parts.append(f"missing: {_counted(Counter(_shown(expected[j], compare_arguments) for j in missing))}")
        if extra:
            parts.append(f"not in reference: {_counted(Counter(_shown(actual[i], compare_arguments) for i in extra))}")
        difference = "; ".join(parts) or None
    if difference is None:
        explanation = f"matches the reference ({params.mode}): {len(actual)} tool call(s), {len(expected)} expected"
    else:
        explanation = difference
    return Score(
        name,
        value=1.0 if difference is None else 0.0,
        passed=difference is None,
        label=params.mode,
        explanation=explanation,
    )


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
                unreadable.append(f"{attribute}={_json_text(raw, 40)} on span {span.name!r} is not a verdict")
                continue
            return Score(
                name,
                value=float(verdict),
                passed=verdict,
                label="success" if verdict else "failure",
                explanation=f"{attribute}={_json_text(raw, 40)} on span {span.name!r}",
            )
    if params.contains is None and params.regex is None:
        why = unreadable or [f"no span sets {' or '.join(names) or 'a success attribute'}"]
        return _skip(name, "no success signal", "; ".join([*why, "no checker (contains, regex) is configured"]))
    output = target.output_text
    if output is None:
        why = unreadable or [f"no span sets {' or '.join(names) or 'a success attribute'}"]
        return _skip(name, "no success signal", "; ".join([*why, "no final output to check"]))
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


# --- builtin/tool-error-recovery ---------------------------------------------------------------------------------


class ToolErrorRecoveryParams(Params):
    any_tool: bool = False  # a later successful call of any tool recovers a failure, not only one of the same tool
    min_rate: float = Field(1.0, ge=0.0, le=1.0)  # passed when at least this share of failed calls is recovered


def _failed_agent(target: Target) -> str | None:
    """The run's own agent step (one with no agent above it) that ended in error, as text; None when none did."""
    steps = _steps(target)
    by_id = {s.get("span_id"): s for s in steps}
    for step in steps:
        if step.get("type") != "agent" or not step.get("error"):
            continue
        parent = by_id.get(step.get("parent_span_id"))
        while parent is not None and parent.get("type") != "agent":
            parent = by_id.get(parent.get("parent_span_id"))
        if parent is None:  # no agent above it: the run's own agent
            kind = step.get("error_type") or step.get("status_message")
            return f"agent step {step.get('name')!r} failed" + (f" ({kind})" if kind else "")
    return None


@evaluator("builtin/tool-error-recovery", requires=("trajectory",), params=ToolErrorRecoveryParams)
def tool_error_recovery(target: Target, params: ToolErrorRecoveryParams) -> Score:
    """Failed tool calls the agent got past (a later success, then an answer): share recovered (0..1, higher better)."""
    name = "tool-error-recovery"
    calls = _tool_calls(target)
    failed = [i for i, c in enumerate(calls) if c.get("error")]
    if not failed:
        executed = sum(1 for c in calls if c.get("error") is not None)
        if not calls:
            why = "no tool calls"
        elif not executed:
            why = f"{len(calls)} tool call(s) requested, but no tool span records how they ended"
        else:
            why = f"none of {executed} executed tool call(s) failed"
        return _skip(name, "no failed tool calls", why)
    # walking back: which tools succeed after each call (a call with no recorded outcome is no success)
    succeeded_after: list[frozenset[str]] = [frozenset()] * len(calls)
    later: set[str] = set()
    for i in range(len(calls) - 1, -1, -1):
        succeeded_after[i] = frozenset(later)
        if calls[i].get("error") is False:
            later.add(str(calls[i].get("name")))
    run_failure = _failed_agent(target)
    final = (target.trajectory or {}).get("final_output")
    if run_failure is None and (final is None or not str(final).strip()):
        if not target.has_content:  # an answer may have been given, but not recorded
            return _skip(name, "no content", "whether the run ended with a final output is not recorded")
        run_failure = "the run ended without a final output"
    recovered: Counter[str] = Counter()
    unrecovered: Counter[str] = Counter()
    for i in failed:
        tool = str(calls[i].get("name"))
        retried = bool(succeeded_after[i]) if params.any_tool else tool in succeeded_after[i]
        (recovered if retried and run_failure is None else unrecovered)[tool] += 1
    k, n = recovered.total(), len(failed)
    explanation = f"{k} of {n} failed tool call(s) recovered" + (f" ({_counted(recovered)})" if recovered else "")
    if unrecovered:
        why = run_failure or f"no later successful call of {'any tool' if params.any_tool else 'the same tool'}"
        explanation += f"; not recovered: {_counted(unrecovered)} ({why})"
    return Score(
        name,
        value=k / n,
        passed=k / n >= params.min_rate,
        label=f"{k}/{n} recovered",
        explanation=explanation,
        metadata={"failed": n, "recovered": k},
    )


# --- builtin/expected-actions ------------------------------------------------------------------------------------


class ExpectedAction(Params):
    """One action the agent must take: a tool call's name and arguments (τ-bench's `kwargs` too); arguments
    given as a JSON string are parsed; no arguments: any arguments."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | None = Field(None, validation_alias=AliasChoices("arguments", "kwargs"))

    @field_validator("arguments", mode="before")
    @classmethod
    def _parsed(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError:
                raise ValueError("a string that is not JSON") from None
            if not isinstance(value, dict):
                raise ValueError(f"a JSON {json_type(value)}, not an object")
        return value


_ACTIONS: TypeAdapter[list[ExpectedAction]] = TypeAdapter(list[ExpectedAction])


class ExpectedActionsParams(Params):
    expected_actions: list[ExpectedAction] | None = None  # else the reference's `expected_actions`
    expected_outputs: list[str] | None = None  # else the reference's `expected_outputs`
    ordered: bool = False  # the expected actions must be taken in their order (other calls may come between)
    allow_extra: bool = True  # else more calls of an expected action's tool than expected fail it


def _reference_actions(value: Any) -> list[ExpectedAction]:
    try:
        return _ACTIONS.validate_python(value)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            problems.append(f"reference.expected_actions{where}: {err['msg'].removeprefix('Value error, ')}")
        raise ValueError("; ".join(problems)) from None


def _reference_outputs(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"reference.expected_outputs must be a list of strings, got {_json_text(value)}")
    return value


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 equals 1.0, true is not 1, objects compare key by key whatever their order."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _parsed_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def _takes(call: tuple[str, Any], action: ExpectedAction) -> bool:
    return call[0] == action.name and (action.arguments is None or _json_equal(call[1], action.arguments))


def _matched_any_order(actual: list[tuple[str, Any]], expected: list[ExpectedAction]) -> tuple[list[bool], set[int]]:
    """Each expected action paired with a call of its own, as many as possible: which are, and the calls used.
    Actions with arguments go first: equal arguments are an equivalence, so this greedy pairing is a largest one."""
    matched = [False] * len(expected)
    used: set[int] = set()
    for j in sorted(range(len(expected)), key=lambda j: expected[j].arguments is None):
        i = next((i for i, call in enumerate(actual) if i not in used and _takes(call, expected[j])), None)
        if i is not None:
            matched[j] = True
            used.add(i)
    return matched, used


def _matched_in_order(actual: list[tuple[str, Any]], expected: list[ExpectedAction]) -> list[bool]:
    """The expected actions in a longest run of them the calls take in order (a longest common subsequence)."""
    n, m = len(expected), len(actual)
    best = [[0] * (m + 1) for _ in range(n + 1)]  # best[j][i]: most of expected[j:] taken in order by actual[i:]
    for j in range(n - 1, -1, -1):
        for i in range(m - 1, -1, -1):
            take = 1 + best[j + 1][i + 1] if _takes(actual[i], expected[j]) else 0
            best[j][i] = max(take, best[j + 1][i], best[j][i + 1])
    matched = [False] * n
    j = i = 0
    while j < n and i < m:
        if best[j][i] == 0:
            break
        if _takes(actual[i], expected[j]) and best[j][i] == 1 + best[j + 1][i + 1]:
            matched[j] = True
            j, i = j + 1, i + 1
        elif best[j][i] == best[j][i + 1]:
            i += 1
        else:
            j += 1
    return matched


def _pair(action: ExpectedAction) -> tuple[str, Any]:
    return action.name, action.arguments


def _action_text(name: str, arguments: Any) -> str:
    return f"{name}({_arguments_text(arguments, 60)})" if arguments is not None else name


def _said(text: str) -> str:
    """An answer or an expected output as τ-bench compares them: lowercase, commas removed."""
    return text.lower().replace(",", "")


def _answer_texts(target: Target) -> list[str]:
    """The final output and every assistant message the trace's LLM calls wrote."""
    final = (target.trajectory or {}).get("final_output")
    texts = [str(final)] if final else []
    for step in _steps(target):
        if step.get("type") != "llm":
            continue
        for message in step.get("output") or ():
            if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
                texts += [
                    p["content"]
                    for p in message.get("parts") or ()
                    if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("content"), str)
                ]
    return texts


@evaluator("builtin/expected-actions", requires=("trajectory",), params=ExpectedActionsParams)
def expected_actions(target: Target, params: ExpectedActionsParams) -> Score:
    """τ-bench-style action match: expected tool calls (name, equal arguments) and outputs found, share (0..1)."""
    name = "expected-actions"
    reference = target.reference
    if params.expected_actions is not None:
        expected = list(params.expected_actions)
    elif reference.get("expected_actions") is not None:
        expected = _reference_actions(reference["expected_actions"])
    else:
        expected = None
    if params.expected_outputs is not None:
        outputs: list[str] | None = params.expected_outputs
    elif reference.get("expected_outputs") is not None:
        outputs = _reference_outputs(reference["expected_outputs"])
    else:
        outputs = None
    if expected is None and outputs is None:
        return _skip(
            name, "no reference", "set params.expected_actions or expected_outputs, or the reference's expected_actions"
        )
    expected, outputs = expected or [], outputs or []
    if not expected and not outputs:
        return _skip(name, "nothing expected", "expected_actions and expected_outputs are both empty")

    # a call whose tool failed did not take effect: it is not an action taken
    actual = [
        (str(c.get("name")), _parsed_arguments(c.get("arguments"))) for c in _tool_calls(target) if not c.get("error")
    ]
    with_arguments = {a.name for a in expected if a.arguments is not None}
    if any(tool in with_arguments and arguments is None for tool, arguments in actual):
        return _skip(name, "no tool arguments", "arguments are to be matched, but the trace does not record them")
    if outputs and not target.has_content:
        return _skip(name, "no content", "outputs are to be found, but the trace records no message content")

    anywhere, used = _matched_any_order(actual, expected)
    matched = _matched_in_order(actual, expected) if params.ordered else anywhere
    said = [_said(t) for t in _answer_texts(target)]
    found = [any(_said(o) in t for t in said) for o in outputs]
    names = {a.name for a in expected}
    extra = [] if params.allow_extra else [c for i, c in enumerate(actual) if i not in used and c[0] in names]

    parts = []
    unmatched = [j for j, ok in enumerate(matched) if not ok]
    # in order: an action taken, but not where the order wants it, is out of order rather than missing
    late = [j for j in unmatched if params.ordered and anywhere[j]]
    if late:
        parts.append(f"out of order: {_counted(Counter(_action_text(*_pair(expected[j])) for j in late))}")
    missing = [j for j in unmatched if j not in late]
    if missing:
        parts.append(f"missing: {_counted(Counter(_action_text(*_pair(expected[j])) for j in missing))}")
    not_found = [o for o, ok in zip(outputs, found, strict=True) if not ok]
    if not_found:
        parts.append(f"output not found: {', '.join(_json_text(o, 60) for o in not_found)}")
    if extra:
        parts.append(f"extra: {_counted(Counter(_action_text(*c) for c in extra))}")
    k = sum(matched) + sum(found)
    n = len(expected) + len(outputs)
    if not parts:
        taken = f"{len(expected)} action(s) taken{' in order' if params.ordered and len(expected) > 1 else ''}"
        parts.append(f"all {n} expected found: {taken}, {len(outputs)} output(s) given")
    return Score(
        name,
        value=k / n,
        passed=k == n and not extra,
        label=f"{k}/{n} matched" + (f", {len(extra)} extra" if extra else ""),
        explanation="; ".join(parts),
        metadata={
            "actions": len(expected),
            "actions_matched": sum(matched),
            "outputs": len(outputs),
            "outputs_found": sum(found),
            "extra": len(extra),
        },
    )
