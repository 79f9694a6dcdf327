"""The Vercel AI SDK mapper: its `ai.*` spans (`ai.generateText` and its `ai.generateText.doGenerate` model calls,
`ai.streamText` / `.doStream`, `ai.toolCall`, ...), as the SDK wrote them up to version 6 and @ai-sdk/otel's
`LegacyOpenTelemetry` still does. The model-call spans also carry `gen_ai.*`; the `ai.*` names win and each call's
usage is read once, on its model-call span (the top-level span's `ai.usage.*` is the sum of its calls)."""

from __future__ import annotations

from typing import Any

from evalsi.model.span import Span, StepType
from evalsi.processors.normalize.mapper import register_mapper
from evalsi.processors.normalize.messages import Message, Part, tool_arguments, unparsed_message
from evalsi.processors.normalize.otel_genai import span_error_type
from evalsi.processors.normalize.values import (
    as_text,
    count,
    first,
    is_malformed,
    loads,
    number,
    strings,
    text,
    token_count,
)

PRECEDENCE = 35

OPERATION_ID = "ai.operationId"
FUNCTION_ID = "ai.telemetry.functionId"
METADATA_PREFIX = "ai.telemetry.metadata."
MODEL_ID = "ai.model.id"
MODEL_PROVIDER = "ai.model.provider"
PROMPT = "ai.prompt"  # the call's prompt: {"system", "prompt" | "messages"}
PROMPT_MESSAGES = "ai.prompt.messages"  # what one model call was sent
RESPONSE_TEXT = "ai.response.text"
RESPONSE_OBJECT = "ai.response.object"
RESPONSE_TOOL_CALLS = "ai.response.toolCalls"
RESPONSE_REASONING = "ai.response.reasoning"
RESPONSE_FINISH_REASON = "ai.response.finishReason"
RESPONSE_ID = "ai.response.id"
RESPONSE_MODEL = "ai.response.model"
MS_TO_FIRST_CHUNK = "ai.response.msToFirstChunk"
TOOL_CALL_NAME = "ai.toolCall.name"
TOOL_CALL_ID = "ai.toolCall.id"
TOOL_CALL_ARGS = "ai.toolCall.args"
TOOL_CALL_RESULT = "ai.toolCall.result"

ROOT_OPERATIONS = frozenset(("ai.generateText", "ai.streamText", "ai.generateObject", "ai.streamObject"))
CALL_SUFFIXES = (".doGenerate", ".doStream")
EMBED_CALLS = frozenset(("ai.embed.doEmbed", "ai.embedMany.doEmbed"))

# canonical usage field -> ai.* names (5.x and later, then 4.x), then the gen_ai.* ones its call spans also carry;
# an embedding call's count is `ai.usage.tokens`
INPUT_TOKENS = ("ai.usage.inputTokens", "ai.usage.promptTokens", "gen_ai.usage.input_tokens", "ai.usage.tokens")
OUTPUT_TOKENS = ("ai.usage.outputTokens", "ai.usage.completionTokens", "gen_ai.usage.output_tokens")
DETAIL_COUNTS = (
    ("reasoning_tokens", ("ai.usage.outputTokenDetails.reasoningTokens", "ai.usage.reasoningTokens")),
    ("cache_read_input_tokens", ("ai.usage.inputTokenDetails.cacheReadTokens", "ai.usage.cachedInputTokens")),
    ("cache_creation_input_tokens", ("ai.usage.inputTokenDetails.cacheWriteTokens",)),
    ("total_tokens", ("ai.usage.totalTokens",)),
)
SETTINGS = (
    ("ai.settings.temperature", "temperature", number),
    ("ai.settings.maxOutputTokens", "max_tokens", count),
    ("ai.settings.maxTokens", "max_tokens", count),
    ("ai.settings.topP", "top_p", number),
    ("ai.settings.topK", "top_k", number),
    ("ai.settings.frequencyPenalty", "frequency_penalty", number),
    ("ai.settings.presencePenalty", "presence_penalty", number),
    ("ai.settings.seed", "seed", count),
    ("ai.settings.stopSequences", "stop_sequences", strings),
)


def _json(value: Any) -> Any:
    """A JSON text as its value (the SDK JSON-encodes structured attributes); anything else as given."""
    if isinstance(value, str) and value[:1] in ("{", "[", '"'):
        parsed = loads(value)
        return value if is_malformed(parsed) else parsed
    return value


