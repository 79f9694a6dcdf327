"""The OpenInference mapper (Arize/Phoenix): `openinference.span.kind`, `llm.*`, flattened messages and
`input.value` / `output.value` to canonical fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evalsi.model.span import Span, StepType
from evalsi.processors.normalize import llamaindex
from evalsi.processors.normalize.langchain import tool_message
from evalsi.processors.normalize.mapper import register_mapper
from evalsi.processors.normalize.messages import Message, Part, semconv_messages, tool_arguments, unparsed_message
from evalsi.processors.normalize.openai_bodies import (
    first_event_seconds,
    openai_request_messages,
    openai_response_messages,
    request_parameters,
    text_message,
)
from evalsi.processors.normalize.otel_genai import (  # the semconv names this convention shares
    CONVERSATION_ID as GEN_AI_CONVERSATION_ID,
    INPUT_MESSAGES as GEN_AI_INPUT_MESSAGES,
    INPUT_TOKENS as GEN_AI_INPUT_TOKENS,
    OUTPUT_MESSAGES as GEN_AI_OUTPUT_MESSAGES,
    OUTPUT_TOKENS as GEN_AI_OUTPUT_TOKENS,
    PROVIDER as GEN_AI_PROVIDER,
    REQUEST_MODEL as GEN_AI_REQUEST_MODEL,
    RESPONSE_MODEL as GEN_AI_RESPONSE_MODEL,
    SYSTEM as GEN_AI_SYSTEM,
    span_error_type,
)
from evalsi.processors.normalize.values import as_text, count, is_malformed, loads, number, text, token_count

SPAN_KIND = "openinference.span.kind"
CREWAI_AGENT_SUFFIX = "._execute_core"  # CrewAI's agent spans are `<role>._execute_core`: the role names the agent
MODEL_NAME = "llm.model_name"
RESPONSE_MODEL_NAME = "llm.response.model_name"
REQUEST_MODEL_NAME = "llm.request.model_name"
EMBEDDING_MODEL_NAME = "embedding.model_name"
RERANKER_MODEL_NAME = "reranker.model_name"
INVOCATION_PARAMETERS = "llm.invocation_parameters"
EMBEDDING_INVOCATION_PARAMETERS = "embedding.invocation_parameters"
PROVIDER = "llm.provider"
SYSTEM = "llm.system"
PROMPT_TOKENS = "llm.token_count.prompt"
COMPLETION_TOKENS = "llm.token_count.completion"
TOTAL_TOKENS = "llm.token_count.total"
COST_TOTAL = "llm.cost.total"
COST_PROMPT = "llm.cost.prompt"
COST_COMPLETION = "llm.cost.completion"
FINISH_REASON = "llm.finish_reason"
INPUT_VALUE = "input.value"
INPUT_MIME_TYPE = "input.mime_type"
OUTPUT_VALUE = "output.value"
OUTPUT_MIME_TYPE = "output.mime_type"
TOOL_NAME = "tool.name"
TOOL_ID = "tool.id"
TOOL_DESCRIPTION = "tool.description"
TOOL_PARAMETERS = "tool.parameters"
TOOL_CALL_ID = "tool_call.id"
TOOL_CALL_NAME = "tool_call.function.name"
TOOL_CALL_ARGUMENTS = "tool_call.function.arguments"
SESSION_ID = "session.id"
USER_ID = "user.id"
AGENT_NAME = "agent.name"
GRAPH_NODE_ID = "graph.node.id"
GRAPH_NODE_NAME = "graph.node.name"
GRAPH_NODE_PARENT_ID = "graph.node.parent_id"
RERANKER_QUERY = "reranker.query"
PROMPTS = "llm.prompts"
FIRST_TOKEN_EVENT = "First Token Stream Event"  # openinference-instrumentation-openai, on streamed calls

# Flattened lists: `<prefix>N.<field>`; the key tested before scanning for each.
INPUT_MESSAGES = "llm.input_messages."
OUTPUT_MESSAGES = "llm.output_messages."
PROMPT_LIST = "llm.prompts."
CHOICE_LIST = "llm.choices."
EMBEDDINGS = "embedding.embeddings."
DOCUMENTS = "retrieval.documents."
RERANKER_INPUT_DOCUMENTS = "reranker.input_documents."
RERANKER_OUTPUT_DOCUMENTS = "reranker.output_documents."

# gen_ai.* read only when the OpenInference attribute is absent (instrumentations that write both)

SPAN_KIND_STEP_TYPES: dict[str, StepType] = {
    "LLM": "llm",
    "CHAIN": "chain",
    "TOOL": "tool",
    "AGENT": "agent",
    "RETRIEVER": "retriever",
    "RERANKER": "retriever",
    "EMBEDDING": "embedding",
    "GUARDRAIL": "other",
    "EVALUATOR": "other",
    "PROMPT": "other",
    "UNKNOWN": "other",
}
# kinds whose step type does not say all: the kind is kept as details["span_type"]
_LOSSY_KINDS = frozenset(("RERANKER", "GUARDRAIL", "EVALUATOR", "PROMPT"))

# details key <- token-count attribute
TOKEN_DETAILS: dict[str, str] = {
    "total_tokens": TOTAL_TOKENS,
    "cache_read_input_tokens": "llm.token_count.prompt_details.cache_read",
    "cache_creation_input_tokens": "llm.token_count.prompt_details.cache_write",
    "reasoning_tokens": "llm.token_count.completion_details.reasoning",
}


# --- whole request and response values ------------------------------------------------------------


def body_messages(value: Any, json_body: bool, role: str, output: bool) -> list[Message] | None:
    """Messages from a whole request or response value: an OpenAI body when it is one, else the value as text.

    `json_body`: the value is declared JSON (parse it; malformed JSON is kept raw and flagged). A structured
    (already parsed) value is taken as JSON; a plain string that is not declared JSON is one text message.
    """
    if value is None or value == "":
        return None
    parsed = value
    if isinstance(value, str):
        if not json_body:
            return [text_message(role, value)]
        parsed = loads(value)
        if is_malformed(parsed):
            return [unparsed_message(role, value)]
    if isinstance(parsed, Mapping):
        found = openai_response_messages(parsed) if output else openai_request_messages(parsed)
        if found:
            return found
    elif isinstance(parsed, str):
        # a JSON string literal: its text is the content
        return [text_message(role, parsed)] if parsed else None
    return [text_message(role, value)]


# --- flattened attribute lists --------------------------------------------------------------------


def _flattened(attributes: Mapping[str, Any], prefixes: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """One pass over the keys: `<prefix>N.<field>` -> {prefix: [fields of item 0, item 1, ...]} (by N).

    Every prefix is two dotted words (`llm.input_messages.`), so a key's prefix is its first two words.
    """
    grouped: dict[str, dict[int, dict[str, Any]]] = {p: {} for p in prefixes}
    for key, value in attributes.items():
        if not key.startswith(prefixes):
            continue
        first, _, rest = key.partition(".")
        second, _, rest = rest.partition(".")
        index, _, field = rest.partition(".")
        items = grouped.get(f"{first}.{second}.")
        if items is not None and field and index.isdecimal():
            items.setdefault(int(index), {})[field] = value
    return {p: [items[i] for i in sorted(items)] for p, items in grouped.items() if items}


def _indexed(groups: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    return [groups[i] for i in sorted(groups)]


def _content_part(item: Mapping[str, Any]) -> Part | None:
    kind = item.get("message_content.type")
    body = item.get("message_content.text")
    if kind in (None, "text") and body is not None:
        return {"type": "text", "content": as_text(body)}
    if kind == "reasoning" and body is not None:
        return {"type": "reasoning", "content": as_text(body)}
    if kind == "image":
        url = item.get("message_content.image.image.url")
        if isinstance(url, str) and url:
            return {"type": "uri", "modality": "image", "uri": url}
    if kind is None and body is None:
        return None
    # other content kinds: kept with their OpenInference field names
    part: Part = {"type": str(kind) if kind is not None else "text"}
    part.update((k.removeprefix("message_content."), v) for k, v in item.items() if k != "message_content.type")
    return part


def _tool_call_part(item: Mapping[str, Any]) -> Part:
    return {
        "type": "tool_call",
        "id": text(item.get("tool_call.id")),
        "name": text(item.get("tool_call.function.name")) or "",
        "arguments": tool_arguments(item.get("tool_call.function.arguments")),
    }


_TOOL_CALLS = "message.tool_calls."
_CONTENTS = "message.contents."
_PLAIN_FIELDS = frozenset(("message.role", "message.content"))


def _flat_message(fields: Mapping[str, Any], default_role: str) -> Message:
    """A canonical message from one `llm.*_messages.N.` group (`message.role`, `message.content`, ...)."""
    role = text(fields.get("message.role")) or default_role
    content = fields.get("message.content")
    calls: dict[int, dict[str, Any]] = {}
    contents: dict[int, dict[str, Any]] = {}
    if not fields.keys() <= _PLAIN_FIELDS:
        # nested lists: message.tool_calls.K.tool_call.* and message.contents.M.message_content.*
        for key, value in fields.items():
            if key.startswith(_TOOL_CALLS):
                target, rest = calls, key[len(_TOOL_CALLS) :]
            elif key.startswith(_CONTENTS):
                target, rest = contents, key[len(_CONTENTS) :]
            else:
                continue
            index, _, field = rest.partition(".")
            if field and index.isdecimal():
                target.setdefault(int(index), {})[field] = value
    parts: list[Part] = []
    if content is not None and content != "":
        parts.append({"type": "text", "content": as_text(content)})
    for item in _indexed(contents):
        if calls and item.get("message_content.type") == "tool_use":
            continue  # the Anthropic instrumentation repeats each tool call as a content item
        part = _content_part(item)
        if part is not None:
            parts.append(part)
    if role == "tool":
        texts = [p["content"] for p in parts if p["type"] == "text"]
        response = texts[0] if len(texts) == 1 else ("".join(texts) if texts else None)
        call_id = text(fields.get("message.tool_call_id"))
        return {"role": role, "parts": [{"type": "tool_call_response", "id": call_id, "response": response}]}
    parts.extend(_tool_call_part(item) for item in _indexed(calls))
    function_name = fields.get("message.function_call_name")
    if function_name is not None:
        # the legacy OpenAI function_call form
        parts.append(
            {
                "type": "tool_call",
                "id": None,
                "name": text(function_name) or "",
                "arguments": tool_arguments(fields.get("message.function_call_arguments_json")),
            }
        )
    return {"role": role, "parts": parts}


def _document(fields: Mapping[str, Any]) -> dict[str, Any]:
    metadata = fields.get("document.metadata")
    return {
        "id": text(fields.get("document.id")),
        "content": fields.get("document.content"),
        "score": number(fields.get("document.score")),
        "metadata": tool_arguments(metadata),
    }


def _is_json(mime: Any) -> bool:
    return isinstance(mime, str) and "json" in mime


# --- the mapper -----------------------------------------------------------------------------------


class OpenInference:
    """Spans written to the OpenInference semantic conventions (Arize Phoenix and its instrumentations)."""

    name = "openinference"
    version = "1"
    markers = frozenset((SPAN_KIND,))

    def matches(self, span: Span) -> bool:
        return SPAN_KIND in span.attributes

    def apply(self, span: Span) -> None:
        attributes = span.attributes
        get = attributes.get
        raw_kind = get(SPAN_KIND)
        kind = raw_kind.upper() if isinstance(raw_kind, str) else ""
        step_type = SPAN_KIND_STEP_TYPES.get(kind, "other")
        preparation = step_type == "llm" and llamaindex.is_preparation(span.name)
        if preparation:
            step_type = "other"  # LlamaIndex preparing a request: no model call
        span.step_type = step_type
        details = span.details
        if preparation:
            details["span_type"] = raw_kind
        if kind in _LOSSY_KINDS or (kind and kind not in SPAN_KIND_STEP_TYPES):
            details["span_type"] = raw_kind

        parameters = self._parameters(attributes)
        span.model = self._model(attributes, parameters)
        if parameters is not None:
            request = request_parameters(parameters)
            if request is not None:
                details["request"] = request
        span.provider = text(get(PROVIDER) or get(SYSTEM) or get(GEN_AI_PROVIDER) or get(GEN_AI_SYSTEM))
        span.input_tokens = token_count(span.unparsed, "input_tokens", get(PROMPT_TOKENS), get(GEN_AI_INPUT_TOKENS))
        span.output_tokens = token_count(
            span.unparsed, "output_tokens", get(COMPLETION_TOKENS), get(GEN_AI_OUTPUT_TOKENS)
        )
        for key, attribute in TOKEN_DETAILS.items():
            value = get(attribute)
            if value is not None:
                tokens = count(value)
                if tokens is not None:
                    details[key] = tokens
        cost = number(get(COST_TOTAL))
        if cost is None:
            prompt_cost, completion_cost = number(get(COST_PROMPT)), number(get(COST_COMPLETION))
            if prompt_cost is not None or completion_cost is not None:
                cost = (prompt_cost or 0.0) + (completion_cost or 0.0)
        span.cost_usd = cost

        span.session_id = text(get(SESSION_ID) or get(GEN_AI_CONVERSATION_ID))
        span.user_id = text(get(USER_ID))
        agent_name = text(get(AGENT_NAME))
        if agent_name is None and step_type == "agent":
            agent_name = text(get(GRAPH_NODE_NAME)) or text(span.name.removesuffix(CREWAI_AGENT_SUFFIX))
        span.agent_name = agent_name
        for key, attribute in (
            ("graph_node_id", GRAPH_NODE_ID),
            ("graph_node_name", GRAPH_NODE_NAME),
            ("graph_node_parent_id", GRAPH_NODE_PARENT_ID),
        ):
            value = get(attribute)
            if value is not None:
                details[key] = value
        tool_name = text(get(TOOL_NAME))
        if tool_name is None and step_type == "tool":
            tool_name = text(get(TOOL_CALL_NAME))
        span.tool_name = tool_name
        span.error_type = span_error_type(span)
        finish_reason = get(FINISH_REASON)
        if finish_reason is not None and finish_reason != "":
            details["finish_reasons"] = [str(finish_reason)]
        if span.events:
            seconds = first_event_seconds(span, FIRST_TOKEN_EVENT)
            if seconds is not None:
                details["time_to_first_token_s"] = seconds

        if step_type == "llm":
            input_messages, output_messages = self._llm_content(span)
        elif step_type == "tool":
            input_messages, output_messages = self._tool_content(span)
        elif step_type == "embedding":
            input_messages, output_messages = self._embedding_content(span)
        else:
            input_messages, output_messages = self._generic_content(span, kind)
        if input_messages is None:
            input_messages = semconv_messages(get(GEN_AI_INPUT_MESSAGES), "user")
        if output_messages is None:
            output_messages = semconv_messages(get(GEN_AI_OUTPUT_MESSAGES), "assistant")
        if step_type == "chain" and (agent_class := llamaindex.agent_run(span.name)) is not None:
            # LlamaIndex's agent run is a CHAIN span: an agent step; its input (the workflow's initial state) and
            # output (a StopEvent repr) hold no message, so the answer is its last model call's
            span.step_type = "agent"
            span.agent_name = agent_name or agent_class
            details["span_type"] = raw_kind
            input_messages = output_messages = None
        span.input = input_messages
        span.output = output_messages
        span.content_captured = input_messages is not None or output_messages is not None

    @staticmethod
    def _parameters(attributes: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """`llm.invocation_parameters` (or the embedding one) parsed, when it is a JSON object."""
        parameters = attributes.get(INVOCATION_PARAMETERS)
        if parameters is None:
            parameters = attributes.get(EMBEDDING_INVOCATION_PARAMETERS)
        if isinstance(parameters, str) and parameters:
            parameters = loads(parameters)
        return parameters if isinstance(parameters, Mapping) else None

    @staticmethod
    def _model(attributes: Mapping[str, Any], parameters: Mapping[str, Any] | None) -> str | None:
        get = attributes.get
        model = text(
            get(MODEL_NAME)
            or get(RESPONSE_MODEL_NAME)
            or get(REQUEST_MODEL_NAME)
            or get(EMBEDDING_MODEL_NAME)
            or get(RERANKER_MODEL_NAME)
            or get(GEN_AI_RESPONSE_MODEL)
            or get(GEN_AI_REQUEST_MODEL)
        )
        if model is None and parameters is not None:
            # a failed call records no model name; the request's parameters still say which was asked for
            model = text(parameters.get("model") or parameters.get("model_name"))
        return model

    @staticmethod
    def _llm_content(span: Span) -> tuple[list[Message] | None, list[Message] | None]:
        attributes = span.attributes
        get = attributes.get
        prefixes = []
        if f"{INPUT_MESSAGES}0.message.role" in attributes or f"{INPUT_MESSAGES}0.message.content" in attributes:
            prefixes.append(INPUT_MESSAGES)
        if f"{OUTPUT_MESSAGES}0.message.role" in attributes or f"{OUTPUT_MESSAGES}0.message.content" in attributes:
            prefixes.append(OUTPUT_MESSAGES)
        if f"{PROMPT_LIST}0.prompt.text" in attributes:
            prefixes.append(PROMPT_LIST)
        if f"{CHOICE_LIST}0.completion.text" in attributes:
            prefixes.append(CHOICE_LIST)
        groups = _flattened(attributes, tuple(prefixes)) if prefixes else {}

        input_messages: list[Message] | None = None
        if INPUT_MESSAGES in groups:
            input_messages = [_flat_message(m, "user") for m in groups[INPUT_MESSAGES]]
        elif PROMPT_LIST in groups:
            input_messages = [text_message("user", p.get("prompt.text")) for p in groups[PROMPT_LIST]]
        else:
            prompts = get(PROMPTS)
            if isinstance(prompts, list) and prompts:
                input_messages = [text_message("user", p) for p in prompts]
        if input_messages is None:
            input_messages = body_messages(get(INPUT_VALUE), _is_json(get(INPUT_MIME_TYPE)), "user", output=False)

        output_messages: list[Message] | None = None
        if OUTPUT_MESSAGES in groups:
            output_messages = [_flat_message(m, "assistant") for m in groups[OUTPUT_MESSAGES]]
            finish_reason = get(FINISH_REASON)
            if finish_reason is not None and len(output_messages) == 1:
                output_messages[0]["finish_reason"] = str(finish_reason)
        elif CHOICE_LIST in groups:
            output_messages = [text_message("assistant", c.get("completion.text")) for c in groups[CHOICE_LIST]]
        if output_messages is None:
            output_messages = body_messages(
                get(OUTPUT_VALUE), _is_json(get(OUTPUT_MIME_TYPE)), "assistant", output=True
            )
        return input_messages, output_messages

    @staticmethod
    def _tool_content(span: Span) -> tuple[list[Message] | None, list[Message] | None]:
        """The call as an assistant tool_call message in, the result as a tool response message out."""
        get = span.attributes.get
        call_id = text(get(TOOL_CALL_ID) or get(TOOL_ID))
        result = get(OUTPUT_VALUE)
        # LangChain's tool spans: output.value is the serialized ToolMessage, the call id only inside it
        unwrapped = tool_message(result) if isinstance(result, str) and result.startswith("{") else None
        if unwrapped is not None:
            result = unwrapped[0]
            call_id = call_id or unwrapped[1]
        elif (tool_output := llamaindex.tool_result(result)) is not None:  # LlamaIndex's ToolOutput
            result = tool_output
        arguments = get(TOOL_CALL_ARGUMENTS)
        if arguments is None:
            arguments = llamaindex.tool_arguments(get(INPUT_VALUE))  # LlamaIndex's {"kwargs": {...}}
        if arguments is None:
            value = get(INPUT_VALUE)
            if value is not None and value != "":
                # input.value holds the arguments; plain text ones stay as sent
                plain = isinstance(value, str) and not _is_json(get(INPUT_MIME_TYPE))
                arguments = value if plain else tool_arguments(value)
        else:
            arguments = tool_arguments(arguments)
        input_messages: list[Message] | None = None
        if arguments is not None:
            call = {"type": "tool_call", "id": call_id, "name": span.tool_name or "", "arguments": arguments}
            input_messages = [{"role": "assistant", "parts": [call]}]
        output_messages: list[Message] | None = None
        if result is not None and result != "":
            output_messages = [
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": result}]}
            ]
        details = span.details
        if call_id is not None:
            details["tool_call_id"] = call_id
        description = get(TOOL_DESCRIPTION)
        if description is not None:
            details["tool_description"] = description
        parameters = get(TOOL_PARAMETERS)
        if parameters is not None:
            details["tool_parameters"] = tool_arguments(parameters)
        return input_messages, output_messages

    @staticmethod
    def _embedding_content(span: Span) -> tuple[list[Message] | None, list[Message] | None]:
        """The embedded texts in (one user message, a part per text); vectors are not content."""
        attributes = span.attributes
        texts: list[Part] = []
        if f"{EMBEDDINGS}0.embedding.text" in attributes:
            for item in _flattened(attributes, (EMBEDDINGS,)).get(EMBEDDINGS, ()):
                value = item.get("embedding.text")
                if value is not None:
                    texts.append({"type": "text", "content": as_text(value)})
        if texts:
            return [{"role": "user", "parts": texts}], None
        get = attributes.get
        return body_messages(get(INPUT_VALUE), _is_json(get(INPUT_MIME_TYPE)), "user", output=False), None

    @staticmethod
    def _generic_content(span: Span, kind: str) -> tuple[list[Message] | None, list[Message] | None]:
        """Chains, agents, retrievers, rerankers and the rest: input.value / output.value; documents to details."""
        attributes = span.attributes
        get = attributes.get
        prefixes = []
        if f"{DOCUMENTS}0.document.content" in attributes or f"{DOCUMENTS}0.document.id" in attributes:
            prefixes.append(DOCUMENTS)
        if kind == "RERANKER":
            prefixes.extend((RERANKER_INPUT_DOCUMENTS, RERANKER_OUTPUT_DOCUMENTS))
        if prefixes:
            groups = _flattened(attributes, tuple(prefixes))
            documents = groups.get(DOCUMENTS) or groups.get(RERANKER_OUTPUT_DOCUMENTS)
            if documents:
                span.details["documents"] = [_document(d) for d in documents]
            if RERANKER_INPUT_DOCUMENTS in groups:
                span.details["input_documents"] = [_document(d) for d in groups[RERANKER_INPUT_DOCUMENTS]]
        input_messages = body_messages(get(INPUT_VALUE), _is_json(get(INPUT_MIME_TYPE)), "user", output=False)
        if input_messages is None and kind == "RERANKER":
            query = get(RERANKER_QUERY)
            if query is not None and query != "":
                input_messages = [text_message("user", query)]
        output_messages = body_messages(get(OUTPUT_VALUE), _is_json(get(OUTPUT_MIME_TYPE)), "assistant", output=True)
        return input_messages, output_messages


OPENINFERENCE = register_mapper(OpenInference(), precedence=30)
