"""The built-in reference agent (`target: {openai: ...}`): a tool-calling loop over any OpenAI-compatible Chat
Completions endpoint.

Its tools are Python functions `module:function` (sync or async), each one's JSON schema made from its signature,
type hints and docstring (or taken from its `__tool_schema__`), or, with `mock_tools`, answers read from each task's
`metadata.tool_results`. Every model call is recorded as an `LlmCall` and every tool execution as a `ToolCall`.

Whose failure is what: the endpoint's failures are the infrastructure's (`AttemptFailed`: 5xx, 429 and refused
connections are retried with `Backoff` first, then `target_error`; another 4xx is `target_error` at once; a reply
that is no Chat Completions JSON is `malformed`; spent `max_steps` / `max_tokens` are `budget`); a tool that raises
or is called wrongly is the agent's behaviour: the model gets `{"error": "..."}` as the result and the loop goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from evalsi.run_harness.cassette import Kind
from evalsi.run_harness.model import Attempt, LlmCall, Message, Task, ToolCall
from evalsi.run_harness.spec import OpenAITarget
from evalsi.run_harness.stub_llm import StubLLM
from evalsi.run_harness.targets.base import AttemptContext, AttemptFailed, TargetError
from evalsi.run_harness.tools import MockResults, Tool, json_safe, load_tool, result_text
from evalsi.runtime.backoff import Backoff, retry_after

if TYPE_CHECKING:
    from evalsi.run_harness.mcp_tools import McpTools

STUB = "stub"
"""`base_url: stub` runs the bundled stub model (`evalsi.run_harness.stub_llm`) for the run."""
AGENT_NAME = "evalsi-openai-agent"
"""`Attempt.agent_name` of this agent's attempts."""
PROVIDER = "openai"
DEFAULT_RETRIES = 3
"""Retries of a model call after a 5xx, a 429 or a failed connection (so 4 tries in all)."""
DEFAULT_BACKOFF = Backoff(initial=0.5, maximum=8.0, max_retry_after=60.0)

# --- the wire format ----------------------------------------------------------------------------------------------


