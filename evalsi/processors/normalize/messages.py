"""The canonical message list (the OTel GenAI semconv message schema) and its converters from the forms seen
in the wild: `gen_ai.*.messages`, per-message events (span events or log records), prompt/completion events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from evalsi.model.span import SpanEvent
from evalsi.processors.normalize.values import as_text, is_malformed, loads

Message = dict[str, Any]
Part = dict[str, Any]

# Per-message events (semconv 1.28-1.36; openai-v2 still emits them as log records): name -> default role.
# `gen_ai.choice` is the only output event; its role comes from its `message`.
MESSAGE_EVENT_ROLES: dict[str, str] = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
    "gen_ai.choice": "assistant",
}
CHOICE_EVENT = "gen_ai.choice"

# The even older span events, each holding a whole OpenAI-style message list as a JSON string.
PROMPT_EVENT = "gen_ai.content.prompt"
COMPLETION_EVENT = "gen_ai.content.completion"
PROMPT_EVENT_ATTRIBUTE = "gen_ai.prompt"
COMPLETION_EVENT_ATTRIBUTE = "gen_ai.completion"

DETAILS_EVENT = "gen_ai.client.inference.operation.details"  # a log record, or (Strands) a span event

CONTENT_EVENTS = frozenset((*MESSAGE_EVENT_ROLES, PROMPT_EVENT, COMPLETION_EVENT, DETAILS_EVENT))

# Some emitters (Semantic Kernel for .NET) put the event body as JSON into one span-event attribute.
EVENT_BODY_ATTRIBUTE = "gen_ai.event.content"


def _text_part(value: Any) -> Part:
    return {"type": "text", "content": as_text(value)}


def unparsed_message(role: str, raw: Any) -> Message:
    """Content that could not be parsed: kept whole as text, and flagged so the span records it as unparsed."""
    return {"role": role, "parts": [_text_part(raw)], "unparsed": True}


def tool_arguments(value: Any) -> Any:
    """Tool-call arguments, parsed when they arrive as a JSON string; otherwise (or if malformed) as given."""
    if isinstance(value, str):
        parsed = loads(value)
        return value if is_malformed(parsed) else parsed
    return value


# --- (a) gen_ai.input.messages / gen_ai.output.messages / gen_ai.system_instructions --------------


_NOT_TEXT: Any = object()


def _semconv_part(part: Any) -> Part:
    if not isinstance(part, dict):
        return _text_part(part)
    kind = part.get("type")
    if kind == "text" or (kind is None and "content" in part):
        content = part.get("content")
        return {"type": "text", "content": "" if content is None else as_text(content)}
    if kind == "tool_call":
        return {
            "type": "tool_call",
            "id": part.get("id"),
            "name": as_text(part.get("name") or ""),
            "arguments": tool_arguments(part.get("arguments")),
        }
    if kind == "tool_call_response":
        # the schema says `response`; the registry's example of gen_ai.input.messages says `result`
        response = part["response"] if "response" in part else part.get("result")
        blocks = converse_blocks(response)  # Strands records a tool's result as Converse content blocks
        if blocks is not None:
            response = converse_text(blocks) or response
        return {"type": "tool_call_response", "id": part.get("id"), "response": response}
    if kind is None:
        # neither a type nor content: not a part of any known form, so its JSON is the text
        return _text_part(part)
    if kind == "reasoning":
        content = part.get("content")
        return {**part, "content": "" if content is None else as_text(content)}
    if kind == "server_tool_call":
        # a tool the provider ran (web search, code interpreter): its details under `server_tool_call`
        return {**part, "id": part.get("id"), "name": as_text(part.get("name") or "")}
    if kind == "server_tool_call_response":
        return {**part, "id": part.get("id")}
    # blob (inline data), file (a file id), uri, compaction, vendor types: kept as sent
    return dict(part)


def _semconv_message(message: Any, default_role: str) -> Message:
    if not isinstance(message, dict):
        return {"role": default_role, "parts": [_text_part(message)]}
    role = message.get("role")
    if not isinstance(role, str) or not role:
        role = default_role
    parts = message.get("parts")
    if parts is None and ("content" in message or "tool_calls" in message):
        # an OpenAI-style message where a semconv one was expected
        return chat_message(role, message)
    if isinstance(parts, list):
        canonical: Message = {"role": role, "parts": [_semconv_part(p) for p in parts]}
    elif parts is None:
        canonical = {"role": role, "parts": []}
    else:
        canonical = {"role": role, "parts": [_semconv_part(parts)]}
    finish_reason = message.get("finish_reason")
    if finish_reason is not None:
        canonical["finish_reason"] = as_text(finish_reason)
    return canonical


def semconv_messages(value: Any, default_role: str) -> list[Message] | None:
    """Canonical messages from a `gen_ai.input.messages` / `gen_ai.output.messages` value.

    `value` is the attribute as received: a JSON string or an already-structured list. Malformed JSON,
    or JSON that is not a message list, becomes one `default_role` message holding the raw text.
    None or an empty list give None (nothing captured).
    """
    if value is None:
        return None
    if isinstance(value, str):
        if not value:
            return None
        parsed = loads(value)
        if is_malformed(parsed):
            return [unparsed_message(default_role, value)]
        value = parsed
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return [unparsed_message(default_role, value)]
    if not value:
        return None
    messages: list[Message] = []
    for message in value:
        # the common shape, `{"role": ..., "parts": [{"type": "text", "content": "..."}, ...]}`, read here as
        # `_semconv_message` and `_semconv_part` read it, without a call a message and a part
        parts = message.get("parts") if type(message) is dict else None
        if type(parts) is not list:
            messages.append(_semconv_message(message, default_role))
            continue
        role = message.get("role")
        if not isinstance(role, str) or not role:
            role = default_role
        canonical_parts: list[Part] = []
        for part in parts:
            content = part.get("content") if type(part) is dict and part.get("type") == "text" else _NOT_TEXT
            if type(content) is str:
                canonical_parts.append({"type": "text", "content": content})
            else:
                canonical_parts.append(_semconv_part(part))
        canonical: Message = {"role": role, "parts": canonical_parts}
        finish_reason = message.get("finish_reason")
        if finish_reason is not None:
            canonical["finish_reason"] = as_text(finish_reason)
        messages.append(canonical)
    return messages


def system_message(value: Any) -> Message | None:
    """The leading system message from `gen_ai.system_instructions` (a JSON list of parts, or plain text)."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        parsed = loads(value)
        # a plain instruction string is not JSON; neither is it a JSON string literal worth unwrapping
        value = [value] if is_malformed(parsed) or isinstance(parsed, str) else parsed
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        value = [value]
    if not value:
        return None
    return {"role": "system", "parts": [_semconv_part(p) for p in value]}


