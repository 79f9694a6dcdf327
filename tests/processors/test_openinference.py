"""The OpenInference mapper, on real openinference-instrumentation-openai 0.1.66 captures and hand-built edge cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from captures import any_value, normalized_capture, parts, texts

import evalsi.processors.normalize.openinference  # noqa: F401  (registers the mapper)
from evalsi.model.span import Span, SpanEvent
from evalsi.processors.normalize import normalize_span

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FOLDER = FIXTURES / "openinference"
SCENARIOS = ("chat_simple", "chat_tools", "chat_pii", "chat_error", "embeddings", "chat_stream")
META = json.loads((FOLDER / "meta.json").read_text())

# what each OpenInference span kind means, written out here rather than read from the mapper
KIND_STEP = {"LLM": "llm", "TOOL": "tool", "AGENT": "agent", "EMBEDDING": "embedding", "CHAIN": "chain"}


# --- reading the captures -------------------------------------------------------------------------


def raw_spans(scenario: str) -> dict[str, dict[str, Any]]:
    """The spans of a capture's OTLP/JSON file by span id: attributes, events and status as written."""
    request = json.loads((FOLDER / f"{scenario}.json").read_text())
    spans: dict[str, dict[str, Any]] = {}
    for resource in request["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                spans[span["spanId"]] = {
                    "name": span["name"],
                    "attributes": {a["key"]: any_value(a["value"]) for a in span.get("attributes", [])},
                    "events": [
                        (e["name"], {a["key"]: any_value(a["value"]) for a in e.get("attributes", [])})
                        for e in span.get("events", [])
                    ],
                    "status": span.get("status", {}).get("code", 0),
                    "start": int(span["startTimeUnixNano"]),
                    "event_times": [(e["name"], int(e["timeUnixNano"])) for e in span.get("events", [])],
                }
    return spans


def normalized(scenario: str, suffix: str) -> list[Span]:
    return normalized_capture("openinference", scenario, suffix)


def dump(messages: list[dict[str, Any]] | None) -> str:
    return json.dumps(messages, ensure_ascii=False)


def indexed(attributes: dict[str, Any], prefix: str, field: str) -> list[Any]:
    """`prefix.N.field` values of a raw span in N order (N from 0 while present)."""
    found = []
    n = 0
    while f"{prefix}.{n}.{field}" in attributes or any(k.startswith(f"{prefix}.{n}.") for k in attributes):
        found.append(attributes.get(f"{prefix}.{n}.{field}"))
        n += 1
    return found


# --- the captures, span by span -------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".pb"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_capture_span_matches_its_raw_attributes(scenario: str, suffix: str) -> None:
    spans = normalized(scenario, suffix)
    raw = raw_spans(scenario)
    assert len(spans) == META["scenarios"][scenario]["span_count"] == len(raw)
    for span in spans:
        source = raw[span.span_id]
        attrs = source["attributes"]
        assert span.convention == "openinference"
        assert span.step_type == KIND_STEP[attrs["openinference.span.kind"]]
        # model: the recorded name; a failed call recorded none, so the request's model
        expected_model = attrs.get("llm.model_name") or attrs.get("embedding.model_name")
        if expected_model is None and "llm.invocation_parameters" in attrs:
            expected_model = json.loads(attrs["llm.invocation_parameters"])["model"]
        assert span.model == expected_model
        assert span.provider == attrs.get("llm.provider", attrs.get("llm.system"))
        assert span.input_tokens == attrs.get("llm.token_count.prompt")
        assert span.output_tokens == attrs.get("llm.token_count.completion")
        assert span.details.get("total_tokens") == attrs.get("llm.token_count.total")
        assert span.details.get("cache_read_input_tokens") == attrs.get("llm.token_count.prompt_details.cache_read")
        assert span.details.get("reasoning_tokens") == attrs.get("llm.token_count.completion_details.reasoning")
        assert span.tool_name == attrs.get("tool.name")
        assert span.session_id == attrs.get("session.id")
        assert span.user_id == attrs.get("user.id")
        assert span.content_captured
        assert span.unparsed == []
        # errors: the status and the recorded exception's type
        exceptions = [e for name, e in source["events"] if name == "exception"]
        if source["status"] == 2:
            assert span.status_code == "ERROR"
            assert span.error_type == exceptions[0]["exception.type"]
        else:
            assert span.status_code != "ERROR" and span.error_type is None