def _tool_output(part: dict[str, Any]) -> Any:
    """A tool-result part's result: 5.x+ `output: {"type": "text" | "json" | "error-text" | ..., "value"}`, 4.x
    `result`."""
    output = part.get("output")
    if isinstance(output, dict) and "value" in output:
        return output["value"]
    return output if "output" in part else part.get("result")


def _part(item: Any) -> Part:
    if not isinstance(item, dict):
        return {"type": "text", "content": as_text(item)}
    kind = item.get("type")
    if kind == "text":
        return {"type": "text", "content": as_text(item.get("text", ""))}
    if kind == "reasoning":
        return {"type": "reasoning", "content": as_text(item.get("text", ""))}
    if kind == "tool-call":
        arguments = item["input"] if "input" in item else item.get("args")
        return {
            "type": "tool_call",
            "id": item.get("toolCallId"),
            "name": as_text(item.get("toolName") or ""),
            "arguments": tool_arguments(arguments),
        }
    if kind == "tool-result":
        return {"type": "tool_call_response", "id": item.get("toolCallId"), "response": _tool_output(item)}
    if kind in ("image", "file"):
        data = item.get("image", item.get("data"))
        media = item.get("mediaType") or item.get("mimeType")
        modality = "image" if kind == "image" or str(media or "").startswith("image/") else "document"
        if isinstance(data, str) and data.startswith(("http://", "https://", "gs://")):
            return {"type": "uri", "modality": modality, "mime_type": media, "uri": data}
        return {"type": "blob", "modality": modality, "mime_type": media, "content": data}
    return dict(item)


def _message(item: Any) -> Message:
    if not isinstance(item, dict):
        return {"role": "user", "parts": [{"type": "text", "content": as_text(item)}]}
    role = item.get("role") if isinstance(item.get("role"), str) else "user"
    content = item.get("content")
    if isinstance(content, list):
        return {"role": role, "parts": [_part(p) for p in content]}
    return {"role": role, "parts": [] if content is None else [{"type": "text", "content": as_text(content)}]}


def prompt_messages(value: Any) -> list[Message] | None:
    """`ai.prompt.messages` (the AI SDK's ModelMessage list, JSON) as canonical messages."""
    if value is None or value == "":
        return None
    parsed = _json(value)
    if not isinstance(parsed, list):
        return [unparsed_message("user", value)]
    return [_message(m) for m in parsed] or None


def prompt(value: Any) -> list[Message] | None:
    """`ai.prompt` (`{"system", "prompt" | "messages"}`, JSON) as canonical messages, the system message first."""
    if value is None or value == "":
        return None
    parsed = _json(value)
    if not isinstance(parsed, dict):
        return [unparsed_message("user", value)]
    messages: list[Message] = []
    system = parsed.get("system")
    if system:
        messages.append({"role": "system", "parts": [{"type": "text", "content": as_text(system)}]})
    if isinstance(parsed.get("prompt"), str):
        messages.append({"role": "user", "parts": [{"type": "text", "content": parsed["prompt"]}]})
    elif isinstance(parsed.get("prompt"), list):
        messages.extend(_message(m) for m in parsed["prompt"])
    if isinstance(parsed.get("messages"), list):
        messages.extend(_message(m) for m in parsed["messages"])
    return messages or None


def response(attributes: dict[str, Any]) -> list[Message] | None:
    """The answer: `ai.response.reasoning`, `ai.response.text` (or `.object`), `ai.response.toolCalls`."""
    parts: list[Part] = []
    reasoning = attributes.get(RESPONSE_REASONING)
    if isinstance(reasoning, str) and reasoning:
        parts.append({"type": "reasoning", "content": reasoning})
    answer = attributes.get(RESPONSE_TEXT)
    if answer is None:
        answer = attributes.get(RESPONSE_OBJECT)
    if answer is not None and answer != "":
        parts.append({"type": "text", "content": as_text(answer)})
    calls = _json(attributes.get(RESPONSE_TOOL_CALLS))
    if isinstance(calls, list):
        parts.extend(_part({"type": "tool-call", **c}) for c in calls if isinstance(c, dict))
    if not parts:
        return None
    message: Message = {"role": "assistant", "parts": parts}
    finish = text(attributes.get(RESPONSE_FINISH_REASON))
    if finish is not None:
        message["finish_reason"] = finish
    return [message]


