"""The agentgateway mapper: the gateway's request spans (LLM, MCP, A2A) and its outbound call spans.

agentgateway writes one SERVER span per request, named after the route (`POST /*`) or the MCP method, with
the call's details as attributes, and one CLIENT span per outbound call (`agentgateway.outbound.kind` /
`subtype`). The call type comes from `protocol`, `gen_ai.operation.name`, `mcp.method.name` and `a2a.method`,
never from the span name.

A request is one step, on its SERVER span: tokens, cost, content and the step type live there (that is where
agentgateway writes them). An outbound CLIENT span is the same call seen from the upstream side (the provider
call, the MCP server call, a guardrail or a mirror), so it is step type `other` with what it called in
`details` (`outbound_kind`, `outbound_subtype`, `mcp_target`, ...): counting it as a step of its own would
count every LLM and tool call twice.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from evalsi.model.span import Span
from evalsi.processors.normalize.mapper import register_mapper
from evalsi.processors.normalize.messages import Message, chat_message, chat_messages, tool_arguments
from evalsi.processors.normalize.otel_genai import (
    OPERATION,
    OTEL_GENAI,
    OTHER_ERROR,
    span_error_type,
    tool_messages,
)
from evalsi.processors.normalize.values import count, number, text

SCOPE = "agentgateway"  # the instrumentation scope of every span agentgateway writes
OUTBOUND_KIND = "agentgateway.outbound.kind"  # Primary, Policy, Mirror
OUTBOUND_SUBTYPE = "agentgateway.outbound.subtype"  # Http, Llm, Mcp, ExtAuthz, ExtProc, Guardrail, RateLimit, Oidc
PROTOCOL = "protocol"  # the backend protocol: http, tcp, llm, mcp, a2a
SOURCE_ADDRESS = "src.addr"
DURATION = "duration"
JWT_SUBJECT = "jwt.sub"
HTTP_STATUS = "http.status"
REASON = "reason"  # why the gateway answered itself (RateLimit, Guardrail, JwtAuth, UpstreamFailure, ...)
DIRECT_RESPONSE = "DirectResponse"  # a configured direct response: a reason that is not an error

MCP_METHOD = "mcp.method.name"
MCP_TARGET = "mcp.target"
MCP_RESOURCE_TYPE = "mcp.resource.type"
MCP_RESOURCE_URI = "mcp.resource.uri"
MCP_SESSION_ID = "mcp.session.id"
MCP_ERROR_CODE = "mcp.error.code"
MCP_ERROR_MESSAGE = "mcp.error.message"
MCP_PROMPT_NAME = "gen_ai.prompt.name"  # the MCP prompt requested by prompts/get, not prompt content
MCP_TOOL_CALL = "tools/call"

A2A_METHOD = "a2a.method"
A2A_OUTCOME = "a2a.response.outcome"  # success, error, unknown
A2A_ERROR_CODE = "a2a.response.error_code"
A2A_RESULT_KIND = "a2a.result.kind"
A2A_TASK_STATE = "a2a.task.state"
A2A_CONTEXT_ID = "a2a.context.id"
# The methods that send an agent a message (A2A 0.1-0.2, 0.3, 1.0); the others poll or manage tasks.
A2A_INVOCATIONS = frozenset(
    ("message/send", "message/stream", "tasks/send", "tasks/sendSubscribe", "SendMessage", "SendStreamingMessage")
)

COST_TOTAL = "agw.ai.usage.cost.total"
COST_PREFIX = "agw.ai.usage.cost."
COST_PARTS = ("input", "output", "cache_read", "cache_write", "reasoning", "input_audio", "output_audio")
COST_PART_ATTRIBUTES = tuple((name, COST_PREFIX + name) for name in COST_PARTS)
TIME_TO_FIRST_TOKEN = "agw.ai.time_to_first_token"  # seconds
TIME_PER_OUTPUT_TOKEN = "agw.ai.time_per_output_token"  # seconds
EXTRA_TOKENS: tuple[tuple[str, str], ...] = (
    ("gen_ai.usage.input_audio_tokens", "input_audio_tokens"),
    ("gen_ai.usage.output_audio_tokens", "output_audio_tokens"),
    ("gen_ai.usage.output_image_tokens", "output_image_tokens"),
)

# Content only appears when the gateway's CEL tracing fields add it (off by default). The fields its own
# examples use: `gen_ai.prompt: flattenRecursive(llm.prompt)` gives gen_ai.prompt.N.role / .content;
# Phoenix's example gives llm.input_messages.N.message.* and llm.output_messages.N.*; without
# flattenRecursive the whole list is one attribute.
FLATTENED_CONTENT: tuple[tuple[str, str, bool], ...] = (
    ("gen_ai.prompt.", "user", True),
    ("gen_ai.completion.", "assistant", False),
    ("llm.input_messages.", "user", True),
    ("llm.output_messages.", "assistant", False),
)
# each prefix with the keys its first message would have: the keys are scanned only when one is there
_CONTENT_FIRST_KEYS = tuple(
    (prefix, role, is_input, tuple(prefix + f for f in ("0.role", "0.content", "0.message.role", "0.message.content")))
    for prefix, role, is_input in FLATTENED_CONTENT
)
PROMPT = "gen_ai.prompt"
COMPLETION = "gen_ai.completion"


def _cost(span: Span, get: Any) -> None:
    parts: dict[str, float] = {}
    for name, attribute in COST_PART_ATTRIBUTES:
        value = get(attribute)
        if value is not None:
            # agentgateway writes costs as lossless decimal strings; numbers are tolerated
            found = number(value)
            if found is not None:
                parts[name] = found
    total = number(get(COST_TOTAL))
    if total is None and parts:
        # summed as decimals so 0.1 + 0.2 stays 0.3, as the gateway's own total would be
        total = float(sum(Decimal(repr(v)) for v in parts.values()))
    span.cost_usd = total
    if parts:
        span.details["cost_usd_parts"] = parts


def _tool_calls(fields: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Flattened `tool_calls.M.{id,name,arguments[.key]}` fields as flat tool-call dicts, by M."""
    calls: dict[int, dict[str, Any]] = {}
    for field, value in fields.items():
        if not field.startswith("tool_calls."):
            continue
        index, _, sub = field[11:].partition(".")
        if not index.isdigit() or not sub:
            continue
        call = calls.setdefault(int(index), {})
        if sub.startswith("arguments."):
            arguments = call.get("arguments")
            if not isinstance(arguments, dict):
                arguments = call["arguments"] = {}
            arguments[sub[10:]] = value
        elif sub.startswith("function."):
            call[sub[9:]] = value
        else:
            call[sub] = value
    if not calls:
        return None
    return [calls[i] for i in sorted(calls)]


