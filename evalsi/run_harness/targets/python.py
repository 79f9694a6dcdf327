"""The `python` target: a callable `module:function(input)`, sync (run in a thread) or async, returning the output
(a string, a JSON object, or `{"output": ..., "trajectory": [...steps...]}`)."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalsi.run_harness.model import Attempt, LlmCall, Step, Task, ToolCall, text_message
from evalsi.run_harness.spec import PythonTarget
from evalsi.run_harness.targets.base import AttemptContext, AttemptFailed, TargetError


def import_function(ref: str, search: list[Path] | None = None) -> Callable[..., Any]:
    """`module:function` imported (with `search` directories first on sys.path); TargetError says what failed."""
    for d in reversed(search or []):
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
    module_name, _, name = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise TargetError(f"cannot import {module_name!r} for {ref}: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise TargetError(f"{module_name} has no function {name!r} ({ref})")
    return fn


def steps_from(trajectory: Any, start_ns: int) -> list[Step]:
    """Steps a callable returned as plain data: `{"type": "llm", "model", "input", "output", "input_tokens",
    "output_tokens", "cost_usd"}` (input/output: text or messages) and `{"type": "tool", "name", "arguments",
    "result", "error"}`, in order; times spaced 1 µs apart from `start_ns` unless given (`start_ns`, `end_ns`)."""
    if not isinstance(trajectory, list):
        raise AttemptFailed("malformed", f"trajectory must be a list of steps, not {type(trajectory).__name__}")
    steps: list[Step] = []
    t = start_ns
    for i, raw in enumerate(trajectory):
        if not isinstance(raw, dict) or raw.get("type") not in ("llm", "tool"):
            raise AttemptFailed("malformed", f"trajectory[{i}]: expected an object with type 'llm' or 'tool'")
        begin, end = int(raw.get("start_ns", t)), int(raw.get("end_ns", t + 1000))
        t = end + 1000
        if raw["type"] == "llm":
            steps.append(
                LlmCall(
                    model=str(raw.get("model", "")),
                    input_messages=_messages(raw.get("input"), "user"),
                    output_messages=_messages(raw.get("output"), "assistant"),
                    start_ns=begin,
                    end_ns=end,
                    input_tokens=raw.get("input_tokens"),
                    output_tokens=raw.get("output_tokens"),
                    cost_usd=raw.get("cost_usd"),
                )
            )
        else:
            if not isinstance(raw.get("name"), str):
                raise AttemptFailed("malformed", f"trajectory[{i}]: a tool step needs a name")
            steps.append(
                ToolCall(
                    name=raw["name"],
                    call_id=str(raw.get("id", f"call_{i}")),
                    arguments=raw.get("arguments"),
                    result=raw.get("result"),
                    start_ns=begin,
                    end_ns=end,
                    error=raw.get("error"),
                )
            )
    return steps


def _messages(value: Any, role: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
        return value
    return [text_message(role, value if isinstance(value, str) else str(value))]


def read_result(attempt: Attempt, result: Any, start_ns: int) -> str | None:
    """Put a function's result in the attempt: its steps (a `trajectory`) added, its output set; the output text."""
    if isinstance(result, dict) and ("output" in result or "trajectory" in result):
        if "trajectory" in result:
            attempt.steps.extend(steps_from(result["trajectory"], start_ns))
        result = result.get("output")
    if isinstance(result, str):
        attempt.output = result
    elif result is not None:
        attempt.output_json = result
    return attempt.output_text


class _Session:
    """A conversation with a function taking `messages`: each reply calls it with the user's message and the
    conversation so far (`{"role", "content"}` dicts, the new message last)."""

    def __init__(self, agent: PythonAgent, task: Task, ctx: AttemptContext) -> None:
        self.agent = agent
        self.ctx = ctx
        self.attempt = Attempt(task, ctx.trial)
        self.messages: list[dict[str, str]] = []

    async def reply(self, text: str) -> str:
        self.messages.append({"role": "user", "content": text})
        start = time.time_ns()
        result = await self.agent.call(text, self.ctx, messages=list(self.messages))
        answer = read_result(self.attempt, result, start) or ""
        self.messages.append({"role": "assistant", "content": answer})
        return answer


class PythonAgent:
    def __init__(self, config: PythonTarget, base_dir: Path) -> None:
        self.config = config
        self.base_dir = base_dir
        self.identity = f"python:{config.function}"
        self._fn: Callable[..., Any] | None = None
        self._params: set[str] = set()

    @property
    def holds_conversations(self) -> bool:
        """A function taking `messages` (the conversation so far) can hold a multi-turn conversation."""
        return "messages" in self._params

    async def prepare(self, tasks: list[Task]) -> None:
        search = [*(self.base_dir / p for p in self.config.path), self.base_dir]
        self._fn = import_function(self.config.function, search)
        try:
            self._params = set(inspect.signature(self._fn).parameters)
        except (TypeError, ValueError):
            self._params = set()

    async def call(self, task_input: Any, ctx: AttemptContext, **extra: Any) -> Any:
        """The function's result for one input (`traceparent` and `workdir` given when it takes them)."""
        assert self._fn is not None
        kwargs = dict(extra)
        if "traceparent" in self._params:
            kwargs["traceparent"] = ctx.traceparent
        if "workdir" in self._params and ctx.workdir is not None:
            kwargs["workdir"] = str(ctx.workdir)
        try:
            if inspect.iscoroutinefunction(self._fn):
                return await self._fn(task_input, **kwargs)
            return await asyncio.to_thread(self._fn, task_input, **kwargs)
        except AttemptFailed:
            raise
        except Exception as e:
            raise AttemptFailed("crash", f"{self.config.function} raised {type(e).__name__}: {e}") from None

    async def attempt(self, task: Task, ctx: AttemptContext) -> Attempt:
        attempt = Attempt(task, ctx.trial)
        result = await self.call(task.input, ctx)
        attempt.end_ns = time.time_ns()
        read_result(attempt, result, attempt.start_ns)
        return attempt

    async def open_session(self, task: Task, ctx: AttemptContext) -> _Session:
        if not self.holds_conversations:
            raise AttemptFailed("target_error", f"{self.config.function} takes no `messages`: it cannot converse")
        return _Session(self, task, ctx)

    async def close(self) -> None:
        return None
