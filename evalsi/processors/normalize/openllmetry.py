"""The OpenLLMetry (Traceloop) mapper: `llm.request.type`, `traceloop.*` and the indexed `gen_ai.prompt.N.*` /
`gen_ai.completion.N.*` attributes of releases up to 0.54, and the `gen_ai.*.messages` of newer ones.
"""

from __future__ import annotations

from typing import Any

from evalsi.model.span import Span, StepType
from evalsi.processors.normalize.mapper import register_mapper
from evalsi.processors.normalize.messages import (
    CONTENT_EVENTS,
    Message,
    chat_message,
    messages_from_span_events,
    semconv_messages,
    tool_arguments,
    unparsed_message,
    with_system_instructions,
)
from evalsi.processors.normalize.otel_genai import (  # the semconv names this convention shares
    AGENT_NAME,
    CONVERSATION_ID,
    INPUT_MESSAGES,
    OPERATION,
    OPERATION_STEP_TYPES as OTEL_OPERATION_STEP_TYPES,
    OUTPUT_MESSAGES,
    REQUEST_MODEL,
    RESPONSE_MODEL,
    SYSTEM_INSTRUCTIONS,
    TOOL_CALL_ID,
    TOOL_NAME,
    fill_details,
    fill_provider_and_tokens,
    mark_framework_spans,
    span_error_type,
    tool_messages,
)
from evalsi.processors.normalize.values import as_text, count, first, is_malformed, loads, objects, text

PRECEDENCE = 40

REQUEST_TYPE = "llm.request.type"
SPAN_KIND = "traceloop.span.kind"
ENTITY_NAME = "traceloop.entity.name"
ENTITY_INPUT = "traceloop.entity.input"
ENTITY_OUTPUT = "traceloop.entity.output"
ENTITY_PATH = "traceloop.entity.path"
WORKFLOW_NAME = "traceloop.workflow.name"
ASSOCIATION_PREFIX = "traceloop.association.properties."
PROMPT_PREFIX = "gen_ai.prompt."
COMPLETION_PREFIX = "gen_ai.completion."
FUNCTIONS_PREFIX = "llm.request.functions."

TOOL_DEFINITIONS = "gen_ai.tool.definitions"

# details key <- OpenLLMetry's own count attributes (0.54 names, then the semconv-ai 0.5 ones); the semconv's
# gen_ai.usage.cache_read.input_tokens and friends are read by otel_genai.fill_details first
_DETAIL_COUNTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cache_read_input_tokens", ("gen_ai.usage.cache_read_input_tokens",)),
    ("cache_creation_input_tokens", ("gen_ai.usage.cache_creation_input_tokens",)),
    ("reasoning_tokens", ("llm.usage.reasoning_tokens",)),
    ("total_tokens", ("llm.usage.total_tokens", "gen_ai.usage.total_tokens")),
)

SPAN_KIND_STEP_TYPES: dict[str, StepType] = {"workflow": "chain", "task": "chain", "agent": "agent", "tool": "tool"}
REQUEST_TYPE_STEP_TYPES: dict[str, StepType] = {
    "chat": "llm",
    "completion": "llm",
    "embedding": "embedding",
    # a rerank reorders retrieved documents: a retrieval-stage step
    "rerank": "retriever",
}
# the newer releases write gen_ai.operation.name; these are OpenLLMetry's own values beside the semconv ones
OPERATION_STEP_TYPES: dict[str, StepType] = {
    **OTEL_OPERATION_STEP_TYPES,
    "execute_task": "chain",
    "llm_request": "llm",
    "vector_db_retrieve": "retriever",
}

# Present on OpenLLMetry spans and on nobody else's: the request type, the Traceloop SDK's keys, the first
# indexed prompt/completion key, and the streaming flag every LLM span carries (llm.* before 0.5, gen_ai.* after).
_MARKER_ATTRIBUTES = frozenset(
    (
        REQUEST_TYPE,
        SPAN_KIND,
        ENTITY_NAME,
        WORKFLOW_NAME,
        ENTITY_PATH,
        "gen_ai.prompt.0.role",
        "gen_ai.prompt.0.content",
        "gen_ai.prompt.0.user",
        "gen_ai.completion.0.role",
        "gen_ai.completion.0.content",
        "gen_ai.completion.0.finish_reason",
        "llm.is_streaming",
        "gen_ai.is_streaming",
        "llm.usage.total_tokens",
    )
)
_SCANNED_PREFIXES = (PROMPT_PREFIX, COMPLETION_PREFIX, FUNCTIONS_PREFIX, ASSOCIATION_PREFIX)


# --- the indexed gen_ai.prompt.N.* / gen_ai.completion.N.* attributes -----------------------------


class _Scan:
    """Everything behind a prefix, gathered in one pass over the attribute keys."""

    __slots__ = ("association", "completions", "functions", "prompts")

    def __init__(self) -> None:
        self.prompts: dict[int, dict[str, Any]] = {}
        self.completions: dict[int, dict[str, Any]] = {}
        self.functions: dict[int, dict[str, Any]] = {}
        self.association: dict[str, Any] = {}


