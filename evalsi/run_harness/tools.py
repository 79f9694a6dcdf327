"""The tools an agent may call: Python functions with their JSON schemas made from type hints and docstrings,
mocked results read from a task, and the `Tool` every kind of tool (function, mock, MCP) is called through."""

from __future__ import annotations

import asyncio
import collections.abc
import enum
import functools
import importlib
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from evalsi.run_harness.targets.base import TargetError

_JSON_TYPE = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_ARRAYS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set, collections.abc.Iterable)
_OBJECTS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_ARGS_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params):\s*$")
_ARG_LINE = re.compile(r"^\s+(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


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


def json_safe(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value, ensure_ascii=False, default=str))
    except (TypeError, ValueError):
        return str(value)


def result_text(result: Any) -> str:
    """A tool result as a tool message's content: a string as is, anything else as JSON."""
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)


class MockResults:
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
