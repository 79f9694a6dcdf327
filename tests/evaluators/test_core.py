"""The core pack on every capture (answers, timings and usage checked against the files themselves) and on
constructed traces (JSON, schemas, budgets, wrappers that repeat their children's totals)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from running_collector import FIXTURES

from evalsi.evaluators import REGISTRY, Target, load_evaluators, parse_params, run
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.model.trajectory import build_trajectory
from evalsi.processors.normalize.files import normalize_files
from evalsi.receivers.otlp.decode import decode_traces_json, decode_traces_protobuf

load_evaluators()

FOLDERS = ["otel-openai-v2", "otel-openai-v2-latest", "openinference", "openllmetry-0.54", "openlit", "mlflow"]
SCENARIOS = ["chat_simple", "chat_tools", "chat_pii", "chat_error", "chat_stream", "embeddings"]
OUTPUT_REFS = ["exact-match", "contains", "regex", "json-valid", "json-schema", "length"]
CORE_REFS = [*OUTPUT_REFS, "latency", "tokens", "cost"]
# params that make each output evaluator runnable on any answer
RUNNABLE: dict[str, dict[str, Any]] = {
    "exact-match": {"expected": "x"},
    "contains": {"any": ["x"]},
    "regex": {"pattern": "x"},
    "json-valid": {},
    "json-schema": {"schema": {"type": "object"}},
    "length": {},
}


def _files(folder: str, scenario: str, logs: bool = True) -> list[Path]:
    files = [FIXTURES / folder / f"{scenario}.pb"]
    log_file = FIXTURES / folder / f"{scenario}.logs.pb"
    return files + ([log_file] if logs and log_file.exists() else [])


def _target(spans: list[Span], reference: dict[str, Any] | None = None) -> Target:
    ids = {s.span_id for s in spans}
    root = min((s for s in spans if s.parent_span_id not in ids), key=lambda s: s.start_time_unix_nano)
    return Target(spans, span=root, trajectory=build_trajectory(spans), reference=reference or {})


def _fixture(folder: str, scenario: str, logs: bool = True, reference: dict[str, Any] | None = None) -> Target:
    return _target(normalize_files(_files(folder, scenario, logs)).spans, reference)


def _meta(folder: str, scenario: str) -> dict[str, Any]:
    return json.loads((FIXTURES / folder / "meta.json").read_text())["scenarios"][scenario]


def _raw_spans(path: Path) -> list[Span]:
    """The file's spans as decoded, before normalize: what the expectations are computed from."""
    decode = decode_traces_json if path.suffix == ".json" else decode_traces_protobuf
    return decode(path.read_bytes()).batch.spans


def _score(ref: str, target: Target, **params: Any) -> Score:
    ev = REGISTRY[f"builtin/{ref}"]
    (score,) = run(ev, target, parse_params(ev, params))
    assert score.evaluator == f"builtin/{ref}" and score.name == ref
    return score


def _answer(text: str, **span_fields: Any) -> Target:
    span = Span(
        "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "", "chat", "CLIENT", 1_000, 2_000,
        step_type="llm", content_captured=True,
        output=[{"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": "stop"}],
        **span_fields,
    )  # fmt: skip
    return Target([span], span=span)