def _indexed(into: dict[int, dict[str, Any]], rest: str, value: Any) -> None:
    index, _, name = rest.partition(".")
    # non-numeric "indexes" are request-wide keys (gen_ai.prompt.prompt_filter_results, gen_ai.prompt.error)
    if name and index.isdecimal():
        into.setdefault(int(index), {})[name] = value


def _scan(attributes: dict[str, Any]) -> _Scan:
    found = _Scan()
    for key, value in attributes.items():
        if not key.startswith(_SCANNED_PREFIXES):
            continue
        if key.startswith(PROMPT_PREFIX):
            _indexed(found.prompts, key[len(PROMPT_PREFIX) :], value)
        elif key.startswith(COMPLETION_PREFIX):
            _indexed(found.completions, key[len(COMPLETION_PREFIX) :], value)
        elif key.startswith(FUNCTIONS_PREFIX):
            _indexed(found.functions, key[len(FUNCTIONS_PREFIX) :], value)
        else:
            found.association[key[len(ASSOCIATION_PREFIX) :]] = value
    return found


def _content(value: Any) -> Any:
    """Message content: multimodal content arrives as a JSON list of OpenAI content parts; text stays text."""
    if isinstance(value, str) and value.startswith("["):
        parsed = loads(value)
        if isinstance(parsed, list) and parsed and all(isinstance(p, dict) and "type" in p for p in parsed):
            return parsed
    return value


def _flat_message(fields: dict[str, Any], default_role: str) -> Message:
    role = fields.get("role")
    if not isinstance(role, str) or not role:
        # the legacy completions API records its prompt as gen_ai.prompt.0.user
        role = "user" if "user" in fields else default_role
    content = fields.get("content")
    if content is None:
        content = fields.get("user")
    if content is None:
        content = fields.get("refusal")
    body: dict[str, Any] = {"role": role, "content": _content(content)}
    calls: dict[int, dict[str, Any]] = {}
    for name, value in fields.items():
        if name.startswith("tool_calls."):
            index, _, part = name[len("tool_calls.") :].partition(".")
            if part and index.isdecimal():
                calls.setdefault(int(index), {})[part] = value
        elif name.startswith("function_call."):
            calls.setdefault(0, {})[name[len("function_call.") :]] = value
    if calls:
        body["tool_calls"] = [calls[i] for i in sorted(calls)]
    if "tool_call_id" in fields:
        body["tool_call_id"] = fields["tool_call_id"]
    if fields.get("finish_reason") is not None:
        body["finish_reason"] = fields["finish_reason"]
    return chat_message(role, body)


def _flat_messages(indexed: dict[int, dict[str, Any]], default_role: str) -> list[Message] | None:
    if not indexed:
        return None
    return [_flat_message(indexed[i], default_role) for i in sorted(indexed)]


def _tools_declared(functions: dict[int, dict[str, Any]], definitions: Any) -> list[dict[str, Any]] | None:
    if functions:
        declared = []
        for i in sorted(functions):
            fields = functions[i]
            tool: dict[str, Any] = {"name": as_text(fields.get("name") or "")}
            if fields.get("description") is not None:
                tool["description"] = as_text(fields["description"])
            if fields.get("parameters") is not None:
                tool["parameters"] = tool_arguments(fields["parameters"])
            declared.append(tool)
        return declared
    return objects(definitions)


# --- traceloop.entity.input / traceloop.entity.output of the SDK's decorated functions -------------


def _entity_text(raw: Any, role: str) -> Message:
    """A JSON-encoded entity value as one text message: a JSON string literal is unwrapped, other JSON kept."""
    if isinstance(raw, str):
        parsed = loads(raw)
        if is_malformed(parsed):
            return unparsed_message(role, raw)
        content = parsed if isinstance(parsed, str) else raw
    else:
        content = as_text(raw)
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def _tool_call_arguments(parsed: Any) -> Any:
    """The decorator records `{"args": [...], "kwargs": {...}}`; a call made by keyword is just its kwargs."""
    if isinstance(parsed, dict) and parsed.keys() == {"args", "kwargs"} and not parsed["args"]:
        return parsed["kwargs"]
    return parsed


def _tool_messages(span: Span, attributes: dict[str, Any]) -> tuple[list[Message] | None, list[Message] | None]:
    """A tool span's call as an assistant tool_call message in, and a tool response message out."""
    # the semconv's gen_ai.tool.call.* (newer SDKs) first; the decorator's traceloop.entity.* otherwise
    input_messages, output_messages = tool_messages(span, attributes)
    get = attributes.get
    call_id = text(get(TOOL_CALL_ID))
    if input_messages is None:
        raw = get(ENTITY_INPUT)
        parsed = loads(raw) if isinstance(raw, str) else raw
        if is_malformed(parsed):
            input_messages = [unparsed_message("assistant", raw)]
        elif raw is not None:
            call = {
                "type": "tool_call",
                "id": call_id,
                "name": span.tool_name or "",
                "arguments": _tool_call_arguments(parsed),
            }
            input_messages = [{"role": "assistant", "parts": [call]}]
    if output_messages is None:
        result = get(ENTITY_OUTPUT)
        if isinstance(result, str):
            parsed = loads(result)
            if isinstance(parsed, str):
                result = parsed
        if result is not None:
            output_messages = [
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": result}]}
            ]
    return input_messages, output_messages


