"""Reading canonical message content: the text of the last message, the tool calls asked for, a tool's result."""

from __future__ import annotations

from typing import Any

from evalsi.model.span import Span


def last_text(messages: list[dict[str, Any]] | None) -> str | None:
    if not messages:
        return None
    texts = [p.get("content", "") for p in messages[-1].get("parts", []) if p.get("type") == "text"]
    joined = "".join(t for t in texts if isinstance(t, str))
    return joined or None


def tool_calls(messages: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [
        {"id": p.get("id"), "name": p.get("name"), "arguments": p.get("arguments")}
        for m in messages or []
        for p in m.get("parts", [])
        if p.get("type") == "tool_call"
    ]


def tool_result(span: Span) -> Any:
    for m in span.output or []:
        for p in m.get("parts", []):
            if p.get("type") == "tool_call_response":
                return p.get("response")
    return last_text(span.output)