def _invalid(ref: str, params: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as e:
        parse_params(REGISTRY[f"builtin/{ref}"], params)
    return str(e.value)


# --- the registry --------------------------------------------------------------------------------------------


def test_core_refs_are_registered_with_what_they_need() -> None:
    for ref in CORE_REFS:
        ev = REGISTRY[f"builtin/{ref}"]
        assert ev.scope == "trace" and ev.version == "1"
        assert ev.description and "\n" not in ev.description
        assert ev.params.model_json_schema()["properties"]  # what `evalsi evaluators list` shows
        assert ev.requires == (("output",) if ref in OUTPUT_REFS else ())


# --- answers in the captures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", FOLDERS)
def test_simple_answer_is_checked_against_the_capture(folder: str) -> None:
    meta = _meta(folder, "chat_simple")
    result, completion = meta["result"], meta["markers"]["completion"]
    target = _fixture(folder, "chat_simple")

    assert _score("contains", target, any=["Paris", "Lyon"]).passed is True
    assert _score("contains", target, all=["Paris", completion]).passed is True
    contains_lyon = _score("contains", target, all=["Paris", "Lyon"])
    assert contains_lyon.passed is False and "'Lyon'" in (contains_lyon.explanation or "")
    assert _score("contains", target, none=["Paris"]).passed is False
    assert _score("contains", target, any=["PARIS"]).passed is False
    assert _score("contains", target, any=["PARIS"], case_insensitive=True).passed is True

    assert _score("exact-match", target, expected=result).passed is True
    assert _score("exact-match", target, expected=f"  {result}\n").passed is True  # strip is on by default
    assert _score("exact-match", target, expected=f"  {result}\n", strip=False).passed is False
    assert _score("exact-match", target, expected=result.upper()).passed is False
    assert _score("exact-match", target, expected=result.upper(), case_insensitive=True).passed is True
    from_reference = _fixture(folder, "chat_simple", reference={"expected_output": result})
    assert _score("exact-match", from_reference).passed is True
    # a record's reference is more specific than the policy's constant
    assert _score("exact-match", from_reference, expected="Lyon").passed is True

    assert _score("regex", target, pattern=r"\bParis\.$").passed is True
    assert _score("regex", target, pattern=r"\bParis\b", must_match=False).passed is False
    assert _score("regex", target, pattern=r"the capital .* paris", ignore_case=True).passed is True
    assert _score("regex", target, pattern=r"Paris", full=True).passed is False
    assert _score("regex", target, pattern=r"^paris", ignore_case=True, multiline=True).passed is False
    # a pattern that backtracks for hours in Python's re (2**60 steps) is answered by RE2 at once
    assert _score("regex", _answer("a" * 60 + "!"), pattern=r"^(a+)+$").passed is False
    assert _score("regex", _answer("a" * 60), pattern=r"^(a+)+$").passed is True

    chars = _score("length", target)
    assert chars.value == len(result) and chars.passed is None
    words = _score("length", target, unit="words", max=len(result.split()))
    assert words.value == len(result.split()) and words.passed is True
    assert _score("length", target, unit="words", min=len(result.split()) + 1).passed is False

    # prose is not JSON
    assert _score("json-valid", target).passed is False
    assert _score("json-schema", target, schema={"type": "object"}).label == "invalid_json"


@pytest.mark.parametrize("folder", FOLDERS)
def test_tool_loop_answer_is_the_final_one(folder: str) -> None:
    meta = _meta(folder, "chat_tools")
    target = _fixture(folder, "chat_tools", reference={"expected_output": meta["result"]})
    assert _score("exact-match", target).passed is True
    assert _score("contains", target, all=[meta["markers"]["completion"]]).passed is True


@pytest.mark.parametrize("folder", FOLDERS)
def test_failed_call_has_no_answer_to_check(folder: str) -> None:
    target = _fixture(folder, "chat_error")
    # openlit records no content for a failed call; the others record the prompt and no answer
    expected = "no output" if target.has_content else "no content"
    for ref in OUTPUT_REFS:
        score = _score(ref, target, **RUNNABLE[ref])
        assert (score.outcome, score.reason) == ("skipped", expected), ref
        assert score.value is None and score.passed is None
    assert _score("latency", target).outcome == "scored"
    assert _score("tokens", target).reason == "no token usage"


def test_spans_without_their_content_events_are_skipped_not_failed() -> None:
    """openai-v2 sends content as log records: the spans alone carry none."""
    target = _fixture("otel-openai-v2", "chat_simple", logs=False)
    for ref in OUTPUT_REFS:
        assert _score(ref, target, **RUNNABLE[ref]).reason == "no content", ref
    assert _score("tokens", target).value == 23.0
    assert _score("latency", target).outcome == "scored"


def test_exact_match_without_an_expected_output_is_skipped() -> None:
    score = _score("exact-match", _fixture("openinference", "chat_simple"))
    assert (score.outcome, score.reason) == ("skipped", "no reference")


def test_exact_match_explains_without_repeating_the_texts() -> None:
    score = _score("exact-match", _answer("The capital is Paris."), expected="The capital is Lyon.")
    assert score.passed is False
    assert "character 15" in (score.explanation or "") and "Paris" not in (score.explanation or "")
    assert _score("exact-match", _answer("a  b\n c"), expected="a b c", collapse_whitespace=True).passed is True


# --- timings and usage, against the files -------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("folder", FOLDERS)
def test_latency_is_the_root_span_duration_in_the_file(folder: str, scenario: str) -> None:
    raw = _raw_spans(FIXTURES / folder / f"{scenario}.pb")
    ids = {s.span_id for s in raw}
    (root,) = [s for s in raw if s.parent_span_id not in ids]
    expected_ms = (root.end_time_unix_nano - root.start_time_unix_nano) / 1e6
    score = _score("latency", _fixture(folder, scenario))
    assert score.value == pytest.approx(expected_ms, abs=1e-9) and score.passed is None
    assert _score("latency", _fixture(folder, scenario), max_ms=expected_ms).passed is True
    assert _score("latency", _fixture(folder, scenario), max_ms=expected_ms * 0.99).passed is False


def _usage(span: Span) -> tuple[int, int] | None:
    """(input, output) tokens as each library writes them."""
    a = span.attributes
    if "mlflow.chat.tokenUsage" in a:
        usage = json.loads(a["mlflow.chat.tokenUsage"])
        return usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    if a.get("mlflow.spanType") == '"EMBEDDING"':  # the OpenAI response's usage, inside the span's outputs
        usage = json.loads(a["mlflow.spanOutputs"])["usage"]
        return usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    for prompt, completion in (
        ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"),
        ("llm.token_count.prompt", "llm.token_count.completion"),
        ("gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"),
    ):
        if prompt in a or completion in a:
            return int(a.get(prompt, 0)), int(a.get(completion, 0))
    return None


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("folder", FOLDERS)
def test_tokens_are_the_sum_of_the_usage_in_the_file(folder: str, scenario: str) -> None:
    usages = [u for s in _raw_spans(FIXTURES / folder / f"{scenario}.pb") if (u := _usage(s)) is not None]
    target = _fixture(folder, scenario)
    score = _score("tokens", target)
    if not usages:
        assert (score.outcome, score.reason) == ("skipped", "no token usage")
        return
    inputs, outputs = sum(u[0] for u in usages), sum(u[1] for u in usages)
    assert score.value == inputs + outputs
    assert score.metadata == {"input": inputs, "output": outputs, "total": inputs + outputs, "calls": len(usages)}
    assert _score("tokens", target, measure="input").value == inputs
    assert _score("tokens", target, measure="output").value == outputs
    assert _score("tokens", target, max_total=inputs + outputs, max_input=inputs).passed is True
    over = _score("tokens", target, max_total=inputs + outputs - 1)
    assert over.passed is False and f"total {inputs + outputs} > {inputs + outputs - 1}" in (over.explanation or "")
    if outputs:
        assert _score("tokens", target, max_output=outputs - 1).passed is False


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_cost_is_the_cost_openlit_records(scenario: str) -> None:
    raw = _raw_spans(FIXTURES / "openlit" / f"{scenario}.pb")
    costs = [s.attributes["gen_ai.usage.cost"] for s in raw if "gen_ai.usage.cost" in s.attributes]
    target = _fixture("openlit", scenario)
    score = _score("cost", target)
    if not costs:
        assert (score.outcome, score.reason) == ("skipped", "no cost recorded")
        return
    assert score.value == pytest.approx(sum(costs), rel=1e-12)
    assert _score("cost", target, max_usd=sum(costs) * 1.01).passed is True
    assert _score("cost", target, max_usd=sum(costs) * 0.99).passed is False


def test_cost_from_agentgateway() -> None:
    path = FIXTURES / "agentgateway" / "example-otlp.json"
    costs = [float(s.attributes["agw.ai.usage.cost.total"]) for s in _raw_spans(path)
             if "agw.ai.usage.cost.total" in s.attributes]  # fmt: skip
    spans = normalize_files([path]).spans
    score = _score("cost", _target(spans))
    assert costs and score.value == pytest.approx(sum(costs))


@pytest.mark.parametrize("folder", ["otel-openai-v2", "openinference", "openllmetry-0.54", "mlflow"])
def test_no_cost_recorded_is_skipped(folder: str) -> None:
    score = _score("cost", _fixture(folder, "chat_tools"), max_usd=1.0)
    assert (score.outcome, score.reason) == ("skipped", "no cost recorded")


# --- wrappers that repeat their children's totals -----------------------------------------------------------


def _span(n: int, parent: int | None, step_type: str, start_ms: float, end_ms: float, **fields: Any) -> Span:
    return Span(
        "4bf92f3577b34da6a3ce929d0e0e4736", f"{n:016x}", "" if parent is None else f"{parent:016x}", step_type,
        "INTERNAL", int(start_ms * 1e6), int(end_ms * 1e6), step_type=step_type, **fields,
    )  # fmt: skip


def test_a_wrapper_reporting_its_childrens_totals_is_not_counted_twice() -> None:
    spans = [
        _span(1, None, "agent", 0, 900, cost_usd=0.03),
        _span(2, 1, "chain", 10, 800, input_tokens=300, output_tokens=30),  # a framework's LLM wrapper
        _span(3, 2, "llm", 20, 400, input_tokens=100, output_tokens=10, cost_usd=0.01),
        _span(4, 2, "llm", 400, 790, input_tokens=200, output_tokens=20, cost_usd=0.02),
        _span(5, 1, "embedding", 800, 850, input_tokens=7),
    ]
    target = Target(spans, span=spans[0])
    tokens = _score("tokens", target)
    assert tokens.value == 337 and tokens.metadata["calls"] == 3
    cost = _score("cost", target)
    assert cost.value == pytest.approx(0.03) and "2 spans" in (cost.explanation or "")
    # an LLM span inside an LLM span (a gateway call under an SDK call): the inner one counts
    nested = [_span(1, None, "llm", 0, 10, input_tokens=5, output_tokens=5), _span(2, 1, "llm", 1, 9, input_tokens=5,
              output_tokens=5)]  # fmt: skip
    nested_tokens = _score("tokens", Target(nested, span=nested[0]))
    assert nested_tokens.value == 10 and "no usage" not in (nested_tokens.explanation or "")


def test_latency_spans_the_whole_trace_and_tokens_note_calls_without_usage() -> None:
    spans = [_span(1, None, "agent", 5, 100), _span(2, 1, "llm", 10, 150, input_tokens=3), _span(3, 1, "llm", 20, 30)]
    target = Target(spans, span=spans[0])
    assert _score("latency", target).value == pytest.approx(145.0)  # a child that outlives its parent counts
    tokens = _score("tokens", target)
    assert tokens.value == 3 and "1 more recorded no usage" in (tokens.explanation or "")
    untimed = [_span(1, None, "llm", 0, 0)]
    assert _score("latency", Target(untimed, span=untimed[0])).reason == "no timing"
    no_model = [_span(1, None, "tool", 0, 1)]
    assert _score("tokens", Target(no_model, span=no_model[0])).reason == "no model calls"


# --- JSON ----------------------------------------------------------------------------------------------------

ORDER_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "order",
    "type": "object",
    "required": ["id", "items", "status"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "status": {"enum": ["open", "paid"]},
        "note": {"type": ["string", "null"], "maxLength": 20},
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["sku", "qty"],
                "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"}, "qty": {"type": "integer"}},
                "additionalProperties": {"type": "number"},
            },
        },
    },
}
VALID_ORDER = {"id": 7, "status": "paid", "note": None, "items": [{"sku": "ABC-1", "qty": 2.0, "price": 9.5}]}


