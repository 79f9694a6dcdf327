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
import collections.abc
import contextlib
import dataclasses
import enum
import functools
import importlib
import inspect
import json
import os
import re
import sys
import time
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import httpx

from evalsi.backoff import Backoff, retry_after
from evalsi.run_harness.model import Attempt, LlmCall, Message, Task, ToolCall
from evalsi.run_harness.spec import OpenAITarget
from evalsi.run_harness.stub_llm import StubLLM
from evalsi.run_harness.targets.base import AttemptContext, AttemptFailed, TargetError

STUB = "stub"
"""`base_url: stub` runs the bundled stub model (`evalsi.run_harness.stub_llm`) for the run."""
AGENT_NAME = "evalsi-openai-agent"
"""`Attempt.agent_name` of this agent's attempts."""
PROVIDER = "openai"
DEFAULT_RETRIES = 3
"""Retries of a model call after a 5xx, a 429 or a failed connection (so 4 tries in all)."""
DEFAULT_BACKOFF = Backoff(initial=0.5, maximum=8.0, max_retry_after=60.0)

_JSON_TYPE = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_ARRAYS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set, collections.abc.Iterable)
_OBJECTS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_ARGS_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params):\s*$")
_ARG_LINE = re.compile(r"^\s+(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


# --- tools --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """A tool the model may call: the Python function and what the model is told of it."""

    name: str
    function: Callable[..., Any]
    description: str
    parameters: dict[str, Any]
    ref: str = ""

    def definition(self) -> dict[str, Any]:
        """The tool as the Chat Completions `tools` list holds it."""
        fn: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}

    async def call(self, arguments: dict[str, Any]) -> Any:
        """Run the function with these keyword arguments: an async one on the loop, a sync one in a thread (so that
        parallel tool calls run at the same time)."""
        fn = self.function
        if inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
        ):
            return await fn(**arguments)
        result = await asyncio.to_thread(fn, **arguments)
        if inspect.isawaitable(result):
            result = await result
        return result


