"""The agent pack on every capture with a tool loop, and on constructed agent traces (loops, cycles, errors,
schema violations, budgets, reference trajectories, task success)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from running_collector import FIXTURES

from evalsi.evaluators import REGISTRY, Target, load_evaluators, parse_params, run
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.model.trajectory import build_trajectory
from evalsi.processors.normalize.files import normalize_files

load_evaluators()

TOOL_LOOP_FOLDERS = [
    "otel-openai-v2", "otel-openai-v2-latest", "openinference", "openllmetry-0.54", "openlit", "mlflow",
]  # fmt: skip
# the libraries that record the tool's parameter schema: OpenLLMetry on the chat span (the functions the request
# declared), OpenInference on the tool span (tool.parameters)
WITH_SCHEMAS = {"openinference", "openllmetry-0.54"}


def _files(folder: str, scenario: str) -> list[Path]:
    files = [FIXTURES / folder / f"{scenario}.pb"]
    logs = FIXTURES / folder / f"{scenario}.logs.pb"
    return files + ([logs] if logs.exists() else [])


def _fixture(folder: str, scenario: str = "chat_tools", reference: dict[str, Any] | None = None) -> Target:
    spans = normalize_files(_files(folder, scenario)).spans
    root = next(s for s in spans if not s.parent_span_id)
    return Target(spans, span=root, trajectory=build_trajectory(spans), reference=reference or {})


def _markers(folder: str, scenario: str = "chat_tools") -> dict[str, Any]:
    return json.loads((FIXTURES / folder / "meta.json").read_text())["scenarios"][scenario]["markers"]


def _score(ref: str, target: Target, **params: Any) -> Score:
    ev = REGISTRY[f"builtin/{ref}"]
    (score,) = run(ev, target, parse_params(ev, params))
    assert score.evaluator == f"builtin/{ref}" and score.name == ref
    return score


# --- constructed traces: an agent span with LLM and tool spans under it, as an agent framework records them -------

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
UNRECORDED = object()


def _span(n: int, step_type: str, name: str, **fields: Any) -> Span:
    return Span(
        TRACE_ID, f"{n:016x}", "" if n == 1 else f"{1:016x}", name, "INTERNAL",
        1_000_000 * n, 1_000_000 * n + 500_000, step_type=step_type, **fields,
    )  # fmt: skip


def llm(tokens: tuple[int, int] | None = (100, 20), cost: float | None = None, **details: Any) -> dict[str, Any]:
    return {"type": "llm", "tokens": tokens, "cost": cost, "details": details}


def tool(name: str, arguments: Any = UNRECORDED, error: str | None = None) -> dict[str, Any]:
    return {"type": "tool", "name": name, "arguments": arguments, "error": error}


def _trace(
    *steps: dict[str, Any], root_attributes: dict[str, Any] | None = None, reference: dict[str, Any] | None = None
) -> Target:
    root = _span(1, "agent", "invoke_agent planner", agent_name="planner", attributes=dict(root_attributes or {}))
    spans = [root]
    for n, step in enumerate(steps, start=2):
        if step["type"] == "llm":
            tokens = step["tokens"] or (None, None)
            span = _span(
                n, "llm", "chat gpt-4o-mini", model="gpt-4o-mini", input_tokens=tokens[0], output_tokens=tokens[1],
                cost_usd=step["cost"], details=step["details"],
            )  # fmt: skip
        elif step["type"] == "tool":
            call_input = None
            if step["arguments"] is not UNRECORDED:
                part = {"type": "tool_call", "id": f"call_{n}", "name": step["name"], "arguments": step["arguments"]}
                call_input = [{"role": "assistant", "parts": [part]}]
            span = _span(
                n, "tool", f"execute_tool {step['name']}", tool_name=step["name"], input=call_input,
                status_code="ERROR" if step["error"] else "UNSET", error_type=step["error"],
            )  # fmt: skip
        else:
            span = _span(n, "other", step["name"], attributes=step.get("attributes", {}))
        spans.append(span)
    return Target(spans, span=root, trajectory=build_trajectory(spans), reference=reference or {})


# --- the captures: one get_weather(location=Paris) call that succeeded ---------------------------------------------


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_capture_has_one_successful_tool_call(folder: str) -> None:
    target = _fixture(folder)
    tool_spans = [s for s in target.spans if s.step_type == "tool"]
    assert [s.tool_name for s in tool_spans] == ["get_weather"] and all(s.status_code != "ERROR" for s in tool_spans)
    score = _score("tool-call-error-rate", target)
    assert score.outcome == "scored"
    assert (score.value, score.passed, score.label) == (0.0, True, "0/1 failed")


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_capture_tool_selection(folder: str) -> None:
    target = _fixture(folder)
    score = _score("tool-selection", target, expected_tools=["get_weather"])
    assert (score.value, score.passed) == (1.0, True)
    assert score.explanation == "called: get_weather"
    # a second expected tool the agent never called: recall 1/2, F1 2/3
    partial = _score("tool-selection", target, expected_tools=["get_weather", "get_forecast"])
    assert partial.value == pytest.approx(2 / 3) and partial.passed is False
    assert partial.metadata["recall"] == 0.5 and partial.metadata["precision"] == 1.0
    assert "missing: get_forecast" in (partial.explanation or "")
    assert _score("tool-selection", target, expected_tools=["get_weather", "get_forecast"], mode="any").passed
    assert not _score("tool-selection", target, expected_tools=[], mode="exact").passed
    # the dataset's reference is used when the policy gives no list
    from_reference = _score("tool-selection", _fixture(folder, reference={"expected_tools": ["get_weather"]}))
    assert from_reference.value == 1.0


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_capture_trajectory_match(folder: str) -> None:
    target = _fixture(folder)
    match = _score("trajectory-match", target, reference=["get_weather"])
    assert (match.value, match.passed) == (1.0, True)
    other = _score("trajectory-match", target, reference=["lookup"])
    assert (other.value, other.passed) == (0.0, False)
    assert other.explanation == "tool call 1: expected lookup, got get_weather"
    # arguments as the capture recorded them: location=Paris
    assert any("Paris" in m for m in _markers(folder)["tool_args"])
    paris = [{"name": "get_weather", "arguments": {"location": "Paris"}}]
    assert _score("trajectory-match", target, reference=paris, match_arguments="superset").value == 1.0
    lyon = [{"name": "get_weather", "arguments": {"location": "Lyon"}}]
    wrong = _score("trajectory-match", target, reference=lyon, match_arguments="exact")
    assert wrong.value == 0.0 and "do not match" in (wrong.explanation or "") and "Lyon" in (wrong.explanation or "")
    # without argument matching, the arguments of the reference are not compared
    assert _score("trajectory-match", target, reference=lyon).value == 1.0


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_capture_has_no_loop(folder: str) -> None:
    score = _score("loop-detection", _fixture(folder))
    assert (score.passed, score.value, score.label) == (True, 1.0, "no loop")


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_capture_tool_arguments(folder: str) -> None:
    target = _fixture(folder)
    score = _score("tool-arguments", target)
    if folder in WITH_SCHEMAS:
        assert (score.outcome, score.value, score.passed) == ("scored", 1.0, True)
    else:
        assert (score.outcome, score.reason) == ("skipped", "no tool schemas")
    # a schema given in the policy applies to every capture, and wins over the recorded one
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    strict = _score("tool-arguments", target, schemas={"get_weather": {**city, "additionalProperties": False}})
    assert (strict.value, strict.passed, strict.label) == (0.0, False, "1/1 invalid")
    assert "city: required but missing" in (strict.explanation or "")
    assert "location: not an allowed property" in (strict.explanation or "")


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_capture_step_budgets(folder: str) -> None:
    target = _fixture(folder)
    llm_spans = [s for s in target.spans if s.step_type == "llm"]
    tokens = sum((s.input_tokens or 0) + (s.output_tokens or 0) for s in llm_spans)
    assert len(llm_spans) == 2 and tokens > 0
    within = _score("step-efficiency", target, max_llm_calls=2, max_tool_calls=1, max_tokens=tokens, max_steps=3)
    assert (within.value, within.passed, within.label) == (1.0, True, "within budget")
    over = _score("step-efficiency", target, max_llm_calls=1, max_tokens=tokens - 1, max_tool_calls=5)
    assert over.value == pytest.approx(1 / 3) and over.passed is False
    assert over.label == "exceeded: llm_calls, tokens"
    assert f"tokens {tokens} > {tokens - 1}" in (over.explanation or "")


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_capture_task_success_by_checker(folder: str) -> None:
    target = _fixture(folder)
    completion = _markers(folder)["completion"]
    assert _score("task-success", target, contains=completion).value == 1.0
    failed = _score("task-success", target, contains="raining")
    assert (failed.value, failed.passed, failed.label) == (0.0, False, "failure")
    no_signal = _score("task-success", target)
    assert (no_signal.outcome, no_signal.reason) == ("skipped", "no success signal")


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_capture_without_tools(folder: str) -> None:
    target = _fixture(folder, "chat_simple")
    for ref in ("tool-call-error-rate", "loop-detection", "tool-arguments"):
        score = _score(ref, target)
        assert (score.outcome, score.reason) == ("skipped", "no tool calls")
    # an empty reference means "no tool call expected": the simple chat meets it
    assert _score("trajectory-match", target, reference=[]).value == 1.0
    assert _score("tool-selection", target, expected_tools=[], mode="exact").passed
    assert _score("trajectory-match", target).reason == "no reference"
    assert _score("tool-selection", target).reason == "no reference"


def test_empty_trace_is_skipped_not_scored() -> None:
    target = Target([], trajectory=build_trajectory([]))
    for ref in ("tool-call-error-rate", "tool-selection", "loop-detection", "trajectory-match"):
        score = _score(ref, target)
        assert (score.outcome, score.reason) == ("skipped", "no trajectory")


# --- errors -----------------------------------------------------------------------------------------------------


def test_tool_errors_rate_and_kinds() -> None:
    target = _trace(
        llm(), tool("search", {"q": "a"}), tool("search", {"q": "b"}, error="timeout"), tool("fetch", {"url": "x"}),
        tool("fetch", {"url": "y"}), llm(),
    )  # fmt: skip
    score = _score("tool-call-error-rate", target)
    assert (score.value, score.passed, score.label) == (0.25, False, "1/4 failed")
    assert score.explanation == "1 of 4 tool calls failed: search (timeout)"
    assert _score("tool-call-error-rate", target, max_rate=0.25).passed is True


def test_tool_calls_without_outcome_are_not_counted() -> None:
    # the LLM asked for a tool, but nothing records the execution
    asked = [{"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "search", "arguments": {}}]}]
    root = _span(1, "agent", "invoke_agent planner")
    chat = _span(2, "llm", "chat", output=asked, input_tokens=10, output_tokens=2)
    target = Target([root, chat], span=root, trajectory=build_trajectory([root, chat]))
    score = _score("tool-call-error-rate", target)
    assert (score.outcome, score.reason) == ("skipped", "no tool outcomes")
    assert _score("tool-selection", target, expected_tools=["search"]).value == 1.0


# --- loops and cycles -------------------------------------------------------------------------------------------


def test_same_call_repeated_is_a_loop() -> None:
    paris = {"location": "Paris"}
    looping = _trace(*(s for _ in range(3) for s in (llm(), tool("get_weather", paris))), llm())
    score = _score("loop-detection", looping)
    assert (score.passed, score.value, score.label) == (False, 3.0, "repeated call")
    assert score.explanation == 'get_weather called 3 times with arguments {"location":"Paris"}'
    # twice is not yet a loop; a higher threshold lets three pass
    assert _score("loop-detection", _trace(tool("get_weather", paris), tool("get_weather", paris))).passed
    assert _score("loop-detection", looping, max_repeats=4).passed


def test_different_arguments_are_not_a_loop_unless_ignored() -> None:
    cities = _trace(*(tool("get_weather", {"location": c}) for c in ("Paris", "Lyon", "Nice")))
    assert _score("loop-detection", cities).passed
    by_name = _score("loop-detection", cities, ignore_arguments=True)
    assert by_name.passed is False and "get_weather called 3 times" in (by_name.explanation or "")


def test_key_order_does_not_hide_a_loop() -> None:
    calls = [tool("search", {"q": "x", "k": 5}), tool("search", {"k": 5, "q": "x"}), tool("search", {"q": "x", "k": 5})]
    assert _score("loop-detection", _trace(*calls)).passed is False


def test_unrecorded_arguments_are_not_compared() -> None:
    score = _score("loop-detection", _trace(*(tool("get_weather") for _ in range(3))))
    assert score.passed is True
    assert "3 call(s) without recorded arguments not compared" in (score.explanation or "")


def test_a_b_a_b_cycle() -> None:
    search, read = tool("search", {"q": "refund policy"}), tool("read_page", {"url": "/refunds"})
    target = _trace(llm(), search, read, search, read, llm())
    score = _score("loop-detection", target)
    assert (score.passed, score.label, score.value) == (False, "cycle", 2.0)
    assert score.explanation == "cycle search → read_page repeated 2 times from tool call 1"
    assert _score("loop-detection", target, detect_cycles=False).passed
    assert _score("loop-detection", target, cycle_repeats=3).passed


def test_a_b_c_cycle_found_after_other_calls() -> None:
    a, b, c = tool("plan", {"step": 1}), tool("search", {"q": "x"}), tool("summarize", {"n": 3})
    target = _trace(tool("login", {}), a, b, c, a, b, c, a, b, c)
    score = _score("loop-detection", target, max_repeats=4)
    assert score.passed is False
    assert score.explanation == "cycle plan → search → summarize repeated 3 times from tool call 2"


def test_alternating_calls_with_new_arguments_are_not_a_cycle() -> None:
    steps = [tool(n, {"i": i}) for i in range(3) for n in ("search", "read_page")]
    assert _score("loop-detection", _trace(*steps)).passed


# --- argument schemas -------------------------------------------------------------------------------------------

WEATHER = {
    "type": "object",
    "properties": {
        "location": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["location"],
    "additionalProperties": False,
}
DECLARED = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


def test_schema_violations_from_declared_tools() -> None:
    target = _trace(
        llm(tools_declared=DECLARED),
        tool("get_weather", {"location": "Paris", "unit": "celsius", "days": 2.0}),  # 2.0 is an integer in JSON
        tool("get_weather", {"unit": "celsius"}),
        tool("get_weather", {"location": 75001}),
        tool("get_weather", {"location": "Paris", "unit": "kelvin"}),
        tool("get_weather", {"location": "Paris", "country": "FR"}),
        tool("get_weather", '{"location": "Paris"'),
        tool("get_weather", ["Paris"]),
        tool("get_weather", {"location": "Paris", "days": True}),
    )
    score = _score("tool-arguments", target)
    assert score.value == pytest.approx(1 / 8) and score.passed is False and score.label == "7/8 invalid"
    explanation = score.explanation or ""
    assert "call 2 get_weather: location: required but missing" in explanation
    assert "call 3 get_weather: location: expected string, got integer" in explanation
    assert "; and 4 more" in explanation  # the rest are counted, not listed


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"location": "Paris", "unit": "kelvin"}, 'unit: "kelvin" is not one of ["celsius","fahrenheit"]'),
        ({"location": "Paris", "country": "FR"}, "country: not an allowed property"),
        ('{"location": "Paris"', "arguments are not valid JSON"),
        (["Paris"], "arguments are a JSON array, not an object"),
        ({"location": "Paris", "days": True}, "days: expected integer, got boolean"),
    ],
)
def test_each_schema_violation_is_named(arguments: Any, problem: str) -> None:
    score = _score("tool-arguments", _trace(llm(tools_declared=DECLARED), tool("get_weather", arguments)))
    assert score.passed is False and problem in (score.explanation or "")


def test_nested_and_combined_schemas() -> None:
    schema = {
        "type": "object",
        "properties": {
            "filters": {"type": "array", "items": {"type": "object", "required": ["field"]}},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "mode": {"oneOf": [{"const": "fast"}, {"const": "full"}]},
        },
    }
    good = tool("query", {"filters": [{"field": "a"}], "limit": None, "mode": "fast"})
    bad = tool("query", {"filters": [{"field": "a"}, {"op": "="}], "limit": "ten", "mode": "slow"})
    score = _score("tool-arguments", _trace(good, bad), schemas={"query": schema})
    assert score.label == "1/2 invalid"
    explanation = score.explanation or ""
    assert "filters[1].field: required but missing" in explanation
    assert "limit: matches none of anyOf" in explanation
    assert "mode: matches none of oneOf" in explanation


def test_draft_2020_12_keywords_in_argument_schemas() -> None:
    schema = {
        "type": "object",
        "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}},
        "properties": {
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"$ref": "#/$defs/unit"},
            "query": {"type": "string", "minLength": 1},
            "notify": {"type": "string", "format": "email"},
            "mode": {"oneOf": [{"const": "fast"}, {"type": "string", "maxLength": 4}]},
        },
        "required": ["days"],
    }
    target = _trace(
        tool("forecast", {"days": 3, "unit": "celsius", "notify": "me@example.com"}),
        tool("forecast", {"days": 0}),
        tool("forecast", {"days": 3, "unit": "kelvin"}),
        tool("forecast", {"days": 3, "query": ""}),
        tool("forecast", {"days": 3, "notify": "nobody"}),
        tool("forecast", {"days": 30, "mode": "fast", "query": ""}),
    )
    score = _score("tool-arguments", target, schemas={"forecast": schema})
    assert score.label == "5/6 invalid"
    explanation = score.explanation or ""
    assert "call 2 forecast: days: less than the minimum 1" in explanation
    assert 'call 3 forecast: unit: "kelvin" is not one of ["celsius","fahrenheit"]' in explanation  # through $ref
    assert "call 4 forecast: query: shorter than 1 characters" in explanation
    # the rest are counted, not listed: alone, they show that a call's problems are listed by path
    last = _trace(
        tool("forecast", {"days": 3, "notify": "nobody"}), tool("forecast", {"days": 30, "mode": "fast", "query": ""})
    )
    assert _score("tool-arguments", last, schemas={"forecast": schema}).explanation == (
        "call 1 forecast: notify: not a valid email; call 2 forecast: days: greater than the maximum 14, "
        "mode: matches 2 of oneOf, exactly 1 allowed, query: shorter than 1 characters"
    )


def test_invalid_schemas_are_refused_or_reported() -> None:
    ev = REGISTRY["builtin/tool-arguments"]
    bad = {"type": "object", "properties": {"days": {"type": "int"}}}
    with pytest.raises(ValueError) as e:
        parse_params(ev, {"schemas": {"forecast": bad}})
    assert str(e.value).startswith(
        "schemas: forecast: not a valid JSON Schema (draft 2020-12): $.properties.days.type: matches none of anyOf "
        '(closest: "int" is not one of ["array",'
    )
    # a schema recorded in the trace is not the policy's to fix: its calls are not checked, and the note says why
    declared = [{"type": "function", "function": {"name": "get_weather", "parameters": {"required": "location"}}}]
    score = _score("tool-arguments", _trace(llm(tools_declared=declared), tool("get_weather", {"location": "Paris"})))
    assert (score.outcome, score.reason) == ("skipped", "no tool schemas")
    assert score.explanation == (
        "not checked, get_weather's schema: not a valid JSON Schema (draft 2020-12): $.required: expected array, "
        "got string"
    )
    dangling = [{"name": "get_weather", "parameters": {"properties": {"location": {"$ref": "#/$defs/city"}}}}]
    score = _score("tool-arguments", _trace(llm(tools_declared=dangling), tool("get_weather", {"location": "Paris"})))
    assert score.explanation == "not checked, get_weather's schema: cannot resolve $ref '/$defs/city'"


def test_schema_sources_and_what_is_not_checked() -> None:
    # a tool span's own schema (OpenInference's tool.parameters); a tool without one is not checked
    root = _span(1, "agent", "invoke_agent planner")
    parts = [{"type": "tool_call", "id": "c2", "name": "get_weather", "arguments": {"city": "Paris"}}]
    weather = _span(
        2, "tool", "get_weather", tool_name="get_weather", input=[{"role": "assistant", "parts": parts}],
        details={"tool_parameters": WEATHER},
    )  # fmt: skip
    lookup_parts = [{"type": "tool_call", "id": "c3", "name": "lookup", "arguments": {"q": 1}}]
    lookup = _span(3, "tool", "lookup", tool_name="lookup", input=[{"role": "assistant", "parts": lookup_parts}])
    spans = [root, weather, lookup]
    target = Target(spans, span=root, trajectory=build_trajectory(spans))
    score = _score("tool-arguments", target)
    assert score.label == "1/1 invalid"
    assert "not checked, no schema: lookup" in (score.explanation or "")
    # arguments not recorded (content capture off): nothing to judge
    unrecorded = _score("tool-arguments", _trace(llm(tools_declared=DECLARED), tool("get_weather")))
    assert (unrecorded.outcome, unrecorded.reason) == ("skipped", "no tool arguments")
    # schemas exist, but not for the tools called
    other = _score("tool-arguments", _trace(llm(tools_declared=DECLARED), tool("lookup", {"q": "x"})))
    assert (other.outcome, other.reason) == ("skipped", "no tool schemas")


# --- budgets ----------------------------------------------------------------------------------------------------


def test_budgets_met_and_exceeded() -> None:
    target = _trace(
        llm((1000, 200), cost=0.002), tool("search", {"q": "x"}), llm((1500, 300), cost=0.003),
        tool("search", {"q": "y"}), llm((2000, 100), cost=0.004),
    )  # fmt: skip
    within = _score("step-efficiency", target, max_steps=5, max_llm_calls=3, max_tokens=5100, max_cost_usd=0.01)
    assert (within.value, within.passed) == (1.0, True)
    measured = {"steps": 5, "llm_calls": 3, "tool_calls": 2, "tokens": 5100, "cost_usd": 0.009}
    assert within.metadata == pytest.approx(measured)
    over = _score("step-efficiency", target, max_steps=4, max_tokens=5000, max_cost_usd=0.01, max_tool_calls=2)
    assert over.value == 0.5 and over.passed is False
    assert over.label == "exceeded: steps, tokens"
    assert "steps 5 > 4" in (over.explanation or "") and "tokens 5100 > 5000" in (over.explanation or "")


def test_unknown_cost_is_not_judged_unless_already_over() -> None:
    partly_priced = _trace(llm(cost=0.004), llm(cost=None))
    score = _score("step-efficiency", partly_priced, max_cost_usd=0.01, max_llm_calls=5)
    assert (score.value, score.passed) == (1.0, True)  # only llm_calls judged
    assert "cost_usd not judged: 1 of 2 LLM calls report none" in (score.explanation or "")
    over = _score("step-efficiency", partly_priced, max_cost_usd=0.001)
    assert over.passed is False and "cost_usd at least 0.004 > 0.001" in (over.explanation or "")
    unpriced = _score("step-efficiency", _trace(llm(cost=None)), max_cost_usd=0.01)
    assert (unpriced.outcome, unpriced.reason) == ("skipped", "no cost data")


def test_budget_params_are_validated() -> None:
    ev = REGISTRY["builtin/step-efficiency"]
    with pytest.raises(ValueError, match="set at least one budget"):
        parse_params(ev, {})
    with pytest.raises(ValueError, match="max_tokens"):
        parse_params(ev, {"max_tokens": -1})
    with pytest.raises(ValueError, match="max_token"):
        parse_params(ev, {"max_token": 100})  # a typo is an error, not an ignored key


# --- reference trajectories -------------------------------------------------------------------------------------


def _calls(*names: str) -> Target:
    return _trace(*(tool(n, {"q": n}) for n in names))


@pytest.mark.parametrize(
    ("actual", "reference", "mode", "value", "explanation"),
    [
        (["search", "read"], ["search", "read"], "strict", 1.0, None),
        (["read", "search"], ["search", "read"], "strict", 0.0, "tool call 1: expected search, got read"),
        (["read", "search"], ["search", "read"], "unordered", 1.0, None),
        (["search"], ["search", "read"], "strict", 0.0, "tool call 2: expected read, but the trace made only 1"),
        (["search", "read", "search"], ["search", "read"], "strict", 0.0,
         "tool call 3: search is beyond the reference's 2 call(s)"),
        (["search", "read", "search"], ["search", "read"], "unordered", 0.0, "not in reference: search"),
        # superset: the trace made every reference call, extras allowed
        (["search", "read", "search"], ["read", "search"], "superset", 1.0, None),
        (["search"], ["search", "read"], "superset", 0.0, "missing: read"),
        # subset: the trace made only calls from the reference
        (["search"], ["search", "read", "write"], "subset", 1.0, None),
        (["search", "delete"], ["search", "read"], "subset", 0.0, "not in reference: delete"),
        ([], ["search"], "strict", 0.0, "tool call 1: expected search, but the trace made none"),
    ],
)  # fmt: skip
def test_trajectory_modes(
    actual: list[str], reference: list[str], mode: str, value: float, explanation: str | None
) -> None:
    target = _calls(*actual) if actual else _trace(llm())
    score = _score("trajectory-match", target, reference=reference, mode=mode)
    assert (score.value, score.passed, score.label) == (value, value == 1.0, mode)
    if explanation is not None:
        assert score.explanation == explanation
    else:
        assert (score.explanation or "").startswith(f"matches the reference ({mode})")


def test_trajectory_argument_matching() -> None:
    target = _trace(tool("search", {"q": "refunds", "k": 5}), tool("read", {"url": "/refunds"}))
    exact = [{"name": "search", "arguments": {"q": "refunds", "k": 5}}, "read"]
    partial = [{"name": "search", "arguments": {"q": "refunds"}}, {"name": "read"}]
    wider = [{"name": "search", "arguments": {"q": "refunds", "k": 5, "lang": "en"}}, "read"]

    def value(reference: list[Any], match_arguments: str, mode: str = "strict") -> float | None:
        return _score("trajectory-match", target, reference=reference, match_arguments=match_arguments, mode=mode).value

    assert value(exact, "exact") == 1.0 and value(partial, "exact") == 0.0
    assert value(partial, "superset") == 1.0 and value(wider, "superset") == 0.0
    assert value(wider, "subset") == 1.0 and value(partial, "subset") == 0.0
    assert value(partial[::-1], "superset", mode="unordered") == 1.0
    missing = _score("trajectory-match", target, reference=partial[::-1], match_arguments="exact", mode="unordered")
    assert missing.explanation == 'missing: search({"q":"refunds"}); not in reference: search({"k":5,"q":"refunds"})'


def test_unordered_matching_finds_the_pairing_a_greedy_one_misses() -> None:
    # the first reference call fits both actual calls; pairing it with the first would strand the second
    target = _trace(tool("search", {"q": "x", "k": 5}), tool("search", {"q": "x"}))
    reference = [{"name": "search", "arguments": {"q": "x"}}, {"name": "search", "arguments": {"q": "x", "k": 5}}]
    score = _score("trajectory-match", target, reference=reference, mode="unordered", match_arguments="superset")
    assert score.value == 1.0


def test_trajectory_from_the_reference_and_unrecorded_arguments() -> None:
    reference = {"expected_trajectory": [{"name": "search", "arguments": {"q": "x"}}, "read"]}
    target = _trace(tool("search", {"q": "x"}), tool("read", {"u": 1}), reference=reference)
    assert _score("trajectory-match", target, match_arguments="exact").value == 1.0
    no_args = _trace(tool("search"), tool("read"), reference=reference)
    assert _score("trajectory-match", no_args).value == 1.0  # names only: still judged
    skipped = _score("trajectory-match", no_args, match_arguments="exact")
    assert (skipped.outcome, skipped.reason) == ("skipped", "no tool arguments")
    broken = _score("trajectory-match", _trace(tool("search"), reference={"expected_trajectory": "search"}))
    assert broken.outcome == "error" and "expected_trajectory must be a list" in (broken.explanation or "")


# --- task success -----------------------------------------------------------------------------------------------


def test_task_success_from_the_root_attribute() -> None:
    score = _score("task-success", _trace(llm(), root_attributes={"task.success": True}))
    assert (score.value, score.passed, score.label) == (1.0, True, "success")
    assert score.explanation == "task.success=true on span 'invoke_agent planner'"


@pytest.mark.parametrize(
    ("raw", "verdict"), [("true", True), ("Yes", True), ("passed", True), (1, True), ("false", False), (0, False)]
)
def test_task_success_accepts_words_and_numbers(raw: Any, verdict: bool) -> None:
    score = _score("task-success", _trace(llm(), root_attributes={"evalsi.task.success": raw}))
    assert score.passed is verdict and score.value == float(verdict)


def test_task_success_root_first_then_any_span() -> None:
    grader = {"type": "other", "name": "grade", "attributes": {"task.success": "failed"}}
    child_only = _score("task-success", _trace(llm(), grader))
    assert child_only.passed is False and "on span 'grade'" in (child_only.explanation or "")
    root_wins = _score("task-success", _trace(llm(), grader, root_attributes={"task.success": "ok"}))
    assert root_wins.passed is True
    custom = _score("task-success", _trace(llm(), root_attributes={"app.resolved": True}), attribute="app.resolved")
    assert custom.passed is True


def test_task_success_unreadable_attribute_is_not_a_verdict() -> None:
    target = _trace(llm(), root_attributes={"task.success": "maybe"})
    score = _score("task-success", target)
    assert (score.outcome, score.reason) == ("skipped", "no success signal")
    assert "task.success=\"maybe\" on span 'invoke_agent planner' is not a verdict" in (score.explanation or "")


def test_task_success_by_regex_checker() -> None:
    folder = "otel-openai-v2-latest"
    target = _fixture(folder)
    assert _score("task-success", target, regex=r"\d+ degrees Celsius").passed is True
    assert _score("task-success", target, regex=r"DEGREES celsius", ignore_case=True).passed is True
    both = _score("task-success", target, contains="Paris", regex=r"\bsnow\b")
    assert both.passed is False and both.explanation == r"final output does not match /\bsnow\b/"
    with pytest.raises(ValueError, match="regex: invalid regular expression '\\(': missing \\)"):
        parse_params(REGISTRY["builtin/task-success"], {"regex": "("})


def test_task_success_checker_without_output_is_skipped() -> None:
    score = _score("task-success", _trace(llm()), contains="done")
    assert (score.outcome, score.reason) == ("skipped", "no success signal")
    assert "no final output to check" in (score.explanation or "")


def test_params_name_the_bad_key() -> None:
    with pytest.raises(ValueError, match="max_rate"):
        parse_params(REGISTRY["builtin/tool-call-error-rate"], {"max_rate": 2})
    with pytest.raises(ValueError, match="mode"):
        parse_params(REGISTRY["builtin/trajectory-match"], {"mode": "fuzzy"})
    with pytest.raises(ValueError, match="max_repeats"):
        parse_params(REGISTRY["builtin/loop-detection"], {"max_repeats": 1})


def test_pack_is_registered_with_honest_declarations() -> None:
    refs = {
        "tool-call-error-rate", "tool-selection", "tool-arguments", "loop-detection", "step-efficiency",
        "trajectory-match", "task-success",
    }  # fmt: skip
    for ref in refs:
        ev = REGISTRY[f"builtin/{ref}"]
        assert ev.scope == "trace" and ev.description and ev.version
        assert ev.requires == (() if ref == "task-success" else ("trajectory",))
