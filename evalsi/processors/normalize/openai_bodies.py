"""OpenAI request and response bodies (chat completions, completions, responses API, embeddings) read into canonical
messages, tool calls and request parameters: shared by the mappers that record them raw (OpenInference, MLflow).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evalsi.model.span import Span
from evalsi.processors.normalize.messages import Message, Part, chat_message, chat_messages, tool_arguments
from evalsi.processors.normalize.values import as_text, text


def text_message(role: str, value: Any) -> Message:
    return {"role": role, "parts": [{"type": "text", "content": "" if value is None else as_text(value)}]}


# OpenAI request keys -> keys of details["request"] (the names the OTel GenAI mapper gives them)
REQUEST_KEYS: tuple[tuple[str, str], ...] = (
    ("temperature", "temperature"),
    ("max_tokens", "max_tokens"),
    ("max_completion_tokens", "max_tokens"),
    ("max_output_tokens", "max_tokens"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("frequency_penalty", "frequency_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("stop", "stop_sequences"),
    ("seed", "seed"),
    ("n", "choice_count"),
    ("encoding_format", "encoding_formats"),
    ("stream", "stream"),
    ("dimensions", "dimensions"),
    ("user", "user"),
)
_LIST_PARAMETERS = frozenset(("stop_sequences", "encoding_formats"))


def request_parameters(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The sampling and request parameters of an OpenAI-style request body, under canonical names."""
    request: dict[str, Any] = {}
    for key, name in REQUEST_KEYS:
        value = body.get(key)
        if value is not None and name not in request:
            if name in _LIST_PARAMETERS and isinstance(value, str):
                value = [value]
            request[name] = value
    return request or None


# --- OpenAI-style request and response bodies (chat, completions, responses, embeddings) -----------


def _responses_content(content: Any) -> list[Part]:
    """Responses-API content parts (`input_text`, `output_text`, `refusal`, ...) as canonical parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    if not isinstance(content, list):
        return [] if content is None else [{"type": "text", "content": as_text(content)}]
    parts: list[Part] = []
    for item in content:
        if isinstance(item, Mapping):
            value = item.get("text")
            if value is None:
                value = item.get("refusal")
            if isinstance(value, str):
                parts.append({"type": "text", "content": value})
            else:
                parts.append(dict(item))
        elif item is not None:
            parts.append({"type": "text", "content": as_text(item)})
    return parts


def _responses_items(items: list[Any], default_role: str) -> list[Message]:
    """Responses-API items: messages, function calls and their outputs, reasoning; consecutive assistant
    parts are merged into one message."""
    messages: list[Message] = []
    for item in items:
        if isinstance(item, str):
            messages.append(text_message(default_role, item))
            continue
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "function_call":
            call_id = item.get("call_id")
            part: Part = {
                "type": "tool_call",
                "id": call_id if call_id is not None else item.get("id"),
                "name": text(item.get("name")) or "",
                "arguments": tool_arguments(item.get("arguments")),
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1]["parts"].append(part)
            else:
                messages.append({"role": "assistant", "parts": [part]})
        elif kind == "function_call_output":
            response = {"type": "tool_call_response", "id": item.get("call_id"), "response": item.get("output")}
            messages.append({"role": "tool", "parts": [response]})
        elif kind == "reasoning":
            summary = item.get("summary")
            reasoning = " ".join(
                s["text"] for s in summary or () if isinstance(s, Mapping) and isinstance(s.get("text"), str)
            )
            if reasoning:
                messages.append({"role": "assistant", "parts": [{"type": "reasoning", "content": reasoning}]})
        else:
            role = text(item.get("role")) or default_role
            parts = _responses_content(item.get("content"))
            if role == "assistant" and messages and messages[-1]["role"] == "assistant":
                messages[-1]["parts"].extend(parts)
            else:
                messages.append({"role": role, "parts": parts})
    return messages


def openai_request_messages(body: Any) -> list[Message] | None:
    """Input messages from an OpenAI request body (chat `messages`, responses `input`/`instructions`,
    completions `prompt`, embeddings `input`); None if the body has none of them."""
    if not isinstance(body, Mapping):
        return None
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        found = chat_messages(messages, "user")
        system = body.get("system")  # Anthropic-style bodies keep the system prompt beside the messages
        if isinstance(system, str) and system and found:
            found = [text_message("system", system), *found]
        return found
    found = None
    value = body.get("input")
    if value is None:
        value = body.get("prompt")
    if isinstance(value, str):
        found = [text_message("user", value)] if value else None
    elif isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            # embeddings and batched completions: one message, a text part per input
            found = [{"role": "user", "parts": [{"type": "text", "content": v} for v in value]}]
        else:
            found = _responses_items(value, "user") or None
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        found = [text_message("system", instructions), *(found or ())]
    return found


def _choice_message(choice: Any) -> Message | None:
    if not isinstance(choice, Mapping):
        return None if choice is None else text_message("assistant", choice)
    message = choice.get("message")
    if message is None:
        message = choice.get("delta")
    if isinstance(message, Mapping):
        canonical = chat_message("assistant", message)
    elif isinstance(choice.get("text"), str):
        canonical = text_message("assistant", choice["text"])
    else:
        return None
    finish_reason = choice.get("finish_reason")
    if finish_reason is not None:
        canonical["finish_reason"] = str(finish_reason)
    return canonical


def openai_response_messages(body: Any) -> list[Message] | None:
    """Output messages from an OpenAI response body (`choices[].message`, `choices[].text`, responses `output`,
    or an Anthropic-style `{role, content}`); None if the body has none of them."""
    if not isinstance(body, Mapping):
        return None
    choices = body.get("choices")
    if isinstance(choices, list) and choices:
        messages = [m for m in map(_choice_message, choices) if m is not None]
        return messages or None
    output = body.get("output")
    if isinstance(output, list) and output:
        return _responses_items(output, "assistant") or None
    if "content" in body and "role" in body:
        return [chat_message("assistant", body)]
    return None


# --- streamed responses ---------------------------------------------------------------------------


def first_event_seconds(span: Span, name: str) -> float | None:
    """Seconds from the span's start to its first event called `name` (or starting with it, if it ends in ".")."""
    prefix = name.endswith(".")
    for event in span.events:
        if event.name.startswith(name) if prefix else event.name == name:
            if event.time_unix_nano >= span.start_time_unix_nano > 0:
                return (event.time_unix_nano - span.start_time_unix_nano) / 1e9
            return None
    return None
