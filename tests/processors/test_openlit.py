"""The OpenLIT mapper, on real openlit 1.45.0 captures (spans, and what the log records beside them hold) and
hand-built spans in the shapes of older OpenLIT releases.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from captures import any_value, normalized_capture, parts

import evalsi.processors.normalize.openlit  # noqa: F401  (registers the mapper)
from evalsi.model.span import Span, SpanEvent
from evalsi.processors.normalize import normalize_span
from evalsi.processors.normalize.messages import semconv_messages

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FOLDER = FIXTURES / "openlit"
SCENARIOS = ("chat_simple", "chat_tools", "chat_pii", "chat_error", "embeddings", "chat_stream")
LOGGED = ("chat_simple", "chat_tools", "chat_pii", "embeddings", "chat_stream")
META = json.loads((FOLDER / "meta.json").read_text())

# gen_ai.operation.name -> step type, written out here rather than read from the mapper
OPERATION_STEP = {"chat": "llm", "embeddings": "embedding"}


# --- reading the captures -------------------------------------------------------------------------


def raw_spans(scenario: str) -> dict[str, dict[str, Any]]:
    """The spans of a capture's OTLP/JSON file by span id: attributes, scope and status code as written."""
    request = json.loads((FOLDER / f"{scenario}.json").read_text())
    spans: dict[str, dict[str, Any]] = {}
    for resource in request["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                spans[span["spanId"]] = {
                    "attributes": {a["key"]: any_value(a["value"]) for a in span.get("attributes", [])},
                    "scope": scope.get("scope", {}).get("name", ""),
                    "status": span.get("status", {}).get("code", 0),
                }
    return spans


def raw_log_records(scenario: str) -> list[dict[str, Any]]:
    request = json.loads((FOLDER / f"{scenario}.logs.json").read_text())
    return [
        {**record, "attributes": {a["key"]: any_value(a["value"]) for a in record.get("attributes", [])}}
        for resource in request["resourceLogs"]
        for scope in resource["scopeLogs"]
        for record in scope["logRecords"]
    ]


def normalized(scenario: str, suffix: str = ".json") -> list[Span]:
    return normalized_capture("openlit", scenario, suffix)


def dump(messages: list[dict[str, Any]] | None) -> str:
    return json.dumps(messages, ensure_ascii=False)


def openlit_spans(spans: list[Span]) -> list[Span]:
    return sorted((s for s in spans if s.convention == "openlit"), key=lambda s: s.start_time_unix_nano)


# --- every capture, span by span, against the raw attribute values -------------------------------


