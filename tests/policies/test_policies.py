"""OnlineEvalPolicy files: validation errors with paths, selectors, deterministic sampling, `always`, cascades,
score ids, sessions and promotion, on the fixture traces and on synthetic ones."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from policy_helpers import fixture_spans, policy_doc, span, write
from running_collector import FIXTURES

from evalsi.policies import PolicyError, load_policies, sampling_hash
from evalsi.processors.tail_sampling.buffer import Trace
from evalsi.processors.tail_sampling.policies import SAMPLED, Probabilistic

REPO = Path(__file__).resolve().parents[2]


def load(tmp_path: Path, *docs: dict, **kw) -> object:
    write(tmp_path / "policies" / "p.yaml", *docs)
    return load_policies(["policies/*.yaml"], tmp_path, **kw)


def errors_of(tmp_path: Path, globs: list[str] | None = None) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load_policies(globs or ["policies/*.yaml"], tmp_path)
    return caught.value.errors


# --- validation ------------------------------------------------------------------------------------------------


def test_every_problem_is_reported_at_once_with_file_and_key_path(tmp_path: Path) -> None:
    bad = {
        "apiVersion": "evals.si/v1alpha1",
        "kind": "OnlineEvalPolicy",
        "metadata": {"name": "bad", "labells": {}},
        "spec": {
            "selector": "trace.llm_calls >",
            "sampling": {"rate": 1.5, "alwys": ["trace.error"], "always": ["scores['x'].passed"]},
            "cascade": [
                {"ref": "builtin/contans"},
                {"ref": "test/keyword", "params": {"keyword": 3, "extra": True}},
                {"ref": "test/echo", "when": "scores['keyword'].passed &&"},
                {"ref": "test/echo"},
                {"ref": "test/attribute", "spans": "span.step_type == 'llm'"},
            ],
            "window": "5 minutes",
            "alerts": [{"when": "rate('keyword') <", "notify": "env:EVALSI_TEST_UNSET_HOOK"}],
            "promote": {"when": "true", "dataset": "no/slashes"},
        },
    }
    write(tmp_path / "policies" / "bad.yaml", bad)
    errors = errors_of(tmp_path)
    heads = [e.split("\n")[0] for e in errors]
    expected = [
        "policies/bad.yaml: metadata.labells: unknown key",
        "policies/bad.yaml: spec.sampling.rate: Input should be less than or equal to 1",
        "policies/bad.yaml: spec.sampling.alwys: unknown key",
        "policies/bad.yaml: spec.window: invalid duration '5 minutes' (use e.g. 500ms, 5s, 1m30s, 2h, 7d)",
        "policies/bad.yaml: spec.cascade.0.ref: unknown evaluator 'builtin/contans'",
        "policies/bad.yaml: spec.cascade.1.params.keyword: Input should be a valid string",
        "policies/bad.yaml: spec.cascade.1.params.extra: unknown key",
        "policies/bad.yaml: spec.cascade.3: stage 2 is already known as 'echo' in `scores`; give one of them a `name:`",
        "policies/bad.yaml: spec.cascade.4.spans: only for span-scope evaluators (test/attribute has scope trace)",
        "policies/bad.yaml: spec.alerts.0.notify: environment variable EVALSI_TEST_UNSET_HOOK is not set",
        "policies/bad.yaml: spec.promote.dataset: 'no/slashes' is neither a dataset name",
    ]
    for want in expected:
        assert any(h.startswith(want) for h in heads), (want, heads)
    # CEL problems name their key and carry CEL's own message with the caret
    for key in ("spec.selector", "spec.cascade.2.when", "spec.alerts.0.when"):
        found = [e for e in errors if e.startswith(f"policies/bad.yaml: {key}: invalid CEL expression")]
        assert found and "^" in found[0], (key, errors)
    # a selector cannot see scores: they do not exist before the cascade
    assert any(
        e.startswith("policies/bad.yaml: spec.sampling.always.0: invalid CEL expression") and "scores" in e
        for e in errors
    )
    assert len(errors) == len(expected) + 4


def test_several_documents_duplicate_names_yaml_errors_and_globs(tmp_path: Path) -> None:
    write(tmp_path / "policies" / "a.yaml", policy_doc("one"), policy_doc("two", selector="trace.nope("))
    write(tmp_path / "policies" / "b.yaml", policy_doc("one"))
    (tmp_path / "policies" / "c.yaml").write_text("spec: [unclosed\n")
    (tmp_path / "policies" / "d.yaml").write_text("- just\n- a list\n")
    errors = errors_of(tmp_path, ["policies/*.yaml", "missing/*.yaml", "nofile.yaml"])
    heads = [e.split("\n")[0] for e in errors]
    assert heads[0] == "missing/*.yaml: no policy files match"
    assert heads[1].startswith("nofile.yaml: no such policy file")
    assert heads[2].startswith("policies/a.yaml[2]: spec.selector: invalid CEL expression")
    assert heads[3] == "policies/b.yaml: metadata.name: policy 'one' is also defined in policies/a.yaml[1]"
    assert heads[4].startswith("policies/c.yaml: invalid YAML:")
    assert heads[5] == "policies/d.yaml: (document): must be a mapping with apiVersion, kind, metadata and spec"
    assert len(errors) == 6


def test_shape_errors_for_kind_version_and_missing_cascade(tmp_path: Path) -> None:
    doc = {"apiVersion": "evals.si/v1", "kind": "EvalPolicy", "metadata": {"name": "Bad Name"}, "spec": {}}
    write(tmp_path / "policies" / "x.yaml", doc)
    heads = [e.split("\n")[0] for e in errors_of(tmp_path)]
    assert heads == [
        "policies/x.yaml: apiVersion: Input should be 'evals.si/v1alpha1'",
        "policies/x.yaml: kind: Input should be 'OnlineEvalPolicy'",
        "policies/x.yaml: metadata.name: 'Bad Name' is not a policy name: use lowercase letters, digits, '-', '_' "
        "and '.' (starting and ending with a letter or digit)",
        "policies/x.yaml: spec.cascade: Field required",
    ]


def test_defaults_and_an_empty_glob_list(tmp_path: Path) -> None:
    assert len(load_policies([], tmp_path)) == 0
    ps = load(tmp_path, policy_doc("d"))
    p = ps.policies[0]
    assert (p.rate, p.window.seconds, p.selector, p.always, p.promote) == (1.0, 300.0, None, [], None)
    assert [s.key for s in p.stages] == ["echo"]


def test_the_example_policies_in_deploy_load(tmp_path: Path) -> None:
    examples = sorted((REPO / "deploy" / "policies").glob("example-*.yaml"))
    assert examples
    ps = load_policies([str(p) for p in examples], REPO, datasets_dir=tmp_path)
    assert len(ps) >= len(examples)


# --- selection and sampling ------------------------------------------------------------------------------------


def test_selector_sees_trace_root_span_resource_and_session(tmp_path: Path) -> None:
    tools = fixture_spans("otel-openai-v2", "chat_tools")
    simple = fixture_spans("otel-openai-v2", "chat_simple")
    error = fixture_spans("otel-openai-v2", "chat_error")
    root = next(s for s in tools if not s.parent_span_id)
    ps = load(
        tmp_path,
        policy_doc("tools", selector="trace.tool_calls > 0 && 'get_weather' in trace.tool_names"),
        policy_doc("root", selector=f"span.name == {root.name!r} && span.step_type == 'agent'"),
        policy_doc("errors", selector="trace.error && trace.steps['llm'] == 1"),
        policy_doc("service", selector=f"resource['service.name'] == {root.service_name!r}"),
        policy_doc("session", selector="session.id == null"),
    )
    picked = {}
    for name, spans in (("tools", tools), ("simple", simple), ("error", error)):
        picked[name] = sorted({s.policy for s in ps.evaluate_trace(spans, now=0)})
    assert picked["tools"] == ["root", "service", "session", "tools"]
    assert picked["simple"] == ["service", "session"]
    assert picked["error"] == ["errors", "service", "session"]
    assert ps.stats["tools"].seen == 3 and ps.stats["tools"].selected == 1


def _trace(i: int, **kw) -> list:
    return [span(f"{random.Random(i).getrandbits(128):032x}", **kw)]


def test_sampling_is_deterministic_by_trace_id_across_instances(tmp_path: Path) -> None:
    doc = policy_doc("sampled", sampling={"rate": 0.3})
    a = load(tmp_path / "a", doc)
    b = load(tmp_path / "b", doc)
    ids = [f"{random.Random(i).getrandbits(128):032x}" for i in range(10_000)]
    decisions_a = [a.policies[0].sampled(t) for t in ids]
    decisions_b = [b.policies[0].sampled(t) for t in ids]
    assert decisions_a == decisions_b
    assert abs(sum(decisions_a) / len(ids) - 0.3) < 0.02
    # the engine applies the same decision, trace by trace
    for i in range(500):
        spans = [span(ids[i])]
        assert bool(a.evaluate_trace(spans, now=0)) == decisions_a[i] == bool(b.evaluate_trace(spans, now=0))
    st = a.stats["sampled"]
    assert st.sampled + st.not_sampled == st.selected == 500


def test_sampling_is_independent_of_the_tail_samplers_hash() -> None:
    # the same 50% of the same ids: were the hashes alike, the policy would keep exactly what tail sampling kept
    tail = Probabilistic("half", 50, "")
    ids = [f"{random.Random(i).getrandbits(128):032x}" for i in range(10_000)]
    both = sum(1 for t in ids if tail.evaluate(Trace(t, [], 0, 0), 0) is SAMPLED and sampling_hash(t) < 2**63)
    assert abs(both / len(ids) - 0.25) < 0.02


def test_rate_zero_and_one(tmp_path: Path) -> None:
    ps = load(tmp_path, policy_doc("none", sampling={"rate": 0}), policy_doc("all", sampling={"rate": 1}))
    for i in range(200):
        ps.evaluate_trace(_trace(i), now=0)
    assert (ps.stats["none"].sampled, ps.stats["all"].sampled) == (0, 200)


def test_always_rules_override_the_rate(tmp_path: Path) -> None:
    ps = load(tmp_path, policy_doc("errs", sampling={"rate": 0, "always": ["trace.error"]}))
    for folder in ("otel-openai-v2", "openinference", "openllmetry-0.54"):
        for scenario in ("chat_simple", "chat_error"):
            spans = fixture_spans(folder, scenario)
            has_error = any(s.status_code == "ERROR" for s in spans)
            assert bool(ps.evaluate_trace(spans, now=0)) == has_error, (folder, scenario)
    st = ps.stats["errs"]
    assert (st.selected, st.sampled, st.sampled_always, st.not_sampled) == (6, 3, 3, 3)


def test_always_latency_above_a_percentile(tmp_path: Path) -> None:
    ps = load(tmp_path, policy_doc("slow", sampling={"rate": 0, "always": ["latency > p95"]}))
    durations = list(range(1, 101))
    random.Random(7).shuffle(durations)
    for i, ms in enumerate(durations):
        ps.evaluate_trace(_trace(i, duration_ms=ms), now=0)
    st = ps.stats["slow"]
    # nothing is judged slow before 20 traces; after that only the slowest few percent of those seen so far
    assert 1 <= st.sampled <= 8
    assert st.sampled == st.sampled_always
    ps2 = load(tmp_path / "again", policy_doc("slow", sampling={"rate": 0, "always": ["latency > p95"]}))
    for i in range(40):
        ps2.evaluate_trace(_trace(i, duration_ms=10), now=0)
    assert ps2.evaluate_trace(_trace(99, duration_ms=11), now=0)
    assert not ps2.evaluate_trace(_trace(98, duration_ms=10), now=0)


# --- cascade ---------------------------------------------------------------------------------------------------


def test_the_second_stage_runs_only_where_the_first_passed(tmp_path: Path) -> None:
    ps = load(
        tmp_path,
        policy_doc(
            "cascade",
            cascade=[
                {"ref": "test/keyword", "params": {"keyword": "Paris"}},
                {"ref": "test/echo", "when": "scores['keyword'].passed"},
            ],
        ),
    )
    ran: dict[tuple[str, str], list[tuple[str, str, bool | None]]] = {}
    for folder in ("otel-openai-v2", "openinference", "openllmetry-0.54"):
        for scenario in ("chat_simple", "chat_pii", "chat_error"):
            scores = ps.evaluate_trace(fixture_spans(folder, scenario), now=0)
            ran[folder, scenario] = [(s.name, s.outcome, s.passed) for s in scores]
    meta = json.loads((FIXTURES / "otel-openai-v2" / "meta.json").read_text())["scenarios"]
    assert "Paris" in meta["chat_simple"]["markers"]["completion"]
    assert "Paris" not in meta["chat_pii"]["markers"]["completion"]
    for folder in ("otel-openai-v2", "openinference", "openllmetry-0.54"):
        assert ran[folder, "chat_simple"] == [("keyword", "scored", True), ("echo", "scored", True)]
        assert ran[folder, "chat_pii"] == [("keyword", "scored", False)]
        # a failed call has no output: the first stage is skipped, so `passed` is null and the second does not run
        assert ran[folder, "chat_error"] == [("keyword", "skipped", None)]
    st = ps.stats["cascade"]
    assert st.stage_runs == {"keyword": 9, "echo": 3}
    assert st.when_not_met == {"echo": 6}
    assert st.scores == {"scored": 9, "skipped": 3}


def test_when_sees_values_labels_outcomes_and_stage_names(tmp_path: Path) -> None:
    ps = load(
        tmp_path,
        policy_doc(
            "w",
            cascade=[
                {"ref": "test/attribute", "name": "first"},
                {"ref": "test/boom"},
                {"ref": "test/echo", "name": "high", "when": "scores['attribute'].value >= 0.5"},
                {"ref": "test/echo", "name": "errored", "when": "scores['boom'].outcome == 'error'"},
                {"ref": "test/echo", "name": "by-stage", "when": "scores['first'].passed == false"},
            ],
        ),
    )
    low = ps.evaluate_trace([span("01" * 16, attributes={"test.value": 0.2, "test.passed": False})], now=0)
    high = ps.evaluate_trace([span("02" * 16, attributes={"test.value": 0.9, "test.passed": True})], now=0)
    assert [(s.name, s.outcome) for s in low] == [
        ("attribute", "scored"), ("boom", "error"), ("echo", "scored"), ("echo", "scored")
    ]  # fmt: skip
    assert [s.name for s in high] == ["attribute", "boom", "echo", "echo"]
    assert ps.stats["w"].when_not_met == {"high": 1, "by-stage": 1}
    boom = low[1]
    assert (boom.reason, boom.explanation) == ("RuntimeError", "kaput")


def test_span_scope_runs_once_per_llm_span_or_per_chosen_span(tmp_path: Path) -> None:
    tools = fixture_spans("otel-openai-v2", "chat_tools")
    llm = [s for s in tools if s.step_type == "llm"]
    tool = [s for s in tools if s.step_type == "tool"]
    assert len(llm) == 2 and len(tool) == 1
    mean = float(sum(s.output_tokens for s in llm) / 2)
    ps = load(
        tmp_path,
        policy_doc(
            "spans",
            cascade=[
                {"ref": "test/span-tokens"},
                {"ref": "test/span-tokens", "name": "tools", "spans": "span.step_type == 'tool'"},
                {"ref": "test/echo", "when": f"scores['span-tokens'].n == 2 && scores['span-tokens'].value == {mean}"},
                {"ref": "test/echo", "name": "after-tools", "when": "scores['tools'].n == 1"},
            ],
        ),
    )
    scores = ps.evaluate_trace(tools, now=0)
    per_span = [(s.span_id, s.value) for s in scores if s.name == "span-tokens"]
    assert per_span == [(s.span_id, s.output_tokens) for s in llm] + [(tool[0].span_id, tool[0].output_tokens)]
    # `scores[key]` of several span scores: their count and the mean of their values; both echo stages ran
    assert [s.name for s in scores][-2:] == ["echo", "echo"]
    ps2 = load(tmp_path / "b", policy_doc("none", cascade=[{"ref": "test/span-tokens"}]))
    [skipped] = ps2.evaluate_trace([span("ab" * 16, step_type="tool")], now=0)
    assert (skipped.outcome, skipped.reason, skipped.evaluator) == ("skipped", "no matching spans", "test/span-tokens")


def test_scores_carry_trace_root_span_session_policy_evaluator_and_run(tmp_path: Path) -> None:
    ps = load(tmp_path, policy_doc("ids", cascade=[{"ref": "test/keyword", "params": {"keyword": "Paris"}}]))
    tools = fixture_spans("openinference", "chat_tools")
    root = next(s for s in tools if not s.parent_span_id)
    [s] = ps.evaluate_trace(tools, now=1234.5)
    assert (s.trace_id, s.span_id, s.policy, s.evaluator, s.evaluator_version) == (
        root.trace_id, root.span_id, "ids", "test/keyword", "3"
    )  # fmt: skip
    assert s.timestamp_unix_nano == 1_234_500_000_000
    assert s.session_id == (root.session_id or next((x.session_id for x in tools if x.session_id), None) or "")
    run = {"evalsi.run_id": "r7", "evalsi.trial": 2, "evalsi.task_id": "t3"}
    harness = [span("cd" * 16, session_id="conv-1", attributes=run)]
    [h] = load(tmp_path / "h", policy_doc("h", cascade=[{"ref": "test/echo"}])).evaluate_trace(harness, now=0)
    assert (h.session_id, h.run_id, h.trial, h.task_id) == ("conv-1", "r7", 2, "t3")


def test_session_stages_run_only_for_sessions(tmp_path: Path) -> None:
    ps = load(
        tmp_path,
        policy_doc(
            "sess",
            selector="session.id == 'conv-9'",
            cascade=[{"ref": "test/echo"}, {"ref": "test/session-traces"}],
        ),
    )
    t1 = [span("11" * 16, "r1", session_id="conv-9", start=1)]
    t2 = [span("22" * 16, "r2", session_id="conv-9", start=2), span("22" * 16, "c2", parent="r2", start=3)]
    assert [s.name for s in ps.evaluate_trace(t1, now=0)] == ["echo"]
    [s] = ps.evaluate_session(t2 + t1, now=0)
    # a session score belongs to its first trace's root span
    assert (s.name, s.value, s.trace_id, s.span_id, s.session_id) == ("session-traces", 2, "11" * 16, "r1", "conv-9")
    assert ps.evaluate_session([span("33" * 16, session_id="other")], now=0) == []


# --- promotion -------------------------------------------------------------------------------------------------


def test_promotion_appends_each_trace_once(tmp_path: Path) -> None:
    doc = policy_doc(
        "promote",
        cascade=[{"ref": "test/keyword", "params": {"keyword": "Paris"}}],
        promote={"when": "scores['keyword'].passed", "dataset": "paris"},
    )
    ps = load(tmp_path, doc, datasets_dir=tmp_path / "datasets")
    simple = fixture_spans("otel-openai-v2", "chat_simple")
    pii = fixture_spans("otel-openai-v2", "chat_pii")
    for spans in (simple, pii, simple):
        ps.evaluate_trace(spans, now=0)
    path = tmp_path / "datasets" / "paris.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["trace_id"] for r in rows] == [simple[0].trace_id]
    markers = json.loads((FIXTURES / "otel-openai-v2" / "meta.json").read_text())["scenarios"]["chat_simple"]
    row = rows[0]
    assert markers["markers"]["prompt"] in row["input"]
    assert markers["markers"]["completion"] in row["output"]
    assert "reference" not in row  # not known online
    assert row["metadata"]["policy"] == "promote"
    assert row["metadata"]["scores"]["keyword"] == {"value": None, "passed": True, "label": None, "outcome": "scored"}
    assert row["metadata"]["models"] == [simple[0].model]
    assert (ps.stats["promote"].promoted, ps.stats["promote"].promote_duplicates) == (1, 1)
    # a restarted collector reads the ids already in the dataset
    again = load(tmp_path, doc, datasets_dir=tmp_path / "datasets")
    again.evaluate_trace(simple, now=0)
    assert len(path.read_text().splitlines()) == 1
    assert again.stats["promote"].promote_duplicates == 1


def test_promotion_skips_traces_without_content_and_takes_jsonl_paths(tmp_path: Path) -> None:
    doc = policy_doc("nc", promote={"when": "true", "dataset": "out/regressions.jsonl"})
    ps = load(tmp_path, doc)
    ps.evaluate_trace([span("44" * 16)], now=0)  # no messages recorded
    assert ps.stats["nc"].promote_no_content == 1
    ps.evaluate_trace(fixture_spans("openinference", "chat_simple"), now=0)
    assert len((tmp_path / "out" / "regressions.jsonl").read_text().splitlines()) == 1
