"""The MLflow mapper, on real mlflow-tracing 3.17.2 captures (`mlflow.openai.autolog()`, exported over OTLP)
and hand-built edge cases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from captures import normalized_capture, parts, texts

import evalsi.processors.normalize.mlflow  # noqa: F401  (registers the mapper)
from evalsi.model.span import Span
from evalsi.processors.normalize import normalize_span

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FOLDER = FIXTURES / "mlflow"
SCENARIOS = ("chat_simple", "chat_tools", "chat_pii", "chat_error", "embeddings", "chat_stream")
META = json.loads((FOLDER / "meta.json").read_text())

# what each MLflow span type means, written out here rather than read from the mapper
TYPE_STEP = {"CHAT_MODEL": "llm", "LLM": "llm", "TOOL": "tool", "AGENT": "agent", "EMBEDDING": "embedding"}


# --- reading the captures -------------------------------------------------------------------------


def raw_spans(scenario: str) -> dict[str, dict[str, Any]]:
    """The spans of a capture's OTLP/JSON file by span id. MLflow JSON-encodes every attribute value it
    sets, so each string attribute is decoded here as well (`decoded`)."""
    request = json.loads((FOLDER / f"{scenario}.json").read_text())
    spans: dict[str, dict[str, Any]] = {}
    for resource in request["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                attributes = {a["key"]: a["value"].get("stringValue") for a in span.get("attributes", [])}
                spans[span["spanId"]] = {
                    "name": span["name"],
                    "attributes": attributes,
                    "decoded": {k: json.loads(v) for k, v in attributes.items() if v is not None},
                    "events": [
                        (e["name"], {a["key"]: a["value"].get("stringValue") for a in e.get("attributes", [])})
                        for e in span.get("events", [])
                    ],
                    "status": span.get("status", {}).get("code", 0),
                    "start": int(span["startTimeUnixNano"]),
                    "event_times": [(e["name"], int(e["timeUnixNano"])) for e in span.get("events", [])],
                }
    return spans


def normalized(scenario: str, suffix: str) -> list[Span]:
    return normalized_capture("mlflow", scenario, suffix)


def dump(messages: list[dict[str, Any]] | None) -> str:
    return json.dumps(messages, ensure_ascii=False)


# --- the captures, span by span -------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".json", ".pb"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_capture_span_matches_its_raw_attributes(scenario: str, suffix: str) -> None:
    spans = normalized(scenario, suffix)
    raw = raw_spans(scenario)
    assert len(spans) == META["scenarios"][scenario]["span_count"] == len(raw)
    for span in spans:
        source = raw[span.span_id]
        values = source["decoded"]
        assert span.convention == "mlflow"
        assert span.step_type == TYPE_STEP[values["mlflow.spanType"]]
        assert span.details["mlflow_trace_request_id"] == values["mlflow.traceRequestId"]
        assert span.details.get("function_name") == values.get("mlflow.spanFunctionName")
        inputs = values.get("mlflow.spanInputs")
        outputs = values.get("mlflow.spanOutputs")
        if span.step_type in ("llm", "embedding"):
            # the model MLflow recorded; a failed call recorded none, so the request's
            assert span.model == values.get("mlflow.llm.model", inputs["model"])
            # openai autolog names no provider; its message format is OpenAI's own API
            expected_provider = "openai" if values.get("mlflow.message.format") == "openai" else None
            assert span.provider == expected_provider
        else:
            assert (span.model, span.provider) == (None, None)
        usage = values.get("mlflow.chat.tokenUsage")
        if usage is not None:
            assert (span.input_tokens, span.output_tokens) == (usage["input_tokens"], usage["output_tokens"])
            assert span.details["total_tokens"] == usage["total_tokens"]
            assert span.details["cache_read_input_tokens"] == usage["cache_read_input_tokens"]
        elif span.step_type == "embedding":
            # embeddings carry no tokenUsage attribute: the response body's usage is the only record
            assert span.input_tokens == outputs["usage"]["prompt_tokens"]
            assert span.output_tokens is None
        else:
            assert (span.input_tokens, span.output_tokens) == (None, None)
        assert span.tool_name == (source["name"] if span.step_type == "tool" else None)
        assert span.agent_name == (source["name"] if span.step_type == "agent" else None)
        assert span.session_id == values.get("session.id")
        assert span.user_id == values.get("user.id")
        assert span.content_captured
        assert span.unparsed == []
        exceptions = [e for name, e in source["events"] if name == "exception"]
        if source["status"] == 2:
            assert span.status_code == "ERROR"
            assert span.error_type == exceptions[0]["exception.type"]
            assert span.output is None and "mlflow.spanOutputs" not in values
        else:
            assert span.error_type is None


@pytest.mark.parametrize("suffix", [".json", ".pb"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_content_is_the_request_and_response_bodies_and_carries_the_markers(scenario: str, suffix: str) -> None:
    spans = normalized(scenario, suffix)
    raw = raw_spans(scenario)
    markers = META["scenarios"][scenario]["markers"]
    for span in spans:
        values = raw[span.span_id]["decoded"]
        inputs = values.get("mlflow.spanInputs")
        outputs = values.get("mlflow.spanOutputs")
        if span.step_type == "llm":
            messages = inputs["messages"]
            assert [m["role"] for m in span.input or ()] == [m["role"] for m in messages]
            contents = [m["content"] for m in messages if m.get("content") is not None]
            tool_responses = [p["response"] for p in parts(span.input, "tool_call_response")]
            assert texts(span.input) + tool_responses == contents
            assert markers["prompt"] in dump(span.input)
            if outputs is not None:
                choices = outputs["choices"]
                assert [m["finish_reason"] for m in span.output or ()] == [c["finish_reason"] for c in choices]
                assert texts(span.output) == [c["message"]["content"] for c in choices if c["message"]["content"]]
        elif span.step_type == "embedding":
            assert texts(span.input) == inputs["input"]
            assert markers["prompt"] in dump(span.input)
            assert span.output is None  # vectors are not content
        elif span.step_type == "agent":
            assert inputs == {} and span.input is None  # the agent function took no arguments
            assert texts(span.output) == [outputs]
    if "completion" in markers:
        final = max((s for s in spans if s.step_type == "llm"), key=lambda s: s.start_time_unix_nano)
        assert markers["completion"] in " ".join(texts(final.output))


@pytest.mark.parametrize("suffix", [".json", ".pb"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_request_parameters_response_and_first_chunk_time(scenario: str, suffix: str) -> None:
    raw = raw_spans(scenario)
    for span in normalized(scenario, suffix):
        source = raw[span.span_id]
        values = source["decoded"]
        if span.step_type not in ("llm", "embedding"):
            assert not {"request", "response_id", "finish_reasons"} & span.details.keys()
            continue
        inputs = values["mlflow.spanInputs"]
        outputs = values.get("mlflow.spanOutputs", {})
        request = span.details.get("request", {})
        for key in ("temperature", "max_tokens", "top_p", "seed", "stream", "user"):
            assert request.get(key) == inputs.get(key)
        assert "model" not in request and "messages" not in request
        assert span.details.get("response_id") == outputs.get("id")
        reasons = [c["finish_reason"] for c in outputs.get("choices", [])]
        assert span.details.get("finish_reasons") == (reasons or None)
        chunks = [t for name, t in source["event_times"] if name.startswith("mlflow.chunk.item.")]
        if chunks:
            assert span.details["time_to_first_token_s"] == (chunks[0] - source["start"]) / 1e9
        else:
            assert "time_to_first_token_s" not in span.details


@pytest.mark.parametrize("suffix", [".json", ".pb"])
def test_tool_calls_and_results_in_the_tools_capture(suffix: str) -> None:
    spans = normalized("chat_tools", suffix)
    raw = raw_spans("chat_tools")
    markers = META["scenarios"]["chat_tools"]["markers"]
    by_step: dict[str, list[Span]] = {}
    for span in sorted(spans, key=lambda s: s.start_time_unix_nano):
        by_step.setdefault(span.step_type, []).append(span)
    first, second = by_step["llm"]

    raw_call = raw[first.span_id]["decoded"]["mlflow.spanOutputs"]["choices"][0]["message"]["tool_calls"][0]
    (call,) = parts(first.output, "tool_call")
    assert call["id"] == raw_call["id"]
    assert call["name"] == raw_call["function"]["name"]
    assert call["arguments"] == json.loads(raw_call["function"]["arguments"])
    assert any(marker in raw_call["function"]["arguments"] for marker in markers["tool_args"])

    (tool,) = by_step["tool"]
    values = raw[tool.span_id]["decoded"]
    assert tool.tool_name == values["mlflow.spanFunctionName"] == raw[tool.span_id]["name"]
    (call,) = parts(tool.input, "tool_call")
    assert (call["name"], call["arguments"]) == (tool.tool_name, values["mlflow.spanInputs"])
    (result,) = parts(tool.output, "tool_call_response")
    assert result["response"] == values["mlflow.spanOutputs"]
    assert markers["tool_result"] in result["response"]

    messages = raw[second.span_id]["decoded"]["mlflow.spanInputs"]["messages"]
    (call,) = parts(second.input, "tool_call")
    assert call["id"] == messages[2]["tool_calls"][0]["id"]
    (response,) = parts(second.input, "tool_call_response")
    assert (response["id"], response["response"]) == (messages[3]["tool_call_id"], messages[3]["content"])

    (agent,) = by_step["agent"]
    assert agent.agent_name == "weather_agent"
    assert {s.parent_span_id for s in spans if s is not agent} == {agent.span_id}
    assert markers["completion"] in " ".join(texts(agent.output))


# --- hand-built spans -----------------------------------------------------------------------------


def encoded(attributes: dict[str, Any]) -> dict[str, str]:
    """Attributes the way MLflow sets them: every value JSON-encoded."""
    return {k: json.dumps(v) for k, v in attributes.items()}


def span(attributes: dict[str, Any], status: str = "UNSET", name: str = "step") -> Span:
    return Span(
        trace_id="0" * 31 + "1",
        span_id="0" * 15 + "1",
        parent_span_id="",
        name=name,
        kind="INTERNAL",
        start_time_unix_nano=1,
        end_time_unix_nano=2,
        status_code=status,
        attributes=attributes,
    )


def test_mlflow_markers_win_over_gen_ai_attributes() -> None:
    s = span(
        {
            **encoded({"mlflow.spanType": "CHAT_MODEL", "mlflow.spanInputs": {"messages": []}}),
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-x",
            "gen_ai.provider.name": "openai",
            "gen_ai.usage.input_tokens": 5,
            "gen_ai.usage.output_tokens": 2,
            "gen_ai.conversation.id": "conv-1",
            "gen_ai.output.messages": '[{"role": "assistant", "parts": [{"type": "text", "content": "ok"}]}]',
        }
    )
    normalize_span(s)
    assert s.convention == "mlflow"
    assert (s.step_type, s.model, s.provider, s.input_tokens, s.output_tokens, s.session_id) == (
        "llm",
        "gpt-x",
        "openai",
        5,
        2,
        "conv-1",
    )
    assert texts(s.output) == ["ok"]


def test_identity_cost_and_provider_attributes() -> None:
    s = span(
        {
            **encoded(
                {
                    "mlflow.spanType": "LLM",
                    "mlflow.llm.model": "claude-x",
                    "mlflow.llm.provider": "anthropic",
                    "mlflow.llm.cost": {"input_cost": 0.001, "output_cost": 0.002, "total_cost": 0.003},
                    "mlflow.chat.tokenUsage": {
                        "input_tokens": 100,
                        "output_tokens": 20,
                        "total_tokens": 120,
                        "cache_creation_input_tokens": 80,
                    },
                }
            ),
            # copied from the trace metadata onto the root span unencoded
            "session.id": "sess-1",
            "user.id": "user-9",
        }
    )
    normalize_span(s)
    assert (s.model, s.provider, s.cost_usd, s.session_id, s.user_id) == (
        "claude-x",
        "anthropic",
        0.003,
        "sess-1",
        "user-9",
    )
    assert (s.input_tokens, s.output_tokens) == (100, 20)
    assert s.details == {"total_tokens": 120, "cache_creation_input_tokens": 80}


def test_encoded_session_and_trace_metadata_keys() -> None:
    encoded_ids = span(encoded({"mlflow.spanType": "AGENT", "session.id": "s-2", "user.id": 'u "2"'}))
    metadata = span(encoded({"mlflow.spanType": "AGENT", "mlflow.trace.session": "s-3", "mlflow.trace.user": "u-3"}))
    for s in (encoded_ids, metadata):
        normalize_span(s)
    assert (encoded_ids.session_id, encoded_ids.user_id) == ("s-2", 'u "2"')
    assert (metadata.session_id, metadata.user_id) == ("s-3", "u-3")


@pytest.mark.parametrize(
    ("span_type", "step_type", "kept"),
    [
        ("LLM", "llm", None),
        ("CHAT_MODEL", "llm", None),
        ("chat_model", "llm", None),
        ("CHAIN", "chain", None),
        ("PARSER", "chain", "PARSER"),
        ("RETRIEVER", "retriever", None),
        ("RERANKER", "retriever", "RERANKER"),
        ("MEMORY", "retriever", "MEMORY"),
        ("EMBEDDING", "embedding", None),
        ("GUARDRAIL", "other", "GUARDRAIL"),
        ("UNKNOWN", "other", None),
        ("MY_CUSTOM", "other", "MY_CUSTOM"),
    ],
)
def test_span_types(span_type: str, step_type: str, kept: str | None) -> None:
    s = span(encoded({"mlflow.spanType": span_type}))
    normalize_span(s)
    assert (s.convention, s.step_type, s.details.get("span_type")) == ("mlflow", step_type, kept)


def test_an_untyped_span_with_token_usage_is_a_model_call() -> None:
    s = span(encoded({"mlflow.traceRequestId": "tr-1", "mlflow.chat.tokenUsage": {"input_tokens": 1}}))
    normalize_span(s)
    assert (s.step_type, s.input_tokens, s.details["mlflow_trace_request_id"]) == ("llm", 1, "tr-1")


def test_unencoded_values_are_read_as_they_are() -> None:
    s = span({"mlflow.spanType": "CHAT_MODEL", "mlflow.llm.model": "gpt-y", "mlflow.spanInputs": "plain words"})
    normalize_span(s)
    assert (s.step_type, s.model) == ("llm", "gpt-y")
    # not JSON although MLflow always writes JSON: kept raw and flagged
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": "plain words"}], "unparsed": True}]


def test_malformed_inputs_and_outputs_are_kept_raw_and_flagged() -> None:
    raw = '{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "cut'
    s = span({**encoded({"mlflow.spanType": "CHAT_MODEL"}), "mlflow.spanInputs": raw, "mlflow.spanOutputs": "{oops"})
    normalize_span(s)
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": raw}], "unparsed": True}]
    assert s.output == [{"role": "assistant", "parts": [{"type": "text", "content": "{oops"}], "unparsed": True}]
    assert s.unparsed == ["input", "output"] and s.content_captured
    assert s.attributes["mlflow.spanInputs"] == raw
    tool = span({**encoded({"mlflow.spanType": "TOOL"}), "mlflow.spanInputs": "{", "mlflow.spanOutputs": "["})
    normalize_span(tool)
    assert tool.unparsed == ["input", "output"]


def test_generic_inputs_and_outputs() -> None:
    s = span(
        encoded(
            {
                "mlflow.spanType": "CHAIN",
                "mlflow.spanInputs": {"question": "why?"},
                "mlflow.spanOutputs": {"answer": 42, "sources": ["a"]},
            }
        )
    )
    normalize_span(s)
    assert s.input == [{"role": "user", "parts": [{"type": "text", "content": "why?"}]}]
    assert texts(s.output) == ['{"answer": 42, "sources": ["a"]}']
    agent = span(
        encoded(
            {
                "mlflow.spanType": "AGENT",
                "mlflow.spanInputs": {"messages": [{"role": "user", "content": "hi"}]},
                "mlflow.spanOutputs": {"role": "assistant", "content": "hello"},
            }
        ),
        name="helper",
    )
    normalize_span(agent)
    assert (agent.agent_name, texts(agent.input), texts(agent.output)) == ("helper", ["hi"], ["hello"])


def test_retriever_documents_go_to_details() -> None:
    documents = [
        {"page_content": "Paris is the capital.", "metadata": {"doc_uri": "wiki/paris", "score": 0.9}, "id": "d1"},
        {"page_content": "Lyon is a city.", "metadata": {}, "id": None},
        "bare",
    ]
    s = span(
        encoded(
            {"mlflow.spanType": "RETRIEVER", "mlflow.spanInputs": {"query": "capital"}, "mlflow.spanOutputs": documents}
        )
    )
    normalize_span(s)
    assert s.details["documents"] == [
        {"id": "d1", "content": "Paris is the capital.", "score": 0.9, "metadata": documents[0]["metadata"]},
        {"id": None, "content": "Lyon is a city.", "score": None, "metadata": {}},
        {"id": None, "content": "bare", "score": None, "metadata": None},
    ]
    assert texts(s.input) == ["capital"]


def test_responses_api_reasoning_tokens_and_a_tool_call_output() -> None:
    outputs = {
        "output": [{"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"}],
        "usage": {"input_tokens": 9, "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 3}},
    }
    s = span(
        encoded(
            {
                "mlflow.spanType": "CHAT_MODEL",
                "mlflow.spanInputs": {"model": "o-mini", "input": "Weather?"},
                "mlflow.spanOutputs": outputs,
            }
        )
    )
    normalize_span(s)
    assert (s.model, s.input_tokens, s.output_tokens, s.details["reasoning_tokens"]) == ("o-mini", 9, 4, 3)
    assert texts(s.input) == ["Weather?"]
    assert s.output == [
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "w", "arguments": {}}]}
    ]


def test_error_type() -> None:
    failed = span(encoded({"mlflow.spanType": "TOOL"}), status="ERROR")
    normalize_span(failed)
    assert failed.error_type == "_OTHER"


@pytest.mark.parametrize(
    "attributes",
    [
        {"mlflow.spanType": 3},
        {"mlflow.spanType": '"'},
        {"mlflow.traceRequestId": ["x"]},
        {"mlflow.spanType": '"CHAT_MODEL"', "mlflow.spanInputs": "[1, 2]", "mlflow.spanOutputs": "42"},
        {"mlflow.spanType": '"CHAT_MODEL"', "mlflow.spanInputs": '{"messages": "x", "model": 7}'},
        {"mlflow.spanType": '"CHAT_MODEL"', "mlflow.spanInputs": '{"messages": [1, null, []]}'},
        {"mlflow.spanType": '"CHAT_MODEL"', "mlflow.spanOutputs": '{"choices": [null, 3, {"message": 5}]}'},
        {"mlflow.spanType": '"CHAT_MODEL"', "mlflow.chat.tokenUsage": '["a"]', "mlflow.llm.cost": '"cheap"'},
        {"mlflow.spanType": '"CHAT_MODEL"', "mlflow.chat.tokenUsage": "{bad", "mlflow.llm.cost": "{bad"},
        {"mlflow.spanType": '"CHAT_MODEL"', "mlflow.spanOutputs": '{"usage": {"prompt_tokens": "x"}}'},
        {"mlflow.spanType": '"EMBEDDING"', "mlflow.spanInputs": '{"input": [1, 2]}', "model": "5"},
        {"mlflow.spanType": '"RETRIEVER"', "mlflow.spanOutputs": '[null, 1, {"metadata": 3, "score": "hi"}]'},
        {"mlflow.spanType": '"TOOL"', "mlflow.spanInputs": "null", "mlflow.spanOutputs": "null"},
        {"mlflow.spanType": '"AGENT"', "session.id": 5, "user.id": ["u"], "mlflow.spanInputs": {"a": 1}},
    ],
)
def test_odd_values_never_raise(attributes: dict[str, Any]) -> None:
    s = span(dict(attributes))
    normalize_span(s)
    assert s.convention == "mlflow"
    assert s.attributes == attributes
    for message in (s.input or []) + (s.output or []):
        assert isinstance(message["role"], str)
        assert all("type" in p for p in message["parts"])
