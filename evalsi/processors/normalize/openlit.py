"""The OpenLIT mapper: OpenLIT's `gen_ai.*` spans with its cost, environment and application keys, from the
releases with `gen_ai.prompt` / `gen_ai.completion` text to the ones with `gen_ai.input.messages`.
"""

from __future__ import annotations

from typing import Any

from evalsi.model.span import Span, StepType
from evalsi.processors.normalize.mapper import register_mapper
from evalsi.processors.normalize.messages import (
    CONTENT_EVENTS,
    Message,
    messages_from_span_events,
    semconv_messages,
    tool_arguments,
    with_system_instructions,
)
from evalsi.processors.normalize.otel_genai import (  # the semconv names this convention shares
    AGENT_NAME,
    CONVERSATION_ID,
    INPUT_MESSAGES,
    OPERATION,
    OPERATION_STEP_TYPES as OTEL_OPERATION_STEP_TYPES,
    OUTPUT_MESSAGES,
    PROVIDER,
    REQUEST_MODEL,
    RESPONSE_MODEL,
    SYSTEM,
    SYSTEM_INSTRUCTIONS,
    TOOL_CALL_ID,
    TOOL_NAME,
    fill_details,
    fill_provider_and_tokens,
    mark_framework_spans,
    span_error_type,
    tool_messages,
)
from evalsi.processors.normalize.values import as_text, count, first, number, objects, text

PRECEDENCE = 50

SDK_NAME = "telemetry.sdk.name"  # OpenLIT sets it to "openlit" on every span it writes, and on its resource
OPENLIT = "openlit"
COST = "gen_ai.usage.cost"
APPLICATION_NAME = "gen_ai.application_name"  # up to 1.33; later releases write service.name on the span
ENVIRONMENT = "gen_ai.environment"  # up to 1.33; later: deployment.environment
AGENT_VERSION_HASH = "openlit.agent.version_hash"
STREAM = "gen_ai.request.stream"
TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"

PROMPT = "gen_ai.prompt"  # up to 1.36: "role: content" lines (span attribute from 1.35)
COMPLETION = "gen_ai.completion"
TOOL_ARGS = "gen_ai.tool.args"  # OpenLIT's older name for the arguments
TOOL_INPUT = "gen_ai.tool.input"
TOOL_OUTPUT = "gen_ai.tool.output"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
REQUEST_USER = "gen_ai.request.user"
DB_OPERATION = "db.operation.name"
DB_OPERATION_OLD = "db.operation"

# details key <- OpenLIT's own count attributes; the semconv ones are read by otel_genai.fill_details first
_DETAIL_COUNTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reasoning_tokens", ("gen_ai.usage.completion_tokens_details.reasoning_tokens",)),
    ("cache_read_input_tokens", ("gen_ai.usage.prompt_tokens_details.cached_tokens",)),
    ("total_tokens", ("gen_ai.usage.total_tokens", "gen_ai.client.token.usage")),
)
_DETAIL_TEXTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("environment", ("deployment.environment", ENVIRONMENT)),
    ("application_name", (APPLICATION_NAME, "service.name")),
)

# OpenLIT's operation names beyond the semconv ones (and the names "embedding", "agent", "framework" of 1.33 and before)
OPENLIT_OPERATION_STEP_TYPES: dict[str, StepType] = {
    **OTEL_OPERATION_STEP_TYPES,
    "embedding": "embedding",
    "image": "llm",
    "audio": "llm",
    "translate": "llm",
    "speech_to_text": "llm",
    "text_to_speech": "llm",
    "speech_to_text_translate": "llm",
    "transliterate": "llm",
    "language_identification": "llm",
    "model_request": "llm",
    "fine_tuning": "other",
    "agent": "agent",
    "invoke_workflow": "chain",
    "framework": "chain",
    "execute_task": "chain",
    "retrieval": "retriever",
}
VECTORDB = "vectordb"
# a vector-store call is a retrieval only when it reads
_DB_READS = frozenset(("QUERY", "SEARCH", "GET", "FETCH", "SELECT", "PEEK", "QUERY_POINTS", "HYBRID_SEARCH"))

_MARKER_ATTRIBUTES = frozenset((COST, APPLICATION_NAME, AGENT_VERSION_HASH))
_GEN_AI_ATTRIBUTES = frozenset((OPERATION, SYSTEM, PROVIDER, REQUEST_MODEL))


def _step_type(attributes: dict[str, Any], model: str | None) -> str:
    operation = attributes.get(OPERATION)
    if isinstance(operation, str):
        if operation == VECTORDB:
            db_operation = attributes.get(DB_OPERATION) or attributes.get(DB_OPERATION_OLD)
            return "retriever" if isinstance(db_operation, str) and db_operation.upper() in _DB_READS else "other"
        step_type = OPENLIT_OPERATION_STEP_TYPES.get(operation)
        if step_type is not None:
            return step_type
    return "llm" if model else "other"


