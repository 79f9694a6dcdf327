"""Agent frameworks and vendor SDKs (tests/fixtures/README.md): every captured run, normalized and built into
trajectories, against what the fake model server answered (`expected` in each folder's meta.json)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from running_collector import FIXTURES

from evalsi import cel
from evalsi.model.span import PLUMBING, VENDOR_SDK, Span
from evalsi.model.trajectory import build_trajectories, join_twins
from evalsi.policies.trace_view import TraceView
from evalsi.processors.normalize.files import normalize_files

STACKS = [
    "langgraph-openinference",
    "langgraph-openllmetry",
    "anthropic-sdk/sdk",
    "anthropic-sdk/openllmetry",
    "anthropic-sdk/openinference",
    "google-genai",
    "crewai",
    "pydantic-ai",
    "vercel-ai-sdk/legacy",
    "vercel-ai-sdk/otel",
    "vercel-ai-sdk/v6",
    "strands/default",
    "strands/latest",
    "llamaindex",
]

AUTOMATIC_FUNCTION_CALLING = (
    "google-genai's automatic function calling records the SDK's two model calls as one span with the last call's "
    "usage only (45/9 of 76/18): the first call's tokens are not in the capture (docs/conventions.md, Google GenAI)"
)


def _scenarios() -> Iterator[tuple[str, str]]:
    for stack in STACKS:
        meta = json.loads((FIXTURES / stack / "meta.json").read_text())
        for scenario in meta["scenarios"]:
            yield stack, scenario


SCENARIOS = list(_scenarios())


def _expected(stack: str, scenario: str) -> dict[str, Any]:
    meta = json.loads((FIXTURES / stack / "meta.json").read_text())
    expected: dict[str, Any] = meta["scenarios"][scenario]["expected"]
    return expected


def _spans(stack: str, scenario: str) -> list[Span]:
    files = [FIXTURES / stack / f"{scenario}.pb"]
    logs: Path = FIXTURES / stack / f"{scenario}.logs.pb"
    result = normalize_files(files + ([logs] if logs.exists() else []))
    assert not result.problems
    return result.spans


def _params(*gaps: dict[tuple[str, str], str]) -> list[Any]:
    """The scenarios, those with a documented gap in `gaps` marked xfail(strict) with its reason."""
    params = []
    for key in SCENARIOS:
        reason = next((g[key] for g in gaps if key in g), None)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(*key, id="/".join(key), marks=marks))
    return params


def _same_result(got: Any, expected: Any) -> bool:
    """A tool result as text: JSON texts compare by value (an SDK may re-serialize the tool's JSON compactly)."""
    if got == expected:
        return True
    try:
        return bool(json.loads(got) == json.loads(expected))
    except (TypeError, ValueError):
        return False


@pytest.mark.parametrize(("stack", "scenario"), _params())
def test_one_trajectory_per_run(stack: str, scenario: str) -> None:
    assert len(build_trajectories(_spans(stack, scenario))) == 1


@pytest.mark.parametrize(
    ("stack", "scenario"),
    _params({("google-genai", "chat_tools_afc"): AUTOMATIC_FUNCTION_CALLING}),
)
def test_each_model_call_is_one_llm_step_with_its_tokens(stack: str, scenario: str) -> None:
    expected = _expected(stack, scenario)
    trajectories = build_trajectories(_spans(stack, scenario))
    llm_steps = [s for t in trajectories for s in t["steps"] if s["type"] == "llm"]
    assert sum(t["llm_calls"] for t in trajectories) == len(llm_steps) == expected["llm_calls"]
    assert sum(1 for s in llm_steps if s["error"]) == expected["failed_llm_calls"]
    # OTel's gen_ai.usage.input_tokens (the canonical input_tokens) include cached tokens; the Anthropic API's
    # input_tokens do not: the fixture gives both
    input_tokens = expected.get("input_tokens_including_cache", expected["input_tokens"])
    assert sum(t["input_tokens"] for t in trajectories) == input_tokens
    assert sum(t["output_tokens"] for t in trajectories) == expected["output_tokens"]


@pytest.mark.parametrize(
    ("stack", "scenario"),
    _params({("google-genai", "chat_tools_afc"): AUTOMATIC_FUNCTION_CALLING}),
)
def test_policy_selectors_and_span_evaluators_count_each_call_once(stack: str, scenario: str) -> None:
    """What a policy reads besides the trajectory: `trace.llm_calls` and the token sums of its CEL selectors, and the
    spans a span-scope evaluator scores, count a call an SDK and an instrumentation both record once."""
    expected = _expected(stack, scenario)
    spans = _spans(stack, scenario)
    by_trace: dict[str, list[Span]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    by_trace = join_twins(by_trace)  # as the evaluate processor does (a lone SDK call's trace waits for its twin)
    sums = [cel.trace_activation(t)["trace"] for t in by_trace.values()]
    assert sum(t["llm_calls"] for t in sums) == expected["llm_calls"]
    assert sum(t["input_tokens"] for t in sums) == expected.get(
        "input_tokens_including_cache", expected["input_tokens"]
    )
    assert sum(t["output_tokens"] for t in sums) == expected["output_tokens"]
    scored = [s for t in by_trace.values() for s in t if s.step_type == "llm" and s.span_id not in TraceView(t).folded]
    assert len(scored) == expected["llm_calls"]


@pytest.mark.parametrize(("stack", "scenario"), _params())
def test_tool_steps_carry_named_arguments_and_the_tools_result(stack: str, scenario: str) -> None:
    expected = _expected(stack, scenario)
    trajectories = build_trajectories(_spans(stack, scenario))
    tool_steps = [s for t in trajectories for s in t["steps"] if s["type"] == "tool"]
    assert [(s["tool_name"], s["arguments"]) for s in tool_steps] == [
        (e["name"], e["arguments"]) for e in expected["tool_executions"]
    ]
    for step, execution in zip(tool_steps, expected["tool_executions"], strict=True):
        assert _same_result(step["result"], execution["result"]), (step["result"], execution["result"])
    # each call the model asked for is one tool call of the trajectory, executed or not
    calls = [(c["name"], c["arguments"]) for t in trajectories for c in t["tool_calls"]]
    assert calls == [(r["name"], r["arguments"]) for r in expected["tool_calls_requested"]]


@pytest.mark.parametrize(("stack", "scenario"), _params())
def test_final_output_is_the_answer(stack: str, scenario: str) -> None:
    trajectories = build_trajectories(_spans(stack, scenario))
    # Strands records its agent's answer as str(AgentResult), which ends in a newline
    finals = [t["final_output"].strip() if t["final_output"] else t["final_output"] for t in trajectories]
    assert finals == [_expected(stack, scenario)["final_answer"]]


@pytest.mark.parametrize("stack", ["anthropic-sdk/openllmetry", "anthropic-sdk/openinference"])
def test_a_call_recorded_twice_is_one_step_and_both_spans_are_kept(stack: str) -> None:
    spans = _spans(stack, "chat_tool_runner")
    sdk_calls = [s for s in spans if s.step_type == "llm" and s.details.get(VENDOR_SDK) == "anthropic"]
    other_calls = [s for s in spans if s.step_type == "llm" and not s.details.get(VENDOR_SDK)]
    assert len(sdk_calls) == len(other_calls) == 2
    (trajectory,) = build_trajectories(spans)
    llm_steps = [s for s in trajectory["steps"] if s["type"] == "llm"]
    # the instrumentation's span is the step; the SDK's is named as its duplicate
    assert [s["span_id"] for s in llm_steps] == [s.span_id for s in other_calls]
    assert sorted(i for s in llm_steps for i in s["duplicate_span_ids"]) == sorted(s.span_id for s in sdk_calls)


def test_openllmetry_streaming_tokens_are_the_sdks() -> None:
    """OpenLLMetry's Anthropic streaming output count adds message_start's token (11 where the API said 10); the
    SDK's own span copies the API's usage. Both are kept on the spans; the trajectory of the call counts the SDK's."""
    spans = _spans("anthropic-sdk/openllmetry", "chat_stream")
    counts = sorted((s.output_tokens, bool(s.details.get(VENDOR_SDK))) for s in spans if s.step_type == "llm")
    assert counts == [(10, True), (11, False)]


def test_agent_construction_is_no_trajectory() -> None:
    spans = _spans("langgraph-openllmetry", "chat_tools")
    (create,) = [s for s in spans if s.details.get(PLUMBING) == "create_agent"]
    assert create.step_type == "agent"  # the operation's step type, kept; the trajectory skips it
    (trajectory,) = build_trajectories(spans)
    assert trajectory["trace_id"] != create.trace_id
    assert all(s["span_id"] != create.span_id for s in trajectory["steps"])


def test_graph_nodes_and_chains_are_no_agent_steps() -> None:
    (trajectory,) = build_trajectories(_spans("langgraph-openinference", "chat_tools"))
    assert [s["type"] for s in trajectory["steps"]] == ["chain", "chain", "llm", "chain", "tool", "chain", "llm"]
    (trajectory,) = build_trajectories(_spans("langgraph-openllmetry", "chat_tools"))
    # OpenLLMetry's root says invoke_agent (gen_ai.agent.name LangGraph): one agent step, its nodes chains
    assert [s["type"] for s in trajectory["steps"]].count("agent") == 1


def _llm(span_id: str, start: int, end: int, *, sdk: bool, error: bool = False) -> Span:
    return Span(
        trace_id="t" * 32,
        span_id=span_id,
        parent_span_id="app",
        name="call",
        kind="CLIENT",
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        status_code="ERROR" if error else "UNSET",
        step_type="llm",
        model="claude-sonnet-4-5",
        details={VENDOR_SDK: "anthropic"} if sdk else {},
    )


def test_failed_sibling_calls_without_response_ids_pair_by_time() -> None:
    """A failed call has no response id: the SDK span overlapping the instrumentation's is its duplicate, one each."""
    spans = [
        _llm("a1", 100, 200, sdk=False, error=True),
        _llm("s1", 110, 190, sdk=True, error=True),
        _llm("a2", 300, 400, sdk=False),
        _llm("s2", 310, 390, sdk=True),
        _llm("s3", 500, 600, sdk=True),  # the SDK alone: a call of its own
    ]
    (trajectory,) = build_trajectories(spans)
    assert [(s["span_id"], s.get("duplicate_span_ids")) for s in trajectory["steps"]] == [
        ("a1", ["s1"]),
        ("a2", ["s2"]),
        ("s3", None),
    ]
    assert trajectory["llm_calls"] == 3
    assert trajectory["errors"] == 1


def test_a_tool_spans_bare_input_gets_the_named_arguments_of_the_models_call() -> None:
    """LangGraph + OpenInference: the tool span's input is LangChain's bare value (`Paris`), the named arguments are on
    the parent model call's tool call. The tool step carries the named arguments (linked by the call id its
    serialized ToolMessage holds) and the tool's result."""
    spans = _spans("langgraph-openinference", "chat_tools")
    (tool_span,) = [s for s in spans if s.step_type == "tool"]
    assert tool_span.attributes["input.value"] == "Paris"
    (trajectory,) = build_trajectories(spans)
    (call,) = [c for s in trajectory["steps"] if s["type"] == "llm" for c in s["tool_calls"]]
    (step,) = [s for s in trajectory["steps"] if s["type"] == "tool"]
    assert call["arguments"] == {"location": "Paris"}
    assert (step["call_id"], step["arguments"]) == (call["id"], {"location": "Paris"})
    (execution,) = _expected("langgraph-openinference", "chat_tools")["tool_executions"]
    assert step["result"] == execution["result"]


def test_pydantic_ai_agents_are_a_hierarchy_of_steps_with_their_prompt_and_answer() -> None:
    """A coordinator agent whose tool runs a weather agent: each `invoke_agent` span is an agent step with the run's
    prompt and final result (`pydantic_ai.all_messages`, `final_result`), the sub-agent under the tool that ran it."""
    (trajectory,) = build_trajectories(_spans("pydantic-ai", "multi_agent"))
    steps = trajectory["steps"]
    assert [(s["type"], s["depth"]) for s in steps] == [
        ("agent", 0),
        ("llm", 1),
        ("tool", 1),
        ("agent", 2),
        ("llm", 3),
        ("tool", 3),
        ("llm", 3),
        ("llm", 1),
    ]
    coordinator, delegate = steps[0], steps[3]
    assert (coordinator["agent_name"], delegate["agent_name"]) == ("coordinator", "weather_agent")
    assert delegate["parent_span_id"] == steps[2]["span_id"] and steps[2]["tool_name"] == "ask_weather_agent"
    assert coordinator["input"][-1]["parts"][0]["content"] == "Plan my day in Paris: what is the weather like there?"
    assert delegate["input"][-1]["parts"][0]["content"] == "What is the weather like in Paris today?"
    assert delegate["output"][0]["parts"][0]["content"] == steps[2]["result"]
    assert trajectory["final_output"] == coordinator["output"][0]["parts"][0]["content"]


@pytest.mark.parametrize("scenario", ["chat_tools", "multi_agent"])
def test_pydantic_ai_cost_is_each_model_calls_once(scenario: str) -> None:
    """Pydantic AI prices each model call itself (`operation.cost`, genai-prices) and sums usage on the agent span
    (`gen_ai.aggregated_usage.*`): the calls carry the cost, the agent spans none, so a trace counts it once; and it
    is what evalsi's own table gives for the same tokens."""
    from evalsi.processors.normalize.cost import CostConfig, Pricer

    spans = _spans("pydantic-ai", scenario)
    (trajectory,) = build_trajectories(spans)
    llm_steps = [s for s in trajectory["steps"] if s["type"] == "llm"]
    assert all(s["cost_usd"] for s in llm_steps)
    assert [s.cost_usd for s in spans if s.step_type != "llm"] == [None] * sum(1 for s in spans if s.step_type != "llm")
    assert sum(1 for s in spans if s.step_type == "agent" and "gen_ai.aggregated_usage.input_tokens" in s.attributes)
    pricer = Pricer(CostConfig())
    for step in llm_steps:
        tokens = {"input_tokens": step["input_tokens"], "output_tokens": step["output_tokens"]}
        fresh = Span("t" * 32, "s" * 16, None, "chat", "CLIENT", 0, 1, step_type="llm", model=step["model"], **tokens)
        fresh.provider = "openai"
        pricer.price(fresh)
        assert fresh.cost_usd == pytest.approx(step["cost_usd"])


def test_vercel_ai_sdk_ai_spans_count_each_call_once_and_nest_its_agents() -> None:
    """The `ai.*` spans: the model-call spans (`ai.generateText.doGenerate`) also carry `gen_ai.*` and are read once by
    the `vercel_ai` mapper; the top-level `ai.generateText` span's `ai.usage.*` (the sum of its calls) is not read; a
    tool runs under the model call that asked for it, and an agent the tool runs under the tool."""
    spans = _spans("vercel-ai-sdk/legacy", "multi_agent")
    assert {s.convention for s in spans} == {"vercel_ai"}
    roots = [s for s in spans if s.attributes.get("ai.operationId") == "ai.generateText"]
    assert len(roots) == 2 and all(s.attributes.get("ai.usage.inputTokens") for s in roots)
    assert all(s.input_tokens is None and s.step_type == "agent" for s in roots)
    (trajectory,) = build_trajectories(spans)
    assert [(s["type"], s["depth"]) for s in trajectory["steps"]] == [
        ("agent", 0),
        ("llm", 1),
        ("tool", 2),
        ("agent", 3),
        ("llm", 4),
        ("tool", 5),
        ("llm", 4),
        ("llm", 1),
    ]
    assert [s["agent_name"] for s in trajectory["steps"] if s["type"] == "agent"] == ["coordinator", "weather-agent"]
    expected = _expected("vercel-ai-sdk/legacy", "multi_agent")
    assert (
        trajectory["final_output"]
        == expected["final_answer"]
        == trajectory["steps"][0]["output"][0]["parts"][0]["content"]
    )


def test_vercel_ai_sdk_genai_agent_spans_usage_is_not_counted_or_priced_again() -> None:
    """@ai-sdk/otel's GenAI spans: each `invoke_agent` span carries the run's summed `gen_ai.usage.*` and a model; the
    trace counts every call once and the pricer prices the calls, not the agents."""
    from evalsi.processors.normalize.cost import CostConfig, Pricer

    spans = _spans("vercel-ai-sdk/otel", "multi_agent")
    agents = [s for s in spans if s.step_type == "agent"]
    assert len(agents) == 2 and all(s.input_tokens and s.model for s in agents)
    pricer = Pricer(CostConfig())
    for span in spans:
        pricer.price(span)
    assert [s.cost_usd for s in agents] == [None, None]
    calls = [s for s in spans if s.step_type == "llm"]
    (trace,) = [cel.trace_activation(spans)["trace"]]
    assert (
        trace["input_tokens"]
        == sum(s.input_tokens or 0 for s in calls)
        == _expected("vercel-ai-sdk/otel", "multi_agent")["input_tokens"]
    )
    assert trace["cost_usd"] == pytest.approx(sum(s.cost_usd or 0 for s in calls)) and trace["cost_usd"] > 0


MULTI_AGENT = [key for key in SCENARIOS if key[1] == "multi_agent"]


@pytest.mark.parametrize(("stack", "scenario"), MULTI_AGENT, ids=["/".join(k) for k in MULTI_AGENT])
def test_a_sub_agent_is_a_step_under_the_tool_that_ran_it(stack: str, scenario: str) -> None:
    """Agent delegation (a coordinator whose tool runs a weather agent): two agent steps, the weather agent's below
    the coordinator's `ask_weather_agent` tool step, and the coordinator's answer the final output."""
    (trajectory,) = build_trajectories(_spans(stack, scenario))
    steps = {s["span_id"]: s for s in trajectory["steps"]}
    agents = [s for s in trajectory["steps"] if s["type"] == "agent"]
    assert len(agents) == 2 and agents[0]["depth"] == 0
    above = steps[agents[1]["parent_span_id"]]
    while above["type"] != "tool":
        above = steps[above["parent_span_id"]]
    assert above["tool_name"] == "ask_weather_agent"
    while above["type"] != "agent":  # the tool is the coordinator's (via its model call or a graph node)
        above = steps[above["parent_span_id"]]
    assert above is agents[0]
    assert (trajectory["final_output"] or "").strip() == _expected(stack, scenario)["final_answer"]


def test_llamaindex_rag_query_retrieves_documents_and_answers_once() -> None:
    """A LlamaIndex query engine (OpenInference): one retriever step with the documents it found, one model call
    (the dispatcher's outer LLM spans wrap the inner one: one step), and the model's answer."""
    spans = _spans("llamaindex", "rag")
    (trajectory,) = build_trajectories(spans)
    retrievals = [s for s in trajectory["steps"] if s["type"] == "retriever" and s["documents"]]
    (retrieval,) = retrievals
    assert len(retrieval["documents"]) == 2
    assert {d["content"] for d in retrieval["documents"]} <= {
        "Paris is the capital of France.",
        "Berlin is the capital of Germany.",
        "Madrid is the capital of Spain.",
    }
    assert sum(1 for s in spans if s.step_type == "llm") >= 2 and trajectory["llm_calls"] == 1
    assert trajectory["final_output"] == _expected("llamaindex", "rag")["final_answer"]


def test_llamaindex_request_preparation_is_no_model_call() -> None:
    spans = _spans("llamaindex", "chat_tools")
    prepared = [s for s in spans if s.name.endswith("._prepare_chat_with_tools")]
    assert prepared and all(s.step_type == "other" and s.details["span_type"] == "LLM" for s in prepared)


@pytest.mark.parametrize(("stack", "scenario"), _params())
def test_cost_counts_each_model_call_once(stack: str, scenario: str) -> None:
    """Priced as the normalize processor prices (the span's own cost, else the table), a trace's cost is each model
    call's once: the trajectory's `llm` steps and a policy's `trace.cost_usd` agree, and equal the table's price of the
    tokens the fake server answered with, call by call, for the OpenAI-compatible captures."""
    from evalsi.processors.normalize.cost import CostConfig, Pricer

    spans = _spans(stack, scenario)
    pricer = Pricer(CostConfig())
    for span in spans:
        pricer.price(span)
    trajectories = build_trajectories(spans)
    by_trace: dict[str, list[Span]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    steps_cost = sum(s["cost_usd"] or 0 for t in trajectories for s in t["steps"] if s["type"] == "llm")
    policy_cost = sum(cel.trace_activation(t)["trace"]["cost_usd"] for t in join_twins(by_trace).values())
    assert policy_cost == pytest.approx(steps_cost)
    calls = [c for c in _expected(stack, scenario)["calls"] if c["status"] == 200]
    if calls and all(c["api"] == "openai" for c in calls):
        expected = 0.0
        for call in calls:
            fresh = Span("t" * 32, "s" * 16, None, "chat", "CLIENT", 0, 1, step_type="llm", model="gpt-4o-mini")
            fresh.provider, fresh.input_tokens, fresh.output_tokens = (
                "openai",
                call["input_tokens"],
                call["output_tokens"],
            )
            pricer.price(fresh)
            expected += fresh.cost_usd or 0
        assert steps_cost == pytest.approx(expected, rel=1e-6)


def test_a_crew_of_two_agents_is_two_agent_steps_named_by_role() -> None:
    """CrewAI (OpenInference): each agent's `<role>._execute_core` span is an agent step named by its role, with its
    own model calls and tools under it; the last task's answer is the final output."""
    (trajectory,) = build_trajectories(_spans("crewai", "crew_two_agents"))
    steps = trajectory["steps"]
    agents = [s for s in steps if s["type"] == "agent"]
    assert [a["agent_name"] for a in agents] == ["Weather reporter", "Day planner"]
    under = {a["span_id"]: [s["type"] for s in steps if s["parent_span_id"] == a["span_id"]] for a in agents}
    assert under == {agents[0]["span_id"]: ["llm", "tool", "llm"], agents[1]["span_id"]: ["llm"]}
    assert trajectory["final_output"] == _expected("crewai", "crew_two_agents")["final_answer"]
