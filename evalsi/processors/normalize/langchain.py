"""LangChain's own value shapes inside other conventions' attributes: a tool's callback input and its serialized
ToolMessage, which OpenInference and OpenLLMetry record as they get them instead of the arguments and the result.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from evalsi.processors.normalize.values import is_malformed, loads, text

# The keys of LangChain's `on_tool_start` callback input as OpenLLMetry records it (`{"input_str": ..., "tags": [...],
# "metadata": {...}, ...}`): a dict with `input_str` and nothing outside these is that record, not a tool's arguments.
_CALLBACK_KEYS = frozenset(("input_str", "tags", "metadata", "kwargs", "inputs", "run_id", "parent_run_id", "name"))
_OUTPUT_RECORD_KEYS = frozenset(("output", "kwargs", "tags", "metadata", "run_id", "parent_run_id"))
_MAX_LITERAL = 100_000  # ast.literal_eval is safe but not cheap: longer text stays text


def _parsed(value: Any) -> Any:
    """A JSON text as its value; other values (and malformed JSON) as given."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        parsed = loads(value)
        return value if is_malformed(parsed) else parsed
    return value


def tool_input_text(value: str) -> Any:
    """LangChain's tool input string: JSON, or a Python literal (`{'location': 'Paris'}`, what `str(dict)` gives),
    as its value; anything else (a one-argument tool's bare value) as given."""
    parsed = _parsed(value)
    if parsed is not value:
        return parsed
    if value[:1] in ("{", "[") and len(value) <= _MAX_LITERAL:
        try:
            literal = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            return value
        if isinstance(literal, (dict, list)):
            return literal
    return value


def callback_arguments(value: Any) -> Any:
    """A tool's arguments from LangChain's callback input record (`{"input_str": "{'location': 'Paris'}", "tags":
    ..., "metadata": ...}`), else `value` as given."""
    record = _parsed(value)
    if isinstance(record, Mapping) and "input_str" in record and record.keys() <= _CALLBACK_KEYS:
        inner = record["input_str"]
        return tool_input_text(inner) if isinstance(inner, str) else inner
    return value


def _tool_message_fields(value: Any) -> Mapping[str, Any] | None:
    """The fields of a serialized ToolMessage: `{"type": "tool", "data": {...}}` (`messages_to_dict`), the
    `{"lc": 1, "type": "constructor", "id": [..., "ToolMessage"], "kwargs": {...}}` form, either one wrapped in
    `{"output": ..., "kwargs": ...}` (the `on_tool_end` callback's record)."""
    if not isinstance(value, Mapping):
        return None
    if "output" in value and value.keys() <= _OUTPUT_RECORD_KEYS:
        value = value["output"]
        if not isinstance(value, Mapping):
            return None
    if value.get("type") == "tool" and isinstance(value.get("data"), Mapping):
        return value["data"]
    ids = value.get("id")
    if (
        value.get("lc") == 1
        and value.get("type") == "constructor"
        and isinstance(ids, list)
        and ids
        and ids[-1] == "ToolMessage"
        and isinstance(value.get("kwargs"), Mapping)
    ):
        return value["kwargs"]
    return None


def tool_message(value: Any) -> tuple[Any, str | None] | None:
    """(the tool's own result content, the tool call id) from a serialized LangChain ToolMessage (as a value or its
    JSON text), or None when `value` is not one."""
    fields = _tool_message_fields(_parsed(value))
    if fields is None or "content" not in fields:
        return None
    return fields["content"], text(fields.get("tool_call_id"))
