"""The trace against a reference: its tool-call sequence vs an expected trajectory, and τ-bench-style expected
actions and outputs."""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

import orjson
from pydantic import AliasChoices, Field, TypeAdapter, ValidationError, field_validator

from evalsi.evaluators.base import Params, Target, evaluator
from evalsi.evaluators.packs.agent.calls import arguments_text, counted, json_text, skip, steps_of, tool_calls_of
from evalsi.evaluators.schema import json_type
from evalsi.model.score import Score

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


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return bool(a == b)


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
    return f"{tool}({arguments_text(arguments, 60)})" if with_arguments and arguments is not None else tool


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
                f"tool call {i + 1} ({tool}): arguments {arguments_text(arguments, 80)} do not match "
                f"{arguments_text(want_arguments, 80)} ({mode})"
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
        return skip(name, "no reference", "set params.reference or the reference's expected_trajectory")
    actual = [(str(c.get("name")), c.get("arguments")) for c in tool_calls_of(target)]
    compare_arguments = params.match_arguments != "ignore" and any(a is not None for _, a in expected)
    if compare_arguments and any(a is None for _, a in actual):
        return skip(name, "no tool arguments", "arguments are to be matched, but the trace does not record them")

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
            parts.append(f"missing: {counted(Counter(_shown(expected[j], compare_arguments) for j in missing))}")
        if extra:
            parts.append(f"not in reference: {counted(Counter(_shown(actual[i], compare_arguments) for i in extra))}")
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
        raise ValueError(f"reference.expected_outputs must be a list of strings, got {json_text(value)}")
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
    return f"{name}({arguments_text(arguments, 60)})" if arguments is not None else name


def _said(text: str) -> str:
    """An answer or an expected output as τ-bench compares them: lowercase, commas removed."""
    return text.lower().replace(",", "")


def _answer_texts(target: Target) -> list[str]:
    """The final output and every assistant message the trace's LLM calls wrote."""
    final = (target.trajectory or {}).get("final_output")
    texts = [str(final)] if final else []
    for step in steps_of(target):
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
        return skip(
            name, "no reference", "set params.expected_actions or expected_outputs, or the reference's expected_actions"
        )
    expected, outputs = expected or [], outputs or []
    if not expected and not outputs:
        return skip(name, "nothing expected", "expected_actions and expected_outputs are both empty")

    # a call whose tool failed did not take effect: it is not an action taken
    actual = [
        (str(c.get("name")), _parsed_arguments(c.get("arguments"))) for c in tool_calls_of(target) if not c.get("error")
    ]
    with_arguments = {a.name for a in expected if a.arguments is not None}
    if any(tool in with_arguments and arguments is None for tool, arguments in actual):
        return skip(name, "no tool arguments", "arguments are to be matched, but the trace does not record them")
    if outputs and not target.has_content:
        return skip(name, "no content", "outputs are to be found, but the trace records no message content")

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
        parts.append(f"out of order: {counted(Counter(_action_text(*_pair(expected[j])) for j in late))}")
    missing = [j for j in unmatched if j not in late]
    if missing:
        parts.append(f"missing: {counted(Counter(_action_text(*_pair(expected[j])) for j in missing))}")
    not_found = [o for o, ok in zip(outputs, found, strict=True) if not ok]
    if not_found:
        parts.append(f"output not found: {', '.join(json_text(o, 60) for o in not_found)}")
    if extra:
        parts.append(f"extra: {counted(Counter(_action_text(*c) for c in extra))}")
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