def test_json_valid() -> None:
    assert _score("json-valid", _answer('{"answer": "Paris"}')).passed is True
    assert _score("json-valid", _answer("[1, 2, 3]")).explanation == "valid JSON (array)"
    broken = _score("json-valid", _answer('{"answer": "Paris",}'))
    assert broken.passed is False and "line 1" in (broken.explanation or "")
    fenced = _answer('Here you go:\n```json\n{"answer": "Paris"}\n```\nAnything else?')
    assert _score("json-valid", fenced).passed is False
    assert _score("json-valid", fenced, extract_fence=True).passed is True
    # without a fence, extract_fence parses the whole output
    assert _score("json-valid", _answer('{"a": 1}'), extract_fence=True).passed is True


def test_json_schema_accepts_a_valid_document() -> None:
    score = _score("json-schema", _answer(json.dumps(VALID_ORDER)), schema=ORDER_SCHEMA)
    assert score.passed is True, score.explanation


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"id": "7"}, "$.id: expected integer, got string"),
        ({"id": True}, "$.id: expected integer, got boolean"),
        ({"id": 0}, "$.id: less than the minimum 1"),
        ({"status": "lost"}, '$.status: not one of ["open","paid"]'),
        ({"note": "x" * 21}, "$.note: longer than 20 characters"),
        ({"items": []}, "$.items: fewer than 1 items"),
        ({"items": [{"sku": "abc", "qty": 1}]}, "$.items[0].sku: does not match the pattern"),
        ({"items": [{"sku": "ABC-1"}]}, "$.items[0].qty: required but missing"),
        ({"items": [{"sku": "ABC-1", "qty": 1, "gift": "yes"}]}, "$.items[0].gift: expected number, got string"),
        ({"extra": 1}, "$.extra: not an allowed property"),
    ],
)
def test_json_schema_names_each_violation(change: dict[str, Any], expected: str) -> None:
    score = _score("json-schema", _answer(json.dumps({**VALID_ORDER, **change})), schema=ORDER_SCHEMA)
    assert score.passed is False and score.label == "invalid"
    assert expected in (score.explanation or "")