@pytest.mark.parametrize("suffix", [".json", ".pb"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_content_is_the_flattened_messages_and_carries_the_markers(scenario: str, suffix: str) -> None:
    spans = normalized(scenario, suffix)
    raw = raw_spans(scenario)
    markers = META["scenarios"][scenario]["markers"]
    for span in spans:
        attrs = raw[span.span_id]["attributes"]
        if span.step_type == "llm":
            roles = indexed(attrs, "llm.input_messages", "message.role")
            assert [m["role"] for m in span.input or ()] == roles
            contents = [c for c in indexed(attrs, "llm.input_messages", "message.content") if c is not None]
            # a tool message's content is its tool_call_response, the rest are text parts
            tool_responses = [p["response"] for p in parts(span.input, "tool_call_response")]
            assert texts(span.input) + tool_responses == contents
            assert markers["prompt"] in dump(span.input)
            output_contents = [c for c in indexed(attrs, "llm.output_messages", "message.content") if c is not None]
            assert texts(span.output) == output_contents
            if "llm.finish_reason" in attrs:
                assert span.output is not None and span.output[0]["finish_reason"] == attrs["llm.finish_reason"]
            if not span.output:
                assert "output.value" not in attrs and "llm.output_messages.0.message.role" not in attrs
        elif span.step_type == "embedding":
            assert texts(span.input) == indexed(attrs, "embedding.embeddings", "embedding.text")
            assert markers["prompt"] in dump(span.input)
            assert span.output is None  # vectors are not content
        elif span.step_type == "agent":
            assert texts(span.input) == [attrs["input.value"]]
            assert texts(span.output) == [attrs["output.value"]]
            assert span.agent_name == raw[span.span_id]["name"]
    if "completion" in markers:
        final = max((s for s in spans if s.step_type == "llm"), key=lambda s: s.start_time_unix_nano)
        assert markers["completion"] in " ".join(texts(final.output))


@pytest.mark.parametrize("suffix", [".json", ".pb"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_request_parameters_finish_reason_and_first_token_time(scenario: str, suffix: str) -> None:
    raw = raw_spans(scenario)
    for span in normalized(scenario, suffix):
        source = raw[span.span_id]
        attrs = source["attributes"]
        parameters = json.loads(
            attrs.get("llm.invocation_parameters") or attrs.get("embedding.invocation_parameters") or "{}"
        )
        request = span.details.get("request", {})
        for key in ("temperature", "max_tokens", "top_p", "seed", "stream", "user"):
            assert request.get(key) == parameters.get(key)
        if "encoding_format" in parameters:
            assert request["encoding_formats"] == [parameters["encoding_format"]]
        assert "model" not in request
        reason = attrs.get("llm.finish_reason")
        assert span.details.get("finish_reasons") == (None if reason is None else [reason])
        first_token = [t for name, t in source["event_times"] if name == "First Token Stream Event"]
        if first_token:
            assert span.details["time_to_first_token_s"] == (first_token[0] - source["start"]) / 1e9
        else:
            assert "time_to_first_token_s" not in span.details


@pytest.mark.parametrize("suffix", [".json", ".pb"])
def test_tool_calls_and_results_in_the_tools_capture(suffix: str) -> None:
    spans = normalized("chat_tools", suffix)
    raw = raw_spans("chat_tools")
    markers = META["scenarios"]["chat_tools"]["markers"]
    by_kind: dict[str, list[Span]] = {}
    for span in sorted(spans, key=lambda s: s.start_time_unix_nano):
        by_kind.setdefault(span.step_type, []).append(span)
    first, second = by_kind["llm"]

    # the model's call, in the first completion's output
    attrs = raw[first.span_id]["attributes"]
    prefix = "llm.output_messages.0.message.tool_calls.0.tool_call"
    (call,) = parts(first.output, "tool_call")
    assert call["id"] == attrs[f"{prefix}.id"]
    assert call["name"] == attrs[f"{prefix}.function.name"]
    assert call["arguments"] == json.loads(attrs[f"{prefix}.function.arguments"])
    assert any(marker in attrs[f"{prefix}.function.arguments"] for marker in markers["tool_args"])
    assert first.output is not None and first.output[0]["finish_reason"] == "tool_calls"

    # the tool span: the call in, the result out
    (tool,) = by_kind["tool"]
    attrs = raw[tool.span_id]["attributes"]
    assert tool.tool_name == attrs["tool.name"]
    (call,) = parts(tool.input, "tool_call")
    assert (call["name"], call["arguments"]) == (attrs["tool.name"], json.loads(attrs["input.value"]))
    (result,) = parts(tool.output, "tool_call_response")
    assert result["response"] == attrs["output.value"]
    assert markers["tool_result"] in result["response"]
    assert tool.details["tool_parameters"] == json.loads(attrs["tool.parameters"])
    assert tool.details["tool_description"] == attrs["tool.description"]
    assert "tool_call_id" not in tool.details  # this capture's tool span records no call id

    # the second completion sees the call and the tool's answer
    attrs = raw[second.span_id]["attributes"]
    (call,) = parts(second.input, "tool_call")
    assert call["id"] == attrs["llm.input_messages.2.message.tool_calls.0.tool_call.id"]
    (response,) = parts(second.input, "tool_call_response")
    assert response["id"] == attrs["llm.input_messages.3.message.tool_call_id"]
    assert markers["tool_result"] in response["response"]
    assert markers["completion"] in " ".join(texts(second.output))

    (agent,) = by_kind["agent"]
    assert {s.parent_span_id for s in spans if s is not agent} == {agent.span_id}
    assert markers["completion"] in " ".join(texts(agent.output))


# --- hand-built spans -----------------------------------------------------------------------------


def span(attributes: dict[str, Any], events: list[SpanEvent] | None = None, status: str = "UNSET") -> Span:
    return Span(
        trace_id="0" * 31 + "1",
        span_id="0" * 15 + "1",
        parent_span_id="",
        name="step",
        kind="INTERNAL",
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        status_code=status,
        attributes=attributes,
        events=events or [],
    )


def test_openinference_markers_win_over_gen_ai_attributes() -> None:
    s = span(
        {
            "openinference.span.kind": "LLM",
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "from-gen-ai",
            "gen_ai.system": "anthropic",
            "gen_ai.usage.input_tokens": 3,
            "llm.model_name": "from-openinference",
            "llm.token_count.prompt": 7,
        }
    )
    normalize_span(s)
    assert s.convention == "openinference"
    # OpenInference names first, gen_ai.* fills what they leave out
    assert (s.model, s.input_tokens, s.provider) == ("from-openinference", 7, "anthropic")


def test_gen_ai_content_fills_in_when_openinference_has_none() -> None:
    s = span(
        {
            "openinference.span.kind": "LLM",
            "gen_ai.input.messages": '[{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]',
        }
    )
    normalize_span(s)
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}] and s.output is None


def test_provider_and_identity_attributes() -> None:
    s = span(
        {
            "openinference.span.kind": "AGENT",
            "llm.provider": "azure",
            "llm.system": "openai",
            "session.id": "sess-1",
            "user.id": "user-9",
            "agent.name": "planner",
            "graph.node.id": "n2",
            "graph.node.name": "plan",
            "graph.node.parent_id": "n1",
        }
    )
    normalize_span(s)
    assert (s.step_type, s.provider, s.session_id, s.user_id, s.agent_name) == (
        "agent",
        "azure",
        "sess-1",
        "user-9",
        "planner",
    )
    assert s.details == {"graph_node_id": "n2", "graph_node_name": "plan", "graph_node_parent_id": "n1"}
    assert not s.content_captured and s.input is None and s.output is None


def test_agent_name_falls_back_to_the_graph_node_then_the_span_name() -> None:
    node = span({"openinference.span.kind": "AGENT", "graph.node.name": "researcher"})
    bare = span({"openinference.span.kind": "AGENT"})
    chain = span({"openinference.span.kind": "CHAIN"})
    for s in (node, bare, chain):
        normalize_span(s)
    assert (node.agent_name, bare.agent_name, chain.agent_name) == ("researcher", "step", None)


@pytest.mark.parametrize(
    ("kind", "step_type", "kept"),
    [
        ("LLM", "llm", None),
        ("llm", "llm", None),
        ("CHAIN", "chain", None),
        ("RETRIEVER", "retriever", None),
        ("RERANKER", "retriever", "RERANKER"),
        ("EMBEDDING", "embedding", None),
        ("GUARDRAIL", "other", "GUARDRAIL"),
        ("EVALUATOR", "other", "EVALUATOR"),
        ("UNKNOWN", "other", None),
        ("SOMETHING_NEW", "other", "SOMETHING_NEW"),
        (7, "other", None),
    ],
)
def test_span_kinds(kind: Any, step_type: str, kept: str | None) -> None:
    s = span({"openinference.span.kind": kind})
    normalize_span(s)
    assert (s.convention, s.step_type, s.details.get("span_type")) == ("openinference", step_type, kept)


def test_token_details_cost_and_numeric_strings() -> None:
    s = span(
        {
            "openinference.span.kind": "LLM",
            "llm.token_count.prompt": "120",
            "llm.token_count.completion": 30.0,
            "llm.token_count.total": 150,
            "llm.token_count.prompt_details.cache_read": 100,
            "llm.token_count.prompt_details.cache_write": 20,
            "llm.token_count.completion_details.reasoning": "12",
            "llm.cost.prompt": 0.001,
            "llm.cost.completion": "0.002",
        }
    )
    normalize_span(s)
    assert (s.input_tokens, s.output_tokens) == (120, 30)
    assert s.details == {
        "total_tokens": 150,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 20,
        "reasoning_tokens": 12,
    }
    assert s.cost_usd == pytest.approx(0.003)
    total = span({"openinference.span.kind": "LLM", "llm.cost.total": 0.5, "llm.cost.prompt": 0.1})
    normalize_span(total)
    assert total.cost_usd == 0.5


def test_message_contents_tool_messages_and_legacy_function_calls() -> None:
    s = span(
        {
            "openinference.span.kind": "LLM",
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.contents.0.message_content.type": "text",
            "llm.input_messages.0.message.contents.0.message_content.text": "What is in",
            "llm.input_messages.0.message.contents.1.message_content.type": "image",
            "llm.input_messages.0.message.contents.1.message_content.image.image.url": "https://x/cat.png",
            "llm.input_messages.0.message.contents.2.message_content.type": "audio",
            "llm.input_messages.0.message.contents.2.message_content.audio.audio.url": "https://x/a.wav",
            "llm.input_messages.1.message.role": "assistant",
            "llm.input_messages.1.message.function_call_name": "lookup",
            "llm.input_messages.1.message.function_call_arguments_json": '{"q": "cat"}',
            "llm.input_messages.2.message.role": "tool",
            "llm.input_messages.2.message.tool_call_id": "c1",
            "llm.input_messages.2.message.content": "a cat",
            # indices sort as numbers, not strings
            "llm.input_messages.10.message.role": "user",
            "llm.input_messages.10.message.content": "tenth",
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.contents.0.message_content.type": "reasoning",
            "llm.output_messages.0.message.contents.0.message_content.text": "thinking",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "zoom",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": "not json",
            "llm.output_messages.1.message.role": "assistant",
            "llm.output_messages.1.message.content": "second choice",
            "llm.output_messages.2.message.role": "assistant",
            "llm.output_messages.2.message.tool_calls.0.tool_call.function.name": "only_a_name",
            "llm.finish_reason": "tool_calls",
        }
    )
    normalize_span(s)
    assert s.input == [
        {
            "role": "user",
            "parts": [
                {"type": "text", "content": "What is in"},
                {"type": "uri", "modality": "image", "uri": "https://x/cat.png"},
                {"type": "audio", "audio.audio.url": "https://x/a.wav"},
            ],
        },
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": None, "name": "lookup", "arguments": {"q": "cat"}}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "a cat"}]},
        {"role": "user", "parts": [{"type": "text", "content": "tenth"}]},
    ]
    # with two output messages the span's one finish reason belongs to neither for sure
    assert s.output == [
        {
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "content": "thinking"},
                {"type": "tool_call", "id": None, "name": "zoom", "arguments": "not json"},
            ],
        },
        {"role": "assistant", "parts": [{"type": "text", "content": "second choice"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": None, "name": "only_a_name", "arguments": None}]},
    ]


def test_request_and_response_bodies_when_messages_are_not_flattened() -> None:
    request = {
        "model": "gpt-x",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ],
    }
    response = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}],
                },
            }
        ]
    }
    s = span(
        {
            "openinference.span.kind": "LLM",
            "input.value": json.dumps(request),
            "input.mime_type": "application/json",
            "output.value": json.dumps(response),
            "output.mime_type": "application/json; charset=utf-8",
        }
    )
    normalize_span(s)
    assert s.input == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Hi"}]},
    ]
    assert s.output == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c", "name": "f", "arguments": {"a": 1}}],
            "finish_reason": "tool_calls",
        }
    ]