def type_schema(tp: Any) -> dict[str, Any]:
    """The JSON schema of a type hint: str, int, float, bool, None, list/tuple/set[...], dict[str, ...], Literal,
    Enum, Optional and other unions, Annotated (a string in it is the description), Any. Raises TypeError for
    anything else."""
    if tp is Any or tp is inspect.Parameter.empty or tp is object:
        return {}
    if tp is None:
        tp = type(None)
    if isinstance(tp, type) and tp in _JSON_TYPE:
        return {"type": _JSON_TYPE[tp]}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        schema = type_schema(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        return {**schema, "description": notes[0]} if notes else schema
    if origin is Literal:
        values = [v.value if isinstance(v, enum.Enum) else v for v in args]
        kinds = {_JSON_TYPE.get(type(v)) for v in values}
        return {"type": kinds.pop(), "enum": values} if len(kinds) == 1 and None not in kinds else {"enum": values}
    if origin is Union or origin is types.UnionType:
        present = [a for a in args if a is not type(None)]
        schema = type_schema(present[0]) if len(present) == 1 else {"anyOf": [type_schema(a) for a in present]}
        if len(present) == len(args) or not schema:
            return schema
        return _nullable(schema)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [m.value for m in tp]
        kinds = {_JSON_TYPE.get(type(v)) for v in values}
        return {"type": kinds.pop(), "enum": values} if len(kinds) == 1 and None not in kinds else {"enum": values}
    if tp in _ARRAYS or origin in _ARRAYS:
        if origin is tuple and args and args[-1] is not Ellipsis:
            items = [type_schema(a) for a in args]
            return {"type": "array", "prefixItems": items, "minItems": len(items), "maxItems": len(items)}
        schema = {"type": "array"}
        if args and type_schema(args[0]):
            schema["items"] = type_schema(args[0])
        if tp in (set, frozenset) or origin in (set, frozenset, collections.abc.Set):
            schema["uniqueItems"] = True
        return schema
    if tp in _OBJECTS or origin in _OBJECTS:
        schema = {"type": "object"}
        if len(args) == 2 and type_schema(args[1]):
            schema["additionalProperties"] = type_schema(args[1])
        return schema
    raise TypeError(f"no JSON schema for the type {tp!r}")


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    schema = dict(schema)
    if "enum" in schema:
        schema["enum"] = [*schema["enum"], None]
    if isinstance(schema.get("type"), str):
        schema["type"] = [schema["type"], "null"]
    elif "anyOf" in schema:
        schema["anyOf"] = [*schema["anyOf"], {"type": "null"}]
    elif "enum" not in schema:
        schema = {"anyOf": [schema, {"type": "null"}]}
    return schema


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The docstring's first line, and each parameter's description from a Google-style `Args:` section."""
    doc = inspect.getdoc(fn) or ""
    lines = doc.splitlines()
    summary = lines[0].strip() if lines else ""
    params: dict[str, str] = {}
    current: str | None = None
    current_indent = 0
    in_args = False
    for line in lines:
        if _ARGS_SECTION.match(line):
            in_args, current = True, None
            continue
        if not in_args:
            continue
        if line.strip() and not line[:1].isspace():
            break  # the next section
        m = _ARG_LINE.match(line)
        indent = len(line) - len(line.lstrip())
        if m and (current is None or indent <= current_indent):
            current, current_indent = m.group(1).lstrip("*"), indent
            params[current] = m.group(2).strip()
        elif current and line.strip():
            params[current] = f"{params[current]} {line.strip()}".strip()
    return summary, params


def function_schema(fn: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """What the model is told of a Python function: `{"name", "description", "parameters"}` (the `function` object
    of a Chat Completions tool). Its `__tool_schema__`, when set, wins: that object, a whole tool
    (`{"type": "function", "function": {...}}`), or only the parameters' schema. Otherwise: each parameter (not
    `*args`/`**kwargs`) a property typed by its hint, required unless it has a default (given as `default` when it is
    JSON), described from the docstring's `Args:` section; the description is the docstring's first line.

    Raises TypeError when a parameter's type has no JSON schema, or the hints cannot be resolved."""
    target: Any = fn
    if isinstance(fn, functools.partial):
        target = fn.func
    elif isinstance(fn, type):
        target = fn.__init__
    elif not (inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn)):
        target = type(fn).__call__
    fn_name = name or getattr(fn, "__name__", None) or getattr(target, "__name__", None) or type(fn).__name__
    summary, docs = _docstring(fn if isinstance(fn, type) else target)
    given = getattr(fn, "__tool_schema__", None)
    if given is not None:
        if not isinstance(given, dict):
            raise TypeError("__tool_schema__ is not a JSON object")
        if isinstance(given.get("function"), dict):
            given = given["function"]
        if "parameters" in given or "name" in given:
            out = {"name": given.get("name") or fn_name, "description": given.get("description", summary)}
            out["parameters"] = given.get("parameters") or {"type": "object", "properties": {}}
        else:
            out = {"name": fn_name, "description": summary, "parameters": given}
        json.dumps(out)  # it is sent as JSON: refuse what cannot be
        return out
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception as e:
        raise TypeError(f"cannot resolve its type hints: {type(e).__name__}: {e}") from None
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name in ("self", "cls"):
            continue
        annotation = hints.get(param.name, param.annotation)
        if isinstance(annotation, str):
            raise TypeError(f"parameter {param.name!r}: cannot resolve the type hint {annotation!r}")
        try:
            schema = type_schema(annotation)
        except TypeError as e:
            raise TypeError(f"parameter {param.name!r}: {e}") from None
        if param.name in docs and "description" not in schema:
            schema["description"] = docs[param.name]
        if param.default is param.empty:
            required.append(param.name)
        else:
            try:
                json.dumps(param.default)
                schema["default"] = param.default
            except (TypeError, ValueError):
                pass
        properties[param.name] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {"name": fn_name, "description": summary, "parameters": parameters}


def load_tool(ref: str, path: Sequence[str | Path] = ()) -> Tool:
    """Import `module:function` (the directories in `path` first on `sys.path`) and make its `Tool`; a problem is a
    `TargetError` naming the tool."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise TargetError(f"tool {ref!r}: expected `module:function`")
    for directory in reversed([str(p) for p in path]):
        if directory not in sys.path:
            sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise TargetError(f"tool {ref!r}: cannot import {module_name}: {type(e).__name__}: {e}") from None
    fn = module
    for part in attr.split("."):
        try:
            fn = getattr(fn, part)
        except AttributeError:
            raise TargetError(f"tool {ref!r}: {module_name} has no {attr!r}") from None
    if not callable(fn):
        raise TargetError(f"tool {ref!r}: {module_name}.{attr} is not a function")
    try:
        schema = function_schema(fn)
    except (TypeError, ValueError) as e:
        raise TargetError(f"tool {ref!r}: no JSON schema: {e} (give the function a `__tool_schema__`)") from None
    return Tool(schema["name"], fn, schema.get("description") or "", schema["parameters"], ref)


def _json_safe(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value, ensure_ascii=False, default=str))
    except (TypeError, ValueError):
        return str(value)


def _content(result: Any) -> str:
    """A tool result as a tool message's content: a string as is, anything else as JSON."""
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