def _flattened_message(fields: dict[str, Any], default_role: str) -> Message:
    body: dict[str, Any] = {"role": fields.get("role"), "content": fields.get("content")}
    calls = _tool_calls(fields)
    if calls is not None:
        body["tool_calls"] = [{**c, "arguments": tool_arguments(c.get("arguments"))} for c in calls]
    for key in ("tool_call_id", "id", "finish_reason"):
        if key in fields:
            body[key] = fields[key]
    return chat_message(default_role, body)


def _flattened_content(attributes: dict[str, Any]) -> tuple[list[Message] | None, list[Message] | None]:
    """(input, output) from `prefix.N.field` attributes, scanning the keys once and only if a first key is there."""
    present: list[tuple[str, str, bool]] = []
    for prefix, role, is_input, first_keys in _CONTENT_FIRST_KEYS:
        for key in first_keys:
            if key in attributes:
                present.append((prefix, role, is_input))
                break
    if not present:
        return None, None
    found: dict[str, dict[int, dict[str, Any]]] = {prefix: {} for prefix, _, _ in present}
    prefixes = tuple(found)
    for key, value in attributes.items():
        if not key.startswith(prefixes):
            continue
        for prefix in prefixes:
            if key.startswith(prefix):
                index, _, field = key[len(prefix) :].partition(".")
                if index.isdigit() and field:
                    if field.startswith("message."):
                        field = field[8:]
                    found[prefix].setdefault(int(index), {})[field] = value
                break
    inputs: list[Message] = []
    outputs: list[Message] = []
    for prefix, role, is_input in present:
        messages = found[prefix]
        (inputs if is_input else outputs).extend(_flattened_message(messages[i], role) for i in sorted(messages))
    return inputs or None, outputs or None


def _llm_content(span: Span, get: Any) -> None:
    if span.content_captured:
        return  # gen_ai.input.messages / output.messages (added by CEL) were already read
    input_messages, output_messages = _flattened_content(span.attributes)
    if input_messages is None:
        input_messages = chat_messages(get(PROMPT), "user")
    if output_messages is None:
        output_messages = chat_messages(get(COMPLETION), "assistant")
    span.input = input_messages
    span.output = output_messages
    span.content_captured = input_messages is not None or output_messages is not None


def _apply_llm(span: Span, get: Any) -> None:
    details = span.details
    _cost(span, get)
    for attribute, key in EXTRA_TOKENS:
        tokens = count(get(attribute))
        if tokens is not None:
            details[key] = tokens
    seconds = number(get(TIME_TO_FIRST_TOKEN))
    if seconds is not None:
        details["time_to_first_token_s"] = seconds
    seconds = number(get(TIME_PER_OUTPUT_TOKEN))
    if seconds is not None:
        details["time_per_output_token_s"] = seconds
    _llm_content(span, get)