def test_responses_api_and_completions_bodies() -> None:
    request = {
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "cold"},
        ],
    }
    response = {
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "it is cold"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cold."}]},
        ]
    }
    s = span(
        {
            "openinference.span.kind": "LLM",
            "input.value": json.dumps(request),
            "input.mime_type": "application/json",
            "output.value": json.dumps(response),
            "output.mime_type": "application/json",
        }
    )
    normalize_span(s)
    assert s.input == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Weather?"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "w", "arguments": {"city": "Oslo"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "cold"}]},
    ]
    assert s.output == [
        {
            "role": "assistant",
            "parts": [{"type": "reasoning", "content": "it is cold"}, {"type": "text", "content": "Cold."}],
        }
    ]
    completion = span(
        {
            "openinference.span.kind": "LLM",
            "llm.prompts.0.prompt.text": "Once upon",
            "llm.choices.0.completion.text": " a time",
        }
    )
    normalize_span(completion)
    assert texts(completion.input) == ["Once upon"] and texts(completion.output) == [" a time"]
    legacy = span({"openinference.span.kind": "LLM", "llm.prompts": ["p1", "p2"]})
    normalize_span(legacy)
    assert texts(legacy.input) == ["p1", "p2"]


def test_plain_text_and_unrecognized_json_values_are_one_message() -> None:
    s = span(
        {
            "openinference.span.kind": "CHAIN",
            "input.value": '{"question": "why"}',  # no mime type: plain text by the spec
            "output.value": '{"answer": 42, "sources": []}',
            "output.mime_type": "application/json",
        }
    )
    normalize_span(s)
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": '{"question": "why"}'}]}]
    assert s.output == [{"role": "assistant", "parts": [{"type": "text", "content": '{"answer": 42, "sources": []}'}]}]
    assert s.unparsed == []


