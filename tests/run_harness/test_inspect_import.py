"""Inspect AI eval logs imported as runs: real logs written by `inspect_ai.eval` against Inspect's scripted mock model
(offline, in a subprocess), read back into tasks, attempts, steps and scores; missing, foreign and unfinished logs are
refused with the file named.

Run as a script (`python test_inspect_import.py DIR`) it writes the logs the tests read into DIR."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from evalsi.run_harness.importers.inspect_log import (
    FAKE_STEP_NS,
    ImportedRun,
    InspectImportError,
    read_inspect_log,
)
from evalsi.run_harness.model import Attempt, GivenScore, InfraError, LlmCall, Step, SubAgent, ToolCall

# looked up, not imported, at collection: inspect_ai takes ~1.5 s to import, in every xdist worker
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("inspect_ai") is None,
    reason="needs inspect-ai: pip install -e '.[harness]' (the test extra has it)",
)

QUESTIONS = {"add": "What is 2+3?", "2": "Name the capital of France.", "wrong": "What colour is the sky?"}
ANSWERS = {"add": "5", "2": "Paris", "wrong": "green"}
USAGE = {"input_tokens": 20, "input_tokens_cache_read": 4, "output_tokens": 3, "total_tokens": 27, "total_cost": 0.001}


def write_logs(out: Path) -> None:
    """Run the evals the tests read and list their logs in `out/logs.json`: `arith` (3 samples, 2 epochs, `match()`,
    an `add` tool; also copied as JSON), `agentic` (a react agent calling a subagent through `as_tool()` and a tool
    that fails; one sample whose solver raises, kept by fail_on_error=False) and `failing` (the same with
    fail_on_error=True: the eval stops with an error)."""
    from inspect_ai import Task, eval
    from inspect_ai.agent import as_tool, react
    from inspect_ai.dataset import Sample
    from inspect_ai.log import read_eval_log, write_eval_log
    from inspect_ai.model import ChatMessage, ChatMessageTool, GenerateConfig, ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import includes, match
    from inspect_ai.solver import Generate, Solver, TaskState, generate, solver, use_tools
    from inspect_ai.tool import Tool, ToolChoice, ToolError, ToolInfo, tool

    @tool
    def add() -> Tool:
        async def execute(x: int, y: int) -> int:
            """Add two numbers.

            Args:
                x: The first number.
                y: The second number.
            """
            return x + y

        return execute

    @tool
    def broken() -> Tool:
        async def execute(query: str) -> str:
            """Look something up (always fails).

            Args:
                query: What to look up.
            """
            raise ToolError("the lookup service is down")

        return execute

    @solver
    def boom() -> Solver:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            if state.sample_id == "bad":
                raise RuntimeError("kaboom")
            return state

        return solve

    def script(
        messages: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice, config: GenerateConfig
    ) -> ModelOutput:
        """The mock model's turn: call the tool the conversation is at, else answer."""
        names = {t.name for t in tools}
        results = [m for m in messages if isinstance(m, ChatMessageTool)]
        question = next(m.text for m in messages if m.role == "user")
        if "helper" in names and not results:
            out = ModelOutput.for_tool_call("mockllm/model", "helper", {"input": "2+3"}, tool_call_id="call-helper")
        elif "broken" in names and len(results) == 1:
            out = ModelOutput.for_tool_call("mockllm/model", "broken", {"query": "x"}, tool_call_id="call-broken")
        elif "submit" in names:
            out = ModelOutput.for_tool_call(
                "mockllm/model", "submit", {"answer": "5"}, tool_call_id="call-submit", content=""
            )
        elif "add" in names and not results and "+" in question:
            x, y = (int(n) for n in question.rstrip("?").split()[-1].split("+"))
            out = ModelOutput.for_tool_call(
                "mockllm/model", "add", {"x": x, "y": y}, tool_call_id="call-add", content="Let me add."
            )
        elif results:
            out = ModelOutput.from_content("mockllm/model", results[-1].text)
        else:
            out = ModelOutput.from_content("mockllm/model", "Paris" if "capital" in question else "green")
        out.usage = ModelUsage(**USAGE)  # set, or mockllm counts tokens with tiktoken, which downloads its encoding
        return out

    model = get_model("mockllm/model", custom_outputs=script)
    options: dict[str, Any] = {"model": model, "log_dir": str(out), "display": "none", "sandbox": None}
    arith = Task(
        name="arith",
        dataset=[
            Sample(id="add", input=QUESTIONS["add"], target="5", metadata={"kind": "tool"}),
            Sample(id=2, input=QUESTIONS["2"], target=["Paris", "paris"]),
            Sample(id="wrong", input=QUESTIONS["wrong"], target="blue"),
        ],
        solver=[use_tools(add()), generate()],
        scorer=match(),
    )
    helper = react(name="helper", description="Adds numbers.", tools=[add()], submit=False)

    def agentic(name: str) -> Task:
        return Task(
            name=name,
            dataset=[Sample(id="a", input=QUESTIONS["add"], target="5"), Sample(id="bad", input="x", target="5")],
            solver=[boom(), react(name="main", tools=[as_tool(helper), broken()])],
            scorer=includes(),
        )

    (arith_log,) = eval(arith, epochs=2, **options)
    (agentic_log,) = eval(agentic("agentic"), fail_on_error=False, **options)
    (failing_log,) = eval(agentic("failing"), **options)
    write_eval_log(read_eval_log(arith_log.location), out / "arith.json")
    logs = {
        "arith": arith_log.location,
        "arith_json": str(out / "arith.json"),
        "agentic": agentic_log.location,
        "failing": failing_log.location,
    }
    (out / "logs.json").write_text(json.dumps(logs))


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The logs `write_logs` writes, run in a subprocess: Inspect sets the root logger's level and handlers, and
    keeps traces under the user data directory (pointed into the temporary directory here)."""
    out = tmp_path_factory.mktemp("inspect")
    env = {k: v for k, v in os.environ.items() if not k.startswith("INSPECT_")}
    env |= {
        "INSPECT_LOG_DIR": str(out),
        "INSPECT_DISPLAY": "none",
        "XDG_DATA_HOME": str(out / "data"),
        "XDG_CACHE_HOME": str(out / "cache"),
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        [sys.executable, "-P", __file__, str(out)], cwd=out, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {name: Path(p) for name, p in json.loads((out / "logs.json").read_text()).items()}


@pytest.fixture(scope="module")
def arith(logs: dict[str, Path]) -> ImportedRun:
    return read_inspect_log(logs["arith"])


@pytest.fixture(scope="module")
def agentic(logs: dict[str, Path]) -> ImportedRun:
    return read_inspect_log(logs["agentic"])


def attempt(run: ImportedRun, task_id: str, trial: int = 0) -> Attempt:
    (found,) = [a for a in run.attempts if a.task.id == task_id and a.trial == trial]
    return found


def kinds(steps: list[Step]) -> list[str]:
    return [type(s).__name__ + (f":{s.name}" if isinstance(s, ToolCall | SubAgent) else "") for s in steps]


def ns(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp()) * 1_000_000_000


def edited(src: Path, dest: Path, edit: Callable[[Any], None]) -> Path:
    """A copy of a log changed with Inspect's own model, written by Inspect (as JSON)."""
    from inspect_ai.log import read_eval_log, write_eval_log

    log = read_eval_log(src)
    edit(log)
    write_eval_log(log, dest)
    return dest


