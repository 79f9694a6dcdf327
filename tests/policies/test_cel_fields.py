"""Fields of the CEL variables (`conditions.SCHEMA`): a field `trace`, `span`, `session`, `feedback` or a score does not
have is refused with a did-you-mean, at `evalsi validate`, at policy load and reload; attribute maps stay open; the
schema is the keys of the maps the code builds, and the fields docs/policies.md lists."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from policy_helpers import fixture_spans, policy_doc, span, write
from typer.testing import CliRunner

from evalsi import cel, cli
from evalsi.component import Next, Settings
from evalsi.evaluators import load_evaluators
from evalsi.model.score import Score
from evalsi.policies.conditions import SCHEMA, SCORE_SHAPE, score_summary as _summary
from evalsi.policies.load import PolicyError, load_policies, parse_policy
from evalsi.policies.trace_view import SessionView, TraceView
from evalsi.processors.evaluate import Evaluate, EvaluateConfig
from evalsi.runtime.telemetry import SelfMetrics

DOCS = Path(__file__).parents[2] / "docs" / "policies.md"


def errors_of(**spec: Any) -> list[str]:
    errors: list[str] = []
    parse_policy(
        policy_doc(**spec), "p.yaml", load_evaluators(), errors, base_dir=Path("."), datasets_dir=Path(".")
    )  # fmt: skip
    return errors


# --- typos are refused, with the key path and a suggestion ----------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"selector": "trace.llm_cals > 0"},
         "p.yaml: spec.selector: trace.llm_cals: trace has no field 'llm_cals': did you mean 'llm_calls'?"),
        ({"sampling": {"always": ["feedback.negativ"]}},
         "p.yaml: spec.sampling.always.0: feedback.negativ: feedback has no field 'negativ': did you mean 'negative'?"),
        ({"selector": "trace['toolcalls'] > 0"},
         "p.yaml: spec.selector: trace['toolcalls']: trace has no field 'toolcalls': did you mean 'tool_calls'?"),
        ({"selector": 'span.modle == "gpt-4o"'},
         "p.yaml: spec.selector: span.modle: a span has no field 'modle': did you mean 'model'?"),
        ({"selector": 'trace.root.atributes["x"] == 1'},
         "p.yaml: spec.selector: trace.root.atributes: a span has no field 'atributes': did you mean 'attributes'?"),
        ({"selector": 'trace.spans.exists(s, s.step_typ == "tool")'},
         "p.yaml: spec.selector: s.step_typ: a span has no field 'step_typ': did you mean 'step_type'?"),
        ({"selector": 'trace.spans[0].nme == "chat"'},
         "p.yaml: spec.selector: trace.spans[0].nme: a span has no field 'nme': did you mean 'name'?"),
        ({"selector": "session.trace_cont > 1"},
         "p.yaml: spec.selector: session.trace_cont: session has no field 'trace_cont': did you mean 'trace_count'?"),
        ({"selector": "has(trace.eror)"},
         "p.yaml: spec.selector: trace.eror: trace has no field 'eror': did you mean 'error'?"),
        ({"cascade": [{"ref": "test/echo"}, {"ref": "test/echo", "name": "b", "when": "scores.echo.pased"}]},
         "p.yaml: spec.cascade.1.when: scores['echo'].pased: a score has no field 'pased': did you mean 'passed'?"),
        ({"cascade": [{"ref": "test/span-tokens", "spans": "span.tool_nam == 'x'"}]},
         "p.yaml: spec.cascade.0.spans: span.tool_nam: a span has no field 'tool_nam': did you mean 'tool_name'?"),
        ({"promote": {"when": "feedback.cunt > 0", "dataset": "d"}},
         "p.yaml: spec.promote.when: feedback.cunt: feedback has no field 'cunt': did you mean 'count'?"),
    ],
)  # fmt: skip
def test_a_field_the_variable_does_not_have_is_refused_with_a_suggestion(spec: dict[str, Any], error: str) -> None:
    assert errors_of(**spec) == [error]


def test_without_a_close_field_the_fields_are_listed_and_every_typo_is_reported() -> None:
    [first, second] = errors_of(selector="trace.zzzzzz > 0 || span.qqq == 1")
    assert first.startswith("p.yaml: spec.selector: trace.zzzzzz: trace has no field 'zzzzzz': trace has trace_id, ")
    assert second.startswith("p.yaml: spec.selector: span.qqq: a span has no field 'qqq': a span has trace_id, ")


@pytest.mark.parametrize(
    "selector",
    [
        "trace.llm_calls > 0 && trace.steps['retriever'] > 0 && trace.steps.llm > 0",  # steps: any step type
        "span.attributes['gen_ai.request.model'] == 'x' && span.attributes.anything == 1",  # attributes: open
        "resource['service.name'] == 'x' && resource.whatever == 'y'",  # resource: open
        "span.resource_attributes['k'] == 1 && span.details['documents'].size() > 0",
        "trace.root.attributes['x'] == 1 && trace.spans.exists(s, s.attributes['y'] == 2 && s.model == 'gpt')",
        "trace.spans.map(s, s.name).exists(n, n == 'chat') && trace.models.exists(m, m.startsWith('gpt'))",
        "trace.exists(k, k == 'llm_calls') && size(trace) > 0 && trace[string(1)] == 1",  # a map's keys, a computed key
        "trace.service_name == \"trace.nope\" && 'session.nope' != ''",  # in a string: not a read
        "session.id == 'c' || session.trace_count > 1 || session.trace_ids.size() > 0",
    ],
)
def test_what_the_variables_have_and_their_open_maps_load(selector: str) -> None:
    assert errors_of(selector=selector) == []


def test_feedback_scores_and_score_entries_stay_open_where_they_are_maps() -> None:
    spec = {
        "sampling": {"always": ["feedback.scores['stars'] < 3 || feedback.scores.thumbs == false"]},
        "cascade": [
            {"ref": "test/echo"},
            {"ref": "test/echo", "name": "b", "when": "scores['echo'].passed && scores.echo.n == 1"},
        ],
    }
    assert errors_of(**spec) == []


def test_every_field_of_the_schema_loads(tmp_path: Path) -> None:
    """Each field of every closed variable, read as `.field` and as `has()`, in the condition that sees it."""
    for variable, shape in SCHEMA.items():
        if not isinstance(shape, cel.Fields):
            continue
        for field in shape.fields:
            read = f"{variable}.{field} != null || has({variable}.{field})"
            if variable == "feedback":
                assert errors_of(sampling={"always": [read]}) == [], read
            else:
                assert errors_of(selector=read) == [], read
    for field in SCORE_SHAPE.fields:
        when = f"scores.echo.{field} != null"
        assert errors_of(cascade=[{"ref": "test/echo"}, {"ref": "test/echo", "name": "b", "when": when}]) == []


# --- validate, load, reload ---------------------------------------------------------------------------------------


def _config(tmp_path: Path) -> Path:
    config = {
        "receivers": {"otlp": {}},
        "processors": {"tail_sampling": {}, "evaluate": {"policies": ["policy.yaml"]}},
        "exporters": {"clickhouse": {}},
        "service": {
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"], "processors": ["tail_sampling", "evaluate"], "exporters": ["clickhouse"],
                },
                "scores": {"exporters": ["clickhouse"]},
            }
        },
    }  # fmt: skip
    (tmp_path / "evalsi.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "evalsi.yaml"


def test_evalsi_validate_names_the_policy_key_path_and_the_suggestion(tmp_path: Path) -> None:
    config = _config(tmp_path)
    doc = policy_doc("typos", selector="trace.llm_cals > 0", sampling={"always": ["feedback.negativ"]})
    write(tmp_path / "policy.yaml", doc)
    res = CliRunner().invoke(cli.app, ["validate", "-c", str(config)])
    assert res.exit_code == 1, res.output
    assert "policy.yaml: spec.selector: trace.llm_cals: trace has no field 'llm_cals': did you mean 'llm_calls'?" in (
        res.output
    )
    assert "policy.yaml: spec.sampling.always.0: feedback.negativ: feedback has no field 'negativ': did you mean " in (
        res.output
    )
    write(tmp_path / "policy.yaml", policy_doc("typos", selector="trace.llm_calls > 0"))
    res = CliRunner().invoke(cli.app, ["validate", "-c", str(config)])
    assert res.exit_code == 0, res.output


def test_load_refuses_the_typo_and_a_reload_keeps_the_policies_in_use(tmp_path: Path) -> None:
    write(tmp_path / "policies.yaml", policy_doc("kept", selector="trace.llm_calls > 0"))
    raw = {"policies": ["policies.yaml"], "datasets_dir": str(tmp_path / "datasets")}
    config = EvaluateConfig.model_validate(raw, context={"base_dir": tmp_path})
    metrics = SelfMetrics()
    proc = Evaluate(config, Settings("evaluate", metrics, logging.getLogger("test.evaluate")), Next())
    before = proc.policies

    write(tmp_path / "policies.yaml", policy_doc("kept", selector="trace.llm_cals > 0"))
    with pytest.raises(PolicyError) as refused:
        load_policies(["policies.yaml"], tmp_path)
    assert refused.value.errors == [
        "policies.yaml: spec.selector: trace.llm_cals: trace has no field 'llm_cals': did you mean 'llm_calls'?"
    ]
    with pytest.raises(ValueError, match=r"did you mean 'llm_calls'\?"):
        asyncio.run(proc.reload())
    assert proc.policies is before and before.policies[0].selector.source == "trace.llm_calls > 0"
    labels = {"processor": "evaluate", "result": "failed"}
    assert metrics.registry.get_sample_value("evalsi_policy_reloads_total", labels) == 1


# --- the schema is what the code builds, and what the docs say --------------------------------------------------------


def _keys(shape: cel.Shape) -> set[str]:
    assert isinstance(shape, cel.Fields)
    return set(shape.fields)


@pytest.mark.parametrize("folder", ["openinference", "langgraph-openinference"])
def test_the_schema_is_the_keys_of_the_variables_built_from_real_traces(folder: str) -> None:
    spans = fixture_spans(folder, "chat_tools")
    feedback = [Score("thumbs", passed=False, trace_id=spans[0].trace_id, source="human")]
    view = TraceView(spans, feedback=feedback)
    trace = view.variable("trace")
    assert set(trace) == _keys(SCHEMA["trace"])
    assert set(trace["root"]) == set(trace["spans"][0]) == _keys(SCHEMA["span"])
    assert set(view.variable("span")) == _keys(SCHEMA["span"]) == _keys(cel.SPAN_SHAPE)
    assert set(view.variable("feedback")) == _keys(SCHEMA["feedback"])
    assert set(view.variable("session")) == {"id"} < _keys(SCHEMA["session"])
    assert set(SessionView(spans).variable("session")) == _keys(SCHEMA["session"])
    assert SCHEMA["resource"] is None and view.variable("resource") == spans[0].resource_attributes
    # the tail sampler's `trace` is the policies' less `error` and `steps`
    assert set(cel.trace_activation(spans)["trace"]) == _keys(cel.TRACE_SHAPE) == set(trace) - {"error", "steps"}
    one, two = Score("x", value=1.0), Score("x", value=2.0, passed=True)
    assert set(_summary([one])) == set(_summary([one, two])) == _keys(SCORE_SHAPE)


def _backticked(cell: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", cell))


def test_the_fields_docs_policies_md_lists_are_the_schemas() -> None:
    text = DOCS.read_text()
    section = text[text.index("## What CEL sees") :]
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `([a-z]+)` \| ([^|]*) \|", section[: section.index("\n\n", 200)], re.M)
    }
    assert set(rows) == set(SCHEMA)
    for variable, shape in SCHEMA.items():
        if isinstance(shape, cel.Fields):
            assert _backticked(rows[variable]) == set(shape.fields), variable
        else:
            assert "any" in rows[variable], variable
    cascade = text[text.index("`scores[key]` holds") :]
    table = cascade[: cascade.index("\n\n", cascade.index("| field |"))]
    assert set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M)) == set(SCORE_SHAPE.fields)
    # the session fields the *Sessions* paragraph lists
    sessions = re.search(r"`session` as `\{([^}]*)\}`", text)
    assert sessions is not None and {f.strip() for f in sessions.group(1).split(",")} == _keys(SCHEMA["session"])


def test_the_error_lines_docs_policies_md_shows_are_what_loading_says() -> None:
    text = DOCS.read_text()
    at = text.index("**A field these variables do not have is an error**")
    start = text.index("```\n", at) + 4
    block = text[start : text.index("\n```", start)]
    sources = {
        "spec.selector: trace.": {"selector": "trace.llm_cals > 0"},
        "spec.sampling.always.0": {"sampling": {"always": ["feedback.negativ"]}},
        "spec.selector: s.": {"selector": 'trace.spans.exists(s, s.modle == "gpt-4o")'},
    }
    lines = block.splitlines()
    assert len(lines) == len(sources)
    for line in lines:
        rest = line.split(": ", 1)[1]
        [spec] = [s for key, s in sources.items() if rest.startswith(key)]
        assert errors_of(**spec) == [f"p.yaml: {rest}"], line


def test_a_selector_reads_fields_of_a_trace_it_is_evaluated_over() -> None:
    """The check changes nothing at evaluation: a valid selector matches as before."""
    trace = [span("t1", "a1", step_type="llm", attributes={"k": "v"})]
    errors: list[str] = []
    doc = policy_doc(selector="trace.llm_calls == 1 && span.attributes['k'] == 'v' && trace.steps['llm'] == 1")
    policy = parse_policy(doc, "p.yaml", load_evaluators(), errors, base_dir=Path("."), datasets_dir=Path("."))
    assert errors == [] and policy is not None and policy.selector is not None
    assert policy.selector.matches(TraceView(trace))