def test_malformed_json_content_is_kept_raw_and_flagged() -> None:
    raw = '{"messages": [{"role": "user", "content": "cut'
    s = span(
        {
            "openinference.span.kind": "LLM",
            "input.value": raw,
            "input.mime_type": "application/json",
            "output.value": "[oops",
            "output.mime_type": "application/json",
        }
    )
    normalize_span(s)
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": raw}], "unparsed": True}]
    assert s.output == [{"role": "assistant", "parts": [{"type": "text", "content": "[oops"}], "unparsed": True}]
    assert s.unparsed == ["input", "output"]
    assert s.content_captured
    assert s.attributes["input.value"] == raw


def test_tool_span_from_tool_call_attributes() -> None:
    s = span(
        {
            "openinference.span.kind": "TOOL",
            "tool_call.id": "call_1",
            "tool_call.function.name": "search",
            "tool_call.function.arguments": '{"q": "x"}',
            "output.value": "found",
        }
    )
    normalize_span(s)
    assert (s.tool_name, s.details["tool_call_id"]) == ("search", "call_1")
    assert s.input == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "call_1", "name": "search", "arguments": {"q": "x"}}],
        }
    ]
    assert s.output == [
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "found"}]}
    ]
    plain = span({"openinference.span.kind": "TOOL", "tool.name": "shell", "input.value": "ls -la"})
    normalize_span(plain)
    assert parts(plain.input, "tool_call")[0]["arguments"] == "ls -la" and plain.output is None