class _Mocks:
    """An attempt's mocked tool results, from `task.metadata.tool_results`: a value, or a list used in order."""

    def __init__(self, results: Any) -> None:
        self.results: dict[str, Any] = results if isinstance(results, dict) else {}
        self.used: dict[str, int] = {}

    def take(self, name: str) -> tuple[Any, str | None]:
        """(the result, None), or (None, why there is none)."""
        if name not in self.results:
            known = ", ".join(sorted(self.results)) or "none"
            return None, f"no mock result for tool {name!r} in metadata.tool_results (mocked: {known})"
        value = self.results[name]
        if not isinstance(value, list):
            return value, None
        i = self.used.get(name, 0)
        self.used[name] = i + 1
        if i >= len(value):
            return None, f"no mock result left for tool {name!r}: call {i + 1}, {len(value)} given"
        return value[i], None


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
        self._headers, self.tools = headers, tools
        self._tool_definitions = [t.definition() for t in tools.values()]
        self._prepared = True

    async def attempt(self, task: Task, ctx: AttemptContext) -> Attempt:
        """Run the loop: ask the model, run the tools it calls, until it answers without calling one. A failure of
        the infrastructure raises `AttemptFailed` (with the attempt so far as its `attempt` attribute)."""
        if not self._prepared:
            await self.prepare([task])
        attempt = Attempt(task=task, trial=ctx.trial, agent_name=AGENT_NAME)
        try:
            attempt.output = await self._loop(task, ctx, attempt)
        except AttemptFailed as e:
            attempt.end_ns = time.time_ns()
            attempt.error = e.error
            e.attempt = attempt  # the steps so far: traced, and counted toward the run's budget
            raise
        attempt.end_ns = time.time_ns()
        return attempt

    async def close(self) -> None:
        await self._clients.aclose()
        self._prepared = False
        if self._stub is not None:
            self._stub.stop()
            self._stub = None

    # --- the loop ---

    async def _loop(self, task: Task, ctx: AttemptContext, attempt: Attempt) -> str:
        spec = self.spec
        deadline = time.monotonic() + ctx.timeout_s
        wire: list[dict[str, Any]] = []  # the messages as sent
        sent: list[Message] = []  # the same in the GenAI semconv shape
        if spec.system:
            wire.append({"role": "system", "content": spec.system})
            sent.append({"role": "system", "parts": [{"type": "text", "content": spec.system}]})
        question = task.input_text
        wire.append({"role": "user", "content": question})
        sent.append({"role": "user", "parts": [{"type": "text", "content": question}]})
        mocks = _Mocks(task.metadata.get("tool_results")) if spec.mock_tools else None
        tokens = 0
        for step in range(spec.max_steps):
            start = time.time_ns()
            data = await self._post(wire, deadline, ctx)
            end = time.time_ns()
            try:
                reply = _parse_reply(data, step)
            except ValueError as e:
                raise AttemptFailed("malformed", f"POST {self.url}: {e}: {json.dumps(data)[:200]}") from None
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
            tokens += (reply.input_tokens or 0) + (reply.output_tokens or 0)
            if spec.max_tokens is not None and tokens > spec.max_tokens:
                raise AttemptFailed("budget", f"{tokens} tokens used in {step + 1} model calls, over max_tokens")
            if not reply.tool_calls:
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
            calls = await self._run_tools(reply.tool_calls, mocks)
            attempt.steps.extend(calls)
            for call in calls:
                response = {"error": call.error} if call.error is not None else call.result
                wire.append({"role": "tool", "tool_call_id": call.call_id, "content": _content(response)})
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

    async def _run_tools(self, tool_calls: list[tuple[str, str, str]], mocks: _Mocks | None) -> list[ToolCall]:
        """Run one reply's tool calls at the same time; their results in the order of the calls."""
        if mocks is not None:  # results taken in call order, before anything runs
            return [self._mocked(call_id, name, raw, mocks) for call_id, name, raw in tool_calls]
        return list(await asyncio.gather(*(self._run_tool(*call) for call in tool_calls)))

    def _mocked(self, call_id: str, name: str, raw: str, mocks: _Mocks) -> ToolCall:
        start = time.time_ns()
        arguments = _arguments(raw)
        result, error = mocks.take(name)
        return ToolCall(name, call_id, arguments, _json_safe(result), start, time.time_ns(), error)

    async def _run_tool(self, call_id: str, name: str, raw: str) -> ToolCall:
        start = time.time_ns()
        arguments = _arguments(raw)
        tool = self.tools.get(name)
        error: str | None = None
        result: Any = None
        if tool is None:
            error = f"unknown tool {name!r}; the tools are: {', '.join(self.tools) or 'none'}"
        elif not isinstance(arguments, dict):
            error = f"the arguments are not a JSON object: {raw[:200]}"
        else:
            try:
                result = _json_safe(await tool.call(arguments))
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
        return ToolCall(name, call_id, arguments, result, start, time.time_ns(), error)

    # --- HTTP ---

    async def _post(self, messages: list[dict[str, Any]], deadline: float, ctx: AttemptContext) -> Any:
        """POST the chat request, retrying 5xx, 429 and connection failures (as `Backoff` and Retry-After say, while
        the attempt has time); the reply's JSON."""
        body: dict[str, Any] = {"model": self.spec.model, "messages": messages, "temperature": self.spec.temperature}
        if self._tool_definitions:
            body["tools"] = self._tool_definitions
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
