"""What an offline run is made of: the tasks of a dataset, and each attempt of a target at a task (its answer, its
steps as user turns, LLM and tool calls, the faults injected into them, the scores given outside the collector's
evaluators such as a task checker's verdict, and the infrastructure error that stopped it, if any)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Message = dict[str, Any]
"""A chat message in the GenAI semantic conventions' JSON shape: `{"role": ..., "parts": [{"type": "text",
"content": ...}, {"type": "tool_call", "id", "name", "arguments"}, {"type": "tool_call_response", "id",
"response"}]}` (what `gen_ai.input.messages` / `gen_ai.output.messages` hold)."""


class DatasetError(ValueError):
    """A dataset that cannot be run; `errors` lists every bad row as `<file>:<line>: message`."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


@dataclass(frozen=True)
class Task:
    """One dataset record. `reference` is what evaluators read (`expected_output`, `expected_tools`,
    `reference_trajectory`, ...); `line` is where the record is in its file (1-based), for error messages."""

    id: str
    input: Any
    reference: dict[str, Any] = field(default_factory=dict)
    context: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    line: int = 0
    folder: Path | None = None
    """The task folder (`task.yaml`, scripts, files) the task comes from, if any."""

    @property
    def input_text(self) -> str:
        """The input as a user message's text: a string as is, an object's `question`/`input`/`prompt`, else JSON."""
        if isinstance(self.input, str):
            return self.input
        if isinstance(self.input, dict):
            for key in ("question", "input", "prompt", "query"):
                if isinstance(self.input.get(key), str):
                    return self.input[key]
        return json.dumps(self.input, sort_keys=True, ensure_ascii=False, default=str)


@dataclass
class LlmCall:
    """One model call (a `chat` span)."""

    model: str
    input_messages: list[Message]
    output_messages: list[Message]
    start_ns: int
    end_ns: int
    provider: str = ""
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    finish_reason: str | None = None
    error: str | None = None


FaultKind = Literal["error", "timeout", "malformed", "latency"]


@dataclass(frozen=True)
class Fault:
    """A fault injected into a tool call on purpose (`faults:` in the run spec): an `evalsi.fault` span event."""

    kind: FaultKind
    detail: str


@dataclass
class ToolCall:
    """One tool execution (an `execute_tool` span)."""

    name: str
    call_id: str
    arguments: Any
    result: Any
    start_ns: int
    end_ns: int
    error: str | None = None
    faults: list[Fault] = field(default_factory=list)


@dataclass
class UserTurn:
    """A (simulated) user's message in a multi-turn task: a `user` step of the trace. `stop` marks the turn that ends
    the conversation; `model` is set when an LLM wrote it."""

    text: str
    start_ns: int
    end_ns: int
    stop: bool = False
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass
class SubAgent:
    """A subagent's run inside the attempt (an `invoke_agent` span with its own steps)."""

    name: str
    steps: list[Step]
    start_ns: int
    end_ns: int
    output: str | None = None


Step = LlmCall | ToolCall | SubAgent | UserTurn

InfraKind = Literal[
    "timeout", "target_error", "crash", "budget", "malformed", "not_stored", "environment", "checker", "cassette_miss"
]


@dataclass(frozen=True)
class InfraError:
    """Why an attempt has no result to judge: the infrastructure failed, not the agent's answer. Such attempts are
    reported apart and left out of every quality metric."""

    kind: InfraKind
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(frozen=True)
class GivenScore:
    """A score an attempt brings with it rather than one the collector's evaluators compute: a task checker's verdict
    (source `checker`), or an imported harness's scorer (source `imported`). Stored with the run's key like the
    others."""

    name: str
    value: float | None = None
    passed: bool | None = None
    label: str | None = None
    explanation: str | None = None
    source: str = "checker"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Attempt:
    """A target's attempt at one task in one trial."""

    task: Task
    trial: int
    output: str | None = None
    output_json: Any = None
    steps: list[Step] = field(default_factory=list)
    agent_name: str = ""
    start_ns: int = field(default_factory=time.time_ns)
    end_ns: int = 0
    error: InfraError | None = None
    trace_id: str = ""
    scores: list[GivenScore] = field(default_factory=list)

    @property
    def output_text(self) -> str | None:
        """The answer evaluators read: the text, else the JSON output as canonical JSON (sorted keys)."""
        if self.output is not None:
            return self.output
        if self.output_json is not None:
            return json.dumps(self.output_json, sort_keys=True, ensure_ascii=False, default=str)
        return None

    def earliest_ns(self) -> int:
        """The earliest start of the attempt or any of its steps (an agent's own timestamps may be older)."""
        return min([self.start_ns, *(_starts(self.steps))])

    def llm_calls(self) -> list[LlmCall]:
        """Every model call, subagents' included."""
        return _llm_calls(self.steps)

    @property
    def cost_usd(self) -> float:
        return sum(c.cost_usd or 0.0 for c in self.llm_calls())

    @property
    def tokens(self) -> int:
        return sum((c.input_tokens or 0) + (c.output_tokens or 0) for c in self.llm_calls())


def _starts(steps: list[Step]) -> list[int]:
    out = []
    for step in steps:
        out.append(step.start_ns)
        if isinstance(step, SubAgent):
            out.extend(_starts(step.steps))
    return out


def faults_of(steps: list[Step]) -> list[Fault]:
    """Every fault injected into the attempt's tool calls, subagents' included."""
    out: list[Fault] = []
    for step in steps:
        if isinstance(step, ToolCall):
            out.extend(step.faults)
        elif isinstance(step, SubAgent):
            out.extend(faults_of(step.steps))
    return out


def _llm_calls(steps: list[Step]) -> list[LlmCall]:
    out: list[LlmCall] = []
    for step in steps:
        if isinstance(step, LlmCall):
            out.append(step)
        elif isinstance(step, SubAgent):
            out.extend(_llm_calls(step.steps))
    return out


def text_message(role: str, text: str) -> Message:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


class AttemptFailed(Exception):
    """An attempt failed for the infrastructure (timeout, 5xx, crash, malformed trajectory): raised by a target,
    turned into `Attempt.error` by the runner, counted apart, never scored."""

    def __init__(self, kind: InfraKind, message: str, attempt: Attempt | None = None) -> None:
        super().__init__(message)
        self.error = InfraError(kind, message)
        self.attempt = attempt
        """What the attempt did before it failed (its steps, tokens and cost count toward budgets and are traced)."""
