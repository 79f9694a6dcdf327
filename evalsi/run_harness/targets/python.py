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


class PythonAgent:
    def __init__(self, config: PythonTarget, base_dir: Path) -> None:
        self.config = config
        self.base_dir = base_dir
        self.identity = f"python:{config.function}"
        self._fn: Callable[..., Any] | None = None
        self._takes_traceparent = False

    async def prepare(self, tasks: list[Task]) -> None:
        search = [*(self.base_dir / p for p in self.config.path), self.base_dir]
        self._fn = import_function(self.config.function, search)
        try:
            params = inspect.signature(self._fn).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        self._takes_traceparent = "traceparent" in params

    async def attempt(self, task: Task, ctx: AttemptContext) -> Attempt:
        assert self._fn is not None
        kwargs = {"traceparent": ctx.traceparent} if self._takes_traceparent else {}
        attempt = Attempt(task, ctx.trial)
        try:
            if inspect.iscoroutinefunction(self._fn):
                result = await self._fn(task.input, **kwargs)
            else:
                result = await asyncio.to_thread(self._fn, task.input, **kwargs)
        except AttemptFailed:
            raise
        except Exception as e:
            raise AttemptFailed("crash", f"{self.config.function} raised {type(e).__name__}: {e}") from None
        attempt.end_ns = time.time_ns()
        if isinstance(result, dict) and ("output" in result or "trajectory" in result):
            if "trajectory" in result:
                attempt.steps = steps_from(result["trajectory"], attempt.start_ns)
            result = result.get("output")
        if isinstance(result, str):
            attempt.output = result
        elif result is not None:
            attempt.output_json = result
        return attempt

    async def close(self) -> None:
        return None