# --- a finished eval ------------------------------------------------------------------------------------------------


def test_each_sample_is_a_task_and_each_epoch_a_trial(arith: ImportedRun, logs: dict[str, Path]) -> None:
    assert arith.name == "arith"
    assert [t.id for t in arith.tasks] == ["add", "2", "wrong"]  # the dataset's order; int ids as strings
    assert {t.id: t.input for t in arith.tasks} == QUESTIONS
    assert {t.id: t.reference for t in arith.tasks} == {
        "add": {"expected_output": "5"},
        "2": {"expected_output": ["Paris", "paris"]},
        "wrong": {"expected_output": "blue"},
    }
    assert arith.tasks[0].metadata == {"kind": "tool"}

    assert len(arith.attempts) == 6
    assert [(a.task.id, a.trial) for a in arith.attempts] == [
        (task_id, trial) for task_id in ("add", "2", "wrong") for trial in (0, 1)
    ]
    assert {a.task.id: a.output for a in arith.attempts} == ANSWERS
    assert all(a.error is None and a.agent_name == "inspect" for a in arith.attempts)
    for task in arith.tasks:  # one Task object per sample id, shared by its epochs
        assert all(a.task is task for a in arith.attempts if a.task.id == task.id)

    path = logs["arith"]
    source = arith.source
    assert source["path"] == str(path)
    assert source["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (source["task"], source["task_version"], source["model"]) == ("arith", 0, "mockllm/model")
    assert (source["epochs"], source["scorers"], source["status"], source["samples"]) == (2, ["match"], "success", 6)
    assert source["format"] == "inspect_ai" and source["inspect_version"]
    json.dumps(source)  # the manifest stores it as is


def test_scorer_verdicts_are_imported_scores(arith: ImportedRun) -> None:
    for a in arith.attempts:
        correct = a.task.id != "wrong"
        assert a.scores == [
            GivenScore(
                "match",
                1.0 if correct else 0.0,
                passed=correct,
                label="C" if correct else "I",
                explanation=ANSWERS[a.task.id],  # match() explains with the answer it read
                source="imported",
            )
        ]


def test_model_calls_carry_genai_messages_tokens_and_times(arith: ImportedRun, logs: dict[str, Path]) -> None:
    a = attempt(arith, "add", 1)
    assert kinds(a.steps) == ["LlmCall", "ToolCall:add", "LlmCall"]
    first, _, last = a.steps
    assert isinstance(first, LlmCall) and isinstance(last, LlmCall)
    assert (first.provider, first.model) == ("mockllm", "model")
    assert first.input_messages == [{"role": "user", "parts": [{"type": "text", "content": "What is 2+3?"}]}]
    assert first.output_messages == [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "Let me add."},
                {"type": "tool_call", "id": "call-add", "name": "add", "arguments": {"x": 2, "y": 3}},
            ],
            "finish_reason": "tool_call",
        }
    ]
    assert first.finish_reason == "tool_call" and first.error is None
    assert last.input_messages == [
        *first.input_messages,
        {"role": "assistant", "parts": first.output_messages[0]["parts"]},  # history holds no finish reason
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call-add", "response": "5"}]},
    ]
    assert last.output_messages == [
        {"role": "assistant", "parts": [{"type": "text", "content": "5"}], "finish_reason": "stop"}
    ]
    # Inspect counts cached input apart from input_tokens; evalsi's input tokens are all of them
    assert (last.input_tokens, last.output_tokens, last.cost_usd) == (24, 3, 0.001)
    assert a.tokens == 2 * 27 and a.cost_usd == pytest.approx(0.002)

    created = ns(json.loads(logs["arith_json"].read_text())["eval"]["created"])
    assert created <= a.start_ns < created + 600 * 1_000_000_000
    assert a.start_ns <= a.steps[0].start_ns
    for step, after in itertools.pairwise(a.steps):
        assert step.start_ns <= step.end_ns <= after.start_ns
    assert a.steps[-1].end_ns <= a.end_ns


