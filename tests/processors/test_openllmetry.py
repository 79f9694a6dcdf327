"""The OpenLLMetry mapper, on real opentelemetry-instrumentation-openai 0.54.0 captures and hand-built spans
(Traceloop SDK workflow/task/agent/tool spans, association properties, the newer gen_ai.*.messages shape).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from captures import any_value, normalized_capture, parts

import evalsi.processors.normalize.openllmetry  # noqa: F401  (registers the mapper)
from evalsi.model.span import Span, SpanEvent
from evalsi.processors.normalize import normalize_span

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FOLDER = FIXTURES / "openllmetry-0.54"
SCENARIOS = ("chat_simple", "chat_tools", "chat_pii", "chat_error", "embeddings", "chat_stream")
META = json.loads((FOLDER / "meta.json").read_text())

# llm.request.type -> step type, written out here rather than read from the mapper
REQUEST_STEP = {"chat": "llm", "completion": "llm", "embedding": "embedding"}


# --- reading the captures -------------------------------------------------------------------------


def raw_spans(scenario: str) -> dict[str, dict[str, Any]]:
    """The spans of a capture's OTLP/JSON file by span id: attributes and status code as written."""
    request = json.loads((FOLDER / f"{scenario}.json").read_text())
    spans: dict[str, dict[str, Any]] = {}
    for resource in request["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                spans[span["spanId"]] = {
                    "attributes": {a["key"]: any_value(a["value"]) for a in span.get("attributes", [])},
                    "status": span.get("status", {}).get("code", 0),
                }
    return spans


def normalized(scenario: str, suffix: str = ".json") -> list[Span]:
    return normalized_capture("openllmetry-0.54", scenario, suffix)


def dump(messages: list[dict[str, Any]] | None) -> str:
    return json.dumps(messages, ensure_ascii=False)