def _entity_messages(attributes: dict[str, Any]) -> tuple[list[Message] | None, list[Message] | None]:
    raw_in = attributes.get(ENTITY_INPUT)
    raw_out = attributes.get(ENTITY_OUTPUT)
    return (
        None if raw_in is None else [_entity_text(raw_in, "user")],
        None if raw_out is None else [_entity_text(raw_out, "assistant")],
    )


# --- the mapper -----------------------------------------------------------------------------------


def _step_type(attributes: dict[str, Any], model: str | None) -> str:
    kind = attributes.get(SPAN_KIND)
    if isinstance(kind, str) and kind in SPAN_KIND_STEP_TYPES:
        return SPAN_KIND_STEP_TYPES[kind]
    request_type = attributes.get(REQUEST_TYPE)
    if isinstance(request_type, str) and request_type in REQUEST_TYPE_STEP_TYPES:
        return REQUEST_TYPE_STEP_TYPES[request_type]
    operation = attributes.get(OPERATION)
    if isinstance(operation, str) and operation in OPERATION_STEP_TYPES:
        return OPERATION_STEP_TYPES[operation]
    return "llm" if model else "other"


class OpenLLMetry:
    """Spans from OpenLLMetry instrumentations and the Traceloop SDK, from the 0.2x releases to the latest."""

    name = "openllmetry"
    version = "1"
    markers = _MARKER_ATTRIBUTES

    def matches(self, span: Span) -> bool:
        return not span.attributes.keys().isdisjoint(self.markers)

    def apply(self, span: Span) -> None:
        attributes = span.attributes
        get = attributes.get
        # One pass over the keys for the prefixed families. Association properties have no first key to
        # look up, and this only runs on spans that already carry an OpenLLMetry marker.
        scan = _scan(attributes)
        association = scan.association

        model = text(get(RESPONSE_MODEL) or get(REQUEST_MODEL))
        step_type = _step_type(attributes, model)
        span.step_type = step_type
        span.model = model
        fill_provider_and_tokens(span, get)

        entity = text(get(ENTITY_NAME))
        if step_type == "tool":
            span.tool_name = entity or text(get(TOOL_NAME))
        span.agent_name = (entity if step_type == "agent" else None) or text(get(AGENT_NAME))
        span.session_id = (
            text(association.get("session_id"))
            or text(association.get("conversation_id"))
            or text(get(CONVERSATION_ID))
        )
        span.user_id = text(association.get("user_id")) or text(get("llm.user")) or text(get("gen_ai.user"))
        span.error_type = span_error_type(span)

        fill_details(span, attributes)
        mark_framework_spans(span, get(OPERATION))
        details = span.details
        for key, names in _DETAIL_COUNTS:
            if key not in details:
                tokens = count(first(attributes, names))
                if tokens is not None:
                    details[key] = tokens
        request_type = get(REQUEST_TYPE)
        if isinstance(request_type, str) and request_type:
            details["request_type"] = request_type
        if association:
            details["association_properties"] = association
        workflow = text(get(WORKFLOW_NAME))
        if workflow:
            details["workflow_name"] = workflow
        if entity:
            details["entity_name"] = entity
        definitions = get(TOOL_DEFINITIONS)
        if scan.functions or definitions is not None:
            declared = _tools_declared(scan.functions, definitions)
            if declared:
                details["tools_declared"] = declared

        input_messages: list[Message] | None = None
        output_messages: list[Message] | None = None
        if step_type == "tool" and get(INPUT_MESSAGES) is None and not scan.prompts:
            input_messages, output_messages = _tool_messages(span, attributes)
        if input_messages is None and output_messages is None:
            input_messages = semconv_messages(get(INPUT_MESSAGES), "user")
            # some releases also keep the system message in gen_ai.input.messages: never add it twice
            if not (input_messages and input_messages[0]["role"] == "system"):
                input_messages = with_system_instructions(input_messages, get(SYSTEM_INSTRUCTIONS))
            output_messages = semconv_messages(get(OUTPUT_MESSAGES), "assistant")
        if input_messages is None and output_messages is None:
            input_messages = _flat_messages(scan.prompts, "user")
            output_messages = _flat_messages(scan.completions, "assistant")
        if input_messages is None and output_messages is None:
            input_messages, output_messages = _entity_messages(attributes)
        if input_messages is None and output_messages is None and span.events:
            if any(event.name in CONTENT_EVENTS for event in span.events):
                input_messages, output_messages = messages_from_span_events(span.events)
        span.input = input_messages
        span.output = output_messages
        span.content_captured = input_messages is not None or output_messages is not None


OPENLLMETRY = register_mapper(OpenLLMetry(), precedence=PRECEDENCE)