def test_tool_events_are_tool_calls(arith: ImportedRun) -> None:
    calls = [s for a in arith.attempts for s in a.steps if isinstance(s, ToolCall)]
    assert len(calls) == 2  # the add sample, in both epochs
    for call in calls:
        assert (call.name, call.call_id, call.arguments, call.result, call.error) == (
            "add",
            "call-add",
            {"x": 2, "y": 3},
            "5",
            None,
        )
    assert kinds(attempt(arith, "2").steps) == ["LlmCall"]


def test_agents_subagents_failed_tools_and_failed_samples(agentic: ImportedRun) -> None:
    a = attempt(agentic, "a")
    assert a.agent_name == "main" and a.output == "5" and a.error is None
    assert kinds(a.steps) == [
        "LlmCall",
        "ToolCall:helper",
        "SubAgent:helper",  # the agent as_tool() ran, right after the call that ran it
        "LlmCall",
        "ToolCall:broken",
        "LlmCall",
        "ToolCall:submit",
    ]
    main_call, helper_call, sub, _, broken, _, submit = a.steps
    assert isinstance(main_call, LlmCall) and main_call.input_messages[0]["role"] == "system"
    assert isinstance(sub, SubAgent) and kinds(sub.steps) == ["LlmCall", "ToolCall:add", "LlmCall"]
    assert sub.output == "5" and isinstance(helper_call, ToolCall) and helper_call.result == "5"
    assert helper_call.start_ns <= sub.start_ns <= sub.end_ns <= helper_call.end_ns
    assert len(a.llm_calls()) == 5  # the subagent's included
    assert isinstance(broken, ToolCall)
    assert (broken.arguments, broken.error, broken.result) == ({"query": "x"}, "the lookup service is down", None)
    assert isinstance(submit, ToolCall) and submit.arguments == {"answer": "5"}
    after_broken = a.steps[5]
    assert isinstance(after_broken, LlmCall)
    assert after_broken.input_messages[-1] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "call-broken", "response": "Error: the lookup service is down"}],
    }
    assert [(s.name, s.value, s.passed, s.label) for s in a.scores] == [("includes", 1.0, True, "C")]

    bad = attempt(agentic, "bad")
    assert bad.error == InfraError("target_error", "RuntimeError('kaboom')")
    assert (bad.steps, bad.output, bad.scores) == ([], None, [])
    assert bad.agent_name == "main"  # it failed before its agent ran: named like the run's other attempts
    assert bad.start_ns <= bad.end_ns