def _put(details: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        details[key] = value


def _code(value: Any) -> Any:
    """A JSON-RPC error code: an int when it is one, else as sent."""
    if value is None:
        return None
    code = count(value)
    return value if code is None else code


def _apply_mcp(span: Span, get: Any, method: Any) -> None:
    details = span.details
    method = text(method)
    _put(details, "mcp_method", method)
    _put(details, "mcp_target", text(get(MCP_TARGET)))
    _put(details, "mcp_resource_type", text(get(MCP_RESOURCE_TYPE)))
    _put(details, "mcp_resource_uri", text(get(MCP_RESOURCE_URI)))
    _put(details, "mcp_prompt_name", text(get(MCP_PROMPT_NAME)))
    session = text(get(MCP_SESSION_ID))
    _put(details, "mcp_session_id", session)
    if span.session_id is None:
        span.session_id = session
    _put(details, "mcp_error_code", _code(get(MCP_ERROR_CODE)))
    _put(details, "mcp_error_message", text(get(MCP_ERROR_MESSAGE)))
    # a tool call is a tool step; initialize, tools/list, resources/read, notifications are the protocol's own
    if method == MCP_TOOL_CALL:
        span.step_type = "tool"
        if not span.content_captured:
            # arguments and result appear only when CEL fields add gen_ai.tool.call.arguments / .result
            span.input, span.output = tool_messages(span, span.attributes)
            span.content_captured = span.input is not None or span.output is not None
    else:
        span.step_type = "other"


def _apply_a2a(span: Span, get: Any, method: Any) -> None:
    details = span.details
    method = text(method)
    _put(details, "a2a_method", method)
    _put(details, "a2a_outcome", text(get(A2A_OUTCOME)))
    _put(details, "a2a_result_kind", text(get(A2A_RESULT_KIND)))
    _put(details, "a2a_task_state", text(get(A2A_TASK_STATE)))
    _put(details, "a2a_error_code", _code(get(A2A_ERROR_CODE)))
    context = text(get(A2A_CONTEXT_ID))
    _put(details, "a2a_context_id", context)
    if context is not None:
        # the A2A context ties the turns of one conversation together
        span.session_id = context
    span.step_type = "agent" if method in A2A_INVOCATIONS else "other"


def _gateway_error(get: Any) -> str | None:
    """The most specific error class the gateway records, for a request span without `error.type`."""
    code = get(MCP_ERROR_CODE)
    if code is not None:
        return text(code)  # the semconv's error.type for MCP: the JSON-RPC error code
    code = get(A2A_ERROR_CODE)
    if code is not None:
        return text(code)
    if get(A2A_OUTCOME) == "error":
        return OTHER_ERROR
    reason = text(get(REASON))
    if reason is not None and reason != DIRECT_RESPONSE:
        return reason
    status = count(get(HTTP_STATUS))
    if status is not None and status >= 400:
        return str(status)
    return None


def _apply_outbound(span: Span, kind: Any) -> None:
    """An outbound CLIENT span: not a step of its own; details say what it called."""
    get = span.attributes.get
    details = span.details
    details["outbound_kind"] = text(kind)
    _put(details, "outbound_subtype", text(get(OUTBOUND_SUBTYPE)))
    _put(details, "mcp_target", text(get(MCP_TARGET)))
    _put(details, "mcp_method", text(get(MCP_METHOD)))
    _put(details, "tool_name", text(get("gen_ai.tool.name")))
    error = span_error_type(span)
    if error is None or error == OTHER_ERROR:
        status = count(get(HTTP_STATUS))
        if status is not None and status >= 400:
            error = str(status)
    span.error_type = error


class Agentgateway:
    """Spans written by agentgateway (its `tracing` config): LLM, MCP and A2A requests and their outbound calls."""

    name = "agentgateway"
    version = "1"
    # what `matches` needs (one of them), for normalize to skip the call on other spans
    markers = frozenset((OUTBOUND_KIND, SOURCE_ADDRESS))
    scopes = frozenset((SCOPE,))

    def matches(self, span: Span) -> bool:
        if span.scope_name == SCOPE:
            return True
        attributes = span.attributes
        if OUTBOUND_KIND in attributes:
            return True
        # the request span's own attributes, should a collector on the way have renamed the scope
        return SOURCE_ADDRESS in attributes and DURATION in attributes and PROTOCOL in attributes

    def apply(self, span: Span) -> None:
        attributes = span.attributes
        get = attributes.get
        kind = get(OUTBOUND_KIND)
        if kind is not None:
            _apply_outbound(span, kind)
            return
        # the gen_ai.* attributes (model, provider, tokens, request parameters, cache and reasoning tokens,
        # gen_ai.tool.name, anything CEL fields add) read exactly as the OTel GenAI mapper reads them
        OTEL_GENAI.apply(span)
        protocol = text(get(PROTOCOL))
        if protocol is not None:
            span.details["protocol"] = protocol
        user = text(get(JWT_SUBJECT))
        if user is not None:
            span.user_id = user
        mcp_method = get(MCP_METHOD)
        a2a_method = get(A2A_METHOD)
        if mcp_method is not None or protocol == "mcp":
            _apply_mcp(span, get, mcp_method)
        elif a2a_method is not None or protocol == "a2a":
            _apply_a2a(span, get, a2a_method)
        elif protocol == "llm" or OPERATION in attributes:
            _apply_llm(span, get)
        if span.error_type is None or span.error_type == OTHER_ERROR:
            error = _gateway_error(get)
            if error is not None:
                span.error_type = error


AGENTGATEWAY = register_mapper(Agentgateway(), precedence=10)
