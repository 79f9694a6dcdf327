"""The reference agent (`OpenAIAgent`) against the bundled stub server: tool calls run through real Python
functions (sync and async, in parallel), mocked tool results, budgets, retries and the endpoint's failures, and the
tools' JSON schemas from type hints."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from evalsi.run_harness.model import Attempt, LlmCall, Task, ToolCall
from evalsi.run_harness.spec import OpenAITarget
from evalsi.run_harness.stub_llm import StubLLM
from evalsi.run_harness.targets.base import AttemptContext, AttemptFailed, TargetError
from evalsi.run_harness.targets.openai import OpenAIAgent
from evalsi.run_harness.tools import function_schema, type_schema
from evalsi.runtime.backoff import Backoff

from . import tools

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CTX = AttemptContext(trial=2, timeout_s=10.0, traceparent=TRACEPARENT, run_id="run-1")
FAST = Backoff(initial=0.01, maximum=0.05, jitter=0.0)
WEATHER = f"{tools.__name__}:get_weather"
ASYNC_WEATHER = f"{__name__}:get_weather"


async def get_weather(city: str) -> dict[str, Any]:
    """Get the current weather in a city (async)."""
    await asyncio.sleep(0.2)
    return {"conditions": "windy", "temperature_c": len(city)}


@pytest.fixture
def stub() -> Iterator[StubLLM]:
    with StubLLM() as llm:
        yield llm


def agent(base_url: str, retries: int = 3, **spec: Any) -> OpenAIAgent:
    spec.setdefault("model", "stub")
    return OpenAIAgent(OpenAITarget(base_url=base_url, **spec), retries=retries, backoff=FAST)


async def _run(target: OpenAIAgent, task: Task, ctx: AttemptContext) -> Attempt:
    await target.prepare([task])
    try:
        return await target.attempt(task, ctx)
    finally:
        await target.close()


def run(target: OpenAIAgent, task: Task | str, ctx: AttemptContext = CTX) -> Attempt:
    return asyncio.run(_run(target, task if isinstance(task, Task) else Task("t1", task), ctx))


def failure(target: OpenAIAgent, task: Task | str, ctx: AttemptContext = CTX) -> AttemptFailed:
    with pytest.raises(AttemptFailed) as e:
        run(target, task, ctx)
    return e.value


def tool_results(call: LlmCall) -> list[Any]:
    return [p["response"] for m in call.input_messages for p in m["parts"] if p["type"] == "tool_call_response"]


# --- the loop -----------------------------------------------------------------------------------------------------


def test_a_weather_question_runs_the_tool_and_answers_with_its_result(
    stub: StubLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVALSI_TEST_OPENAI_KEY", "sk-test")
    target = agent(
        stub.base_url + "/",
        system="You are a weather assistant.",
        tools=[WEATHER],
        api_key="env:EVALSI_TEST_OPENAI_KEY",
        price={"input": 1.0, "output": 2.0},
    )
    assert target.identity == f"openai:{stub.base_url}#stub"
    attempt = run(target, Task("w1", {"question": "What's the weather in Paris?"}))

    assert attempt.error is None and attempt.trial == 2 and attempt.end_ns >= attempt.start_ns
    assert attempt.output == "The weather in Paris is sunny, 18°C."
    first, tool, second = attempt.steps
    assert isinstance(first, LlmCall) and isinstance(tool, ToolCall) and isinstance(second, LlmCall)
    assert first.input_messages == [
        {"role": "system", "parts": [{"type": "text", "content": "You are a weather assistant."}]},
        {"role": "user", "parts": [{"type": "text", "content": "What's the weather in Paris?"}]},
    ]
    [out] = first.output_messages
    [part] = out["parts"]
    assert out["role"] == "assistant" and out["finish_reason"] == "tool_calls" == first.finish_reason
    assert part == {"type": "tool_call", "id": tool.call_id, "name": "get_weather", "arguments": {"city": "Paris"}}
    assert (tool.name, tool.arguments, tool.result, tool.error) == (
        "get_weather",
        {"city": "Paris"},
        "sunny, 18°C",
        None,
    )
    assert first.end_ns <= tool.start_ns < tool.end_ns <= second.start_ns
    assert tool.end_ns - tool.start_ns >= tools.SLEEP_S * 1e9 * 0.9
    assert second.input_messages[:2] == first.input_messages
    assert second.input_messages[2] == {"role": "assistant", "parts": [part]}
    assert second.input_messages[3] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": tool.call_id, "response": "sunny, 18°C"}],
    }
    assert second.output_messages == [
        {"role": "assistant", "parts": [{"type": "text", "content": attempt.output}], "finish_reason": "stop"}
    ]
    for call in (first, second):
        assert call.provider == "openai" and call.model == "stub" and call.error is None
        assert call.input_tokens and call.output_tokens
        assert call.cost_usd == pytest.approx((call.input_tokens * 1.0 + call.output_tokens * 2.0) / 1e6)
    assert second.input_tokens > first.input_tokens  # type: ignore[operator]
    assert attempt.tokens == sum((c.input_tokens or 0) + (c.output_tokens or 0) for c in (first, second))

    # what went over the wire: the key, the trace context, the tool's schema, the tool message
    assert stub.last_headers["authorization"] == "Bearer sk-test"
    assert stub.last_headers["traceparent"] == TRACEPARENT
    body = stub.last_body
    assert body["model"] == "stub" and body["temperature"] == 0.0
    [definition] = body["tools"]
    assert definition["type"] == "function" and definition["function"]["name"] == "get_weather"
    assert definition["function"]["description"] == "Get the current weather in a city."
    assert body["messages"][-1] == {"role": "tool", "tool_call_id": tool.call_id, "content": "sunny, 18°C"}


@pytest.mark.parametrize("ref", [WEATHER, ASYNC_WEATHER], ids=["sync", "async"])
def test_parallel_tool_calls_run_at_the_same_time_and_answer_in_call_order(stub: StubLLM, ref: str) -> None:
    attempt = run(agent(stub.base_url, tools=[ref]), "What is the weather in Paris and Tokyo?")
    _, paris, tokyo, final = attempt.steps
    assert isinstance(paris, ToolCall) and isinstance(tokyo, ToolCall) and isinstance(final, LlmCall)
    assert [t.arguments for t in (paris, tokyo)] == [{"city": "Paris"}, {"city": "Tokyo"}]
    assert max(paris.start_ns, tokyo.start_ns) < min(paris.end_ns, tokyo.end_ns)  # overlapping
    assert tool_results(final) == [paris.result, tokyo.result]
    if ref == WEATHER:
        assert attempt.output == "The weather in Paris is sunny, 18°C. The weather in Tokyo is rainy, 12°C."
    else:
        assert paris.result == {"conditions": "windy", "temperature_c": 5}
        assert attempt.output == (
            "The weather in Paris is conditions windy, temperature_c 5. "
            "The weather in Tokyo is conditions windy, temperature_c 5."
        )


def test_a_tool_that_raises_gives_the_model_the_error_and_the_loop_goes_on(stub: StubLLM) -> None:
    attempt = run(agent(stub.base_url, tools=[WEATHER]), "What's the weather in Atlantis?")
    _, tool, final = attempt.steps
    assert isinstance(tool, ToolCall) and isinstance(final, LlmCall)
    assert tool.error == "ValueError: unknown city 'Atlantis'" and tool.result is None
    assert tool_results(final) == [{"error": "ValueError: unknown city 'Atlantis'"}]
    assert json.loads(stub.last_body["messages"][-1]["content"]) == {"error": tool.error}
    assert attempt.error is None
    assert attempt.output == "I could not get the weather in Atlantis: ValueError: unknown city 'Atlantis'."


def test_mock_tools_answer_from_the_task_metadata_in_order(stub: StubLLM) -> None:
    before = list(tools.CALLS)
    mocked = Task(
        "m1",
        "What is the weather in Paris and Tokyo?",
        metadata={"tool_results": {"get_weather": ["hail, -2°C", {"conditions": "fog"}]}},
    )
    attempt = run(agent(stub.base_url, tools=[WEATHER], mock_tools=True), mocked)
    calls = [s for s in attempt.steps if isinstance(s, ToolCall)]
    assert [(c.arguments["city"], c.result, c.error) for c in calls] == [
        ("Paris", "hail, -2°C", None),
        ("Tokyo", {"conditions": "fog"}, None),
    ]
    assert attempt.output == "The weather in Paris is hail, -2°C. The weather in Tokyo is conditions fog."
    assert tools.CALLS == before  # the function never ran

    one_value = Task("m2", "What is the weather in London?", metadata={"tool_results": {"get_weather": "snow"}})
    assert run(agent(stub.base_url, tools=[WEATHER], mock_tools=True), one_value).output == (
        "The weather in London is snow."
    )

    unmocked = Task("m3", "What is the weather in London?", metadata={"tool_results": {"search": "x"}})
    attempt = run(agent(stub.base_url, tools=[WEATHER], mock_tools=True), unmocked)
    [call] = [s for s in attempt.steps if isinstance(s, ToolCall)]
    assert call.result is None and call.error is not None and "no mock result for tool 'get_weather'" in call.error
    assert attempt.output is not None and attempt.output.startswith("I could not get the weather in London: no mock")


def test_mocked_results_must_be_an_object(stub: StubLLM) -> None:
    target = agent(stub.base_url, tools=[WEATHER], mock_tools=True)
    with pytest.raises(TargetError, match=r"task bad \(line 3\): metadata.tool_results is not an object"):
        asyncio.run(target.prepare([Task("bad", "q", metadata={"tool_results": ["x"]}, line=3)]))


def test_task_inputs_and_a_plain_answer(stub: StubLLM) -> None:
    attempt = run(agent(stub.base_url), Task("a", {"question": "What is 2 + 3?", "id": 7}))
    [call] = attempt.steps
    assert attempt.output == "5" and isinstance(call, LlmCall) and call.finish_reason == "stop"
    assert "tools" not in stub.last_body and "authorization" not in stub.last_headers
    attempt = run(agent(stub.base_url), Task("b", {"city": "Paris", "days": 2}))
    assert stub.last_body["messages"] == [{"role": "user", "content": '{"city": "Paris", "days": 2}'}]
    assert attempt.output == "I don't know."


def test_concurrent_attempts_share_a_few_clients(stub: StubLLM) -> None:
    target = agent(stub.base_url, model="stub-slow-100ms")

    async def main() -> tuple[list[Attempt], int]:
        await target.prepare([])
        try:
            ctxs = [AttemptContext(0, 10.0, "", "r")] * 20
            attempts = await asyncio.gather(
                *(target.attempt(Task(str(i), f"What is {i} + 1?"), c) for i, c in enumerate(ctxs))
            )
            return list(attempts), len(target._clients._clients)
        finally:
            await target.close()

    attempts, clients = asyncio.run(main())
    assert [a.output for a in attempts] == [str(i + 1) for i in range(20)]
    assert clients == 3  # at most 8 requests in flight per httpx client


# --- budgets ------------------------------------------------------------------------------------------------------


def test_max_steps_is_a_budget_failure(stub: StubLLM) -> None:
    e = failure(agent(stub.base_url, tools=[WEATHER], max_steps=1), "What's the weather in Paris?")
    assert e.error.kind == "budget" and "max_steps=1" in e.error.message
    partial = e.attempt  # type: ignore[attr-defined]
    assert [type(s) for s in partial.steps] == [LlmCall] and partial.error == e.error
    assert stub.requests == 1


def test_max_tokens_is_a_budget_failure(stub: StubLLM) -> None:
    e = failure(agent(stub.base_url, tools=[WEATHER], max_tokens=30), "What's the weather in Paris?")
    assert e.error.kind == "budget" and "over max_tokens" in e.error.message


# --- the endpoint's failures --------------------------------------------------------------------------------------


def test_503_twice_then_ok_is_retried(stub: StubLLM) -> None:
    attempt = run(agent(stub.base_url, model="stub-fail-503-twice"), "What is 2 + 3?")
    assert attempt.output == "5" and stub.requests == 3
    assert len(attempt.steps) == 1


def test_retry_after_is_honoured(stub: StubLLM) -> None:
    t0 = time.monotonic()
    attempt = run(agent(stub.base_url, model="fail-429-once-retry-after-0.3"), "What is 2 + 3?")
    assert attempt.output == "5" and stub.requests == 2
    assert time.monotonic() - t0 >= 0.3


def test_a_persistent_5xx_is_a_target_error(stub: StubLLM) -> None:
    e = failure(agent(stub.base_url, retries=2, model="fail-503-always"), "What is 2 + 3?")
    assert e.error.kind == "target_error"
    assert e.error.message.startswith(f"POST {stub.base_url}/chat/completions answered 503: injected fault")
    assert stub.requests == 3


def test_a_4xx_is_a_target_error_with_the_bodys_message_and_no_retry(stub: StubLLM) -> None:
    e = failure(agent(stub.base_url, model="bad-request"), "What is 2 + 3?")
    assert e.error.kind == "target_error"
    assert e.error.message == (
        f"POST {stub.base_url}/chat/completions answered 400: "
        "injected fault bad-request: this model does not accept the request"
    )
    assert stub.requests == 1


@pytest.mark.parametrize("fault", ["malformed", "not-json"])
def test_a_reply_that_is_no_chat_completion_is_malformed(stub: StubLLM, fault: str) -> None:
    e = failure(agent(stub.base_url, model=f"stub-{fault}"), "What is 2 + 3?")
    assert e.error.kind == "malformed" and stub.base_url in e.error.message


def test_an_unreachable_endpoint_is_retried_then_a_target_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    e = failure(agent(f"http://127.0.0.1:{port}/v1", retries=1), "What is 2 + 3?")
    assert e.error.kind == "target_error" and "ConnectError" in e.error.message and "(2 tries)" in e.error.message


def test_a_slow_endpoint_times_out_within_the_attempts_time(stub: StubLLM) -> None:
    t0 = time.monotonic()
    e = failure(agent(stub.base_url, model="slow-2s"), "What is 2 + 3?", AttemptContext(0, 0.3, "", "r"))
    assert e.error.kind == "timeout" and time.monotonic() - t0 < 1.5


# --- tools and their schemas ----------------------------------------------------------------------------------------


def test_tool_problems_are_target_errors_at_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVALSI_TEST_NO_SUCH_KEY", raising=False)
    target = agent(
        "http://127.0.0.1:9/v1",
        api_key="env:EVALSI_TEST_NO_SUCH_KEY",
        tools=["evalsi_no_such_module:tool", f"{tools.__name__}:missing", f"{tools.__name__}:takes_bytes", WEATHER],
    )
    with pytest.raises(TargetError) as e:
        asyncio.run(target.prepare([Task("t", "q")]))
    lines = str(e.value).splitlines()
    assert lines[0] == "api_key: the environment variable EVALSI_TEST_NO_SUCH_KEY is not set"
    assert lines[1].startswith("tool 'evalsi_no_such_module:tool': cannot import evalsi_no_such_module:")
    assert lines[2] == f"tool '{tools.__name__}:missing': {tools.__name__} has no 'missing'"
    assert lines[3].startswith(f"tool '{tools.__name__}:takes_bytes': no JSON schema: parameter 'blob'")
    assert len(lines) == 4


def test_the_schema_comes_from_the_type_hints_and_the_docstring() -> None:
    assert function_schema(tools.search_docs) == {
        "name": "search_docs",
        "description": "Search the documentation.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for."},
                "tags": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Only documents with all of these tags.",
                },
                "mode": {"type": "string", "enum": ["fast", "exact"]},
                "limit": {"type": "integer", "description": "At most this many results.", "default": 5},
                "since": {"type": ["string", "null"], "default": None},
            },
            "required": ["query", "tags", "mode"],
        },
    }
    assert type_schema(dict[str, int]) == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert type_schema(float | int) == {"anyOf": [{"type": "number"}, {"type": "integer"}]}
    assert type_schema(bool) == {"type": "boolean"}
    with pytest.raises(TypeError):
        type_schema(bytes)


def test_a_tool_schema_attribute_wins(stub: StubLLM) -> None:
    assert function_schema(tools.lookup) == {
        "name": "kv_lookup",
        "description": "Read a key.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    }
    target = agent(stub.base_url, tools=[f"{tools.__name__}:lookup"])
    asyncio.run(target.prepare([]))
    assert list(target.tools) == ["kv_lookup"]
    asyncio.run(target.close())


# --- the stub on its own ------------------------------------------------------------------------------------------


def test_the_stub_runs_as_a_command() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalsi.run_harness.stub_llm", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:") and line.endswith("/v1")
        base_url = line.removeprefix("listening on ")
        body = {"model": "m", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
        reply = httpx.post(f"{base_url}/chat/completions", json=body, timeout=5).json()
        assert reply["choices"][0]["message"]["content"] == "42"
        assert reply["usage"]["prompt_tokens"] > 0 and reply["model"] == "m"
    finally:
        proc.terminate()
        proc.wait(timeout=5)
