"""The `http` target against a real agent serving the harness contract: runs, metadata, the api key, the input schema
checked before anything runs, timeouts with stop, retries, failed runs and malformed trajectories."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from evalsi.run_harness.model import Attempt, LlmCall, SubAgent, Task, ToolCall
from evalsi.run_harness.spec import HttpTarget
from evalsi.run_harness.targets.base import AttemptContext, AttemptFailed, TargetError
from evalsi.run_harness.targets.http import HttpAgent
from evalsi.runtime.backoff import Backoff

from .harness_server import Capabilities, HarnessServer

KEY = "test-key"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def server() -> Iterator[HarnessServer]:
    with HarnessServer(KEY) as s:
        yield s


def serve(**capabilities: Any) -> HarnessServer:
    return HarnessServer(KEY, Capabilities(**capabilities))


def agent_for(server: HarnessServer, api_key: str | None = KEY, retries: int = 3, **config: Any) -> HttpAgent:
    spec = HttpTarget(url=server.url, api_key=api_key, poll_interval=0.01, stop_grace=2.0, **config)
    return HttpAgent(spec, retries=retries, backoff=lambda: Backoff(initial=0.01, maximum=0.02))


def ctx(trial: int = 1, timeout_s: float = 10.0, run_id: str = "run-abc") -> AttemptContext:
    return AttemptContext(trial=trial, timeout_s=timeout_s, traceparent=TRACEPARENT, run_id=run_id)


def run(agent: HttpAgent, *tasks: Task, context: AttemptContext | None = None) -> list[Attempt]:
    """Prepare the agent for `tasks`, attempt each at once (concurrently), close it."""

    async def main() -> list[Attempt]:
        try:
            await agent.prepare(list(tasks))
            return list(await asyncio.gather(*(agent.attempt(t, context or ctx()) for t in tasks)))
        finally:
            await agent.close()

    return asyncio.run(main())


def failure(agent: HttpAgent, task: Task, context: AttemptContext | None = None) -> AttemptFailed:
    with pytest.raises(AttemptFailed) as e:
        run(agent, task, context=context)
    return e.value


def refusal(agent: HttpAgent, *tasks: Task) -> str:
    with pytest.raises(TargetError) as e:
        run(agent, *tasks)
    return str(e.value)


# a run that completes


def test_a_completed_run_gives_the_answer_and_its_trajectory_as_steps(server: HarnessServer) -> None:
    agent = agent_for(server)
    assert agent.identity == f"http:{server.url}"
    (attempt,) = run(agent, Task("q1", "atif", line=1), context=ctx(trial=2))
    assert attempt.error is None
    assert (attempt.output, attempt.output_json, attempt.trial) == ("The answer is 42.", None, 2)
    assert attempt.agent_name == "test-agent"
    assert attempt.start_ns <= attempt.end_ns
    assert [type(s).__name__ for s in attempt.steps] == [
        "LlmCall", "ToolCall", "ToolCall", "SubAgent", "ToolCall", "LlmCall",
    ]  # fmt: skip
    first, calculator, delegate, sub, lookup, last = attempt.steps
    assert isinstance(first, LlmCall) and isinstance(last, LlmCall)
    assert (first.model, first.input_tokens, first.output_tokens, first.cost_usd) == ("big-model", 120, 30, 0.002)
    assert (last.model, last.input_tokens, last.output_tokens, last.cost_usd) == ("big-model-2", 200, 10, 0.001)
    assert first.input_messages[-1] == {"role": "user", "parts": [{"type": "text", "content": "atif"}]}
    assert isinstance(calculator, ToolCall) and isinstance(delegate, ToolCall) and isinstance(lookup, ToolCall)
    assert (calculator.name, calculator.arguments, calculator.result) == ("calculator", {"expression": "6*7"}, "42")
    assert delegate.result == "Paris has 2.1 million people."
    assert (lookup.result, lookup.error) == ("no such key", "KeyError: no such key")
    assert isinstance(sub, SubAgent) and sub.name == "researcher"
    assert [type(s).__name__ for s in sub.steps] == ["LlmCall", "ToolCall", "LlmCall"]
    assert isinstance(sub.steps[1], ToolCall) and sub.steps[1].result == "2.1 million"
    # the subagent's model calls count in the attempt's totals
    assert attempt.tokens == 120 + 30 + 200 + 10 + 50 + 5 + 70 + 8
    assert attempt.cost_usd == pytest.approx(0.002 + 0.001 + 0.0001 + 0.0002)
    # the trajectory is fetched once, after the terminal status
    assert server.requests.count(("GET", "/evalkit/v1/runs/run-1/trajectory")) == 1


def test_the_metadata_sent_is_the_run_the_task_and_the_trial(server: HarnessServer) -> None:
    run(agent_for(server), Task("case-7", "polls:2", line=3), context=ctx(trial=3, run_id="run-xyz"))
    (body,) = server.posts
    assert body == {
        "input": {"question": "polls:2"},  # no input_schema: a string is sent as {"question": ...}
        "metadata": {"experiment_id": "run-xyz", "case_id": "case-7", "repetition": 3},
    }
    assert server.post_headers[0]["traceparent"] == TRACEPARENT
    assert server.runs["run-1"].polls == 3  # queued, running, completed


def test_an_object_input_is_sent_as_written(server: HarnessServer) -> None:
    (attempt,) = run(agent_for(server), Task("q", {"question": "hello", "context": {"lang": "fr"}}))
    assert server.posts[0]["input"] == {"question": "hello", "context": {"lang": "fr"}}
    assert attempt.output == "answer to hello"


def test_the_model_is_sent_only_to_an_agent_that_accepts_an_override() -> None:
    with serve(model_override=True) as server:
        run(agent_for(server, model="gpt-test"), Task("q", "hi"))
        assert server.posts[0]["model"] == "gpt-test"
    with serve(model_override=False) as server:
        run(agent_for(server, model="gpt-test"), Task("q", "hi"))
        assert "model" not in server.posts[0]


def test_output_without_an_answer_is_the_json_output(server: HarnessServer) -> None:
    (attempt,) = run(agent_for(server), Task("q", "output"))
    assert (attempt.output, attempt.output_json) == (None, {"total": 3, "items": ["a", "b", "c"]})
    assert attempt.output_text == '{"items": ["a", "b", "c"], "total": 3}'


def test_without_a_trajectory_there_are_no_steps_and_nothing_is_fetched() -> None:
    with serve(trajectory=False) as server:
        (attempt,) = run(agent_for(server), Task("q", "atif"))
        assert (attempt.output, attempt.steps, attempt.agent_name) == ("The answer is 42.", [], "test-agent")
        assert not [r for r in server.requests if r[1].endswith("/trajectory")]


def test_no_more_runs_at_once_than_the_agent_allows() -> None:
    with serve(max_concurrent_runs=2) as server:
        agent = agent_for(server)
        attempts = run(agent, *(Task(f"q{i}", f"polls:{3 + i}") for i in range(5)))
        assert [a.output for a in attempts] == [f"answer to polls:{3 + i}" for i in range(5)]
        assert agent.max_concurrent_runs == 2
        assert server.max_active == 2


# the agent and its capabilities


def test_the_api_key_is_required() -> None:
    with serve() as server:
        message = refusal(agent_for(server, api_key="wrong"), Task("q", "hi"))
        assert message.startswith(f"GET {server.url}/capabilities answered 401: the agent refused the api key")
        assert "target.http.api_key" in message
        assert "(none is set)" in refusal(agent_for(server, api_key=None), Task("q", "hi"))
        assert server.posts == []


def test_the_api_key_from_an_environment_variable(monkeypatch: pytest.MonkeyPatch, server: HarnessServer) -> None:
    monkeypatch.delenv("EVALSI_TEST_AGENT_KEY", raising=False)
    message = refusal(agent_for(server, api_key="env:EVALSI_TEST_AGENT_KEY"), Task("q", "hi"))
    assert "EVALSI_TEST_AGENT_KEY is not set" in message
    assert server.requests == []  # refused before asking the agent anything
    monkeypatch.setenv("EVALSI_TEST_AGENT_KEY", KEY)
    (attempt,) = run(agent_for(server, api_key="env:EVALSI_TEST_AGENT_KEY"), Task("q", "hi"))
    assert attempt.output == "answer to hi"


def test_an_unreachable_agent_is_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    spec = HttpTarget(url=f"http://127.0.0.1:{port}/evalkit/v1", api_key=KEY)
    message = refusal(HttpAgent(spec), Task("q", "hi"))
    assert message.startswith(f"cannot reach the agent: GET http://127.0.0.1:{port}/evalkit/v1/capabilities: Connect")
    assert "check target.http.url" in message


def test_capabilities_that_are_not_json_are_refused() -> None:
    with serve(raw=b"<html>welcome</html>") as server:
        message = refusal(agent_for(server), Task("q", "hi"))
        assert message == (
            f"GET {server.url}/capabilities did not answer JSON (text/html: <html>welcome</html>); is target.http.url "
            "the agent's harness base URL (by convention ending in /evalkit/v1)?"
        )


@pytest.mark.parametrize("version", ["1", "1.0", "1.3", 1])
def test_contract_1_is_spoken(version: Any) -> None:
    with serve(contract_version=version) as server:
        (attempt,) = run(agent_for(server), Task("q", "hi"))
        assert attempt.output == "answer to hi"


@pytest.mark.parametrize("version", ["2.0", "v1", None, True])
def test_another_contract_is_refused(version: Any) -> None:
    with serve(contract_version=version) as server:
        message = refusal(agent_for(server), Task("q", "hi"))
        assert "evalsi speaks the agent harness contract 1 (1.x)" in message
        assert server.posts == []


# the input schema, checked for every record before anything runs

SCHEMA = {
    "type": "object",
    "required": ["question", "lang"],
    "properties": {"question": {"type": "string"}, "lang": {"enum": ["en", "fr"]}},
    "additionalProperties": False,
}


def test_an_input_failing_the_schema_refuses_the_run_listing_every_failing_record() -> None:
    tasks = [
        Task("ok", {"question": "hi", "lang": "en"}, line=1),
        Task("no-lang", {"question": "hi"}, line=2),
        Task("text", "just text", line=3),
        Task("ok-too", {"question": "salut", "lang": "fr"}, line=4),
        Task("two", {"question": 7, "lang": "de", "extra": 1}, line=5),
    ]
    with serve(input_schema=SCHEMA) as server:
        message = refusal(agent_for(server), *tasks)
        assert message.splitlines() == [
            "3 of 5 records do not match the agent's input schema (from GET /capabilities); nothing ran. Fix these "
            "records or the agent's schema:",
            "  dataset line 2, task 'no-lang': $.lang: required but missing",
            "  dataset line 3, task 'text': $: expected object, got string",  # sent as written with a schema
            "  dataset line 5, task 'two': $.extra: not an allowed property",
            '  dataset line 5, task \'two\': $.lang: not one of ["en","fr"]',
            "  dataset line 5, task 'two': $.question: expected string, got integer",
        ]
        assert server.posts == []


def test_the_default_schema_wants_a_question() -> None:
    tasks = [Task("a", "a string is wrapped", line=1), Task("b", 42, line=2), Task("c", {"prompt": "x"}, line=3)]
    with serve() as server:
        message = refusal(agent_for(server), *tasks)
        assert message.splitlines() == [
            '2 of 3 records do not match the agent\'s input schema (none declared, so the default {"question": '
            'string}; a string input is sent as {"question": ...}); nothing ran. Fix these records or the agent\'s '
            "schema:",
            "  dataset line 2, task 'b': $: expected object, got integer",
            "  dataset line 3, task 'c': $.question: required but missing",
        ]
        assert server.posts == []


def test_an_invalid_input_schema_is_refused() -> None:
    with serve(input_schema={"type": "strange"}) as server:
        message = refusal(agent_for(server), Task("q", {"question": "hi"}))
        assert message.startswith(f"GET {server.url}/capabilities: input_schema is not a valid JSON Schema")


# runs that do not end well


def test_a_timeout_sends_stop_and_fails_the_attempt_as_a_timeout(server: HarnessServer) -> None:
    e = failure(agent_for(server), Task("q", "hang"), context=ctx(timeout_s=0.2))
    assert e.error.kind == "timeout"
    assert e.error.message == (
        "run run-1 had no terminal status after 0.2s (it was 'running'); sent stop, and the run ended 'cancelled'"
    )
    assert server.stops == ["run-1"]
    assert ("POST", "/evalkit/v1/runs/run-1/stop") in server.requests


def test_a_timeout_without_stop_leaves_the_run_and_says_so() -> None:
    with serve(stop=False) as server:
        e = failure(agent_for(server), Task("q", "hang"), context=ctx(timeout_s=0.1))
        assert e.error.kind == "timeout"
        assert "the agent does not accept stop (accepts.stop), so the run may still be going" in e.error.message
        assert server.stops == []


def test_a_cancelled_attempt_stops_its_run(server: HarnessServer) -> None:
    agent = agent_for(server)

    async def main() -> None:
        await agent.prepare([Task("q", "hang")])
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(agent.attempt(Task("q", "hang"), ctx(timeout_s=30)), 0.3)
        finally:
            await agent.close()

    asyncio.run(main())
    assert server.stops == ["run-1"]


def test_503_on_post_is_retried_then_the_run_goes_on(server: HarnessServer) -> None:
    (attempt,) = run(agent_for(server), Task("q", "flaky:2"))
    assert attempt.output == "answer to flaky:2"
    assert server.post_failures == {"flaky:2": 2}
    assert server.requests.count(("POST", "/evalkit/v1/runs")) == 3


def test_503_on_a_poll_is_retried(server: HarnessServer) -> None:
    (attempt,) = run(agent_for(server), Task("q", "poll503:2"))
    assert attempt.output == "answer to poll503:2"


def test_a_persistent_503_is_a_target_error(server: HarnessServer) -> None:
    e = failure(agent_for(server, retries=2), Task("q", "flaky:99"))
    assert e.error.kind == "target_error"
    assert e.error.message == 'POST /runs answered 503: {"detail": "overloaded, try again"} (3 tries)'
    assert server.runs == {}


def test_a_failed_run_is_a_target_error(server: HarnessServer) -> None:
    e = failure(agent_for(server), Task("q", "fail"))
    assert (e.error.kind, e.error.message) == ("target_error", "run run-1 failed: the tool backend is down")


def test_a_malformed_trajectory_is_malformed_naming_the_place(server: HarnessServer) -> None:
    e = failure(agent_for(server), Task("q", "malformed"))
    assert e.error.kind == "malformed"
    assert e.error.message == (
        "GET /runs/run-1/trajectory: steps[2].observation.results[0].source_call_id: no tool call 'c9'"
    )