def with_system_instructions(messages: list[Message] | None, instructions: Any) -> list[Message] | None:
    """`messages` led by the system message of `gen_ai.system_instructions`, unless they already start with it.

    Some emitters (OpenLIT) send the instructions in both attributes: the same system message is not added twice.
    """
    if instructions is None:
        return messages
    system = system_message(instructions)
    if system is None:
        return messages
    if messages:
        lead = messages[0]
        if lead["role"] == "system" and lead["parts"] == system["parts"]:
            return messages
    return [system, *(messages or ())]


# --- OpenAI-style messages: the body of per-message events and of gen_ai.prompt / gen_ai.completion ---


# Bedrock Converse content blocks (`[{"text": ...}, {"toolUse": {...}}, {"toolResult": {...}}]`), which Strands Agents
# records as the content of its per-message events and tool results: each block is a dict with one of these keys.
CONVERSE_BLOCKS = frozenset(("text", "toolUse", "toolResult", "reasoningContent", "image", "document", "video"))


def converse_blocks(value: Any) -> list[dict[str, Any]] | None:
    """`value` (a list, or its JSON text) as Converse content blocks, or None when it is not a list of them."""
    if isinstance(value, str):
        if not value.startswith("[{"):
            return None
        value = loads(value)
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(b, dict) and len(b) == 1 and next(iter(b)) in CONVERSE_BLOCKS for b in value):
        return value
    return None


def converse_text(blocks: list[dict[str, Any]]) -> str | None:
    """The text of blocks that are all text blocks (a tool's result as Strands records it), else None."""
    if all(isinstance(b.get("text"), str) for b in blocks):
        return "".join(b["text"] for b in blocks)
    return None