@pytest.mark.parametrize("suffix", [".json", ".pb"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_span_matches_the_raw_attributes(scenario: str, suffix: str) -> None:
    spans = normalized(scenario, suffix)
    raw = raw_spans(scenario)
    markers = META["scenarios"][scenario]["markers"]
    assert len(spans) == META["scenarios"][scenario]["span_count"] == len(raw)
    for span in spans:
        written = raw[span.span_id]
        attributes = written["attributes"]
        if attributes.get("telemetry.sdk.name") != "openlit":
            # httpx's POST spans stay unmapped; the capture's own agent/tool spans are plain OTel GenAI
            if written["scope"] == "corpus.capture.manual":
                assert span.convention == "otel_genai"
            else:
                assert (span.convention, span.step_type, span.content_captured) == ("", "other", False)
            continue
        assert written["scope"] == "openlit.instrumentation.openai"
        assert span.convention == "openlit"
        assert span.step_type == OPERATION_STEP[attributes["gen_ai.operation.name"]]
        assert span.model == attributes.get("gen_ai.response.model", attributes["gen_ai.request.model"])
        assert span.provider == attributes["gen_ai.provider.name"]
        assert span.input_tokens == attributes.get("gen_ai.usage.input_tokens")
        assert span.output_tokens == attributes.get("gen_ai.usage.output_tokens")
        assert span.cost_usd == attributes.get("gen_ai.usage.cost")
        assert span.user_id == (attributes.get("gen_ai.request.user") or None)
        assert span.tool_name is None and span.session_id is None and span.agent_name is None
        assert (span.status_code == "ERROR") == (written["status"] == 2)
        assert span.error_type == attributes.get("error.type")
        assert span.details["environment"] == attributes["deployment.environment"]
        assert span.details["application_name"] == attributes["service.name"]
        assert span.details.get("total_tokens") == attributes.get("gen_ai.client.token.usage")
        assert span.details.get("cache_read_input_tokens") == attributes.get("gen_ai.usage.cache_read.input_tokens")
        assert span.details.get("cache_creation_input_tokens") == attributes.get(
            "gen_ai.usage.cache_creation.input_tokens"
        )
        if attributes.get("gen_ai.request.stream"):
            assert span.details["time_to_first_chunk_s"] == attributes["gen_ai.server.time_to_first_token"]
        else:
            assert "time_to_first_chunk_s" not in span.details

        # OpenLIT 1.45 writes the semconv message JSON, system message included: the canonical form as is
        assert span.unparsed == []
        if "gen_ai.input.messages" not in attributes:
            assert (span.input, span.output, span.content_captured) == (None, None, False)
            continue
        assert span.content_captured
        assert span.input == json.loads(attributes["gen_ai.input.messages"])
        assert markers["prompt"] in dump(span.input)
        if "gen_ai.output.messages" in attributes:
            assert span.output == json.loads(attributes["gen_ai.output.messages"])
        else:
            assert span.output is None
    if "completion" in markers:
        assert any(markers["completion"] in dump(s.output) for s in spans)


def test_chat_simple() -> None:
    spans = normalized("chat_simple")
    (span,) = openlit_spans(spans)
    assert (span.step_type, span.model, span.provider) == ("llm", "gpt-4o-mini", "openai")
    assert (span.input_tokens, span.output_tokens, span.user_id) == (17, 6, "user-1234")
    assert span.cost_usd == pytest.approx(6.15e-06)
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
    assert span.details["request"]["temperature"] == 0.2 and span.details["request"]["seed"] == 42


def test_chat_tools_round_trip() -> None:
    spans = normalized("chat_tools")
    raw = raw_spans("chat_tools")
    markers = META["scenarios"]["chat_tools"]["markers"]
    asking, answering = openlit_spans(spans)
    asked = raw[asking.span_id]["attributes"]

    # gen_ai.tool.* on a chat span name the call the model asked for; the span is still the LLM step
    assert asking.step_type == "llm" and asking.tool_name is None
    assert "tool_call_id" not in asking.details
    (call,) = parts(asking.output, "tool_call")
    assert call["name"] == asked["gen_ai.tool.name"]
    assert call["id"] == asked["gen_ai.tool.call.id"]
    assert call["arguments"] == json.loads(asked["gen_ai.tool.args"])
    assert any(m in asked["gen_ai.tool.args"] for m in markers["tool_args"])
    assert asking.output is not None and asking.output[0]["finish_reason"] == "tool_call"
    assert asking.details["finish_reasons"] == asked["gen_ai.response.finish_reasons"] == ["tool_calls"]

    # OpenLIT leaves the assistant's tool-call turn out of the next request's messages
    assert answering.input is not None
    assert [m["role"] for m in answering.input] == ["system", "user", "tool"]
    (response,) = parts(answering.input, "tool_call_response")
    assert response["id"] == call["id"]
    assert markers["tool_result"] in response["response"]
    assert markers["completion"] in dump(answering.output)

    tool = next(s for s in spans if s.step_type == "tool")
    assert (tool.convention, tool.tool_name) == ("otel_genai", "get_weather")


def test_embeddings_input_is_on_the_span() -> None:
    (span,) = openlit_spans(normalized("embeddings"))
    assert (span.step_type, span.model, span.input_tokens, span.output_tokens) == (
        "embedding",
        "text-embedding-3-small",
        10,
        None,
    )
    assert [p["content"] for p in parts(span.input, "text")] == [
        "The capital of France is Paris.",
        "Contact jane.doe@example.com for details.",
    ]
    assert span.output is None and span.cost_usd == pytest.approx(2e-07)


def test_chat_error_records_no_content() -> None:
    spans = normalized("chat_error")
    (span,) = openlit_spans(spans)
    assert (span.status_code, span.error_type) == ("ERROR", "InternalServerError")
    assert (span.input_tokens, span.output_tokens, span.cost_usd) == (None, None, None)
    # OpenLIT writes content only after a response: a failed call has neither span content nor a log record
    assert not span.content_captured and span.input is None
    assert META["scenarios"]["chat_error"]["log_count"] == 0
    http = next(s for s in spans if s.convention == "")
    assert (http.status_code, http.step_type) == ("ERROR", "other")


def test_protobuf_and_json_captures_normalize_alike() -> None:
    for scenario in SCENARIOS:
        from_json = sorted((s.canonical() for s in normalized(scenario)), key=lambda c: c["span_id"])
        from_pb = sorted((s.canonical() for s in normalized(scenario, ".pb")), key=lambda c: c["span_id"])
        assert from_json == from_pb


# --- the log records OpenLIT emits beside its spans -----------------------------------------------


@pytest.mark.parametrize("scenario", LOGGED)
def test_log_records_repeat_the_span_content_as_structured_values(scenario: str) -> None:
    """What the log-record join will find: one `gen_ai.client.inference.operation.details` record per call,
    its content in attributes (AnyValue lists and maps, not JSON strings), the body empty.
    """
    spans = openlit_spans(normalized(scenario))
    records = raw_log_records(scenario)
    assert len(records) == META["scenarios"][scenario]["log_count"] == len(spans)
    by_response = {s.attributes.get("gen_ai.response.id"): s for s in spans}
    for record in records:
        assert record["eventName"] == "gen_ai.client.inference.operation.details"
        assert record["body"] == {"stringValue": ""}
        attributes = record["attributes"]
        assert isinstance(attributes["gen_ai.input.messages"], list)
        span = by_response[attributes.get("gen_ai.response.id")]
        if record.get("spanId"):
            assert (record["spanId"], record["traceId"]) == (span.span_id, span.trace_id)
        assert semconv_messages(attributes["gen_ai.input.messages"], "user") == span.input
        assert semconv_messages(attributes.get("gen_ai.output.messages"), "assistant") == span.output
        # tool definitions travel only in the log record
        if "gen_ai.tool.definitions" in attributes:
            assert "gen_ai.tool.definitions" not in span.attributes
            assert attributes["gen_ai.tool.definitions"][0]["name"] == "get_weather"


def test_the_streamed_call_log_record_has_no_span_context() -> None:
    (record,) = raw_log_records("chat_stream")
    assert "spanId" not in record and "traceId" not in record
    (span,) = openlit_spans(normalized("chat_stream"))
    # only gen_ai.response.id ties it to its span
    assert record["attributes"]["gen_ai.response.id"] == span.attributes["gen_ai.response.id"]


# --- hand-built spans -----------------------------------------------------------------------------


def span(
    attributes: dict[str, Any] | None = None,
    events: list[SpanEvent] | None = None,
    *,
    status: str = "UNSET",
    scope: str = "",
    resource: dict[str, Any] | None = None,
) -> Span:
    return Span(
        trace_id="5b8efff798038103d269b633813fc60c",
        span_id="eee19b7ec3c1b174",
        parent_span_id="",
        name="test",
        kind="CLIENT",
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        status_code=status,
        scope_name=scope,
        attributes=attributes or {},
        resource_attributes=resource or {},
        events=events or [],
    )


@pytest.mark.parametrize(
    ("attributes", "scope", "resource"),
    [
        ({"telemetry.sdk.name": "openlit"}, "", {}),
        ({"gen_ai.usage.cost": 0.1}, "", {}),
        ({"gen_ai.application_name": "app"}, "", {}),
        ({"openlit.agent.version_hash": "abc"}, "", {}),
        ({}, "openlit.instrumentation.anthropic", {}),
        ({}, "", {"telemetry.sdk.name": "openlit"}),
    ],
)
def test_each_marker_claims_a_gen_ai_span(attributes: dict[str, Any], scope: str, resource: dict[str, Any]) -> None:
    s = span(
        {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", **attributes},
        scope=scope,
        resource=resource,
    )
    normalize_span(s)
    assert (s.convention, s.step_type) == ("openlit", "llm")


def test_an_openlit_resource_does_not_claim_its_http_spans() -> None:
    s = span({"http.method": "POST"}, resource={"telemetry.sdk.name": "openlit"})
    normalize_span(s)
    assert s.convention == ""


def test_plain_gen_ai_is_not_claimed() -> None:
    s = span({"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "telemetry.sdk.name": "opentelemetry"})
    normalize_span(s)
    assert s.convention == "otel_genai"


def test_older_releases_prompt_and_completion_text() -> None:
    # OpenLIT 1.33 and before: gen_ai.system, gen_ai.application_name / gen_ai.environment, content as plain text
    s = span(
        {
            "telemetry.sdk.name": "openlit",
            "gen_ai.system": "openai",
            "gen_ai.operation.name": "chat",
            "gen_ai.application_name": "my-app",
            "gen_ai.environment": "prod",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 12,
            "gen_ai.usage.output_tokens": 3,
            "gen_ai.usage.total_tokens": 15,
            "gen_ai.usage.cost": "0.0004",
            "gen_ai.prompt": "system: Be brief.\nuser: Hi",
            "gen_ai.completion": "Hello!",
        }
    )
    normalize_span(s)
    assert (s.provider, s.model, s.input_tokens, s.output_tokens, s.cost_usd) == ("openai", "gpt-4o", 12, 3, 0.0004)
    assert s.details["application_name"] == "my-app" and s.details["environment"] == "prod"
    assert s.details["total_tokens"] == 15
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": "system: Be brief.\nuser: Hi"}]}]
    assert s.output == [{"role": "assistant", "parts": [{"type": "text", "content": "Hello!"}]}]
    assert s.unparsed == []


def test_older_releases_content_events() -> None:
    events = [
        SpanEvent(1, "gen_ai.content.prompt", {"gen_ai.prompt": "user: Hi"}),
        SpanEvent(2, "gen_ai.content.completion", {"gen_ai.completion": "Hello!"}),
    ]
    s = span({"telemetry.sdk.name": "openlit", "gen_ai.operation.name": "chat"}, events)
    normalize_span(s)
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": "user: Hi"}]}]
    assert s.output == [{"role": "assistant", "parts": [{"type": "text", "content": "Hello!"}]}]
    assert s.unparsed == []


def test_older_embedding_operation_and_list_input() -> None:
    s = span(
        {
            "gen_ai.application_name": "app",
            "gen_ai.operation.name": "embedding",
            "gen_ai.request.model": "e",
            "gen_ai.prompt": ["a", "b"],
        }
    )
    normalize_span(s)
    assert s.step_type == "embedding"
    assert [p["content"] for p in parts(s.input, "text")] == ["a", "b"]


def test_tool_span_with_openlit_names() -> None:
    s = span(
        {
            "telemetry.sdk.name": "openlit",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search",
            "gen_ai.tool.call.id": "c9",
            "gen_ai.tool.args": '{"q": "paris"}',
            "gen_ai.tool.output": "3 results",
        }
    )
    normalize_span(s)
    assert (s.step_type, s.tool_name) == ("tool", "search")
    assert s.details["tool_call_id"] == "c9"
    assert s.input == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c9", "name": "search", "arguments": {"q": "paris"}}],
        }
    ]
    assert s.output == [
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c9", "response": "3 results"}]}
    ]


@pytest.mark.parametrize(
    ("operation", "db_operation", "step_type"),
    [
        ("vectordb", "QUERY", "retriever"),
        ("vectordb", "search", "retriever"),
        ("vectordb", "INSERT", "other"),
        ("vectordb", None, "other"),
        ("retrieval", None, "retriever"),
        ("invoke_agent", None, "agent"),
        ("agent", None, "agent"),
        ("invoke_workflow", None, "chain"),
        ("framework", None, "chain"),
        ("image", None, "llm"),
    ],
)
def test_openlit_operations(operation: str, db_operation: str | None, step_type: str) -> None:
    attributes: dict[str, Any] = {"telemetry.sdk.name": "openlit", "gen_ai.operation.name": operation}
    if db_operation is not None:
        attributes["db.operation.name"] = db_operation
    s = span(attributes)
    normalize_span(s)
    assert s.step_type == step_type
    assert s.details.get("workflow") is (True if operation == "invoke_workflow" else None)


def test_system_instructions_are_not_added_twice() -> None:
    system = [{"type": "text", "content": "Be brief."}]
    with_system = [{"role": "system", "parts": system}, {"role": "user", "parts": [{"type": "text", "content": "Hi"}]}]
    without_system = with_system[1:]
    for messages in (with_system, without_system):
        s = span(
            {
                "telemetry.sdk.name": "openlit",
                "gen_ai.operation.name": "chat",
                "gen_ai.system_instructions": json.dumps(system),
                "gen_ai.input.messages": json.dumps(messages),
            }
        )
        normalize_span(s)
        assert s.input == with_system


def test_malformed_messages_are_kept_raw_and_flagged() -> None:
    cut = '[{"role": "user", "parts": [{"type": "text", "content": "cut'
    s = span({"telemetry.sdk.name": "openlit", "gen_ai.input.messages": cut, "gen_ai.output.messages": "{"})
    normalize_span(s)
    assert s.unparsed == ["input", "output"] and s.content_captured
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": cut}], "unparsed": True}]
    assert s.attributes["gen_ai.input.messages"] == cut


@pytest.mark.parametrize("cost", ["abc", True, float("nan"), float("inf"), [1], {"usd": 1}, None])
def test_odd_costs_are_none(cost: Any) -> None:
    s = span({"telemetry.sdk.name": "openlit", "gen_ai.usage.cost": cost})
    normalize_span(s)
    assert s.cost_usd is None


@pytest.mark.parametrize(
    "attributes",
    [
        {"gen_ai.operation.name": 5, "gen_ai.request.model": ["m"], "gen_ai.usage.input_tokens": "7"},
        {"gen_ai.operation.name": "vectordb", "db.operation.name": 3},
        {"gen_ai.usage.output_tokens": True, "gen_ai.client.token.usage": "x", "gen_ai.request.stream": "yes"},
        {"gen_ai.prompt": {"role": "user"}, "gen_ai.completion": 42},
        {"gen_ai.input.messages": 5, "gen_ai.output.messages": [1, None], "gen_ai.tool.definitions": "{bad"},
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.args": None, "gen_ai.tool.output": {"k": [1]}},
        {"gen_ai.server.time_to_first_token": "soon", "gen_ai.request.stream": True, "deployment.environment": 1},
    ],
)
def test_odd_values_never_raise(attributes: dict[str, Any]) -> None:
    given = {"telemetry.sdk.name": "openlit", **attributes}
    s = span(dict(given), status="ERROR")
    normalize_span(s)
    assert s.convention == "openlit" and s.attributes == given
    for message in (s.input or []) + (s.output or []):
        assert isinstance(message["role"], str)
        assert all("type" in p for p in message["parts"])
    assert s.input_tokens is None or isinstance(s.input_tokens, int)
    assert s.cost_usd is None or math.isfinite(s.cost_usd)
