"""The OTel GenAI semconv mapper: `gen_ai.*` attributes and content events to canonical fields."""

from __future__ import annotations

from typing import Any

from evalsi.processors.normalize.mapper import GENERIC_PRECEDENCE, register_mapper
from evalsi.processors.normalize.messages import (
    CONTENT_EVENTS,
    Message,
    messages_from_span_events,
    semconv_messages,
    system_message,
    tool_arguments,
)
from evalsi.span import Span

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
SYSTEM = "gen_ai.system"  # the provider before semconv 1.37
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"  # before semconv 1.27
COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"  # before semconv 1.27
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
CONVERSATION_ID = "gen_ai.conversation.id"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"

EXECUTE_TOOL = "execute_tool"

STEP_TYPES: dict[str, str] = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "embeddings": "embedding",
    EXECUTE_TOOL: "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
}

_MARKER_ATTRIBUTES = frozenset((OPERATION, SYSTEM, PROVIDER, REQUEST_MODEL))


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value or None
    return None if value is None else str(value)


def _count(value: Any) -> int | None:
    """A token count: ints pass; numeric strings and whole floats are tolerated; anything else is None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                return None
            return int(number) if number.is_integer() else None
    return None


def _tool_messages(span: Span, attributes: dict[str, Any]) -> tuple[list[Message] | None, list[Message] | None]:
    """An execute_tool span's call as an assistant tool_call message in, and a tool response message out."""
    input_messages: list[Message] | None = None
    output_messages: list[Message] | None = None
    if TOOL_CALL_ARGUMENTS in attributes:
        call = {
            "type": "tool_call",
            "id": _text(attributes.get(TOOL_CALL_ID)),
            "name": span.tool_name or "",
            "arguments": tool_arguments(attributes[TOOL_CALL_ARGUMENTS]),
        }
        input_messages = [{"role": "assistant", "parts": [call]}]
    if TOOL_CALL_RESULT in attributes:
        response = {
            "type": "tool_call_response",
            "id": _text(attributes.get(TOOL_CALL_ID)),
            "response": attributes[TOOL_CALL_RESULT],
        }
        output_messages = [{"role": "tool", "parts": [response]}]
    return input_messages, output_messages


class OtelGenAI:
    """Spans written to the OTel GenAI semantic conventions, from semconv 1.26 to the latest experimental."""

    name = "otel_genai"
    version = "1"

    def matches(self, span: Span) -> bool:
        if not span.attributes.keys().isdisjoint(_MARKER_ATTRIBUTES):
            return True
        if span.events:
            return any(event.name in CONTENT_EVENTS for event in span.events)
        return False

    def apply(self, span: Span) -> None:
        attributes = span.attributes
        get = attributes.get
        model = _text(get(RESPONSE_MODEL) or get(REQUEST_MODEL))
        operation = get(OPERATION)
        step_type = STEP_TYPES.get(operation) if isinstance(operation, str) else None
        if step_type is None:
            step_type = "llm" if model else "other"
        span.step_type = step_type
        span.model = model
        span.provider = _text(get(PROVIDER) or get(SYSTEM))
        tokens = get(INPUT_TOKENS)
        span.input_tokens = _count(tokens if tokens is not None else get(PROMPT_TOKENS))
        tokens = get(OUTPUT_TOKENS)
        span.output_tokens = _count(tokens if tokens is not None else get(COMPLETION_TOKENS))
        span.tool_name = _text(get(TOOL_NAME))
        span.session_id = _text(get(CONVERSATION_ID))

        input_messages: list[Message] | None = None
        output_messages: list[Message] | None = None
        if operation == EXECUTE_TOOL:
            input_messages, output_messages = _tool_messages(span, attributes)
        if input_messages is None and output_messages is None:
            input_messages = semconv_messages(get(INPUT_MESSAGES), "user")
            instructions = get(SYSTEM_INSTRUCTIONS)
            if instructions is not None:
                system = system_message(instructions)
                if system is not None:
                    input_messages = [system, *(input_messages or ())]
            output_messages = semconv_messages(get(OUTPUT_MESSAGES), "assistant")
        if input_messages is None and output_messages is None and span.events:
            input_messages, output_messages = messages_from_span_events(span.events)
        span.input = input_messages
        span.output = output_messages
        span.content_captured = input_messages is not None or output_messages is not None


OTEL_GENAI = register_mapper(OtelGenAI(), precedence=GENERIC_PRECEDENCE)