def test_json_and_eval_formats_read_alike(arith: ImportedRun, logs: dict[str, Path]) -> None:
    copy = read_inspect_log(logs["arith_json"])

    def summary(run: ImportedRun) -> list[Any]:
        return [(a.task, a.trial, a.output, a.scores, kinds(a.steps), a.start_ns, a.end_ns) for a in run.attempts]

    assert summary(copy) == summary(arith)
    assert copy.source["sha256"] != arith.source["sha256"]


# --- logs changed with Inspect's own model ---------------------------------------------------------------------------


def test_score_values_of_every_kind(logs: dict[str, Path], tmp_path: Path) -> None:
    from inspect_ai.scorer import Score

    def rescore(log: Any) -> None:
        for sample in log.samples:
            sample.scores = {
                "letters": Score(value="P", explanation="half right"),
                "judge": Score(value={"accuracy": 0.75, "verdict": "N", "ok": True}),
                "exact": Score(value=False),
                "grade": Score(value=3),
                "mood": Score(value="happy"),
                "unscored": Score.unscored(reason="grader_failed"),
            }

    run = read_inspect_log(edited(logs["arith"], tmp_path / "rescored.json", rescore))
    imported = {"source": "imported"}
    assert [s.to_dict() for s in run.attempts[0].scores] == [
        {"name": "letters", "value": 0.5, "passed": False, "label": "P", "explanation": "half right", **imported},
        {"name": "judge/accuracy", "value": 0.75, **imported},
        {"name": "judge/verdict", "value": 0.0, "passed": False, "label": "N", **imported},
        {"name": "judge/ok", "value": 1.0, "passed": True, **imported},
        {"name": "exact", "value": 0.0, "passed": False, **imported},
        {"name": "grade", "value": 3.0, **imported},
        {"name": "mood", "label": "happy", **imported},
        {"name": "unscored", "explanation": "reason: grader_failed", **imported},  # NaN: no value
    ]
    assert not any(isinstance(s.value, float) and math.isnan(s.value) for a in run.attempts for s in a.scores)


