"""The OTel GenAI semconv mapper: `gen_ai.*` attributes and content events to canonical fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evalsi.model.span import PLUMBING, VENDOR_SDK, VENDOR_SDK_SCOPES, WORKFLOW, Span, StepType
from evalsi.processors.normalize import pydantic_ai
from evalsi.processors.normalize.langchain import callback_arguments, tool_message
from evalsi.processors.normalize.mapper import GENERIC_PRECEDENCE, register_mapper
from evalsi.processors.normalize.messages import (
    CONTENT_EVENTS,
    Message,
    converse_blocks,
    converse_text,
    messages_from_span_events,
    semconv_messages,
    tool_arguments,
    with_system_instructions,
)
from evalsi.processors.normalize.values import (
    MAX_TOKENS,
    count,
    flag,
    is_malformed,
    loads,
    number,
    number_or_int,
    strings,
    text,
    token_count,
)

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
SYSTEM = "gen_ai.system"  # the provider before semconv 1.37
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"  # before semconv 1.27
COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"  # before semconv 1.27
CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
# the GenAI semconv renamed cache_creation to cache_write (semantic-conventions-genai #440); both are read, the
# new name winning when a span carries both (the Anthropic SDK's spans wrote cache_write before the rename)
CACHE_WRITE_TOKENS = "gen_ai.usage.cache_write.input_tokens"
CACHE_CREATION_TOKENS = "gen_ai.usage.cache_creation.input_tokens"  # the name before the rename
CACHE_READ_TOKENS_UNDERSCORED = "gen_ai.usage.cache_read_input_tokens"  # the names before semconv 1.37
CACHE_CREATION_TOKENS_UNDERSCORED = "gen_ai.usage.cache_creation_input_tokens"
REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
REASONING_TOKENS_UNOFFICIAL = "gen_ai.usage.reasoning_tokens"  # agentgateway, OpenLLMetry: not in the semconv
TOOL_NAME = "gen_ai.tool.name"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
ANTHROPIC_TOOL_RESULT = "anthropic.tool_result.content"  # the Anthropic SDK's tool runner: no tool.call.result
AGENT_NAME = "gen_ai.agent.name"
AGENT_ID = "gen_ai.agent.id"
AGENT_DESCRIPTION = "gen_ai.agent.description"
AGENT_VERSION = "gen_ai.agent.version"
WORKFLOW_NAME = "gen_ai.workflow.name"
DATA_SOURCE_ID = "gen_ai.data_source.id"
RETRIEVAL_QUERY = "gen_ai.retrieval.query.text"
RETRIEVAL_DOCUMENTS = "gen_ai.retrieval.documents"
OUTPUT_TYPE = "gen_ai.output.type"
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
CONVERSATION_ID = "gen_ai.conversation.id"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
USER_ID = "user.id"
ENDUSER_ID = "enduser.id"  # the older name, still in the semconv registry
ERROR_TYPE = "error.type"
EXCEPTION_EVENT = "exception"
EXCEPTION_TYPE = "exception.type"

# The semconv's fallback `error.type` value: the span failed and nothing names the error class.
OTHER_ERROR = "_OTHER"

EXECUTE_TOOL = "execute_tool"
INVOKE_WORKFLOW = "invoke_workflow"
STEP_TYPE = "evalsi.step.type"
"""Set by evalsi's own harness on spans the GenAI conventions have no operation for (a user's turn)."""
RETRIEVAL = "retrieval"

OPERATION_STEP_TYPES: dict[str, StepType] = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "embeddings": "embedding",
    EXECUTE_TOOL: "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
    INVOKE_WORKFLOW: "chain",
    RETRIEVAL: "retriever",
}

# Request parameters (gen_ai.request.*, and the embedding size) -> (key of details["request"], value kind).
# Values are typed by kind so spans re-read from the store (attribute values as strings) map alike.
REQUEST_PARAMETERS: tuple[tuple[str, str, str], ...] = (
    ("gen_ai.request.temperature", "temperature", "number"),
    ("gen_ai.request.max_tokens", "max_tokens", "count"),
    ("gen_ai.request.top_p", "top_p", "number"),
    ("gen_ai.request.top_k", "top_k", "number"),
    ("gen_ai.request.frequency_penalty", "frequency_penalty", "number"),
    ("gen_ai.request.presence_penalty", "presence_penalty", "number"),
    ("gen_ai.request.stop_sequences", "stop_sequences", "list"),
    ("gen_ai.request.seed", "seed", "count"),
    ("gen_ai.request.choice.count", "choice_count", "count"),
    ("gen_ai.request.encoding_formats", "encoding_formats", "list"),
    ("gen_ai.request.stream", "stream", "bool"),
    ("gen_ai.embeddings.dimension.count", "dimensions", "count"),
)

# Plain identifying facts -> details keys
TEXT_DETAILS: tuple[tuple[str, str], ...] = (
    (RESPONSE_ID, "response_id"),
    (AGENT_ID, "agent_id"),
    (AGENT_DESCRIPTION, "agent_description"),
    (AGENT_VERSION, "agent_version"),
    (WORKFLOW_NAME, "workflow_name"),
    (DATA_SOURCE_ID, "data_source_id"),
    (TOOL_TYPE, "tool_type"),
    (TOOL_DESCRIPTION, "tool_description"),
    (TOOL_CALL_ID, "tool_call_id"),
    (OUTPUT_TYPE, "output_type"),
)

_MARKER_ATTRIBUTES = frozenset((OPERATION, SYSTEM, PROVIDER, REQUEST_MODEL, STEP_TYPE))

PLUMBING_OPERATIONS = frozenset(("create_agent",))
"""Operations that are no step of a run, as `details["plumbing"]`."""


def error_type(value: Any) -> str | None:
    """An `error.type` value as canonical text; Python's `<class 'pkg.Error'>` repr becomes `pkg.Error`."""
    found = text(value)
    if found is not None and found.startswith("<class '") and found.endswith("'>"):
        return found[8:-2] or None
    return found