def test_json_schema_details() -> None:
    assert _score("json-schema", _answer("1.0"), schema={"type": "integer"}).passed is True
    assert _score("json-schema", _answer("true"), schema={"enum": [1]}).passed is False
    assert _score("json-schema", _answer("1"), schema={"const": 1.0}).passed is True
    many = _score("json-schema", _answer("[1, 2, 3, 4, 5]"), schema={"items": {"type": "string"}}, max_errors=2)
    assert (
        many.explanation is not None
        and many.explanation.startswith("5 violations")
        and "(and 3 more)" in many.explanation
    )
    fenced = _answer('```json\n{"id": 1}\n```')
    assert _score("json-schema", fenced, schema={"required": ["id"]}, extract_fence=True).passed is True
    # a violation names the place, not the value
    secret = _score("json-schema", _answer('{"token": "s3cr3t"}'), schema={"properties": {"token": {"enum": ["a"]}}})
    assert "s3cr3t" not in (secret.explanation or "")


def test_json_schema_checks_draft_2020_12_keywords() -> None:
    schema = {
        "$defs": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}},
        "type": "object",
        "properties": {
            "sku": {"$ref": "#/$defs/sku"},
            "payment": {
                "oneOf": [
                    {"type": "object", "required": ["card"], "properties": {"card": {"minLength": 12}}},
                    {"type": "object", "required": ["iban"]},
                ]
            },
            "contact": {"type": "string", "format": "email"},
            "tags": {"type": "array", "uniqueItems": True},
            "internal": False,
        },
        "dependentRequired": {"discount": ["coupon"]},
    }
    good = {"sku": "ABC-1", "payment": {"iban": "FR76"}, "contact": "a@example.com", "tags": ["x", "y"]}
    assert _score("json-schema", _answer(json.dumps(good)), schema=schema).passed is True

    def explanation(**change: Any) -> str:
        score = _score("json-schema", _answer(json.dumps({**good, **change})), schema=schema, max_errors=5)
        assert score.passed is False and score.label == "invalid"
        return score.explanation or ""

    assert "$.sku: does not match the pattern '^[A-Z]{3}-[0-9]+$'" in explanation(sku="abc")  # through the $ref
    assert "$.payment: matches none of oneOf (closest: card: shorter than 12 characters)" in explanation(
        payment={"card": "4242"}
    )
    assert "$.payment: matches 2 of oneOf, exactly 1 allowed" in explanation(payment={"card": "4" * 16, "iban": "x"})
    assert "$.contact: not a valid email" in explanation(contact="nobody")
    assert "$.tags: has duplicate items" in explanation(tags=["x", "x"])
    assert "$.internal: not allowed" in explanation(internal=1)
    assert "$.coupon: required when 'discount' is present" in explanation(discount=5)
    # violations are listed by path, whatever order the schema's keywords are checked in
    both = explanation(discount=5, contact="nobody")
    assert both == "2 violations: $.contact: not a valid email; $.coupon: required when 'discount' is present"