@dataclass
class _Reply:
    text: str | None
    tool_calls: list[tuple[str, str, str]]  # (id, name, arguments as sent)
    finish_reason: str | None
    input_tokens: int | None
    output_tokens: int | None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _parse_reply(data: Any, step: int) -> _Reply:
    """A Chat Completions reply; ValueError saying what is missing when it is none."""
    if not isinstance(data, dict):
        raise ValueError("the reply is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the reply has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ValueError("the reply has no choices[0].message")
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    elif content is not None and not isinstance(content, str):
        raise ValueError("choices[0].message.content is neither text nor null")
    if not content and isinstance(message.get("refusal"), str):
        content = message["refusal"]
    calls: list[tuple[str, str, str]] = []
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ValueError("choices[0].message.tool_calls is not a list")
    for i, call in enumerate(raw_calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"choices[0].message.tool_calls[{i}] has no function name")
        arguments = fn.get("arguments")
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{step}_{i}"
        calls.append((call_id, fn["name"], arguments))
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    reason = choices[0].get("finish_reason")
    return _Reply(
        text=content if isinstance(content, str) else None,
        tool_calls=calls,
        finish_reason=reason if isinstance(reason, str) else None,
        input_tokens=_count(usage.get("prompt_tokens", usage.get("input_tokens"))),
        output_tokens=_count(usage.get("completion_tokens", usage.get("output_tokens"))),
    )


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _error_detail(response: httpx.Response) -> str:
    """What a failed response says: its `error.message` (OpenAI's shape), `message` or `detail`, else its text."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        for key in ("error", "message", "detail"):
            if isinstance(body.get(key), str):
                return body[key]
    return response.text.strip()[:300] or response.reason_phrase


class _Clients:
    """The HTTP clients of an agent. One `httpx.AsyncClient`'s pool costs more CPU per request the more connections
    and waiting requests it holds (encode/httpx#3215: 32 at once, a third of the throughput of 4 at once), so the
    requests are spread over as many clients as it takes for each to have at most `PER_CLIENT` in flight. A client
    given by the caller is the only one used, and is not closed."""

    PER_CLIENT = 8

    def __init__(self, given: httpx.AsyncClient | None = None) -> None:
        self._given = given
        self._clients: list[list[Any]] = []  # [client, requests in flight]

    @contextlib.contextmanager
    def lease(self) -> Iterator[httpx.AsyncClient]:
        if self._given is not None:
            yield self._given
            return
        entry = min(self._clients, key=lambda e: e[1], default=None)
        if entry is None or entry[1] >= self.PER_CLIENT:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=self.PER_CLIENT * 2)
            entry = [httpx.AsyncClient(limits=limits, timeout=300.0), 0]
            self._clients.append(entry)
        entry[1] += 1
        try:
            yield entry[0]
        finally:
            entry[1] -= 1

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        for client, _ in clients:
            await client.aclose()


# --- the agent ----------------------------------------------------------------------------------------------------


class _Refused(Exception):
    """A tool call the agent cannot make (unknown tool, arguments not an object, no mocked result left): its
    message is the call's error as is."""


async def _recordable(execute: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
    result, error = await _outcome(execute)
    return {"result": result} if error is None else {"error": error}


async def _outcome(execute: Callable[[], Awaitable[Any]]) -> tuple[Any, str | None]:
    """A tool call's (result, error): a tool's exception is its error, as `Type: message`."""
    try:
        return await execute(), None
    except _Refused as e:
        return None, str(e)
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"


class _Session:
    """The built-in agent's side of one conversation: the messages so far, as sent and in the GenAI shape."""

    def __init__(self, agent: OpenAIAgent, task: Task, ctx: AttemptContext) -> None:
        self.agent = agent
        self.ctx = ctx
        self.attempt = Attempt(task=task, trial=ctx.trial, agent_name=AGENT_NAME)
        self.deadline = time.monotonic() + ctx.timeout_s
        self.wire: list[dict[str, Any]] = []
        self.sent: list[Message] = []
        self.tokens = 0
        self.mocks = MockResults(task.metadata.get("tool_results")) if agent.spec.mock_tools else None
        system = agent.spec.system
        if system:
            self.wire.append({"role": "system", "content": system})
            self.sent.append({"role": "system", "parts": [{"type": "text", "content": system}]})

    async def reply(self, text: str) -> str:
        self.wire.append({"role": "user", "content": text})
        self.sent.append({"role": "user", "parts": [{"type": "text", "content": text}]})
        return await self.agent._turn(self, self.ctx, self.attempt)


class OpenAIAgent:
    """The reference agent for an `OpenAITarget` spec. `path`: directories put first on `sys.path` before the tools
    are imported (the run file's directory, say); `retries` and `backoff` (a template, copied per model call): how
    a model call's 5xx, 429 and connection failures are retried; `client`: an `httpx.AsyncClient` to use instead
    of its own (not closed by `close`)."""

    def __init__(
        self,
        spec: OpenAITarget,
        *,
        path: Sequence[str | Path] = (),
        retries: int = DEFAULT_RETRIES,
        backoff: Backoff | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.spec = spec
        self.base_url = spec.base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.identity = f"openai:{self.base_url}#{spec.model}"
        self.path = list(path)
        self.retries = retries
        self.backoff = backoff or DEFAULT_BACKOFF
        self.tools: dict[str, Tool] = {}
        self._headers: dict[str, str] = {}
        self._tool_definitions: list[dict[str, Any]] = []
        self._clients = _Clients(client)
        self._prepared = False
        self._stub: StubLLM | None = None
        self._mcp: McpTools | None = None

    # --- the target interface ---

    async def prepare(self, tasks: list[Task]) -> None:
        """Read the API key, import the tools and make their schemas, check the mocked results' shape; every
        problem is a line of one `TargetError`."""
        problems: list[str] = []
        if self.spec.base_url == STUB and self._stub is None:
            # the bundled stub model (examples, tests): no key, no network
            self._stub = StubLLM().start()
            self.base_url = self._stub.base_url
            self.url = f"{self.base_url}/chat/completions"
        headers = {}
        key = self.spec.api_key
        if key and key.startswith("env:"):
            var = key[4:]
            key = os.environ.get(var)
            if not key:
                problems.append(f"api_key: the environment variable {var} is not set")
        if key:
            headers["authorization"] = f"Bearer {key}"
        tools: dict[str, Tool] = {}
        for ref in self.spec.tools:
            try:
                tool = load_tool(ref, self.path)
            except TargetError as e:
                problems.append(str(e))
                continue
            if tool.name in tools:
                problems.append(f"tool {ref!r}: {tools[tool.name].ref} is named {tool.name!r} too")
            tools[tool.name] = tool
        if self.spec.mock_tools:
            for task in tasks:
                if not isinstance(task.metadata.get("tool_results", {}), dict):
                    where = f" (line {task.line})" if task.line else ""
                    problems.append(f"task {task.id}{where}: metadata.tool_results is not an object {{tool: result}}")
        if problems:
            raise TargetError("\n".join(problems))
        if self.spec.mcp and self._mcp is None:
            from evalsi.run_harness.mcp_tools import McpTools  # the `mcp` SDK: only when a run uses MCP

            self._mcp = McpTools(self.spec.mcp, Path(self.path[0]) if self.path else Path.cwd())
            for tool in await self._mcp.open():
                if tool.name in tools:
                    problems.append(f"MCP tool {tool.ref!r}: {tools[tool.name].ref} is named {tool.name!r} too")
                tools[tool.name] = tool
            if problems:
                await self._mcp.aclose()
                self._mcp = None
                raise TargetError("\n".join(problems))
        self._headers, self.tools = headers, tools
        self._tool_definitions = [t.definition() for t in tools.values()]
        self._prepared = True

    async def attempt(self, task: Task, ctx: AttemptContext) -> Attempt:
        """Run the loop: ask the model, run the tools it calls, until it answers without calling one. A failure of
        the infrastructure raises `AttemptFailed` (with the attempt so far as its `attempt` attribute)."""
        session = await self.open_session(task, ctx)
        attempt = session.attempt
        try:
            attempt.output = await session.reply(task.input_text)
        except AttemptFailed as e:
            attempt.end_ns = time.time_ns()
            attempt.error = e.error
            e.attempt = attempt  # the steps so far: traced, and counted toward the run's budget
            raise
        attempt.end_ns = time.time_ns()
        return attempt

    async def open_session(self, task: Task, ctx: AttemptContext) -> _Session:
        """A conversation with a user: each `reply` runs the loop for the user's next message, the messages before
        kept (tool calls and results included)."""
        if not self._prepared:
            await self.prepare([task])
        return _Session(self, task, ctx)

    async def close(self) -> None:
        await self._clients.aclose()
        if self._mcp is not None:
            await self._mcp.aclose()
            self._mcp = None
        self._prepared = False
        if self._stub is not None:
            self._stub.stop()
            self._stub = None

    # --- the loop ---

    async def complete(
        self,
        wire: list[dict[str, Any]],
        deadline: float,
        ctx: AttemptContext,
        *,
        kind: Kind = "model",
        tools: bool = True,
    ) -> tuple[_Reply, int, int]:
        """One model call (through the attempt's cassette, if any): the parsed reply, its start and end (ns)."""
        body: dict[str, Any] = {"model": self.spec.model, "messages": wire, "temperature": self.spec.temperature}
        if tools and self._tool_definitions:
            body["tools"] = self._tool_definitions
        start = time.time_ns()
        if ctx.tape is not None:
            data, recorded = await ctx.tape.exchange(kind, body, lambda: self._post(body, deadline, ctx))
        else:
            data, recorded = await self._post(body, deadline, ctx), None
        end = start + recorded if recorded is not None else time.time_ns()
        try:
            reply = _parse_reply(data, len(wire))
        except ValueError as e:
            raise AttemptFailed("malformed", f"POST {self.url}: {e}: {json.dumps(data)[:200]}") from None
        return reply, start, end

    async def _turn(self, session: _Session, ctx: AttemptContext, attempt: Attempt) -> str:
        """The loop for one user message: model calls and tool runs until the model answers without a tool call."""
        spec = self.spec
        wire, sent = session.wire, session.sent
        mocks = session.mocks
        for step in range(spec.max_steps):
            reply, start, end = await self.complete(wire, session.deadline, ctx)
            parts: list[dict[str, Any]] = []
            if reply.text:
                parts.append({"type": "text", "content": reply.text})
            for call_id, name, arguments in reply.tool_calls:
                parts.append({"type": "tool_call", "id": call_id, "name": name, "arguments": _arguments(arguments)})
            out: Message = {"role": "assistant", "parts": parts, "finish_reason": reply.finish_reason or "stop"}
            attempt.steps.append(
                LlmCall(
                    model=spec.model,
                    input_messages=list(sent),
                    output_messages=[out],
                    start_ns=start,
                    end_ns=end,
                    provider=PROVIDER,
                    input_tokens=reply.input_tokens,
                    output_tokens=reply.output_tokens,
                    cost_usd=self._cost(reply),
                    finish_reason=reply.finish_reason,
                )
            )
            session.tokens += (reply.input_tokens or 0) + (reply.output_tokens or 0)
            if spec.max_tokens is not None and session.tokens > spec.max_tokens:
                raise AttemptFailed(
                    "budget", f"{session.tokens} tokens used in {step + 1} model calls, over max_tokens"
                )
            if not reply.tool_calls:
                wire.append({"role": "assistant", "content": reply.text or ""})
                sent.append({"role": "assistant", "parts": parts})
                return reply.text or ""
            if step + 1 >= spec.max_steps:
                break
            wire.append(
                {
                    "role": "assistant",
                    "content": reply.text,
                    "tool_calls": [
                        {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                        for i, n, a in reply.tool_calls
                    ],
                }
            )
            sent.append({"role": "assistant", "parts": parts})
            calls = await self._run_tools(reply.tool_calls, mocks, ctx)
            attempt.steps.extend(calls)
            for call in calls:
                response = {"error": call.error} if call.error is not None else call.result
                wire.append({"role": "tool", "tool_call_id": call.call_id, "content": result_text(response)})
                sent.append(
                    {
                        "role": "tool",
                        "parts": [{"type": "tool_call_response", "id": call.call_id, "response": response}],
                    }
                )
        raise AttemptFailed(
            "budget", f"no answer after max_steps={spec.max_steps} model calls: the last one still called tools"
        )

    def _cost(self, reply: _Reply) -> float | None:
        price = self.spec.price
        if not price or (reply.input_tokens is None and reply.output_tokens is None):
            return None
        return (
            (reply.input_tokens or 0) * price.get("input", 0.0) + (reply.output_tokens or 0) * price.get("output", 0.0)
        ) / 1e6

    async def _run_tools(
        self, tool_calls: list[tuple[str, str, str]], mocks: MockResults | None, ctx: AttemptContext
    ) -> list[ToolCall]:
        """Run one reply's tool calls at the same time (mocked ones in call order); results in the order of the
        calls."""
        return list(await asyncio.gather(*(self._run_tool(*call, mocks, ctx) for call in tool_calls)))

    async def _run_tool(
        self, call_id: str, name: str, raw: str, mocks: MockResults | None, ctx: AttemptContext
    ) -> ToolCall:
        """One tool call: through the attempt's faults, then its cassette, then the tool (or its mocked result)."""
        start = time.time_ns()
        arguments = _arguments(raw)
        taken = mocks.take(name) if mocks is not None else None  # taken now: mocked lists are used in call order

        async def execute() -> Any:
            if taken is not None:
                result, why = taken
                if why is not None:
                    raise _Refused(why)
                return json_safe(result)
            tool = self.tools.get(name)
            if tool is None:
                raise _Refused(f"unknown tool {name!r}; the tools are: {', '.join(self.tools) or 'none'}")
            if not isinstance(arguments, dict):
                raise _Refused(f"the arguments are not a JSON object: {raw[:200]}")
            return json_safe(await tool.call(arguments))

        timing: list[int | None] = []

        async def recorded() -> tuple[Any, str | None]:
            if ctx.tape is None:
                return await _outcome(execute)
            request = {"name": name, "arguments": arguments}
            outcome, duration = await ctx.tape.exchange("tool", request, lambda: _recordable(execute))
            timing.append(duration)
            return outcome.get("result"), outcome.get("error")

        if ctx.faults is not None:
            result, error, faults = await ctx.faults.call(name, recorded)
        else:
            (result, error), faults = await recorded(), []
        end = start + timing[0] if timing and timing[0] is not None else time.time_ns()
        return ToolCall(name, call_id, arguments, result, start, end, error, faults)

    # --- HTTP ---

    async def _post(self, body: dict[str, Any], deadline: float, ctx: AttemptContext) -> Any:
        """POST the chat request, retrying 5xx, 429 and connection failures (as `Backoff` and Retry-After say, while
        the attempt has time); the reply's JSON."""
        headers = dict(self._headers)
        if ctx.traceparent:
            headers["traceparent"] = ctx.traceparent
        backoff = dataclasses.replace(self.backoff)
        last = ""
        for tries in range(1, self.retries + 2):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AttemptFailed("timeout", f"POST {self.url}: no answer within {ctx.timeout_s:g} s")
            server_says: float | None = None
            try:
                with self._clients.lease() as client:
                    response = await client.post(self.url, json=body, headers=headers, timeout=left)
            except httpx.TimeoutException:
                raise AttemptFailed("timeout", f"POST {self.url}: no answer within {ctx.timeout_s:g} s") from None
            except httpx.TransportError as e:
                last = f"POST {self.url} failed: {type(e).__name__}: {e}"
            else:
                status = response.status_code
                if status < 300:
                    try:
                        return response.json()
                    except ValueError:
                        snippet = response.text[:200]
                        message = f"POST {self.url} answered {status}, not JSON: {snippet!r}"
                        raise AttemptFailed("malformed", message) from None
                detail = _error_detail(response)
                if status != 429 and status < 500:
                    raise AttemptFailed("target_error", f"POST {self.url} answered {status}: {detail}")
                last = f"POST {self.url} answered {status}: {detail}"
                server_says = retry_after(response.headers.get("retry-after"))
            if tries > self.retries:
                break
            wait = backoff.next_wait(server_says)
            if wait >= deadline - time.monotonic():
                raise AttemptFailed("target_error", f"{last} (no time left to retry after {tries} tries)")
            await asyncio.sleep(wait)
        raise AttemptFailed("target_error", f"{last} ({self.retries + 1} tries)")
