"""The MLflow tracing mapper: `mlflow.spanType`, `mlflow.spanInputs` / `mlflow.spanOutputs`, `mlflow.chat.tokenUsage`
and the other `mlflow.*` span attributes (as MLflow exports them over OTLP) to canonical fields.

MLflow JSON-encodes every attribute value it sets: a string arrives as `"\\"CHAT_MODEL\\""`, a number as `"40"`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evalsi.model.span import Span, StepType
from evalsi.processors.normalize.mapper import register_mapper
from evalsi.processors.normalize.messages import Message, semconv_messages, tool_arguments, unparsed_message
from evalsi.processors.normalize.openai_bodies import (
    first_event_seconds,
    openai_request_messages,
    openai_response_messages,
    request_parameters,
    text_message,
)
from evalsi.processors.normalize.otel_genai import (  # the semconv names this convention shares
    AGENT_NAME as GEN_AI_AGENT_NAME,
    CONVERSATION_ID as GEN_AI_CONVERSATION_ID,
    INPUT_MESSAGES as GEN_AI_INPUT_MESSAGES,
    INPUT_TOKENS as GEN_AI_INPUT_TOKENS,
    OUTPUT_MESSAGES as GEN_AI_OUTPUT_MESSAGES,
    OUTPUT_TOKENS as GEN_AI_OUTPUT_TOKENS,
    PROVIDER as GEN_AI_PROVIDER,
    REQUEST_MODEL as GEN_AI_REQUEST_MODEL,
    RESPONSE_MODEL as GEN_AI_RESPONSE_MODEL,
    SYSTEM as GEN_AI_SYSTEM,
    TOOL_NAME as GEN_AI_TOOL_NAME,
    span_error_type,
)
from evalsi.processors.normalize.values import count, first, is_malformed, loads, number, text, token_count

SPAN_TYPE = "mlflow.spanType"
TRACE_REQUEST_ID = "mlflow.traceRequestId"
INPUTS = "mlflow.spanInputs"
OUTPUTS = "mlflow.spanOutputs"
FUNCTION_NAME = "mlflow.spanFunctionName"
TOKEN_USAGE = "mlflow.chat.tokenUsage"
COST = "mlflow.llm.cost"
MODEL = "mlflow.llm.model"
PROVIDER = "mlflow.llm.provider"
MESSAGE_FORMAT = "mlflow.message.format"
REQUEST_MODEL = "model"  # openai autolog sets each request keyword argument as an attribute
SESSION_ID = "session.id"  # copied onto the root span from the trace metadata for OTLP export
USER_ID = "user.id"
TRACE_SESSION = "mlflow.trace.session"  # the trace-metadata keys, when an app sets them on a span
TRACE_USER = "mlflow.trace.user"
CHUNK_EVENT_PREFIX = "mlflow.chunk.item."  # one event per streamed chunk: mlflow.chunk.item.0, .1, ...


SPAN_TYPE_STEP_TYPES: dict[str, StepType] = {
    "LLM": "llm",
    "CHAT_MODEL": "llm",
    "CHAIN": "chain",
    "WORKFLOW": "chain",
    "TASK": "chain",
    "PARSER": "chain",
    "AGENT": "agent",
    "TOOL": "tool",
    "RETRIEVER": "retriever",
    "RERANKER": "retriever",
    "MEMORY": "retriever",
    "EMBEDDING": "embedding",
    "GUARDRAIL": "other",
    "EVALUATOR": "other",
    "UNKNOWN": "other",
}
# types whose step type does not say all: the type is kept as details["span_type"]
_LOSSY_TYPES = frozenset(("WORKFLOW", "TASK", "PARSER", "RERANKER", "MEMORY", "GUARDRAIL", "EVALUATOR"))

# mlflow.message.format values that name the provider's own API (the openai autolog writes "openai")
_FORMAT_PROVIDERS = {"openai": "openai"}

# details key <- mlflow.chat.tokenUsage key
USAGE_DETAILS = {
    "total_tokens": "total_tokens",
    "cache_read_input_tokens": "cache_read_input_tokens",
    "cache_creation_input_tokens": "cache_creation_input_tokens",
}

_MARKER_ATTRIBUTES = frozenset((SPAN_TYPE, TRACE_REQUEST_ID, INPUTS, OUTPUTS))

_ABSENT = object()


def _scalar(value: Any) -> Any:
    """A JSON-encoded string attribute decoded (`'"gpt-4o"'` -> `'gpt-4o'`); other values as given."""
    if isinstance(value, str) and value[:1] == '"':
        if len(value) > 1 and value[-1] == '"' and "\\" not in value:
            return value[1:-1]  # the common case, without a JSON parse
        decoded = loads(value)
        if isinstance(decoded, str):
            return decoded
    return value


def _parsed(value: Any) -> Any:
    """A JSON attribute (inputs, outputs, usage) parsed; `_ABSENT` when missing, the malformed marker if bad."""
    if value is None or value == "":
        return _ABSENT
    if isinstance(value, str):
        return loads(value)
    return value


def _content(raw: Any, parsed: Any, role: str, output: bool) -> list[Message] | None:
    """Span inputs or outputs as messages: an OpenAI body when it is one, a lone string as text, else the JSON."""
    if parsed is _ABSENT:
        return None
    if is_malformed(parsed):
        return [unparsed_message(role, raw)]
    if parsed is None or parsed == "" or parsed == {} or parsed == []:
        return None
    if isinstance(parsed, str):
        return [text_message(role, parsed)]
    if isinstance(parsed, Mapping):
        found = openai_response_messages(parsed) if output else openai_request_messages(parsed)
        if found:
            return found
        if len(parsed) == 1:
            (only,) = parsed.values()
            if isinstance(only, str) and only:
                return [text_message(role, only)]
    return [text_message(role, raw if isinstance(raw, str) else parsed)]


def _document(item: Any) -> dict[str, Any]:
    """An MLflow `Document` (`page_content`, `metadata`, `id`) as a canonical document."""
    if not isinstance(item, Mapping):
        return {"id": None, "content": item, "score": None, "metadata": None}
    metadata = item.get("metadata")
    score = item.get("score")
    if score is None and isinstance(metadata, Mapping):
        score = metadata.get("score")
    content = item.get("page_content")
    return {
        "id": text(item.get("id") or (metadata.get("doc_uri") if isinstance(metadata, Mapping) else None)),
        "content": item.get("content") if content is None else content,
        "score": number(score),
        "metadata": metadata,
    }


class MLflow:
    """Spans from MLflow tracing (`mlflow.<flavor>.autolog()`, `@mlflow.trace`), exported over OTLP."""

    name = "mlflow"
    version = "1"
    markers = _MARKER_ATTRIBUTES

    def matches(self, span: Span) -> bool:
        return not span.attributes.keys().isdisjoint(self.markers)

    def apply(self, span: Span) -> None:
        attributes = span.attributes
        get = attributes.get
        details = span.details
        raw_type = _scalar(get(SPAN_TYPE))
        kind = raw_type.upper() if isinstance(raw_type, str) else ""
        step_type = SPAN_TYPE_STEP_TYPES.get(kind)
        if step_type is None:
            step_type = "llm" if TOKEN_USAGE in attributes or MODEL in attributes else "other"
        if kind in _LOSSY_TYPES or (kind and kind not in SPAN_TYPE_STEP_TYPES):
            details["span_type"] = raw_type
        span.step_type = step_type
        request_id = text(_scalar(get(TRACE_REQUEST_ID)))
        if request_id is not None:
            details["mlflow_trace_request_id"] = request_id
        function_name = text(_scalar(get(FUNCTION_NAME)))
        if function_name is not None:
            details["function_name"] = function_name

        raw_inputs = get(INPUTS)
        raw_outputs = get(OUTPUTS)
        inputs = _parsed(raw_inputs)
        outputs = _parsed(raw_outputs)
        model_call = step_type in ("llm", "embedding")

        model = text(_scalar(get(MODEL)) or get(GEN_AI_RESPONSE_MODEL) or get(GEN_AI_REQUEST_MODEL))
        if model is None and model_call:
            if isinstance(inputs, Mapping):
                model = text(inputs.get("model"))
            if model is None:
                model = text(_scalar(get(REQUEST_MODEL)))
        span.model = model
        provider = text(_scalar(get(PROVIDER)) or get(GEN_AI_PROVIDER) or get(GEN_AI_SYSTEM))
        if provider is None and step_type == "llm":
            message_format = _scalar(get(MESSAGE_FORMAT))
            if isinstance(message_format, str):
                provider = _FORMAT_PROVIDERS.get(message_format)
        span.provider = provider
        self._tokens(span, outputs if model_call else _ABSENT)
        if model_call:
            self._call_details(span, inputs, outputs)
        cost = _parsed(get(COST))
        if isinstance(cost, Mapping):
            span.cost_usd = number(cost.get("total_cost"))
        elif cost is not _ABSENT and not is_malformed(cost):
            span.cost_usd = number(cost)

        span.session_id = text(_scalar(get(SESSION_ID)) or _scalar(get(TRACE_SESSION)) or get(GEN_AI_CONVERSATION_ID))
        span.user_id = text(_scalar(get(USER_ID)) or _scalar(get(TRACE_USER)))
        if step_type == "tool":
            span.tool_name = text(get(GEN_AI_TOOL_NAME)) or text(span.name) or function_name
        elif step_type == "agent":
            span.agent_name = text(get(GEN_AI_AGENT_NAME)) or text(span.name) or function_name
        span.error_type = span_error_type(span)

        if step_type == "tool":
            input_messages, output_messages = self._tool_content(span, raw_inputs, inputs, outputs)
        else:
            input_messages = _content(raw_inputs, inputs, "user", output=False)
            if step_type == "embedding":
                output_messages = None  # vectors are not content
            else:
                if step_type == "retriever" and isinstance(outputs, list):
                    details["documents"] = [_document(d) for d in outputs]
                output_messages = _content(raw_outputs, outputs, "assistant", output=True)
        if input_messages is None:
            input_messages = semconv_messages(get(GEN_AI_INPUT_MESSAGES), "user")
        if output_messages is None:
            output_messages = semconv_messages(get(GEN_AI_OUTPUT_MESSAGES), "assistant")
        span.input = input_messages
        span.output = output_messages
        span.content_captured = input_messages is not None or output_messages is not None

    @staticmethod
    def _call_details(span: Span, inputs: Any, outputs: Any) -> None:
        """Request parameters, the response id, finish reasons and time to the first streamed chunk."""
        details = span.details
        if isinstance(inputs, Mapping):
            request = request_parameters(inputs)
            if request is not None:
                details["request"] = request
        if isinstance(outputs, Mapping):
            response_id = text(outputs.get("id"))
            if response_id is not None:
                details["response_id"] = response_id
            choices = outputs.get("choices")
            if isinstance(choices, list):
                reasons = [
                    str(c["finish_reason"]) for c in choices if isinstance(c, Mapping) and c.get("finish_reason")
                ]
                if reasons:
                    details["finish_reasons"] = reasons
        if span.events:
            seconds = first_event_seconds(span, CHUNK_EVENT_PREFIX)
            if seconds is not None:
                details["time_to_first_token_s"] = seconds

    @staticmethod
    def _tokens(span: Span, outputs: Any) -> None:
        """`mlflow.chat.tokenUsage`; else gen_ai.usage.*; else the response body's `usage` (embeddings have
        only that). Reasoning tokens come from the response body, the only place MLflow keeps them."""
        get = span.attributes.get
        details = span.details
        usage = _parsed(get(TOKEN_USAGE))
        usage_in = usage_out = None
        if isinstance(usage, Mapping):
            usage_in, usage_out = usage.get("input_tokens"), usage.get("output_tokens")
            for key, field in USAGE_DETAILS.items():
                value = count(usage.get(field))
                if value is not None:
                    details[key] = value
        body_usage = outputs.get("usage") if isinstance(outputs, Mapping) else None
        body_in = body_out = None
        if isinstance(body_usage, Mapping):
            body_in = first(body_usage, ("prompt_tokens", "input_tokens"))
            body_out = first(body_usage, ("completion_tokens", "output_tokens"))
        unparsed = span.unparsed
        input_tokens = token_count(unparsed, "input_tokens", usage_in, get(GEN_AI_INPUT_TOKENS), body_in)
        output_tokens = token_count(unparsed, "output_tokens", usage_out, get(GEN_AI_OUTPUT_TOKENS), body_out)
        if isinstance(body_usage, Mapping):
            if "total_tokens" not in details:
                total = count(body_usage.get("total_tokens"))
                if total is not None:
                    details["total_tokens"] = total
            token_details = body_usage.get("completion_tokens_details") or body_usage.get("output_tokens_details")
            if isinstance(token_details, Mapping):
                reasoning = count(token_details.get("reasoning_tokens"))
                if reasoning is not None:
                    details["reasoning_tokens"] = reasoning
        span.input_tokens = input_tokens
        span.output_tokens = output_tokens

    @staticmethod
    def _tool_content(
        span: Span, raw_inputs: Any, inputs: Any, outputs: Any
    ) -> tuple[list[Message] | None, list[Message] | None]:
        """The call's keyword arguments as an assistant tool_call message in, its return value as a tool response."""
        input_messages: list[Message] | None = None
        if is_malformed(inputs):
            input_messages = [unparsed_message("assistant", raw_inputs)]
        elif inputs is not _ABSENT:
            call = {"type": "tool_call", "id": None, "name": span.tool_name or "", "arguments": tool_arguments(inputs)}
            input_messages = [{"role": "assistant", "parts": [call]}]
        output_messages: list[Message] | None = None
        if is_malformed(outputs):
            output_messages = [unparsed_message("tool", span.attributes.get(OUTPUTS))]
        elif outputs is not _ABSENT and outputs is not None:
            response = {"type": "tool_call_response", "id": None, "response": outputs}
            output_messages = [{"role": "tool", "parts": [response]}]
        return input_messages, output_messages


MLFLOW = register_mapper(MLflow(), precedence=20)