def _text_messages(value: Any, role: str) -> list[Message] | None:
    """`gen_ai.prompt` / `gen_ai.completion`: plain text by design (not JSON), or a list of inputs."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, list):
        return [{"role": role, "parts": [{"type": "text", "content": as_text(item)}]} for item in value]
    return [{"role": role, "parts": [{"type": "text", "content": as_text(value)}]}]


def _tool_messages(span: Span, attributes: dict[str, Any]) -> tuple[list[Message] | None, list[Message] | None]:
    """A tool span's call in and result out: the semconv's gen_ai.tool.call.*, else OpenLIT's older names."""
    input_messages, output_messages = tool_messages(span, attributes)
    call_id = text(attributes.get(TOOL_CALL_ID))
    if input_messages is None:
        arguments = first(attributes, (TOOL_ARGS, TOOL_INPUT))
        if arguments is not None:
            call = {
                "type": "tool_call",
                "id": call_id,
                "name": span.tool_name or "",
                "arguments": tool_arguments(arguments),
            }
            input_messages = [{"role": "assistant", "parts": [call]}]
    if output_messages is None:
        result = attributes.get(TOOL_OUTPUT)
        if result is not None:
            output_messages = [
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": result}]}
            ]
    return input_messages, output_messages


def _event_text(span: Span) -> tuple[list[Message] | None, list[Message] | None]:
    """The `gen_ai.content.prompt` / `gen_ai.content.completion` events of 1.36 and before: plain text."""
    input_messages: list[Message] | None = None
    output_messages: list[Message] | None = None
    for event in span.events:
        if event.name == "gen_ai.content.prompt" and input_messages is None:
            input_messages = _text_messages(event.attributes.get(PROMPT), "user")
        elif event.name == "gen_ai.content.completion" and output_messages is None:
            output_messages = _text_messages(event.attributes.get(COMPLETION), "assistant")
    return input_messages, output_messages


class OpenLIT:
    """Spans written by OpenLIT's instrumentations (`openlit.init()`)."""

    name = "openlit"
    version = "1"

    def matches(self, span: Span) -> bool:
        attributes = span.attributes
        if attributes.get(SDK_NAME) == OPENLIT or span.scope_name.startswith(OPENLIT):
            return True
        if not attributes.keys().isdisjoint(_MARKER_ATTRIBUTES):
            return True
        # An OpenLIT resource also holds the process's HTTP and DB spans: only its GenAI spans are ours.
        return span.resource_attributes.get(SDK_NAME) == OPENLIT and not attributes.keys().isdisjoint(
            _GEN_AI_ATTRIBUTES
        )

    def apply(self, span: Span) -> None:
        attributes = span.attributes
        get = attributes.get
        model = text(get(RESPONSE_MODEL) or get(REQUEST_MODEL))
        step_type = _step_type(attributes, model)
        span.step_type = step_type
        span.model = model
        fill_provider_and_tokens(span, get)
        span.cost_usd = number(get(COST))
        # on a chat span gen_ai.tool.name lists the calls the model asked for (they are in the output);
        # only a tool span is the execution of one
        if step_type == "tool":
            span.tool_name = text(get(TOOL_NAME))
        span.agent_name = text(get(AGENT_NAME))
        span.session_id = text(get(CONVERSATION_ID))
        span.user_id = text(get(REQUEST_USER))
        span.error_type = span_error_type(span)

        fill_details(span, attributes)
        mark_framework_spans(span, get(OPERATION))  # workflows (and agents being built) as otel_genai marks them
        details = span.details
        if step_type != "tool":
            # on a chat span it is the (comma-joined) ids of the calls the model asked for, not a call made
            details.pop("tool_call_id", None)
        for key, names in _DETAIL_COUNTS:
            if key not in details:
                tokens = count(first(attributes, names))
                if tokens is not None:
                    details[key] = tokens
        for key, names in _DETAIL_TEXTS:
            found = text(first(attributes, names))
            if found:
                details[key] = found
        # OpenLIT measures the time to the first token for every call; only a streamed one has a first chunk
        if get(STREAM) is True and "time_to_first_chunk_s" not in details:
            seconds = number(get(TIME_TO_FIRST_TOKEN))
            if seconds is not None:
                details["time_to_first_chunk_s"] = seconds
        definitions = get(TOOL_DEFINITIONS)
        if definitions is not None:
            declared = objects(definitions)
            if declared:
                details["tools_declared"] = declared

        input_messages: list[Message] | None = None
        output_messages: list[Message] | None = None
        if step_type == "tool":
            input_messages, output_messages = _tool_messages(span, attributes)
        if input_messages is None and output_messages is None:
            input_messages = semconv_messages(get(INPUT_MESSAGES), "user")
            # some releases also keep the system message in gen_ai.input.messages: never add it twice
            if not (input_messages and input_messages[0]["role"] == "system"):
                input_messages = with_system_instructions(input_messages, get(SYSTEM_INSTRUCTIONS))
            output_messages = semconv_messages(get(OUTPUT_MESSAGES), "assistant")
        if input_messages is None and output_messages is None:
            input_messages = _text_messages(get(PROMPT), "user")
            output_messages = _text_messages(get(COMPLETION), "assistant")
        if input_messages is None and output_messages is None and span.events:
            input_messages, output_messages = _event_text(span)
            if input_messages is None and output_messages is None:
                if any(event.name in CONTENT_EVENTS for event in span.events):
                    input_messages, output_messages = messages_from_span_events(span.events)
        span.input = input_messages
        span.output = output_messages
        span.content_captured = input_messages is not None or output_messages is not None


OPENLIT_MAPPER = register_mapper(OpenLIT(), precedence=PRECEDENCE)