def test_retriever_documents_go_to_details() -> None:
    s = span(
        {
            "openinference.span.kind": "RETRIEVER",
            "input.value": "capital of France",
            "retrieval.documents.0.document.id": "d1",
            "retrieval.documents.0.document.content": "Paris is the capital.",
            "retrieval.documents.0.document.score": 0.9,
            "retrieval.documents.0.document.metadata": '{"source": "wiki"}',
            "retrieval.documents.1.document.content": "Lyon is a city.",
            "retrieval.documents.1.document.score": "0.2",
            "retrieval.documents.1.document.metadata": "{broken",
        }
    )
    normalize_span(s)
    assert s.step_type == "retriever"
    assert s.details["documents"] == [
        {"id": "d1", "content": "Paris is the capital.", "score": 0.9, "metadata": {"source": "wiki"}},
        {"id": None, "content": "Lyon is a city.", "score": 0.2, "metadata": "{broken"},
    ]
    assert texts(s.input) == ["capital of France"] and s.output is None


def test_reranker_documents_and_query() -> None:
    s = span(
        {
            "openinference.span.kind": "RERANKER",
            "reranker.query": "capital",
            "reranker.model_name": "rerank-1",
            "reranker.input_documents.0.document.content": "a",
            "reranker.input_documents.1.document.content": "b",
            "reranker.output_documents.0.document.content": "b",
            "reranker.output_documents.0.document.score": 0.8,
        }
    )
    normalize_span(s)
    assert (s.step_type, s.model, texts(s.input)) == ("retriever", "rerank-1", ["capital"])
    assert [d["content"] for d in s.details["input_documents"]] == ["a", "b"]
    assert s.details["documents"] == [{"id": None, "content": "b", "score": 0.8, "metadata": None}]


