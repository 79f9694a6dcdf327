"""Tool calls judged one by one: errors and recovery from them, the tools chosen, arguments against their schema."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import Field, field_validator

from evalsi.evaluators.base import Params, Target, evaluator
from evalsi.evaluators.packs.agent.calls import SHOWN, counted, json_text, listing, skip, steps_of, tool_calls_of
from evalsi.evaluators.schema import compiled, json_type, violations
from evalsi.model.score import Score
from evalsi.model.span import Span

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

# --- builtin/tool-call-error-rate --------------------------------------------------------------------------------


class ToolCallErrorRateParams(Params):
    max_rate: float = Field(0.0, ge=0.0, le=1.0)  # passed when the error rate is at most this


@evaluator("builtin/tool-call-error-rate", requires=("trajectory",), params=ToolCallErrorRateParams)
def tool_call_error_rate(target: Target, params: ToolCallErrorRateParams) -> Score:
    """Share of executed tool calls that failed (0..1, lower is better); passed when at most `max_rate`."""
    name = "tool-call-error-rate"
    calls = tool_calls_of(target)
    if not calls:
        return Score.skipped(name, "no tool calls")
    # a call the LLM asked for that no tool span records has no known outcome: it is not counted either way
    executed = [c for c in calls if c.get("error") is not None]
    if not executed:
        return skip(
            name, "no tool outcomes", f"{len(calls)} tool call(s) requested, but no tool span records how they ended"
        )
    failed = [c for c in executed if c["error"]]
    rate = len(failed) / len(executed)
    kinds: dict[str, str] = {}
    for step in steps_of(target):
        if step.get("type") == "tool" and step.get("error"):
            kinds.setdefault(str(step.get("tool_name")), step.get("error_type") or step.get("status_message") or "")
    details = Counter(f"{c['name']} ({kinds[c['name']]})" if kinds.get(c["name"]) else str(c["name"]) for c in failed)
    explanation = f"{len(failed)} of {len(executed)} tool calls failed"
    if failed:
        explanation += f": {counted(details)}"
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
        raise ValueError(f"{where} must be a list of tool names, got {json_text(value)}")
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
        return skip(name, "no reference", "set params.expected_tools or the reference's expected_tools")
    called = {str(c.get("name")) for c in tool_calls_of(target) if c.get("name")}
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
    calls = tool_calls_of(target)
    if not calls:
        return Score.skipped(name, "no tool calls")
    schemas = _tool_schemas(target.spans, params.schemas)
    if not schemas:
        return skip(name, "no tool schemas", "no span declares tool parameters and params.schemas is empty")
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
            invalid.append(f"call {i} {tool}: {', '.join(problems[:SHOWN])}")
    notes = []
    if no_schema:
        notes.append(f"not checked, no schema: {counted(no_schema)}")
    notes += [f"not checked, {tool}'s schema: {why}" for tool, why in bad_schema.items()]
    if unrecorded:
        notes.append(f"not checked, arguments not recorded: {unrecorded} call(s)")
    if not checked:
        if unrecorded:
            return skip(name, "no tool arguments", "; ".join(notes))
        return skip(name, "no tool schemas", "; ".join(notes))
    explanation = listing(invalid) if invalid else f"{checked} call(s) match their schema"
    return Score(
        name,
        value=(checked - len(invalid)) / checked,
        passed=not invalid,
        label=f"{len(invalid)}/{checked} invalid",
        explanation="; ".join([explanation, *notes]),
    )


# --- builtin/tool-error-recovery ---------------------------------------------------------------------------------


class ToolErrorRecoveryParams(Params):
    any_tool: bool = False  # a later successful call of any tool recovers a failure, not only one of the same tool
    min_rate: float = Field(1.0, ge=0.0, le=1.0)  # passed when at least this share of failed calls is recovered


def _failed_agent(target: Target) -> str | None:
    """The run's own agent step (one with no agent above it) that ended in error, as text; None when none did."""
    steps = steps_of(target)
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
    calls = tool_calls_of(target)
    failed = [i for i, c in enumerate(calls) if c.get("error")]
    if not failed:
        executed = sum(1 for c in calls if c.get("error") is not None)
        if not calls:
            why = "no tool calls"
        elif not executed:
            why = f"{len(calls)} tool call(s) requested, but no tool span records how they ended"
        else:
            why = f"none of {executed} executed tool call(s) failed"
        return skip(name, "no failed tool calls", why)
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
            return skip(name, "no content", "whether the run ended with a final output is not recorded")
        run_failure = "the run ended without a final output"
    recovered: Counter[str] = Counter()
    unrecovered: Counter[str] = Counter()
    for i in failed:
        tool = str(calls[i].get("name"))
        retried = bool(succeeded_after[i]) if params.any_tool else tool in succeeded_after[i]
        (recovered if retried and run_failure is None else unrecovered)[tool] += 1
    k, n = recovered.total(), len(failed)
    explanation = f"{k} of {n} failed tool call(s) recovered" + (f" ({counted(recovered)})" if recovered else "")
    if unrecovered:
        why = run_failure or f"no later successful call of {'any tool' if params.any_tool else 'the same tool'}"
        explanation += f"; not recovered: {counted(unrecovered)} ({why})"
    return Score(
        name,
        value=k / n,
        passed=k / n >= params.min_rate,
        label=f"{k}/{n} recovered",
        explanation=explanation,
        metadata={"failed": n, "recovered": k},
    )