def test_json_schema_rejects_an_invalid_schema() -> None:
    prefix = "schema: not a valid JSON Schema (draft 2020-12): "
    message = _invalid("json-schema", {"schema": {"type": "text"}})
    assert message.startswith(prefix + '$.type: matches none of anyOf (closest: "text" is not one of ["array",')
    assert _invalid("json-schema", {"schema": {"pattern": "("}}) == prefix + "$.pattern: not a valid regex"
    nested = _invalid("json-schema", {"schema": {"properties": {"a": {"minLength": -1}}}})
    assert nested == prefix + "$.properties.a.minLength: less than the minimum 0"
    assert _invalid("json-schema", {"schema": {"required": "id"}}) == prefix + "$.required: expected array, got string"
    assert _invalid("json-schema", {}).startswith("schema: ")


# --- params --------------------------------------------------------------------------------------------------


def test_params_errors_name_the_key() -> None:
    assert "set at least one of any, all, none" in _invalid("contains", {})
    assert _invalid("contains", {"all": ["Paris", ""]}).startswith("all: ")
    assert _invalid("contains", {"any": ["x"], "ignore_case": True}).startswith("ignore_case: ")
    assert _invalid("regex", {"pattern": "(unclosed"}).startswith("pattern: invalid regular expression")
    assert _invalid("regex", {}).startswith("pattern: ")
    # RE2: what needs backtracking is refused where it is given, with the reason and the syntax it takes
    backreference = _invalid("regex", {"pattern": r"(a)\1"})
    assert backreference.startswith("pattern: invalid regular expression") and "RE2 syntax" in backreference
    assert "invalid perl operator" in _invalid("regex", {"pattern": r"Paris(?=\.)"})
    assert _invalid("task-success", {"regex": r"(?<!not )done"}).startswith("regex: invalid regular expression")
    assert "min (5) is greater than max (3)" in _invalid("length", {"min": 5, "max": 3})
    assert _invalid("length", {"unit": "tokens"}).startswith("unit: ")
    assert _invalid("latency", {"max_ms": 0}).startswith("max_ms: ")
    assert _invalid("tokens", {"max_total": -1}).startswith("max_total: ")
    assert _invalid("tokens", {"measure": "cached"}).startswith("measure: ")
    assert _invalid("cost", {"max_usd": -0.1}).startswith("max_usd: ")


def test_contains_reports_every_problem() -> None:
    score = _score("contains", _answer("Paris is sunny"), any=["Lyon", "Nice"], all=["Paris", "rain"], none=["sunny"])
    assert score.passed is False
    assert score.explanation == "output has none of 'Lyon', 'Nice'; missing 'rain'; contains forbidden 'sunny'"