def test_a_log_without_events_gets_steps_from_messages(logs: dict[str, Path], tmp_path: Path) -> None:
    def strip(log: Any) -> None:
        for sample in log.samples:
            sample.events = []
            sample.started_at = sample.completed_at = None

    run = read_inspect_log(edited(logs["arith"], tmp_path / "no-events.json", strip))
    a = attempt(run, "add")
    assert kinds(a.steps) == ["LlmCall", "ToolCall:add", "LlmCall"]
    first, call, last = a.steps
    assert isinstance(first, LlmCall) and isinstance(call, ToolCall) and isinstance(last, LlmCall)
    assert first.input_messages == [{"role": "user", "parts": [{"type": "text", "content": "What is 2+3?"}]}]
    assert first.output_messages[0]["parts"][-1] == {
        "type": "tool_call",
        "id": "call-add",
        "name": "add",
        "arguments": {"x": 2, "y": 3},
    }
    assert (call.call_id, call.arguments, call.result) == ("call-add", {"x": 2, "y": 3}, "5")
    assert len(last.input_messages) == 3 and (first.input_tokens, last.input_tokens) == (None, 24)  # output usage
    # no times at all: a made-up clock from the log's creation, 1 ms a step, attempts one after another
    assert [s.start_ns - a.start_ns for s in a.steps] == [0, FAKE_STEP_NS, 2 * FAKE_STEP_NS]
    created = ns(run.source["created"])
    by_time = sorted(run.attempts, key=lambda x: x.start_ns)
    assert by_time[0].start_ns > created
    for earlier, later in itertools.pairwise(by_time):
        assert earlier.end_ns < later.start_ns


# --- refused --------------------------------------------------------------------------------------------------------


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.eval"
    with pytest.raises(InspectImportError, match=f"^{re.escape(str(missing))}: no such file$"):
        read_inspect_log(missing)


def test_a_json_file_that_is_no_eval_log(tmp_path: Path) -> None:
    other = tmp_path / "results.json"
    other.write_text(json.dumps({"accuracy": 0.9}))
    with pytest.raises(
        InspectImportError, match=f"^{re.escape(str(other))}: not a readable Inspect eval log: not an eval log: eval:"
    ):
        read_inspect_log(other)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(InspectImportError, match=f"^{re.escape(str(broken))}: not a readable Inspect eval log: "):
        read_inspect_log(broken)
    archive = tmp_path / "fake.eval"
    archive.write_bytes(b"PK not a zip")
    with pytest.raises(InspectImportError, match=f"^{re.escape(str(archive))}: not a readable Inspect eval log: "):
        read_inspect_log(archive)
    text = tmp_path / "log.txt"
    text.write_text("{}")
    with pytest.raises(InspectImportError, match=r"not an Inspect eval log \(expected a `\.eval` or `\.json` file\)"):
        read_inspect_log(text)


def test_an_eval_that_stopped_with_an_error_is_refused(logs: dict[str, Path]) -> None:
    path = logs["failing"]
    with pytest.raises(InspectImportError) as raised:
        read_inspect_log(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: the eval stopped with an error (RuntimeError('kaboom'))")
    assert "fail_on_error=False" in message


def test_an_unfinished_eval_is_refused(logs: dict[str, Path], tmp_path: Path) -> None:
    def unfinish(log: Any) -> None:
        log.status = "started"

    path = edited(logs["arith"], tmp_path / "running.json", unfinish)
    with pytest.raises(InspectImportError, match=f"^{re.escape(str(path))}: the eval has not finished"):
        read_inspect_log(path)


def test_without_inspect_the_error_says_what_to_install(logs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "inspect_ai.log", None)  # importing it now raises ImportError
    with pytest.raises(InspectImportError, match=r"pip install 'evalsi\[harness\]'"):
        read_inspect_log(logs["arith"])


if __name__ == "__main__":
    write_logs(Path(sys.argv[1]))