def indexed(attributes: dict[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """gen_ai.prompt.N.field values of a raw span, by N (the test's own reading of the flattened keys)."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if key.startswith(prefix):
            index, _, field = key[len(prefix) :].partition(".")
            found.setdefault(int(index), {})[field] = value
    return found


def llm_spans(spans: list[Span]) -> list[Span]:
    return sorted((s for s in spans if s.convention == "openllmetry"), key=lambda s: s.start_time_unix_nano)


# --- every capture, span by span, against the raw attribute values -------------------------------


@pytest.mark.parametrize("suffix", [".json", ".pb"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_span_matches_the_raw_attributes(scenario: str, suffix: str) -> None:
    spans = normalized(scenario, suffix)
    raw = raw_spans(scenario)
    markers = META["scenarios"][scenario]["markers"]
    assert len(spans) == META["scenarios"][scenario]["span_count"] == len(raw)
    for span in spans:
        attributes = raw[span.span_id]["attributes"]
        if "llm.request.type" not in attributes:
            # the capture's own agent/tool spans are plain OTel GenAI (scope corpus.capture.manual)
            assert span.convention == "otel_genai" and span.scope_name == "corpus.capture.manual"
            continue
        assert span.convention == "openllmetry"
        assert span.step_type == REQUEST_STEP[attributes["llm.request.type"]]
        assert span.details["request_type"] == attributes["llm.request.type"]
        assert span.model == attributes.get("gen_ai.response.model", attributes["gen_ai.request.model"])
        assert span.provider == attributes["gen_ai.system"]
        assert span.input_tokens == attributes.get("gen_ai.usage.input_tokens")
        assert span.output_tokens == attributes.get("gen_ai.usage.output_tokens")
        assert span.details.get("total_tokens") == attributes.get("llm.usage.total_tokens")
        assert span.details.get("cache_read_input_tokens") == attributes.get("gen_ai.usage.cache_read_input_tokens")
        assert span.user_id == attributes.get("llm.user")
        assert span.tool_name is None and span.session_id is None and span.agent_name is None
        assert span.cost_usd is None
        # status: 2 is ERROR in OTLP/JSON
        assert (span.status_code == "ERROR") == (raw[span.span_id]["status"] == 2)
        assert span.error_type == attributes.get("error.type")

        # the input is gen_ai.prompt.N.*, message by message
        assert span.content_captured and span.unparsed == []
        prompts = indexed(attributes, "gen_ai.prompt.")
        assert span.input is not None and len(span.input) == len(prompts)
        for message, n in zip(span.input, sorted(prompts), strict=True):
            fields = prompts[n]
            assert message["role"] == fields.get("role", "user")
            if "content" in fields and fields.get("role") != "tool":
                assert {"type": "text", "content": fields["content"]} in message["parts"]
        assert markers["prompt"] in dump(span.input)

        completions = indexed(attributes, "gen_ai.completion.")
        if not completions:
            assert span.output is None
        else:
            assert span.output is not None and len(span.output) == len(completions)
            for message, n in zip(span.output, sorted(completions), strict=True):
                assert message["role"] == completions[n]["role"]
                assert message["finish_reason"] == completions[n]["finish_reason"]
        if "completion" in markers and not any("tool_calls.0.name" in f for f in completions.values()):
            assert any(markers["completion"] in dump(s.output) for s in spans)


def test_chat_simple() -> None:
    (span,) = normalized("chat_simple")
    assert (span.step_type, span.model, span.provider) == ("llm", "gpt-4o-mini", "openai")
    assert (span.input_tokens, span.output_tokens, span.user_id) == (17, 6, "user-1234")
    assert span.input == [
        {"role": "system", "parts": [{"type": "text", "content": "You are a concise assistant."}]},
        {"role": "user", "parts": [{"type": "text", "content": "What is the capital of France?"}]},
    ]
    assert span.output == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "The capital of France is Paris."}],
            "finish_reason": "stop",
        }
    ]
    assert span.details["request"] == {"temperature": 0.2, "max_tokens": 64, "top_p": 0.9}


def test_chat_tools_round_trip() -> None:
    spans = normalized("chat_tools")
    raw = raw_spans("chat_tools")
    markers = META["scenarios"]["chat_tools"]["markers"]
    asking, answering = llm_spans(spans)
    asked = raw[asking.span_id]["attributes"]

    (call,) = parts(asking.output, "tool_call")
    assert call["id"] == asked["gen_ai.completion.0.tool_calls.0.id"]
    assert call["name"] == asked["gen_ai.completion.0.tool_calls.0.name"]
    assert call["arguments"] == json.loads(asked["gen_ai.completion.0.tool_calls.0.arguments"])
    assert any(m in asked["gen_ai.completion.0.tool_calls.0.arguments"] for m in markers["tool_args"])
    assert asking.output is not None and asking.output[0]["finish_reason"] == "tool_calls"
    declared = asking.details["tools_declared"]
    assert [t["name"] for t in declared] == [asked["llm.request.functions.0.name"]]
    assert declared[0]["description"] == asked["llm.request.functions.0.description"]
    assert declared[0]["parameters"] == json.loads(asked["llm.request.functions.0.parameters"])

    sent = raw[answering.span_id]["attributes"]
    assert answering.input is not None
    assert [m["role"] for m in answering.input] == ["system", "user", "assistant", "tool"]
    (echoed,) = parts(answering.input, "tool_call")
    assert echoed["id"] == sent["gen_ai.prompt.2.tool_calls.0.id"]
    assert echoed["arguments"] == json.loads(sent["gen_ai.prompt.2.tool_calls.0.arguments"])
    (response,) = parts(answering.input, "tool_call_response")
    assert response["id"] == sent["gen_ai.prompt.3.tool_call_id"]
    assert response["response"] == sent["gen_ai.prompt.3.content"]
    assert markers["tool_result"] in response["response"]
    assert markers["completion"] in dump(answering.output)

    tool = next(s for s in spans if s.step_type == "tool")
    assert tool.convention == "otel_genai" and tool.tool_name == "get_weather"


def test_embeddings_input_is_on_the_span() -> None:
    (span,) = normalized("embeddings")
    attributes = raw_spans("embeddings")[span.span_id]["attributes"]
    assert (span.step_type, span.model, span.input_tokens, span.output_tokens) == (
        "embedding",
        "text-embedding-3-small",
        10,
        None,
    )
    assert span.input == [
        {"role": "user", "parts": [{"type": "text", "content": attributes["gen_ai.prompt.0.content"]}]},
        {"role": "user", "parts": [{"type": "text", "content": attributes["gen_ai.prompt.1.content"]}]},
    ]
    assert span.output is None and span.content_captured
    assert META["scenarios"]["embeddings"]["markers"]["prompt"] in dump(span.input)


def test_chat_error_keeps_the_prompt_and_the_error() -> None:
    (span,) = normalized("chat_error")
    assert (span.status_code, span.error_type) == ("ERROR", "InternalServerError")
    assert (span.input_tokens, span.output_tokens, span.output) == (None, None, None)
    assert span.content_captured and META["scenarios"]["chat_error"]["markers"]["prompt"] in dump(span.input)


def test_protobuf_and_json_captures_normalize_alike() -> None:
    for scenario in SCENARIOS:
        from_json = sorted((s.canonical() for s in normalized(scenario)), key=lambda c: c["span_id"])
        from_pb = sorted((s.canonical() for s in normalized(scenario, ".pb")), key=lambda c: c["span_id"])
        assert from_json == from_pb


# --- hand-built spans -----------------------------------------------------------------------------


def span(
    attributes: dict[str, Any] | None = None, events: list[SpanEvent] | None = None, status: str = "UNSET"
) -> Span:
    return Span(
        trace_id="5b8efff798038103d269b633813fc60c",
        span_id="eee19b7ec3c1b174",
        parent_span_id="",
        name="test",
        kind="INTERNAL",
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        status_code=status,
        attributes=attributes or {},
        events=events or [],
    )


def test_a_span_with_openllmetry_markers_and_gen_ai_is_openllmetrys() -> None:
    s = span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-4o",
            "llm.request.type": "chat",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "hi",
        }
    )
    normalize_span(s)
    assert (s.convention, s.step_type, s.model) == ("openllmetry", "llm", "gpt-4o")


@pytest.mark.parametrize(
    "marker",
    [
        {"llm.request.type": "chat"},
        {"traceloop.span.kind": "task"},
        {"traceloop.workflow.name": "w"},
        {"gen_ai.prompt.0.content": "hi"},
        {"gen_ai.completion.0.content": "hello"},
        {"gen_ai.is_streaming": False},
    ],
)
def test_each_marker_claims_a_gen_ai_span(marker: dict[str, Any]) -> None:
    s = span({"gen_ai.system": "openai", **marker})
    normalize_span(s)
    assert s.convention == "openllmetry"


def test_plain_gen_ai_is_not_claimed() -> None:
    s = span({"gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.prompt": "x"})
    normalize_span(s)
    assert s.convention == "otel_genai"


def test_association_properties_give_session_and_user() -> None:
    s = span(
        {
            "llm.request.type": "chat",
            "llm.user": "openai-user",
            "traceloop.association.properties.session_id": "sess-1",
            "traceloop.association.properties.user_id": "user-9",
            "traceloop.association.properties.tenant": "acme",
        }
    )
    normalize_span(s)
    assert (s.session_id, s.user_id) == ("sess-1", "user-9")
    assert s.details["association_properties"] == {"session_id": "sess-1", "user_id": "user-9", "tenant": "acme"}


def test_conversation_id_association_property_is_the_session() -> None:
    s = span({"llm.request.type": "chat", "traceloop.association.properties.conversation_id": "conv-7"})
    normalize_span(s)
    assert s.session_id == "conv-7"


@pytest.mark.parametrize(
    ("kind", "step_type"), [("workflow", "chain"), ("task", "chain"), ("agent", "agent"), ("tool", "tool")]
)
def test_traceloop_span_kinds(kind: str, step_type: str) -> None:
    s = span({"traceloop.span.kind": kind, "traceloop.entity.name": "thing", "traceloop.workflow.name": "flow"})
    normalize_span(s)
    assert (s.convention, s.step_type) == ("openllmetry", step_type)
    assert s.tool_name == ("thing" if kind == "tool" else None)
    assert s.agent_name == ("thing" if kind == "agent" else None)
    assert s.details["workflow_name"] == "flow" and s.details["entity_name"] == "thing"


@pytest.mark.parametrize(
    ("request_type", "step_type"),
    [("chat", "llm"), ("completion", "llm"), ("embedding", "embedding"), ("rerank", "retriever")],
)
def test_request_types(request_type: str, step_type: str) -> None:
    s = span({"llm.request.type": request_type})
    normalize_span(s)
    assert s.step_type == step_type


def test_unknown_kinds_fall_back_to_the_model() -> None:
    with_model = span({"traceloop.span.kind": "unknown", "llm.request.type": "unknown", "gen_ai.request.model": "m"})
    without = span({"llm.request.type": "unknown"})
    normalize_span(with_model)
    normalize_span(without)
    assert (with_model.step_type, without.step_type) == ("llm", "other")


def test_workflow_entity_input_and_output_are_content() -> None:
    s = span(
        {
            "traceloop.span.kind": "workflow",
            "traceloop.entity.name": "joke_workflow",
            "traceloop.entity.input": json.dumps({"args": ["pirates"], "kwargs": {}}),
            "traceloop.entity.output": json.dumps("Why did the pirate..."),
        }
    )
    normalize_span(s)
    assert s.content_captured
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": '{"args": ["pirates"], "kwargs": {}}'}]}]
    assert s.output == [{"role": "assistant", "parts": [{"type": "text", "content": "Why did the pirate..."}]}]


def test_tool_entity_input_is_a_tool_call() -> None:
    s = span(
        {
            "traceloop.span.kind": "tool",
            "traceloop.entity.name": "get_weather",
            "traceloop.entity.input": json.dumps({"args": [], "kwargs": {"location": "Paris"}}),
            "traceloop.entity.output": json.dumps({"temperature_c": 18}),
        }
    )
    normalize_span(s)
    assert (s.step_type, s.tool_name) == ("tool", "get_weather")
    assert s.input == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": None, "name": "get_weather", "arguments": {"location": "Paris"}}],
        }
    ]
    assert s.output == [
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": None, "response": '{"temperature_c": 18}'}]}
    ]


def test_tool_with_positional_arguments_keeps_the_whole_record() -> None:
    s = span({"traceloop.span.kind": "tool", "traceloop.entity.input": '{"args": ["Paris"], "kwargs": {}}'})
    normalize_span(s)
    (call,) = parts(s.input, "tool_call")
    assert call["arguments"] == {"args": ["Paris"], "kwargs": {}}


def test_semconv_tool_call_attributes_win_on_a_tool_span() -> None:
    s = span(
        {
            "traceloop.span.kind": "tool",
            "traceloop.entity.name": "get_weather",
            "gen_ai.tool.call.id": "c1",
            "gen_ai.tool.call.arguments": '{"location": "Paris"}',
            "gen_ai.tool.call.result": "sunny",
            "traceloop.entity.input": '{"args": [], "kwargs": {"location": "Rome"}}',
        }
    )
    normalize_span(s)
    (call,) = parts(s.input, "tool_call")
    assert call == {"type": "tool_call", "id": "c1", "name": "get_weather", "arguments": {"location": "Paris"}}
    (response,) = parts(s.output, "tool_call_response")
    assert response == {"type": "tool_call_response", "id": "c1", "response": "sunny"}


def test_malformed_entity_input_is_kept_raw_and_flagged() -> None:
    # the SDK truncates large values, which can cut the JSON
    cut = '{"args": [], "kwargs": {"text": "a very long'
    for kind in ("workflow", "tool"):
        s = span({"traceloop.span.kind": kind, "traceloop.entity.input": cut})
        normalize_span(s)
        assert s.unparsed == ["input"]
        assert s.input is not None and s.input[0]["parts"] == [{"type": "text", "content": cut}]
        assert s.input[0]["unparsed"] is True
        assert s.attributes["traceloop.entity.input"] == cut


def test_newer_releases_write_gen_ai_messages() -> None:
    s = span(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.is_streaming": False,
            "gen_ai.usage.input_tokens": 10,
            "gen_ai.usage.output_tokens": 2,
            "gen_ai.usage.total_tokens": 12,
            "gen_ai.usage.cache_read.input_tokens": 4,
            "gen_ai.user": "u-1",
            "gen_ai.conversation.id": "conv-2",
            "gen_ai.tool.definitions": json.dumps([{"type": "function", "name": "f", "parameters": {}}]),
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]),
            "gen_ai.output.messages": json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": "hello"}], "finish_reason": "stop"}]
            ),
        }
    )
    normalize_span(s)
    assert (s.convention, s.step_type, s.provider, s.input_tokens, s.output_tokens) == (
        "openllmetry",
        "llm",
        "openai",
        10,
        2,
    )
    assert (s.user_id, s.session_id) == ("u-1", "conv-2")
    assert s.details["total_tokens"] == 12 and s.details["cache_read_input_tokens"] == 4
    assert s.details["tools_declared"] == [{"type": "function", "name": "f", "parameters": {}}]
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
    assert s.output == [{"role": "assistant", "parts": [{"type": "text", "content": "hello"}], "finish_reason": "stop"}]


def test_malformed_gen_ai_messages_are_kept_raw_and_flagged() -> None:
    s = span({"gen_ai.is_streaming": True, "gen_ai.input.messages": '[{"role": "user", "parts": [', "x": 1})
    normalize_span(s)
    assert s.unparsed == ["input"] and s.content_captured
    assert s.input == [
        {"role": "user", "parts": [{"type": "text", "content": '[{"role": "user", "parts": ['}], "unparsed": True}
    ]


def test_legacy_completions_prompt_and_refusal() -> None:
    s = span(
        {
            "llm.request.type": "completion",
            "gen_ai.prompt.0.user": "Say hi",
            "gen_ai.completion.0.refusal": "I can't help with that.",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.finish_reason": "stop",
        }
    )
    normalize_span(s)
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": "Say hi"}]}]
    assert s.output == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "I can't help with that."}],
            "finish_reason": "stop",
        }
    ]


def test_multimodal_content_is_a_json_list_of_parts() -> None:
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "u"}}]
    s = span(
        {"llm.request.type": "chat", "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": json.dumps(content)}
    )
    normalize_span(s)
    assert s.input == [
        {
            "role": "user",
            "parts": [
                {"type": "text", "content": "What is this?"},
                {"type": "image_url", "image_url": {"url": "u"}},
            ],
        }
    ]


def test_text_that_looks_like_json_stays_text() -> None:
    s = span({"llm.request.type": "chat", "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "[1, 2] or [3"})
    normalize_span(s)
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": "[1, 2] or [3"}]}]
    assert s.unparsed == []


def test_messages_are_ordered_by_their_index_not_by_key_order() -> None:
    s = span(
        {
            "llm.request.type": "chat",
            "gen_ai.prompt.10.role": "user",
            "gen_ai.prompt.10.content": "eleventh",
            "gen_ai.prompt.2.role": "user",
            "gen_ai.prompt.2.content": "third",
            "gen_ai.prompt.0.role": "system",
            "gen_ai.prompt.0.content": "first",
        }
    )
    normalize_span(s)
    assert [m["parts"][0]["content"] for m in s.input or ()] == ["first", "third", "eleventh"]


@pytest.mark.parametrize(
    "attributes",
    [
        {"llm.request.type": 5, "traceloop.span.kind": ["tool"], "traceloop.entity.name": 3},
        {"llm.request.type": "chat", "gen_ai.prompt.0.role": 7, "gen_ai.prompt.0.content": 42},
        {"llm.request.type": "chat", "gen_ai.prompt.x.role": "user", "gen_ai.prompt.": "?", "gen_ai.prompt.0": "?"},
        {
            "llm.request.type": "chat",
            "gen_ai.prompt.\u00b2.role": "user",
            "gen_ai.completion.0.tool_calls.\u00b2.id": "c",
        },
        {"llm.request.type": "chat", "gen_ai.completion.0.tool_calls.x.name": "f", "gen_ai.completion.0.role": None},
        {"llm.request.type": "chat", "gen_ai.completion.0.tool_calls.0.arguments": "{not json"},
        {"llm.request.type": "chat", "gen_ai.usage.input_tokens": "12", "gen_ai.usage.output_tokens": True},
        {"llm.request.type": "chat", "llm.usage.total_tokens": "many", "llm.request.functions.0.name": None},
        {"llm.request.type": "chat", "llm.request.functions.0.parameters": "{bad", "gen_ai.tool.definitions": "{bad"},
        {"traceloop.span.kind": "tool", "traceloop.entity.input": ["a"], "traceloop.entity.output": {"k": 1}},
        {"traceloop.span.kind": "tool", "traceloop.entity.input": "null", "traceloop.entity.output": ""},
        {"traceloop.workflow.name": "w", "traceloop.association.properties.session_id": 12},
        {"gen_ai.is_streaming": True, "gen_ai.input.messages": 5, "gen_ai.system_instructions": 7},
    ],
)
def test_odd_values_never_raise(attributes: dict[str, Any]) -> None:
    s = span(dict(attributes), status="ERROR")
    normalize_span(s)
    assert s.convention == "openllmetry"
    assert s.attributes == attributes
    for message in (s.input or []) + (s.output or []):
        assert isinstance(message["role"], str)
        assert all("type" in p for p in message["parts"])
    if s.input_tokens is not None:
        assert isinstance(s.input_tokens, int)


def test_token_strings_are_counted() -> None:
    s = span({"llm.request.type": "chat", "gen_ai.usage.prompt_tokens": "12", "gen_ai.usage.completion_tokens": 3.0})
    normalize_span(s)
    assert (s.input_tokens, s.output_tokens) == (12, 3)


def test_error_type_from_the_exception_event() -> None:
    event = SpanEvent(1, "exception", {"exception.type": "openai.RateLimitError", "exception.message": "slow down"})
    s = span({"llm.request.type": "chat"}, [event], status="ERROR")
    normalize_span(s)
    assert s.error_type == "openai.RateLimitError"
