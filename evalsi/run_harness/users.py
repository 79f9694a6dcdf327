"""Simulated users for multi-turn tasks (scripted turns, a Python function, or a model given a persona and a goal, in
the style of τ-bench), and the conversation between one of them and a target, every turn a step of the attempt."""

from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path
from typing import Any, Protocol

from evalsi.run_harness.model import Attempt, Message, Task, UserTurn, text_message
from evalsi.run_harness.spec import OpenAITarget, UserSpec
from evalsi.run_harness.targets.base import AgentTarget, AttemptContext, AttemptFailed, TargetError, conversational
from evalsi.run_harness.targets.python import import_function

USER_PROMPT = """You play a user talking to a customer-facing AI agent. Stay in character; never say you are an AI.
{persona}
Your goal (do not reveal it all at once; give details only when asked):
{instruction}

Write only your next message to the agent.
When your goal is met, or the agent cannot meet it, reply with {stop} alone."""
"""The LLM user's system prompt (τ-bench's rules, in short)."""


def user_goal(task: Task) -> dict[str, Any]:
    """A task's `metadata.user`: `instruction`, `persona`, `turns` (all optional)."""
    value = task.metadata.get("user")
    return value if isinstance(value, dict) else {}


def is_conversation(task: Task, spec: UserSpec | None) -> bool:
    return spec is not None or bool(user_goal(task))


class SimulatedUser(Protocol):
    async def reply(self, task: Task, messages: list[Message], ctx: AttemptContext) -> UserTurn:
        """The user's next message after `messages` (the conversation so far: user and assistant text)."""
        ...

    async def close(self) -> None: ...


def _turn(text: str, start_ns: int, marker: str, **kwargs: Any) -> UserTurn:
    return UserTurn(text=text, start_ns=start_ns, end_ns=time.time_ns(), stop=marker in text, **kwargs)


class ScriptedUser:
    """Replies from a list, in order: the task's `metadata.user.turns`, else the run spec's `user.scripted`. When
    they run out, the stop marker."""

    def __init__(self, turns: list[str], marker: str) -> None:
        self.turns = turns
        self.marker = marker

    async def reply(self, task: Task, messages: list[Message], ctx: AttemptContext) -> UserTurn:
        start = time.time_ns()
        turns = user_goal(task).get("turns", self.turns)
        if not isinstance(turns, list):
            raise AttemptFailed("malformed", f"task {task.id}: metadata.user.turns is not a list of strings")
        said = sum(1 for m in messages if m["role"] == "user") - (1 if task.input is not None else 0)
        return _turn(str(turns[said]) if said < len(turns) else self.marker, start, self.marker)

    async def close(self) -> None:
        return None


class PythonUser:
    """`module:function(task, messages)` (sync or async) returning the next message, or None to end."""

    def __init__(self, ref: str, base_dir: Path, marker: str) -> None:
        self.fn = import_function(ref, [base_dir])
        self.marker = marker

    async def reply(self, task: Task, messages: list[Message], ctx: AttemptContext) -> UserTurn:
        start = time.time_ns()
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(task, messages)
        else:
            result = await asyncio.to_thread(self.fn, task, messages)
        if result is None:
            return _turn(self.marker, start, self.marker)
        return _turn(str(result), start, self.marker)

    async def close(self) -> None:
        return None


class LlmUser:
    """A model plays the user: persona and goal in the system prompt, the conversation with roles swapped (the
    agent's messages are its `user` messages). Calls go through the built-in agent's client (retries, cassettes)."""

    def __init__(self, spec: UserSpec, base_dir: Path) -> None:
        from evalsi.run_harness.targets.openai import OpenAIAgent

        assert spec.llm is not None
        llm = spec.llm
        self.spec = spec
        self.persona = llm.persona
        self.client = OpenAIAgent(
            OpenAITarget(base_url=llm.base_url, model=llm.model, api_key=llm.api_key, temperature=llm.temperature,
                         price=llm.price),
            path=[base_dir],
        )  # fmt: skip
        self._ready: asyncio.Lock | None = None
        self._prepared = False

    async def _prepare(self) -> None:
        """Read the key, start the bundled stub for `base_url: stub`: once, before the first turn."""
        if self._ready is None:
            self._ready = asyncio.Lock()
        async with self._ready:
            if not self._prepared:
                await self.client.prepare([])
                self._prepared = True

    async def reply(self, task: Task, messages: list[Message], ctx: AttemptContext) -> UserTurn:
        await self._prepare()
        start = time.time_ns()
        goal = user_goal(task)
        persona = goal.get("persona") or self.persona or ""
        instruction = goal.get("instruction") or task.input_text
        system = USER_PROMPT.format(persona=persona, instruction=instruction, stop=self.spec.stop_marker)
        wire: list[dict[str, Any]] = [{"role": "system", "content": system}]
        if not messages:
            wire.append({"role": "user", "content": "(The agent is waiting. Write your first message.)"})
        for m in messages:
            text = "".join(p.get("content", "") for p in m["parts"] if p.get("type") == "text")
            wire.append({"role": "assistant" if m["role"] == "user" else "user", "content": text})
        deadline = time.monotonic() + ctx.timeout_s
        reply, _, _ = await self.client.complete(wire, deadline, ctx, kind="user", tools=False)
        return _turn(
            (reply.text or self.spec.stop_marker).strip(), start, self.spec.stop_marker,
            model=self.client.spec.model, input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
        )  # fmt: skip

    async def close(self) -> None:
        await self.client.close()


def make_user(spec: UserSpec | None, base_dir: Path) -> SimulatedUser:
    """The run's user (a scripted one with no turns, i.e. ending after the first reply, when the spec has none)."""
    if spec is None:
        spec = UserSpec()
    if spec.llm is not None:
        return LlmUser(spec, base_dir)
    if spec.python is not None:
        try:
            return PythonUser(spec.python, base_dir, spec.stop_marker)
        except Exception as e:
            raise TargetError(f"spec.user.python: {e}") from None
    return ScriptedUser(spec.scripted or [], spec.stop_marker)


async def converse(
    target: AgentTarget, user: SimulatedUser, task: Task, ctx: AttemptContext, spec: UserSpec | None
) -> Attempt:
    """Talk until the user stops (its stop marker) or the agent has replied `max_turns` times. The first message is
    the task's input, or, for a task with none, the user's own opening. Each user message is a `UserTurn` step; the
    agent's steps follow it; the attempt's output is the agent's last reply."""
    if not conversational(target):
        raise AttemptFailed("target_error", f"task {task.id} is a conversation; this target cannot hold one")
    max_turns = spec.max_turns if spec is not None else UserSpec().max_turns
    session = await target.open_session(task, ctx)  # type: ignore[attr-defined]
    attempt: Attempt = session.attempt
    messages: list[Message] = []
    try:
        if task.input is not None:
            now = time.time_ns()
            turn = UserTurn(text=task.input_text, start_ns=now, end_ns=now)
        else:
            turn = await user.reply(task, messages, ctx)
        attempt.steps.append(turn)
        for replies in range(1, max_turns + 1):
            if turn.stop:
                break
            messages.append(text_message("user", turn.text))
            answer = await session.reply(turn.text)
            attempt.output = answer
            messages.append(text_message("assistant", answer))
            if replies == max_turns:
                break
            turn = await user.reply(task, messages, ctx)
            attempt.steps.append(turn)
    except AttemptFailed as e:
        attempt.end_ns = time.time_ns()
        attempt.error = e.error
        e.attempt = attempt
        raise
    attempt.end_ns = time.time_ns()
    return attempt