def _converse_part(block: dict[str, Any]) -> Part:
    ((kind, body),) = block.items()
    if kind == "text":
        return {"type": "text", "content": as_text(body)}
    if kind == "toolUse" and isinstance(body, dict):
        return {
            "type": "tool_call",
            "id": body.get("toolUseId"),
            "name": as_text(body.get("name") or ""),
            "arguments": tool_arguments(body.get("input")),
        }
    if kind == "toolResult" and isinstance(body, dict):
        inner = converse_blocks(body.get("content"))
        result = converse_text(inner) if inner else None
        return {
            "type": "tool_call_response",
            "id": body.get("toolUseId"),
            "response": body.get("content") if result is None else result,
        }
    if kind == "reasoningContent" and isinstance(body, dict):
        reasoning = body.get("reasoningText")
        content = reasoning.get("text") if isinstance(reasoning, dict) else None
        return {"type": "reasoning", "content": as_text(content or "")}
    return {"type": kind, "content": body}


def _content_parts(content: Any) -> list[Part]:
    if content is None or content == "":
        return []
    blocks = converse_blocks(content)
    if blocks is not None:
        return [_converse_part(b) for b in blocks]
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if isinstance(content, list):
        parts: list[Part] = []
        for item in content:
            if isinstance(item, dict):
                if item.get("type") == "text" and "text" in item:
                    # the OpenAI content-part form {"type": "text", "text": ...}
                    parts.append({"type": "text", "content": as_text(item["text"])})
                elif "type" in item:
                    parts.append(_semconv_part(item))
                else:
                    parts.append(_text_part(item))
            elif item is not None:
                parts.append(_text_part(item))
        return parts
    if isinstance(content, dict) and "type" in content:
        return [_semconv_part(content)]
    return [_text_part(content)]


def _tool_call_part(call: Any) -> Part:
    if not isinstance(call, dict):
        return _text_part(call)
    function = call.get("function")
    if isinstance(function, str):
        function = loads(function)
    if not isinstance(function, dict):
        # the flat form {"id", "name", "arguments"}
        function = call
    return {
        "type": "tool_call",
        "id": call.get("id"),
        "name": as_text(function.get("name") or ""),
        "arguments": tool_arguments(function.get("arguments")),
    }


def chat_message(role: str, body: Mapping[str, Any]) -> Message:
    """A canonical message from an OpenAI-style dict (`content`, `tool_calls`, `id`/`tool_call_id`)."""
    body_role = body.get("role")
    if isinstance(body_role, str) and body_role:
        role = body_role
    content = body.get("content")
    blocks = converse_blocks(content) if role == "tool" else None
    if blocks is not None and any("toolResult" in b for b in blocks):
        parts: list[Part] = [_converse_part(b) for b in blocks]
    elif role == "tool":
        call_id = body.get("id")
        if call_id is None:
            call_id = body.get("tool_call_id")
        parts = [{"type": "tool_call_response", "id": call_id, "response": content}]
    else:
        parts = _content_parts(content)
        tool_calls = body.get("tool_calls")
        if isinstance(tool_calls, str):
            parsed = loads(tool_calls)
            tool_calls = [tool_calls] if is_malformed(parsed) else parsed
        if isinstance(tool_calls, dict):
            tool_calls = [tool_calls]
        if isinstance(tool_calls, list):
            parts.extend(_tool_call_part(c) for c in tool_calls)
    message: Message = {"role": role, "parts": parts}
    finish_reason = body.get("finish_reason")
    if finish_reason is not None:
        message["finish_reason"] = as_text(finish_reason)
    return message


# --- (b) per-message events -----------------------------------------------------------------------