def _provider(attributes: dict[str, Any]) -> str | None:
    """`ai.model.provider` is `<provider>.<api>` (`openai.chat`, `anthropic.messages`): the provider is its first
    part."""
    found = text(attributes.get(MODEL_PROVIDER)) or text(attributes.get("gen_ai.system"))
    return found.split(".", 1)[0] if found else None


def _fill_call(span: Span, attributes: dict[str, Any]) -> None:
    get = attributes.get
    span.input_tokens = token_count(span.unparsed, "input_tokens", *(get(n) for n in INPUT_TOKENS))
    span.output_tokens = token_count(span.unparsed, "output_tokens", *(get(n) for n in OUTPUT_TOKENS))
    details = span.details
    for key, names in DETAIL_COUNTS:
        found = count(first(attributes, names))
        if found:
            details[key] = found
    request = {key: found for name, key, read in SETTINGS if (found := read(get(name))) is not None}
    if request:
        details["request"] = request
    response_id = text(get(RESPONSE_ID)) or text(get("gen_ai.response.id"))
    if response_id is not None:
        details["response_id"] = response_id
    finish = text(get(RESPONSE_FINISH_REASON))
    if finish is not None:
        details["finish_reasons"] = [finish]
    first_chunk = number(get(MS_TO_FIRST_CHUNK))
    if first_chunk is not None:
        details["time_to_first_token_s"] = first_chunk / 1000


class VercelAI:
    """Spans of the Vercel AI SDK's own telemetry (`ai.operationId`)."""

    name = "vercel_ai"
    version = "1"
    markers = frozenset((OPERATION_ID,))

    def matches(self, span: Span) -> bool:
        return OPERATION_ID in span.attributes

    def apply(self, span: Span) -> None:
        attributes = span.attributes
        get = attributes.get
        operation = text(get(OPERATION_ID)) or ""
        step_type: StepType = "other"
        if operation in ROOT_OPERATIONS:
            step_type = "agent"
        elif operation.endswith(CALL_SUFFIXES):
            step_type = "llm"
        elif operation in EMBED_CALLS:
            step_type = "embedding"
        elif operation == "ai.toolCall":
            step_type = "tool"
        span.step_type = step_type
        span.details["operation_id"] = operation
        function_id = text(get(FUNCTION_ID))
        if function_id is not None:
            span.details["function_id"] = function_id
        span.model = text(get(RESPONSE_MODEL)) or text(get("gen_ai.response.model")) or text(get(MODEL_ID))
        span.provider = _provider(attributes)
        span.session_id = text(get(METADATA_PREFIX + "sessionId")) or text(get(METADATA_PREFIX + "session_id"))
        span.user_id = text(get(METADATA_PREFIX + "userId")) or text(get(METADATA_PREFIX + "user_id"))
        span.error_type = span_error_type(span)
        if step_type in ("llm", "embedding"):
            # a model call's own usage; the top-level span's ai.usage.* sums its calls and is not read
            _fill_call(span, attributes)
        if step_type == "llm":
            span.input = prompt_messages(get(PROMPT_MESSAGES))
            span.output = response(attributes)
        elif step_type == "agent":
            span.agent_name = function_id or operation
            span.input = prompt(get(PROMPT))
            span.output = response({k: v for k, v in attributes.items() if k != RESPONSE_TOOL_CALLS})
        elif step_type == "tool":
            span.tool_name = text(get(TOOL_CALL_NAME))
            call_id = text(get(TOOL_CALL_ID))
            if call_id is not None:
                span.details["tool_call_id"] = call_id
            arguments = get(TOOL_CALL_ARGS, get("ai.toolCall.input"))
            if arguments is not None:
                call = {
                    "type": "tool_call",
                    "id": call_id,
                    "name": span.tool_name or "",
                    "arguments": tool_arguments(arguments),
                }
                span.input = [{"role": "assistant", "parts": [call]}]
            result = get(TOOL_CALL_RESULT, get("ai.toolCall.output"))
            if result is not None:
                span.output = [
                    {
                        "role": "tool",
                        "parts": [{"type": "tool_call_response", "id": call_id, "response": _json(result)}],
                    }
                ]
        span.content_captured = span.input is not None or span.output is not None


VERCEL_AI = register_mapper(VercelAI(), precedence=PRECEDENCE)