def _exception_type(span: Span) -> str | None:
    for event in span.events:
        if event.name == EXCEPTION_EVENT:
            found = error_type(event.attributes.get(EXCEPTION_TYPE))
            if found is not None:
                return found
    return None


def span_error_type(span: Span) -> str | None:
    """`error.type`; for a span with ERROR status and none, its exception event's type or `_OTHER`."""
    value = span.attributes.get(ERROR_TYPE)
    found = None if value is None else error_type(value)
    if found is None and span.status_code == "ERROR":
        found = (_exception_type(span) if span.events else None) or OTHER_ERROR
    return found


_PARAMETER_KINDS = {"number": number_or_int, "count": count, "list": strings, "bool": flag}


def _document(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        return {"id": None, "content": text(item), "score": None, "metadata": None}
    content = item.get("content")
    if content is None:
        content = item.get("text")
    metadata = item.get("metadata")
    if metadata is None:
        extra = {k: v for k, v in item.items() if k not in ("id", "content", "text", "score", "metadata")}
        metadata = extra or None
    return {"id": text(item.get("id")), "content": content, "score": number(item.get("score")), "metadata": metadata}


def retrieval_documents(value: Any) -> tuple[list[dict[str, Any]] | None, bool]:
    """(documents as {"id", "content", "score", "metadata"}, parsed?) from `gen_ai.retrieval.documents`.

    The value is a list (structured) or its JSON string; text that will not parse is kept as one document's content.
    """
    if value is None or value == "":
        return None, True
    if isinstance(value, str):
        parsed = loads(value)
        if is_malformed(parsed):
            return [{"id": None, "content": value, "score": None, "metadata": None}], False
        value = parsed
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return [{"id": None, "content": text(value), "score": None, "metadata": None}], False
    return [_document(item) for item in value] or None, True


def json_string(value: Any) -> Any:
    """A value that is a JSON-encoded string (`"\"sunny\""`, as the Vercel AI SDK records a tool's string result) as
    that string; anything else as given (a JSON object's text stays text: the span recorded it so)."""
    if isinstance(value, str) and len(value) > 1 and value[0] == '"' and value[-1] == '"':
        parsed = loads(value)
        if isinstance(parsed, str):
            return parsed
    return value


def anthropic_tool_result(value: Any) -> Any:
    """`anthropic.tool_result.content`: the tool_result block's content, a JSON list of content blocks; text blocks
    alone are their text (what the tool returned), anything else is kept as given."""
    blocks = loads(value) if isinstance(value, str) and value.startswith("[") else value
    if (
        isinstance(blocks, list)
        and blocks
        and all(isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in blocks)
    ):
        return "".join(b["text"] for b in blocks)
    return value


def tool_messages(span: Span, attributes: dict[str, Any]) -> tuple[list[Message] | None, list[Message] | None]:
    """A tool call's arguments as an assistant tool_call message in, and its result as a tool response out.

    LangChain's shapes are unwrapped (OpenLLMetry records them as they come): the callback input record
    `{"input_str": "{'location': 'Paris'}", "tags": ...}` becomes the named arguments, a serialized ToolMessage
    its content (and its `tool_call_id` the call id when `gen_ai.tool.call.id` is absent).
    """
    input_messages: list[Message] | None = None
    output_messages: list[Message] | None = None
    call_id = text(attributes.get(TOOL_CALL_ID))
    result: Any = None
    has_result = False
    if TOOL_CALL_RESULT in attributes:
        result, has_result = json_string(attributes[TOOL_CALL_RESULT]), True
    elif ANTHROPIC_TOOL_RESULT in attributes:
        result, has_result = anthropic_tool_result(attributes[ANTHROPIC_TOOL_RESULT]), True
    if has_result:
        blocks = converse_blocks(result)  # Strands: the result as Converse content blocks
        if blocks is not None:
            result = converse_text(blocks) or result
        unwrapped = tool_message(result)
        if unwrapped is not None:
            result = unwrapped[0]
            call_id = call_id or unwrapped[1]
    if TOOL_CALL_ARGUMENTS in attributes:
        call = {
            "type": "tool_call",
            "id": call_id,
            "name": span.tool_name or "",
            "arguments": tool_arguments(callback_arguments(attributes[TOOL_CALL_ARGUMENTS])),
        }
        input_messages = [{"role": "assistant", "parts": [call]}]
    if has_result:
        response = {"type": "tool_call_response", "id": call_id, "response": result}
        output_messages = [{"role": "tool", "parts": [response]}]
    if call_id is not None and TOOL_CALL_ID not in attributes:
        span.details["tool_call_id"] = call_id
    return input_messages, output_messages


_tool_messages = tool_messages  # the name other mappers may already import


def tool_event_messages(
    span: Span, inputs: list[Message] | None, outputs: list[Message] | None
) -> tuple[list[Message] | None, list[Message] | None]:
    """A tool span's call and result from its content events, as Strands writes them by default: a
    `gen_ai.tool.message` whose content is the arguments (read as a tool response: turned into the call) and a
    `gen_ai.choice` whose message is the result (read as assistant text: turned into the response)."""
    parts = [p for m in inputs or () for p in m["parts"]]
    call_id = span.details.get("tool_call_id")
    if parts and not any(p["type"] == "tool_call" for p in parts):
        sent = next((p for p in parts if p["type"] == "tool_call_response"), None)
        if sent is not None:
            call_id = call_id or sent.get("id")
            call = {"type": "tool_call", "id": call_id, "name": span.tool_name or "",
                    "arguments": tool_arguments(sent.get("response"))}  # fmt: skip
            inputs = [{"role": "assistant", "parts": [call]}]
    out_parts = [p for m in outputs or () for p in m["parts"]]
    if out_parts and not any(p["type"] == "tool_call_response" for p in out_parts):
        texts = [p["content"] for p in out_parts if p["type"] == "text" and isinstance(p.get("content"), str)]
        if texts:
            response = {"type": "tool_call_response", "id": call_id, "response": "".join(texts)}
            outputs = [{"role": "tool", "parts": [response]}]
    return inputs, outputs


def fill_provider_and_tokens(span: Span, get: Callable[[str], Any]) -> None:
    """`span.provider` and its input/output token counts, under the semconv's names or the older ones."""
    provider = get(PROVIDER) or get(SYSTEM)
    # `text` and `token_count` read what these forms do not (a count as text, the older names): called for the rest
    span.provider = provider if type(provider) is str and provider else text(provider)
    tokens = get(INPUT_TOKENS)
    if type(tokens) is not int or not 0 <= tokens <= MAX_TOKENS:
        tokens = token_count(span.unparsed, "input_tokens", tokens, get(PROMPT_TOKENS))
    span.input_tokens = tokens
    tokens = get(OUTPUT_TOKENS)
    if type(tokens) is not int or not 0 <= tokens <= MAX_TOKENS:
        tokens = token_count(span.unparsed, "output_tokens", tokens, get(COMPLETION_TOKENS))
    span.output_tokens = tokens


def _detail_fields() -> dict[str, tuple[str | None, str, Callable[[Any], Any], int]]:
    """attribute -> (group (None: top level, or "request"), detail key, converter, priority)."""
    fields: dict[str, tuple[str | None, str, Callable[[Any], Any], int]] = {}
    for attribute, key in TEXT_DETAILS:
        fields[attribute] = (None, key, text, 0)
    fields[CACHE_READ_TOKENS] = (None, "cache_read_input_tokens", count, 1)
    fields[CACHE_READ_TOKENS_UNDERSCORED] = (None, "cache_read_input_tokens", count, 0)
    fields[CACHE_WRITE_TOKENS] = (None, "cache_creation_input_tokens", count, 2)  # the current name wins over
    fields[CACHE_CREATION_TOKENS] = (None, "cache_creation_input_tokens", count, 1)  # the name before the rename,
    fields[CACHE_CREATION_TOKENS_UNDERSCORED] = (None, "cache_creation_input_tokens", count, 0)  # and the older one
    fields[REASONING_TOKENS] = (None, "reasoning_tokens", count, 1)  # the semconv name wins over
    fields[REASONING_TOKENS_UNOFFICIAL] = (None, "reasoning_tokens", count, 0)  # the name some emit
    fields[FINISH_REASONS] = (None, "finish_reasons", strings, 0)
    fields[TIME_TO_FIRST_CHUNK] = (None, "time_to_first_token_s", number, 0)
    for attribute, key, kind in REQUEST_PARAMETERS:
        fields[attribute] = ("request", key, _PARAMETER_KINDS[kind], 0)
    return fields


_DETAIL_FIELDS = _detail_fields()
_DETAIL_KEYS = [spec[1] for spec in _DETAIL_FIELDS.values()]
_CONTESTED_DETAILS = frozenset(key for key in _DETAIL_KEYS if _DETAIL_KEYS.count(key) > 1)
"""Detail keys more than one attribute fills (cache and reasoning counts under their names old and new)."""


def fill_details(span: Span, attributes: dict[str, Any]) -> None:
    """The semconv's extra facts into `span.details`: usage breakdown, request parameters, response, ids.

    One pass over the span's attributes (a dozen) rather than a lookup per known name (forty): this runs per span.
    """
    details = span.details
    fields = _DETAIL_FIELDS
    request: dict[str, Any] | None = None
    won: dict[str, int] | None = None
    for attribute, value in attributes.items():
        spec = fields.get(attribute)
        if spec is None or value is None:
            continue
        group, key, convert, priority = spec
        # what each converter returns as it is, without its call: a non-empty string as text, an int as a count
        if type(value) is str:
            found = value if convert is text and value else convert(value)
        elif type(value) is int:
            found = value if convert is count or convert is number_or_int else convert(value)
        else:
            found = convert(value)
        if found is None:
            continue
        if group is None:
            if key in _CONTESTED_DETAILS:  # more than one attribute fills it: the higher priority wins
                if won is None:
                    won = {}
                elif won.get(key, -1) >= priority:
                    continue
                won[key] = priority
            details[key] = found
        else:
            if request is None:
                request = {}
            request[key] = found
    if request is not None:
        details["request"] = request


def mark_framework_spans(span: Span, operation: Any) -> None:
    """Per-span facts the trajectory needs to count each call once, to skip plumbing and to show workflows
    (`VENDOR_SDK`, `PLUMBING`, `WORKFLOW`)."""
    vendor = VENDOR_SDK_SCOPES.get(span.scope_name)
    if vendor is not None:
        span.details[VENDOR_SDK] = vendor
    if isinstance(operation, str):
        if operation in PLUMBING_OPERATIONS:
            span.details[PLUMBING] = operation
        elif operation == INVOKE_WORKFLOW:
            span.details[WORKFLOW] = True


class OtelGenAI:
    """Spans written to the OTel GenAI semantic conventions, from semconv 1.26 to the latest experimental."""

    name = "otel_genai"
    version = "2"

    def matches(self, span: Span) -> bool:
        if not span.attributes.keys().isdisjoint(_MARKER_ATTRIBUTES):
            return True
        if span.events:
            return any(event.name in CONTENT_EVENTS for event in span.events)
        return False

    def apply(self, span: Span) -> None:
        attributes = span.attributes
        get = attributes.get
        # `text` is called only for what is neither None nor a non-empty string (what it returns as they are)
        model = get(RESPONSE_MODEL) or get(REQUEST_MODEL)
        if type(model) is not str or not model:
            model = text(model)
        operation = get(OPERATION)
        step_type = OPERATION_STEP_TYPES.get(operation) if isinstance(operation, str) else None
        if step_type is None and get(STEP_TYPE) == "user":  # the harness's user turns (no semconv operation yet)
            step_type = "user"
        if step_type is None:
            step_type = "llm" if model else "other"
        span.step_type = step_type
        span.model = model
        fill_provider_and_tokens(span, get)
        value = get(TOOL_NAME)
        span.tool_name = value if value is None or (type(value) is str and value) else text(value)
        value = get(CONVERSATION_ID)
        span.session_id = value if value is None or (type(value) is str and value) else text(value)
        value = get(AGENT_NAME)
        span.agent_name = value if value is None or (type(value) is str and value) else text(value)
        value = get(USER_ID)
        if value is None:
            value = get(ENDUSER_ID)
        span.user_id = value if value is None or (type(value) is str and value) else text(value)
        span.error_type = span_error_type(span) if span.status_code == "ERROR" or ERROR_TYPE in attributes else None
        fill_details(span, attributes)
        mark_framework_spans(span, operation)

        input_messages: list[Message] | None = None
        output_messages: list[Message] | None = None
        if operation == EXECUTE_TOOL:
            input_messages, output_messages = tool_messages(span, attributes)
        if input_messages is None and output_messages is None:
            value = get(INPUT_MESSAGES)
            if value is not None:
                input_messages = semconv_messages(value, "user")
            value = get(SYSTEM_INSTRUCTIONS)
            if value is not None:
                input_messages = with_system_instructions(input_messages, value)
            value = get(OUTPUT_MESSAGES)
            if value is not None:
                output_messages = semconv_messages(value, "assistant")
        if input_messages is None and output_messages is None and span.events:
            input_messages, output_messages = messages_from_span_events(span.events)
            if operation == EXECUTE_TOOL:
                input_messages, output_messages = tool_event_messages(span, input_messages, output_messages)
        if input_messages is None and output_messages is None and pydantic_ai.is_agent_run(attributes):
            input_messages, output_messages = pydantic_ai.agent_messages(attributes)
        if step_type == "llm" and pydantic_ai.OPERATION_COST in attributes:
            span.cost_usd = pydantic_ai.operation_cost(attributes)
        if operation == RETRIEVAL or RETRIEVAL_DOCUMENTS in attributes:
            query = text(get(RETRIEVAL_QUERY))
            if input_messages is None and query is not None:
                input_messages = [{"role": "user", "parts": [{"type": "text", "content": query}]}]
            documents, parsed = retrieval_documents(get(RETRIEVAL_DOCUMENTS))
            if documents is not None:
                span.details["documents"] = documents
                if not parsed:
                    span.unparsed.append("documents")
        span.input = input_messages
        span.output = output_messages
        span.content_captured = input_messages is not None or output_messages is not None


OTEL_GENAI = register_mapper(OtelGenAI(), precedence=GENERIC_PRECEDENCE)
