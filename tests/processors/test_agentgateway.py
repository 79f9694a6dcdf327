"""The agentgateway mapper, on the example capture (checked against agentgateway's source) and hand-built spans."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from captures import any_value
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import evalsi.processors.normalize.agentgateway  # noqa: F401  (registers the mapper)
from evalsi.exporters.clickhouse.rows import attribute_string
from evalsi.model.span import Span
from evalsi.processors.normalize import MAPPERS, normalize_span
from evalsi.receivers.otlp.decode import decode_traces_json, decode_traces_protobuf

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "agentgateway" / "example-otlp.json"


# --- reading the capture --------------------------------------------------------------------------


def raw_spans() -> dict[str, dict[str, Any]]:
    """span id -> {"kind", "status", "attributes"} exactly as the OTLP/JSON file has them."""
    request = json.loads(FIXTURE.read_text())
    found: dict[str, dict[str, Any]] = {}
    for resource in request["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for s in scope["spans"]:
                found[s["spanId"]] = {
                    "kind": s["kind"],
                    "status": s.get("status", {}).get("code", 0),
                    "attributes": {a["key"]: any_value(a["value"]) for a in s["attributes"]},
                }
    return found


RAW = raw_spans()


def raw_where(**wanted: Any) -> dict[str, Any]:
    """The attributes of the one raw span whose attributes hold every `wanted` key (dots as __) and value."""
    matching = [
        (span_id, s["attributes"])
        for span_id, s in RAW.items()
        if all(s["attributes"].get(k.replace("__", ".")) == v for k, v in wanted.items())
    ]
    assert len(matching) == 1, matching
    return {"span_id": matching[0][0], **matching[0][1]}


def normalized(suffix: str = ".json") -> dict[str, Span]:
    body = FIXTURE.read_bytes()
    if suffix == ".pb":
        # the example exists as OTLP/JSON only; its protobuf twin is made here so both decoders are exercised
        request = json.loads(body)
        for resource in request["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for s in scope["spans"]:
                    # OTLP/JSON writes ids as hex; protobuf's JSON mapping expects bytes as base64
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if s.get(key):
                            s[key] = base64.b64encode(bytes.fromhex(s[key])).decode()
        message = json_format.Parse(json.dumps(request), ExportTraceServiceRequest())
        decoded = decode_traces_protobuf(message.SerializeToString())
    else:
        decoded = decode_traces_json(body)
    assert decoded.rejected == 0, decoded.message
    for span in decoded.batch:
        normalize_span(span)
    return {s.span_id: s for s in decoded.batch}


def texts(messages: list[dict[str, Any]] | None) -> list[tuple[str, str]]:
    return [(m["role"], p["content"]) for m in messages or () for p in m["parts"] if p["type"] == "text"]


@pytest.fixture(params=[".json", ".pb"])
def spans(request: pytest.FixtureRequest) -> dict[str, Span]:
    return normalized(request.param)


# --- the capture, span by span --------------------------------------------------------------------


def test_every_span_is_claimed_and_no_attribute_changes(spans: dict[str, Span]) -> None:
    assert set(spans) == set(RAW)
    for span_id, span in spans.items():
        assert span.convention == "agentgateway"
        assert span.attributes == RAW[span_id]["attributes"]
        assert span.kind == ("SERVER" if RAW[span_id]["kind"] == 2 else "CLIENT")
        assert span.status_code == "UNSET" and span.error_type is None and span.unparsed == []


def test_llm_request_span(spans: dict[str, Span]) -> None:
    raw = raw_where(protocol="llm")
    span = spans[raw["span_id"]]
    assert span.kind == "SERVER" and span.name == "POST /*"
    assert span.step_type == "llm"
    assert span.model == raw["gen_ai.response.model"]
    assert span.provider == raw["gen_ai.provider.name"]
    assert (span.input_tokens, span.output_tokens) == (
        raw["gen_ai.usage.input_tokens"],
        raw["gen_ai.usage.output_tokens"],
    )
    assert span.user_id == raw["jwt.sub"]
    assert span.tool_name is None and span.session_id is None
    assert span.details["request"] == {
        "temperature": raw["gen_ai.request.temperature"],
        "max_tokens": raw["gen_ai.request.max_tokens"],
    }
    assert span.details["protocol"] == "llm"


def test_llm_cost_is_the_decimal_total_and_keeps_the_parts(spans: dict[str, Span]) -> None:
    raw = raw_where(protocol="llm")
    span = spans[raw["span_id"]]
    parts = {k.removeprefix("agw.ai.usage.cost."): v for k, v in raw.items() if k.startswith("agw.ai.usage.cost.")}
    total = parts.pop("total")
    assert span.cost_usd == float(Decimal(total))
    assert sum(Decimal(v) for v in parts.values()) == Decimal(total)
    assert span.details["cost_usd_parts"] == {k: float(Decimal(v)) for k, v in parts.items()}


def test_llm_content_from_the_cel_prompt_and_completion_fields(spans: dict[str, Span]) -> None:
    raw = raw_where(protocol="llm")
    span = spans[raw["span_id"]]
    prompt = [(raw[f"gen_ai.prompt.{i}.role"], raw[f"gen_ai.prompt.{i}.content"]) for i in range(2)]
    assert texts(span.input) == prompt
    assert texts(span.output) == [(raw["gen_ai.completion.0.role"], raw["gen_ai.completion.0.content"])]
    assert "capital of France" in texts(span.input)[-1][1]
    assert span.content_captured


def test_outbound_spans_are_not_steps_and_carry_no_tokens_or_cost(spans: dict[str, Span]) -> None:
    for span_id, raw in RAW.items():
        attributes = raw["attributes"]
        if "agentgateway.outbound.kind" not in attributes:
            continue
        span = spans[span_id]
        assert span.kind == "CLIENT"
        assert span.step_type == "other"
        assert span.details["outbound_kind"] == attributes["agentgateway.outbound.kind"]
        assert span.details["outbound_subtype"] == attributes["agentgateway.outbound.subtype"]
        assert (span.input_tokens, span.output_tokens, span.cost_usd, span.model) == (None, None, None, None)
        assert not span.content_captured and span.tool_name is None


def test_tokens_and_cost_are_counted_once_per_trace(spans: dict[str, Span]) -> None:
    llm = raw_where(protocol="llm")
    trace = [s for s in spans.values() if s.trace_id == spans[llm["span_id"]].trace_id]
    assert len(trace) == 3  # the request, the guardrail callout, the provider call
    assert sum(s.input_tokens or 0 for s in trace) == llm["gen_ai.usage.input_tokens"]
    assert sum(s.output_tokens or 0 for s in trace) == llm["gen_ai.usage.output_tokens"]
    assert sum(s.cost_usd or 0 for s in trace) == float(Decimal(llm["agw.ai.usage.cost.total"]))
    assert [s.step_type for s in trace].count("llm") == 1
    provider = raw_where(agentgateway__outbound__subtype="Llm")
    assert spans[provider["span_id"]].parent_span_id == llm["span_id"]
    guardrail = spans[raw_where(agentgateway__outbound__subtype="Guardrail")["span_id"]]
    assert guardrail.details == {"outbound_kind": "Policy", "outbound_subtype": "Guardrail"}


def test_mcp_tool_call(spans: dict[str, Span]) -> None:
    raw = raw_where(protocol="mcp")
    span = spans[raw["span_id"]]
    assert span.step_type == "tool"
    assert span.tool_name == raw["gen_ai.tool.name"]
    assert span.details["mcp_target"] == raw["mcp.target"]
    assert span.details["mcp_method"] == raw["mcp.method.name"] == "tools/call"
    assert span.details["mcp_resource_type"] == raw["mcp.resource.type"]
    assert span.session_id == span.details["mcp_session_id"] == raw["mcp.session.id"]
    assert span.user_id == raw["jwt.sub"]
    # the gateway records no arguments or results unless CEL fields add them
    assert not span.content_captured and span.input is None and span.output is None
    assert (span.model, span.input_tokens, span.cost_usd) == (None, None, None)
    child = raw_where(agentgateway__outbound__subtype="Mcp")
    outbound = spans[child["span_id"]]
    assert outbound.parent_span_id == raw["span_id"]
    assert outbound.details == {
        "outbound_kind": child["agentgateway.outbound.kind"],
        "outbound_subtype": "Mcp",
        "mcp_target": child["mcp.target"],
        "mcp_method": child["mcp.method.name"],
        "tool_name": child["gen_ai.tool.name"],
    }
    trace = [s for s in spans.values() if s.trace_id == span.trace_id]
    assert [s.step_type for s in trace].count("tool") == 1


def test_a2a_call(spans: dict[str, Span]) -> None:
    raw = raw_where(protocol="a2a")
    span = spans[raw["span_id"]]
    assert span.step_type == "agent"
    assert span.session_id == raw["a2a.context.id"]
    assert span.details["a2a_method"] == raw["a2a.method"]
    assert span.details["a2a_outcome"] == raw["a2a.response.outcome"]
    assert span.details["a2a_result_kind"] == raw["a2a.result.kind"]
    assert span.details["a2a_task_state"] == raw["a2a.task.state"]
    assert span.user_id is None and not span.content_captured
    child = spans[
        raw_where(agentgateway__outbound__subtype="Http", http__host="weather-agent.agents.svc.cluster.local")[
            "span_id"
        ]
    ]
    assert child.parent_span_id == raw["span_id"] and child.step_type == "other"


def test_json_and_protobuf_normalize_alike() -> None:
    from_json = {k: s.canonical() for k, s in normalized(".json").items()}
    from_pb = {k: s.canonical() for k, s in normalized(".pb").items()}
    assert from_json == from_pb


def test_span_names_are_never_read() -> None:
    expected = {k: s.canonical() for k, s in normalized().items()}
    decoded = decode_traces_json(FIXTURE.read_bytes())
    for span in decoded.batch:
        span.name = "POST /*"
        normalize_span(span)
        got = span.canonical()
        got["name"] = expected[span.span_id]["name"]
        assert got == expected[span.span_id]


def test_stored_spans_map_alike() -> None:
    # the store keeps attribute values as strings; re-normalizing a stored span gives the same fields
    for span in normalized().values():
        expected = span.canonical()
        span.attributes = {k: attribute_string(v) for k, v in span.attributes.items()}
        normalize_span(span)
        got = span.canonical()
        got["attributes"] = expected["attributes"]
        assert got == expected


# --- hand-built spans -----------------------------------------------------------------------------


def span(
    attributes: dict[str, Any], *, kind: str = "SERVER", status: str = "UNSET", scope: str = "agentgateway"
) -> Span:
    return Span(
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        span_id="a3c1e5f7092b4d6e",
        parent_span_id="",
        name="POST /*",
        kind=kind,
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        status_code=status,
        scope_name=scope,
        attributes=attributes,
    )


def mapped(attributes: dict[str, Any], **kwargs: Any) -> Span:
    s = span(attributes, **kwargs)
    normalize_span(s)
    assert s.convention == "agentgateway"
    return s


def llm(**extra: Any) -> dict[str, Any]:
    return {
        "protocol": "llm",
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 2,
        **extra,
    }


def test_registered_before_the_generic_mapper() -> None:
    names = list(MAPPERS)
    assert names.index("agentgateway") < names.index("otel_genai")


def test_markers_win_over_gen_ai_attributes_whatever_the_scope() -> None:
    # a CLIENT span with gen_ai.* that a collector on the way re-scoped: the outbound marker decides
    s = mapped({"agentgateway.outbound.kind": "Primary", "gen_ai.operation.name": "chat"}, kind="CLIENT", scope="x")
    assert s.step_type == "other"
    # the request span's own attributes, without the scope
    s = mapped({"src.addr": "10.0.0.1:1", "duration": "5ms", **llm()}, scope="relabelled")
    assert (s.step_type, s.model, s.input_tokens) == ("llm", "gpt-4o-mini", 10)
    # gen_ai.* alone is the generic mapper's
    other = span(llm(), scope="opentelemetry.instrumentation.openai_v2")
    del other.attributes["protocol"]
    normalize_span(other)
    assert other.convention == "otel_genai"


def test_default_tracing_records_no_content() -> None:
    s = mapped(llm())
    assert not s.content_captured and s.input is None and s.output is None
    assert (s.step_type, s.input_tokens, s.output_tokens) == ("llm", 10, 2)


def test_embeddings_and_extra_usage() -> None:
    s = mapped(
        llm(
            **{
                "gen_ai.operation.name": "embeddings",
                "gen_ai.usage.cache_read.input_tokens": 4,
                "gen_ai.usage.cache_creation.input_tokens": "3",
                "gen_ai.usage.reasoning_tokens": 7,
                "gen_ai.usage.input_audio_tokens": 1,
                "gen_ai.usage.output_image_tokens": 2,
                "agw.ai.time_to_first_token": 0.25,
                "agw.ai.time_per_output_token": "0.01",
                "gen_ai.embeddings.dimension.count": 8,
            }
        )
    )
    assert s.step_type == "embedding"
    assert s.details["cache_read_input_tokens"] == 4
    assert s.details["cache_creation_input_tokens"] == 3
    assert s.details["reasoning_tokens"] == 7
    assert (s.details["input_audio_tokens"], s.details["output_image_tokens"]) == (1, 2)
    assert (s.details["time_to_first_token_s"], s.details["time_per_output_token_s"]) == (0.25, 0.01)
    assert s.details["request"] == {"dimensions": 8}


def test_cost_from_parts_when_there_is_no_total() -> None:
    s = mapped(llm(**{"agw.ai.usage.cost.input": "0.1", "agw.ai.usage.cost.output": "0.2"}))
    assert s.cost_usd == 0.3  # summed as decimals, so no 0.30000000000000004
    assert s.details["cost_usd_parts"] == {"input": 0.1, "output": 0.2}


@pytest.mark.parametrize("value", ["abc", "", "NaN", "Infinity", [1], {"a": 1}, True, None])
def test_odd_cost_values_are_ignored(value: Any) -> None:
    s = mapped(llm(**{"agw.ai.usage.cost.total": value, "agw.ai.usage.cost.input": value}))
    assert s.cost_usd is None and "cost_usd_parts" not in s.details


def test_jwt_subject_is_the_user_over_user_id() -> None:
    assert mapped(llm(**{"jwt.sub": "alice", "user.id": "bob"})).user_id == "alice"
    assert mapped(llm(**{"user.id": "bob"})).user_id == "bob"


def test_single_attribute_prompt_and_completion() -> None:
    # `gen_ai.prompt: llm.prompt` without flattenRecursive puts the whole list in one attribute
    prompt = json.dumps([{"role": "user", "content": "Hi"}])
    completion = json.dumps([{"role": "assistant", "content": "Hello"}])
    s = mapped(llm(**{"gen_ai.prompt": prompt, "gen_ai.completion": completion}))
    assert texts(s.input) == [("user", "Hi")] and texts(s.output) == [("assistant", "Hello")]
    assert s.content_captured and s.unparsed == []


def test_malformed_content_is_kept_raw_and_flagged() -> None:
    raw = "[{role: user, content: Hi}"
    s = mapped(llm(**{"gen_ai.prompt": raw}))
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": raw}], "unparsed": True}]
    assert s.unparsed == ["input"] and s.content_captured
    assert s.attributes["gen_ai.prompt"] == raw


def test_phoenix_style_fields_and_flattened_tool_calls() -> None:
    s = mapped(
        llm(
            **{
                "llm.input_messages.0.message.role": "user",
                "llm.input_messages.0.message.content": "Weather in Paris?",
                "gen_ai.completion.0.role": "assistant",
                "gen_ai.completion.0.tool_calls.0.id": "c1",
                "gen_ai.completion.0.tool_calls.0.name": "get_weather",
                "gen_ai.completion.0.tool_calls.0.arguments": '{"location": "Paris"}',
                "gen_ai.completion.1.role": "assistant",
                "gen_ai.completion.1.tool_calls.0.name": "get_time",
                "gen_ai.completion.1.tool_calls.0.arguments.city": "Paris",
            }
        )
    )
    assert texts(s.input) == [("user", "Weather in Paris?")]
    assert s.output == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c1", "name": "get_weather", "arguments": {"location": "Paris"}}],
        },
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": None, "name": "get_time", "arguments": {"city": "Paris"}}],
        },
    ]


def test_flattened_content_in_index_order_with_odd_values() -> None:
    attributes = llm(
        **{
            "gen_ai.prompt.10.role": "user",
            "gen_ai.prompt.10.content": "tenth",
            "gen_ai.prompt.2.role": "assistant",
            "gen_ai.prompt.2.content": 42,
            "gen_ai.prompt.0.content": "first, no role",
            "gen_ai.prompt.x.content": "not an index",
            "gen_ai.prompt.3": "no field",
            "gen_ai.prompt.1.role": 7,
        }
    )
    s = mapped(attributes)
    assert texts(s.input) == [("user", "first, no role"), ("assistant", "42"), ("user", "tenth")]
    assert [m["role"] for m in s.input or ()] == ["user", "user", "assistant", "user"]
    assert s.output is None


def test_mcp_prompt_name_is_not_prompt_content() -> None:
    s = mapped({"protocol": "mcp", "mcp.method.name": "prompts/get", "gen_ai.prompt.name": "summarize"})
    assert (s.step_type, s.content_captured) == ("other", False)
    assert s.details["mcp_prompt_name"] == "summarize"


@pytest.mark.parametrize("method", ["initialize", "tools/list", "resources/read", "notifications/initialized"])
def test_mcp_protocol_calls_are_not_tool_steps(method: str) -> None:
    s = mapped({"protocol": "mcp", "mcp.method.name": method, "mcp.target": "everything"})
    assert (s.step_type, s.tool_name, s.details["mcp_method"]) == ("other", None, method)


def test_mcp_session_stream_without_a_method() -> None:
    s = mapped({"protocol": "mcp", "http.method": "GET", "http.status": 200})
    assert (s.step_type, s.error_type) == ("other", None)


def test_mcp_tool_content_added_by_cel_fields() -> None:
    s = mapped(
        {
            "protocol": "mcp",
            "mcp.method.name": "tools/call",
            "gen_ai.tool.name": "echo",
            "gen_ai.tool.call.arguments": '{"message": "hi"}',
            "gen_ai.tool.call.result": '{"content": [{"type": "text", "text": "hi"}]}',
        }
    )
    assert s.step_type == "tool" and s.content_captured
    assert s.input == [
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": None, "name": "echo", "arguments": {"message": "hi"}}],
        }
    ]
    assert s.output is not None and s.output[0]["parts"][0]["type"] == "tool_call_response"


def test_mcp_error() -> None:
    s = mapped(
        {
            "protocol": "mcp",
            "mcp.method.name": "tools/call",
            "gen_ai.tool.name": "missing",
            "mcp.error.code": -32602,
            "mcp.error.message": "tool not found",
            "http.status": 200,
        }
    )
    assert s.error_type == "-32602"
    assert (s.details["mcp_error_code"], s.details["mcp_error_message"]) == (-32602, "tool not found")


@pytest.mark.parametrize(
    ("method", "step_type"),
    [("message/send", "agent"), ("message/stream", "agent"), ("SendMessage", "agent"), ("tasks/get", "other")],
)
def test_a2a_invocations_are_agent_steps(method: str, step_type: str) -> None:
    assert mapped({"protocol": "a2a", "a2a.method": method}).step_type == step_type


def test_a2a_agent_card_fetch_is_not_a_step() -> None:
    assert mapped({"protocol": "a2a", "http.method": "GET"}).step_type == "other"


def test_a2a_error() -> None:
    s = mapped(
        {
            "protocol": "a2a",
            "a2a.method": "message/send",
            "a2a.response.outcome": "error",
            "a2a.response.error_code": -32001,
        }
    )
    assert (s.error_type, s.details["a2a_error_code"]) == ("-32001", -32001)
    s = mapped({"protocol": "a2a", "a2a.method": "message/send", "a2a.response.outcome": "error"})
    assert s.error_type == "_OTHER"


@pytest.mark.parametrize(
    ("extra", "status", "expected"),
    [
        ({"reason": "RateLimit", "http.status": 429}, "ERROR", "RateLimit"),
        ({"reason": "UpstreamFailure"}, "ERROR", "UpstreamFailure"),
        ({"http.status": 429}, "UNSET", "429"),
        ({"http.status": 500}, "ERROR", "500"),
        ({}, "ERROR", "_OTHER"),
        ({"reason": "DirectResponse", "http.status": 200}, "UNSET", None),
        ({"error.type": "timeout", "reason": "Timeout"}, "ERROR", "timeout"),
        ({"http.status": 200}, "UNSET", None),
    ],
)
def test_request_errors(extra: dict[str, Any], status: str, expected: str | None) -> None:
    assert mapped(llm(**extra), status=status).error_type == expected


def test_outbound_errors() -> None:
    failed = {"agentgateway.outbound.kind": "Primary", "agentgateway.outbound.subtype": "Mcp", "error.type": "MCP"}
    assert mapped(failed, kind="CLIENT", status="ERROR").error_type == "MCP"
    refused = {"agentgateway.outbound.kind": "Primary", "agentgateway.outbound.subtype": "Llm", "http.status": 503}
    assert mapped(refused, kind="CLIENT").error_type == "503"
    mirror = {"agentgateway.outbound.kind": "Mirror", "agentgateway.outbound.subtype": "Llm"}
    assert (mapped(mirror, kind="CLIENT").step_type, mapped(mirror, kind="CLIENT").details["outbound_kind"]) == (
        "other",
        "Mirror",
    )


ODD = [None, "", "x", 7, -1.5, True, [1, "a"], {"k": "v"}, b"\xff"]


@pytest.mark.parametrize("value", ODD)
def test_odd_attribute_types_never_raise(value: Any) -> None:
    keys = [
        "protocol",
        "gen_ai.operation.name",
        "gen_ai.usage.input_tokens",
        "jwt.sub",
        "http.status",
        "reason",
        "mcp.method.name",
        "mcp.error.code",
        "mcp.session.id",
        "a2a.method",
        "a2a.context.id",
        "a2a.response.error_code",
        "agw.ai.usage.cost.total",
        "agw.ai.time_to_first_token",
        "gen_ai.prompt",
        "gen_ai.prompt.0.content",
        "gen_ai.completion.0.role",
        "gen_ai.completion.0.tool_calls.0.name",
        "gen_ai.tool.call.arguments",
        "gen_ai.request.temperature",
    ]
    for protocol in ("llm", "mcp", "a2a", value):
        attributes = {k: value for k in keys}
        attributes["protocol"] = protocol
        s = mapped(attributes)
        json.dumps(s.canonical(), default=str)
    outbound = mapped(
        {"agentgateway.outbound.kind": value, "agentgateway.outbound.subtype": value, "http.status": value},
        kind="CLIENT",
    )
    assert outbound.step_type == "other"
