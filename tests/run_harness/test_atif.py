"""ATIF documents read into the run model: model turns, tool calls, subagents, times, and a loud error naming the place
for every document that cannot be read."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from evalsi.run_harness.atif import FAKE_STEP_NS, AtifError, convert, time_ns
from evalsi.run_harness.model import LlmCall, SubAgent, ToolCall

from .harness_server import at, atif_document

START = 1_700_000_000_000_000_000


def ns(seconds: float) -> int:
    return time_ns(at(seconds), "test")


def minimal(*steps: dict[str, Any], **root: Any) -> dict[str, Any]:
    return {"schema_version": "ATIF-v1.7", "agent": {"name": "a", "version": "1"}, "steps": list(steps), **root}


def user(step_id: int, text: Any = "hi", **more: Any) -> dict[str, Any]:
    return {"step_id": step_id, "source": "user", "message": text, **more}


def agent(step_id: int, text: str = "", **more: Any) -> dict[str, Any]:
    return {"step_id": step_id, "source": "agent", "message": text, **more}


def call(call_id: str, name: str = "calculator", **arguments: Any) -> dict[str, Any]:
    return {"tool_call_id": call_id, "function_name": name, "arguments": arguments}


def results(*items: dict[str, Any]) -> dict[str, Any]:
    return {"results": list(items)}


def refused(doc: Any) -> str:
    with pytest.raises(AtifError) as e:
        convert(doc, START)
    return str(e.value)


# what a document becomes


def test_a_full_document_becomes_llm_calls_tool_calls_and_a_subagent() -> None:
    t = convert(atif_document("what is 6*7?", "run-1"), START)
    assert (t.agent_name, t.agent_version) == ("test-agent", "1.2.0")
    assert t.final_metrics["total_prompt_tokens"] == 440
    assert [type(s).__name__ for s in t.steps] == ["LlmCall", "ToolCall", "ToolCall", "SubAgent", "ToolCall", "LlmCall"]
    first, c1, c2, sub, c3, last = t.steps
    assert isinstance(first, LlmCall) and isinstance(last, LlmCall)
    assert (first.model, first.input_tokens, first.output_tokens, first.cost_usd) == ("big-model", 120, 30, 0.002)
    assert (last.model, last.input_tokens, last.output_tokens, last.cost_usd) == ("big-model-2", 200, 10, 0.001)
    assert first.input_messages == [
        {"role": "system", "parts": [{"type": "text", "content": "You are a careful assistant."}]},
        {"role": "user", "parts": [{"type": "text", "content": "what is 6*7?"}]},
    ]
    assert first.output_messages == [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "I need 6*7 and a population."},
                {"type": "text", "content": "Let me compute and look it up."},
                {"type": "tool_call", "id": "c1", "name": "calculator", "arguments": {"expression": "6*7"}},
                {"type": "tool_call", "id": "c2", "name": "delegate", "arguments": {"task": "population of Paris"}},
                {"type": "tool_call", "id": "c3", "name": "lookup", "arguments": {"key": "zzz"}},
            ],
        }
    ]
    # the last turn sees everything before it: the first turn's message and the three tool results
    assert last.input_messages[:3] == [*first.input_messages, *first.output_messages]
    assert last.input_messages[3:] == [
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "42"}]},
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "c2", "response": "Paris has 2.1 million people."}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c3", "response": "no such key"}]},
    ]
    assert last.output_messages == [{"role": "assistant", "parts": [{"type": "text", "content": "The answer is 42."}]}]

    assert isinstance(c1, ToolCall) and isinstance(c2, ToolCall) and isinstance(c3, ToolCall)
    assert (c1.name, c1.call_id, c1.arguments, c1.result, c1.error) == (
        "calculator",
        "c1",
        {"expression": "6*7"},
        "42",
        None,
    )
    assert c2.result == "Paris has 2.1 million people."  # text-only content parts read as one string
    assert (c3.result, c3.error) == ("no such key", "KeyError: no such key")

    assert isinstance(sub, SubAgent)
    assert (sub.name, sub.output) == ("researcher", "Paris has 2.1 million people.")
    assert [type(s).__name__ for s in sub.steps] == ["LlmCall", "ToolCall", "LlmCall"]
    s1, search, s2 = sub.steps
    assert isinstance(s1, LlmCall) and isinstance(search, ToolCall) and isinstance(s2, LlmCall)
    assert (s1.model, s1.input_tokens, s1.output_tokens, s1.cost_usd) == ("small-model", 50, 5, 0.0001)
    assert (search.name, search.result) == ("web_search", "2.1 million")
    assert s2.input_messages[-1] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "s1", "response": "2.1 million"}],
    }


def test_times_come_from_step_and_result_timestamps() -> None:
    first, c1, c2, sub, c3, last = convert(atif_document("q", "run-1"), START).steps
    # a turn runs from the previous step's timestamp to its own
    assert (first.start_ns, first.end_ns) == (ns(0), ns(1))
    # a tool call from its step's timestamp to its result's extra.timestamp
    assert (c1.start_ns, c1.end_ns) == (ns(1), ns(1.25))
    assert (c2.start_ns, c2.end_ns) == (ns(1), ns(2.5))
    assert (c3.start_ns, c3.end_ns) == (ns(1), ns(1.1))
    # the next turn starts when the last tool result came back, not at the previous step
    assert (last.start_ns, last.end_ns) == (ns(2.5), ns(3))
    assert isinstance(sub, SubAgent)
    assert (sub.start_ns, sub.end_ns) == (ns(1), ns(2.2))
    s1, search, s2 = sub.steps
    assert (s1.start_ns, s1.end_ns) == (ns(1.1), ns(1.5))
    assert (search.start_ns, search.end_ns) == (ns(1.5), ns(1.9))
    assert (s2.start_ns, s2.end_ns) == (ns(1.9), ns(2.2))


def test_missing_timestamps_are_made_up_1ms_apart_from_the_attempt_start() -> None:
    doc = minimal(
        user(1),
        agent(2, tool_calls=[call("c1")], observation=results({"source_call_id": "c1", "content": "1"})),
        agent(3, "done"),
    )
    first, tool, last = convert(doc, START).steps
    assert FAKE_STEP_NS == 1_000_000
    assert (first.start_ns, first.end_ns) == (START + 1 * FAKE_STEP_NS, START + 2 * FAKE_STEP_NS)
    assert (tool.start_ns, tool.end_ns) == (START + 2 * FAKE_STEP_NS, START + 3 * FAKE_STEP_NS)
    assert (last.start_ns, last.end_ns) == (START + 2 * FAKE_STEP_NS, START + 3 * FAKE_STEP_NS)


def test_a_timestamp_without_a_zone_is_utc_and_other_zones_are_honoured() -> None:
    assert time_ns("2025-10-16T14:30:00", "x") == time_ns("2025-10-16T16:30:00+02:00", "x") == ns(0)


def test_model_falls_back_to_the_agent_model_and_tokens_may_be_absent() -> None:
    doc = minimal(user(1), agent(2, "hello"), agent={"name": "a", "model_name": "default-model"})
    (turn,) = convert(doc, START).steps
    assert isinstance(turn, LlmCall)
    assert (turn.model, turn.input_tokens, turn.output_tokens, turn.cost_usd) == ("default-model", None, None, None)


def test_a_failed_turn_carries_its_error() -> None:
    doc = minimal(
        user(1), agent(2, extra={"is_error": True, "error": "rate limited"}), agent(3, extra={"is_error": True})
    )
    first, second = convert(doc, START).steps
    assert first.error == "rate limited"
    assert second.error == "the turn failed (extra.is_error)"


def test_a_deterministic_dispatch_step_makes_tool_calls_but_no_llm_call() -> None:
    doc = minimal(
        user(1),
        agent(2, llm_call_count=0, tool_calls=[call("c1")], observation=results({"source_call_id": "c1"})),
        agent(3, "done"),
    )
    tool, turn = convert(doc, START).steps
    assert isinstance(tool, ToolCall) and tool.result is None
    assert isinstance(turn, LlmCall)
    assert turn.input_messages[1]["parts"][0]["type"] == "tool_call"


def test_a_call_without_a_result_is_kept_with_no_result_and_results_may_come_in_a_later_step() -> None:
    doc = minimal(
        user(1),
        agent(2, tool_calls=[call("c1"), call("c2")]),
        {
            "step_id": 3,
            "source": "system",
            "message": "",
            "observation": results({"source_call_id": "c1", "content": "x"}),
        },
    )
    _, c1, c2 = convert(doc, START).steps
    assert (c1.result, c2.result) == ("x", None)


def test_image_parts_and_mixed_result_content() -> None:
    image = {"type": "image", "source": {"media_type": "image/png", "path": "images/cat.png"}}
    doc = minimal(
        user(1, [{"type": "text", "text": "what is this?"}, image]),
        agent(
            2,
            tool_calls=[call("c1", "screenshot")],
            observation=results({"source_call_id": "c1", "content": [image, {"type": "text", "text": "a cat"}]}),
        ),
    )
    turn, tool = convert(doc, START).steps
    uri = {"type": "uri", "modality": "image", "mime_type": "image/png", "uri": "images/cat.png"}
    assert turn.input_messages == [{"role": "user", "parts": [{"type": "text", "content": "what is this?"}, uri]}]
    assert tool.result == [uri, {"type": "text", "content": "a cat"}]


def test_a_nested_subagent_resolves_against_the_root_list() -> None:
    inner = minimal(user(1), agent(2, "inner done"), trajectory_id="inner", agent={"name": "inner-agent"})
    middle = minimal(
        user(1),
        agent(
            2,
            tool_calls=[call("m1", "ask")],
            observation=results({"source_call_id": "m1", "subagent_trajectory_ref": [{"trajectory_id": "inner"}]}),
        ),
        trajectory_id="middle",
        agent={"name": "middle-agent"},
    )
    doc = minimal(
        user(1),
        agent(
            2,
            tool_calls=[call("c1", "ask")],
            observation=results({"source_call_id": "c1", "subagent_trajectory_ref": [{"trajectory_id": "middle"}]}),
        ),
        subagent_trajectories=[middle, inner],
    )
    _, _, sub = convert(doc, START).steps
    assert isinstance(sub, SubAgent) and sub.name == "middle-agent"
    assert [type(s).__name__ for s in sub.steps] == ["LlmCall", "ToolCall", "SubAgent"]
    assert sub.steps[2].name == "inner-agent" and sub.steps[2].output == "inner done"


# what cannot be read, and where


def with_call_and_result(result: dict[str, Any], **root: Any) -> dict[str, Any]:
    return minimal(user(1), agent(2, tool_calls=[call("c1")], observation=results(result)), **root)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "(document): expected an ATIF trajectory object, got array"),
        ({"steps": []}, "schema_version: required but missing"),
        ({"schema_version": 1.7, "steps": []}, "schema_version: expected a string, got number"),
        ({"schema_version": "ATIF-v2.0", "steps": []}, "schema_version: 'ATIF-v2.0' is not ATIF v1"),
        ({"schema_version": "ATIF-v1.7"}, "steps: required but missing"),
        ({"schema_version": "ATIF-v1.7", "steps": {"1": {}}}, "steps: expected an array, got object"),
        (minimal(user(1), "oops"), "steps[1]: expected a step object, got string"),
        (minimal(user(1), agent(3)), "steps[1].step_id: expected 2 (step ids run 1..n in order), got 3"),
        (minimal(user(2), agent(1)), "steps[0].step_id: expected 1 (step ids run 1..n in order), got 2"),
        (minimal(user(1), agent("2")), "steps[1].step_id: expected 2 (step ids run 1..n in order), got '2'"),
        (minimal({"source": "user", "message": "hi"}), "steps[0].step_id: required but missing"),
        (
            minimal(user(1), {"step_id": 2, "source": "bot", "message": ""}),
            "steps[1].source: expected 'user', 'agent' or 'system', got 'bot'",
        ),
        (minimal(user(1), {"step_id": 2, "source": "agent"}), "steps[1].message: required but missing"),
        (minimal(user(1, None)), "steps[0].message: expected a string or an array of content parts, got null"),
        (minimal(user(1, [{"type": "audio"}])), "steps[0].message[0].type: expected 'text' or 'image', got 'audio'"),
        (minimal(user(1, timestamp="yesterday")), "steps[0].timestamp: not an ISO 8601 time: 'yesterday'"),
        (minimal(user(1, tool_calls=[call("c1")])), "steps[0].tool_calls: only agent steps make tool calls"),
        (
            minimal(agent(1, tool_calls=[{"tool_call_id": "c1", "arguments": {}}])),
            "steps[0].tool_calls[0].function_name: required but missing",
        ),
        (
            minimal(agent(1, tool_calls=[{"tool_call_id": "c1", "function_name": "f"}])),
            "steps[0].tool_calls[0].arguments: required but missing",
        ),
        (
            minimal(agent(1, tool_calls=[call("c1")]), agent(2, tool_calls=[call("c1")])),
            "steps[1].tool_calls[0].tool_call_id: 'c1' is already the id of steps[0].tool_calls[0]",
        ),
        (
            minimal(agent(1, metrics={"prompt_tokens": "12"})),
            "steps[0].metrics.prompt_tokens: expected a token count (an integer >= 0), got '12'",
        ),
        (
            minimal(agent(1, metrics={"completion_tokens": -1})),
            "steps[0].metrics.completion_tokens: expected a token count (an integer >= 0), got -1",
        ),
        (
            minimal(agent(1, metrics={"cost_usd": "free"})),
            "steps[0].metrics.cost_usd: expected a non-negative number, got 'free'",
        ),
        (
            with_call_and_result({"source_call_id": "c9"}),
            "steps[1].observation.results[0].source_call_id: no tool call 'c9'",
        ),
        (
            minimal(
                user(1),
                agent(
                    2, tool_calls=[call("c1")], observation=results({"source_call_id": "c1"}, {"source_call_id": "c1"})
                ),
            ),
            "steps[1].observation.results[1].source_call_id: tool call 'c1' already has a result "
            "(steps[1].observation.results[0])",
        ),
        (
            with_call_and_result({"source_call_id": "c1", "extra": {"is_error": "yes"}}),
            "steps[1].observation.results[0].extra.is_error: expected a boolean, got string",
        ),
        (
            with_call_and_result({"source_call_id": "c1", "extra": {"timestamp": 12}}),
            "steps[1].observation.results[0].extra.timestamp: expected an ISO 8601 time string, got integer",
        ),
        (
            with_call_and_result({"source_call_id": "c1", "subagent_trajectory_ref": [{"trajectory_id": "sub-9"}]}),
            "steps[1].observation.results[0].subagent_trajectory_ref[0].trajectory_id: no subagent trajectory 'sub-9' "
            "(embedded: none)",
        ),
        (
            with_call_and_result(
                {"source_call_id": "c1", "subagent_trajectory_ref": [{"trajectory_id": "sub-9"}]},
                subagent_trajectories=[minimal(user(1), trajectory_id="sub-1")],
            ),
            "steps[1].observation.results[0].subagent_trajectory_ref[0].trajectory_id: no subagent trajectory 'sub-9' "
            "(embedded: 'sub-1')",
        ),
        (
            with_call_and_result({"source_call_id": "c1", "subagent_trajectory_ref": [{"session_id": "s"}]}),
            "steps[1].observation.results[0].subagent_trajectory_ref[0].trajectory_id: required but missing",
        ),
        (
            with_call_and_result(
                {"source_call_id": "c1"}, subagent_trajectories=[minimal(user(1), trajectory_id="sub-1")]
            ),
            "subagent_trajectories[0]: subagent trajectory 'sub-1' is referenced by no tool result",
        ),
        (
            with_call_and_result({"source_call_id": "c1"}, subagent_trajectories=[minimal(user(1))]),
            "subagent_trajectories[0].trajectory_id: required but missing",
        ),
        (
            with_call_and_result(
                {"source_call_id": "c1", "subagent_trajectory_ref": [{"trajectory_id": "s"}]},
                subagent_trajectories=[minimal(user(1), trajectory_id="s"), minimal(user(1), trajectory_id="s")],
            ),
            "subagent_trajectories[1].trajectory_id: 's' is already the id of subagent_trajectories[0]",
        ),
        (
            with_call_and_result(
                {"source_call_id": "c1", "subagent_trajectory_ref": [{"trajectory_id": "s"}, {"trajectory_id": "s"}]},
                subagent_trajectories=[minimal(user(1), trajectory_id="s")],
            ),
            "steps[1].observation.results[0].subagent_trajectory_ref[1].trajectory_id: 's' is already referenced at "
            "steps[1].observation.results[0].subagent_trajectory_ref[0]",
        ),
        (
            with_call_and_result(
                {"source_call_id": "c1", "subagent_trajectory_ref": [{"trajectory_id": "s"}]},
                subagent_trajectories=[{"trajectory_id": "s", "steps": []}],
            ),
            "subagent_trajectories[0].schema_version: required but missing",
        ),
        (
            with_call_and_result(
                {"source_call_id": "c1", "subagent_trajectory_ref": [{"trajectory_id": "s"}]},
                subagent_trajectories=[minimal(user(1), agent(3), trajectory_id="s")],
            ),
            "subagent_trajectories[0].steps[1].step_id: expected 2 (step ids run 1..n in order), got 3",
        ),
        (
            with_call_and_result(
                {"source_call_id": "c1", "subagent_trajectory_ref": [{"trajectory_id": "s"}]},
                subagent_trajectories=[minimal(user(1), trajectory_id="s", agent="helper")],
            ),
            "subagent_trajectories[0].agent: expected an object, got string",
        ),
        (
            with_call_and_result({"source_call_id": "c1"}, final_metrics=[1]),
            "final_metrics: expected an object, got array",
        ),
    ],
)
def test_a_document_that_cannot_be_read_is_refused_naming_the_place(doc: Any, message: str) -> None:
    assert refused(doc).startswith(message)


def test_an_unknown_call_id_deep_in_the_shared_fixture_is_named_exactly() -> None:
    doc = copy.deepcopy(atif_document("q", "run-1"))
    doc["steps"][2]["observation"]["results"][2]["source_call_id"] = "c9"
    assert refused(doc) == "steps[2].observation.results[2].source_call_id: no tool call 'c9'"
    doc = copy.deepcopy(atif_document("q", "run-1"))
    doc["subagent_trajectories"][0]["steps"][1]["observation"]["results"][0]["source_call_id"] = "zz"
    assert refused(doc) == "subagent_trajectories[0].steps[1].observation.results[0].source_call_id: no tool call 'zz'"


def test_a_subagent_that_refers_back_to_itself_is_a_cycle_not_a_hang() -> None:
    loop = minimal(
        user(1),
        agent(
            2,
            tool_calls=[call("x", "ask")],
            observation=results({"source_call_id": "x", "subagent_trajectory_ref": [{"trajectory_id": "s"}]}),
        ),
        trajectory_id="s",
    )
    doc = with_call_and_result(
        {"source_call_id": "c1", "subagent_trajectory_ref": [{"trajectory_id": "s"}]}, subagent_trajectories=[loop]
    )
    assert refused(doc) == (
        "subagent_trajectories[0].steps[1].observation.results[0].subagent_trajectory_ref[0].trajectory_id: 's' is "
        "subagent_trajectories[0], which holds this reference (a cycle)"
    )