def test_embedding_texts_from_the_request_body() -> None:
    s = span(
        {
            "openinference.span.kind": "EMBEDDING",
            "input.value": '{"model": "e", "input": "one text"}',
            "input.mime_type": "application/json",
            "output.value": '{"data": [{"embedding": [0.1]}]}',
            "output.mime_type": "application/json",
        }
    )
    normalize_span(s)
    assert texts(s.input) == ["one text"] and s.output is None


def test_error_type_without_an_exception_event() -> None:
    failed = span({"openinference.span.kind": "LLM"}, status="ERROR")
    typed = span({"openinference.span.kind": "LLM", "error.type": "timeout"}, status="ERROR")
    handled = span(
        {"openinference.span.kind": "LLM"}, events=[SpanEvent(1, "exception", {"exception.type": "KeyError"})]
    )
    for s in (failed, typed, handled):
        normalize_span(s)
    assert (failed.error_type, typed.error_type, handled.error_type) == ("_OTHER", "timeout", None)


@pytest.mark.parametrize(
    "attributes",
    [
        {"openinference.span.kind": None},
        {"openinference.span.kind": ["LLM"]},
        {"openinference.span.kind": "LLM", "llm.model_name": 5, "llm.provider": {"x": 1}, "session.id": 12},
        {"openinference.span.kind": "LLM", "llm.token_count.prompt": [1], "llm.token_count.completion": "many"},
        {"openinference.span.kind": "LLM", "llm.cost.total": "free", "llm.invocation_parameters": "{bad"},
        {"openinference.span.kind": "LLM", "llm.invocation_parameters": '["not", "a", "dict"]'},
        {"openinference.span.kind": "LLM", "input.value": 42, "output.value": ["a", 1]},
        {"openinference.span.kind": "LLM", "input.value": '"a json string"', "input.mime_type": "application/json"},
        {"openinference.span.kind": "LLM", "input.value": "null", "input.mime_type": "application/json"},
        {
            "openinference.span.kind": "LLM",
            "input.value": '{"messages": "nope"}',
            "input.mime_type": "application/json",
        },
        {"openinference.span.kind": "LLM", "output.value": '{"choices": [1, null]}', "output.mime_type": "json"},
        {"openinference.span.kind": "LLM", "input.value": '{"input": [1, {"type": 3}]}', "input.mime_type": "json"},
        {"openinference.span.kind": "LLM", "llm.input_messages.0.message.role": 3},
        {"openinference.span.kind": "LLM", "llm.input_messages.0.message.content": {"k": "v"}},
        {"openinference.span.kind": "LLM", "llm.input_messages.x.message.role": "user"},
        {"openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user", "llm.input_messages.0": "?"},
        {
            "openinference.span.kind": "LLM",
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": None,
            "llm.output_messages.0.message.contents.z.message_content.text": "x",
        },
        {"openinference.span.kind": "EMBEDDING", "embedding.embeddings.0.embedding.text": None},
        {"openinference.span.kind": "RETRIEVER", "retrieval.documents.0.document.id": 7},
        {"openinference.span.kind": "TOOL", "tool.name": ["t"], "input.value": {"a": 1}, "tool.parameters": 3},
    ],
)
def test_odd_values_never_raise(attributes: dict[str, Any]) -> None:
    s = span(dict(attributes))
    normalize_span(s)
    assert s.convention == "openinference"
    assert s.attributes == attributes
    for message in (s.input or []) + (s.output or []):
        assert isinstance(message["role"], str)
        assert all("type" in p for p in message["parts"])
