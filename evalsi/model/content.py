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


def server_tool_calls(messages: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Tools the provider ran itself (`server_tool_call` parts: web search, code interpreter), with their responses
    (`server_tool_call_response` parts of the same id) when the messages hold them."""
    calls: list[dict[str, Any]] = []
    responses: dict[Any, Any] = {}
    for m in messages or []:
        for p in m.get("parts", []):
            kind = p.get("type")
            if kind == "server_tool_call":
                calls.append({"id": p.get("id"), "name": p.get("name"), "arguments": p.get("server_tool_call")})
            elif kind == "server_tool_call_response" and p.get("id") is not None:
                responses[p["id"]] = p.get("server_tool_call_response")
    for call in calls:
        call["result"] = responses.get(call["id"]) if call["id"] is not None else None
    return calls


def reasoning(messages: list[dict[str, Any]] | None) -> str | None:
    """The model's reasoning (`reasoning` parts) in `messages`, joined; never part of the answer (`last_text`)."""
    texts = [
        p["content"]
        for m in messages or []
        for p in m.get("parts", [])
        if p.get("type") == "reasoning" and isinstance(p.get("content"), str)
    ]
    return "".join(texts) or None


def tool_result(span: Span) -> Any:
    for m in span.output or []:
        for p in m.get("parts", []):
            if p.get("type") == "tool_call_response":
                return p.get("response")
    return last_text(span.output)
