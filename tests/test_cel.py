"""evalsi.cel: clear compile errors, errors at evaluation as "no match", and the trace and span activations."""

from __future__ import annotations

import pytest

from evalsi import cel
from evalsi.model.span import Span

T0 = 1_700_000_000_000_000_000


def _trace() -> list[Span]:
    root = Span("ab" * 16, "1" * 16, "", "invoke_agent", "INTERNAL", T0, T0 + 3_000_000_000, step_type="agent")
    root.session_id = "conv-9"
    llm = Span(
        "ab" * 16,
        "2" * 16,
        root.span_id,
        "chat",
        "CLIENT",
        T0 + 100,
        T0 + 1_000_000_000,
        status_code="ERROR",
        step_type="llm",
        model="gpt-4o-mini",
        input_tokens=120,
        output_tokens=30,
        attributes={"gen_ai.request.model": "gpt-4o-mini"},
    )
    tool = Span("ab" * 16, "3" * 16, root.span_id, "execute_tool", "INTERNAL", T0 + 50, T0 + 60, step_type="tool")
    tool.tool_name = "search"
    return [llm, tool, root]  # out of order on purpose


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('trace.spans.exists(s, s.model == "gpt-4o-mini" && s.status_code == "ERROR")', True),
        ('trace.root.step_type == "agent" && trace.root.span_id == "1111111111111111"', True),
        ("trace.span_count == 3 && trace.error_count == 1 && trace.llm_calls == 1 && trace.tool_calls == 1", True),
        ("trace.duration_ns == 3000000000 && trace.input_tokens == 120 && trace.output_tokens == 30", True),
        ('trace.session_id == "conv-9" && "search" in trace.tool_names && trace.models == ["gpt-4o-mini"]', True),
        ('trace.spans[0].name == "invoke_agent"', True),  # spans in start order
        ('trace.spans.exists(s, s.attributes["gen_ai.request.model"].startsWith("gpt"))', True),
        # errors are no match: a missing key, a null field used as a string, a type mismatch
        ('trace.root.attributes["missing"] == "x"', False),
        ('trace.nothing == 1 || trace.root.model.startsWith("gpt")', False),
        ('trace.spans.all(s, s.model.startsWith("gpt"))', False),
        ('trace.span_count == "3"', False),
        ("has(trace.nothing)", False),
    ],
)
def test_trace_conditions(expr: str, expected: bool) -> None:
    program = cel.compile(expr)
    assert program.matches(cel.trace_activation(_trace())) is expected
    # span maps cut to the fields the expression names decide the same
    assert program.matches(cel.trace_activation(_trace(), fields=program.fields)) is expected


def test_fields_are_the_canonical_span_keys_the_expression_names() -> None:
    program = cel.compile('trace.spans.exists(s, s.model == "x" && s["input_tokens"] > 1) && trace.span_count > 0')
    assert program.fields == {"model", "input_tokens"}


def test_span_conditions() -> None:
    llm = _trace()[0]
    assert cel.compile('span.step_type == "llm" && span.input_tokens > 100').matches(cel.span_activation(llm))
    assert not cel.compile("span.cost_usd > 0.5").matches(cel.span_activation(llm))  # null > 0.5: no match


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("trace.spans.exists(s, ", "Syntax error"),
        ("spans.size() > 0", "undeclared reference to 'spans'"),
        ("trace.span_count + 1", "must be a condition (bool), not int"),
        ("  ", "empty CEL expression"),
    ],
)
def test_compile_errors_carry_the_cel_message(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cel.compile(expr)


def test_data_the_runtime_cannot_take_is_no_match() -> None:
    program = cel.compile("trace.span_count > 0")
    assert program.matches({"trace": {"span_count": object()}}) is False
    assert program.matches({}) is False


# --- what an expression reads, checked against the variables' shapes (cel.SCHEMA) --------------------------------


def test_reads_are_the_chains_of_fields_from_the_variables_strings_and_computed_keys_left_out() -> None:
    program = cel.compile(
        'trace.root.attributes["k"] == "trace.nope" && trace.spans.exists(s, s.model == "x") && trace[string(1)] == 1'
    )
    assert [r.shown[-1] for r in program.reads] == [
        "trace.root", "trace.root.attributes", 'trace.root.attributes[\'k\']', "trace.spans", "s.model",
    ]  # fmt: skip
    assert program.reads[-1].path == ("trace", "spans", cel.ITEM, "model")


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("trace.llm_cals > 0", "trace.llm_cals: trace has no field 'llm_cals': did you mean 'llm_calls'?"),
        ("trace.error", "trace.error: trace has no field 'error': did you mean 'error_count'?"),  # policies' only
        ("trace.spans.all(x, x.sesion_id != '')", "x.sesion_id: a span has no field 'sesion_id': did you mean "
                                                   "'session_id'?"),
        ("trace.root.attributes.x == 1 && has(trace.root.modle)",
         "trace.root.modle: a span has no field 'modle': did you mean 'model'?"),
    ],
)  # fmt: skip
def test_a_field_the_schema_lacks_is_a_field_error_naming_the_closest(expr: str, problem: str) -> None:
    with pytest.raises(cel.FieldError) as refused:
        cel.compile(expr, schema=cel.SCHEMA)
    assert refused.value.problems == [problem]
    cel.compile(expr)  # without a schema, only CEL's own checks


def test_rescores_trace_selection_refuses_a_field_typo_with_400() -> None:
    from evalsi.collector.run_api import RunRequestError, select_traces

    with pytest.raises(RunRequestError) as refused:
        select_traces(None, {"where": "trace.toolcalls > 0"})  # type: ignore[arg-type]  # refused before any read
    assert refused.value.status == 400
    assert str(refused.value) == "where: trace.toolcalls: trace has no field 'toolcalls': did you mean 'tool_calls'?"