def _event_body(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        return {"content": body}
    packed = body.get(EVENT_BODY_ATTRIBUTE)
    if isinstance(packed, str):
        unpacked = loads(packed)
        if isinstance(unpacked, dict):
            return unpacked
    return body


def message_from_event(name: str, body: Any) -> Message | None:
    """The canonical message of one per-message event, or None if `name` is not one.

    `body` is a plain dict: a span event's attributes or an OTLP log record's body converted
    to a dict (the log-record path uses this too). A non-dict body is taken as the content.
    """
    role = MESSAGE_EVENT_ROLES.get(name)
    if role is None:
        return None
    body = _event_body(body)
    if name == CHOICE_EVENT:
        message = body.get("message")
        if isinstance(message, str):
            parsed = loads(message) if message[:1] in ("{", "[") else None
            message = parsed if isinstance(parsed, dict) else {"content": message}
        if not isinstance(message, Mapping):
            # content at the top level, as some emitters do
            message = body
        canonical = chat_message(role, message)
        finish_reason = body.get("finish_reason")
        if finish_reason is not None:
            canonical["finish_reason"] = as_text(finish_reason)
        return canonical
    return chat_message(role, body)


def _choice_index(body: Any) -> int:
    index = body.get("index") if isinstance(body, Mapping) else None
    return index if isinstance(index, int) and not isinstance(index, bool) else 0


def messages_from_events(
    events: Iterable[tuple[str, Any]],
) -> tuple[list[Message] | None, list[Message] | None]:
    """(input, output) canonical messages from `(event name, body dict)` pairs, in event order.

    Choices become the output, ordered by their `index`; other names are ignored.
    """
    inputs: list[Message] = []
    choices: list[tuple[int, Message]] = []
    for name, raw in events:
        body = _event_body(raw)
        message = message_from_event(name, body)
        if message is None:
            continue
        if name == CHOICE_EVENT:
            choices.append((_choice_index(body), message))
        else:
            inputs.append(message)
    if len(choices) > 1:
        choices.sort(key=lambda c: c[0])
    return (inputs or None), ([m for _, m in choices] or None)


# --- (c) gen_ai.content.prompt / gen_ai.content.completion span events ----------------------------


def chat_messages(value: Any, default_role: str) -> list[Message] | None:
    """Canonical messages from an OpenAI-style message list: a JSON string (as `gen_ai.prompt`) or a list."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        parsed = loads(value)
        if is_malformed(parsed) or isinstance(parsed, str):
            return [unparsed_message(default_role, value)]
        value = parsed
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        return [unparsed_message(default_role, value)]
    messages: list[Message] = []
    for item in value:
        if isinstance(item, Mapping):
            if "parts" in item:
                messages.append(_semconv_message(item, default_role))
            elif isinstance(item.get("message"), Mapping):
                # a completion given as a list of choices
                message = chat_message(default_role, item["message"])
                if item.get("finish_reason") is not None:
                    message["finish_reason"] = as_text(item["finish_reason"])
                messages.append(message)
            else:
                messages.append(chat_message(default_role, item))
        elif item is not None:
            messages.append({"role": default_role, "parts": [_text_part(item)]})
    return messages or None


# --- span events: (b) and (c) together ------------------------------------------------------------


def messages_from_span_events(
    events: Iterable[SpanEvent],
) -> tuple[list[Message] | None, list[Message] | None]:
    """(input, output) from a span's content events: per-message, prompt/completion, or both; or the
    `gen_ai.client.inference.operation.details` events (Strands writes one per attribute) with the semconv's
    message attributes."""
    per_message: list[tuple[str, Any]] = []
    prompt: list[Message] | None = None
    completion: list[Message] | None = None
    details: dict[str, Any] = {}
    for event in events:
        name = event.name
        if name == DETAILS_EVENT:
            details.update(event.attributes)
            continue
        if name in MESSAGE_EVENT_ROLES:
            per_message.append((name, event.attributes))
        elif name == PROMPT_EVENT:
            found = chat_messages(event.attributes.get(PROMPT_EVENT_ATTRIBUTE), "user")
            if found:
                prompt = (prompt or []) + found
        elif name == COMPLETION_EVENT:
            found = chat_messages(event.attributes.get(COMPLETION_EVENT_ATTRIBUTE), "assistant")
            if found:
                completion = (completion or []) + found
    if details:
        inputs = with_system_instructions(
            semconv_messages(details.get("gen_ai.input.messages"), "user"), details.get("gen_ai.system_instructions")
        )
        outputs = semconv_messages(details.get("gen_ai.output.messages"), "assistant")
        if inputs:
            prompt = (prompt or []) + inputs
        if outputs:
            completion = (completion or []) + outputs
    if per_message:
        inputs, outputs = messages_from_events(per_message)
        if inputs:
            prompt = (prompt or []) + inputs
        if outputs:
            completion = (completion or []) + outputs
    return prompt, completion
