"""Late feedback in policies: the `feedback` CEL variable, and `evaluate_late` bringing in sampled-out traces,
running feedback-gated stages and promoting, each at most once and with the keys an online run would give."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from policy_helpers import fixture_spans, policy_doc, span, write

from evalsi.model.score import Score
from evalsi.policies import PolicyError, load_policies
from evalsi.policies.feedback import feedback_variable, verdict
from evalsi.policies.policy import PolicyDecision


def human(name: str, trace_id: str = "", **verdict_fields: object) -> Score:
    return Score(name, trace_id=trace_id, policy="feedback", evaluator="feedback", source="human", **verdict_fields)


def load(tmp_path: Path, *docs: dict) -> object:
    write(tmp_path / "policies" / "p.yaml", *docs)
    return load_policies(["policies/*.yaml"], tmp_path, datasets_dir=tmp_path / "datasets")


# --- the variable ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("score", "expected"),
    [
        (human("thumbs", passed=False), False),
        (human("thumbs", passed=True), True),
        (human("rating", value=0.2), False),
        (human("rating", value=0.5), True),  # at the threshold: not below it
        (human("verdict", label="Thumbs-Down"), False),
        (human("verdict", label="incorrect"), False),
        (human("verdict", label="thumbs up"), True),
        (human("topic", label="billing"), None),  # says nothing about quality
        (human("both", passed=True, value=0.0), True),  # the verdict wins over the value
    ],
)
def test_feedback_verdicts(score: Score, expected: bool | None) -> None:
    assert verdict(score) is expected


def test_feedback_variable_sums_up_human_and_external_scores_only() -> None:
    scores = [
        human("stars", value=4.0),
        human("stars", value=2.0),  # the latest of a name is what `scores` shows
        human("topic", label="billing"),
        Score("relevance", value=0.9, source="external"),
        Score("contains", passed=False, source="code"),  # a policy's own score is not feedback
        Score("judge", outcome="error", reason="timeout", source="external"),  # an error says nothing
    ]
    fb = feedback_variable(scores, negative_below=3)
    assert fb == {
        "negative": True, "positive": True, "count": 4,
        "scores": {"stars": 2.0, "topic": "billing", "relevance": 0.9},
    }  # fmt: skip
    assert feedback_variable([]) == {"negative": False, "positive": False, "count": 0, "scores": {}}


def test_policies_read_feedback_in_always_when_and_promote_but_not_in_the_selector(tmp_path: Path) -> None:
    ps = load(
        tmp_path,
        policy_doc(
            "late",
            sampling={"rate": 0, "always": ["feedback.negative"]},
            cascade=[{"ref": "test/echo"}, {"ref": "test/attribute", "when": "feedback.scores['stars'] < 3"}],
            promote={"when": "feedback.count > 0 && scores['echo'].passed", "dataset": "bad"},
        ),
        policy_doc("online"),
    )
    assert [p.name for p in ps.late] == ["late"]
    write(tmp_path / "sel" / "p.yaml", policy_doc("sel", selector="feedback.negative"))
    with pytest.raises(PolicyError) as caught:
        load_policies(["sel/p.yaml"], tmp_path)
    [error] = caught.value.errors
    assert error.startswith("sel/p.yaml: spec.selector: invalid CEL expression")
    assert "use it in sampling.always, a cascade `when` or promote.when" in error


def test_evalsi_validate_accepts_a_policy_that_reads_feedback(tmp_path: Path) -> None:
    write(
        tmp_path / "late.yaml",
        policy_doc("late", sampling={"rate": 0, "always": ["feedback.negative"]}, cascade=[{"ref": "builtin/latency"}],
                   promote={"when": "feedback.negative", "dataset": "bad"}),
    )  # fmt: skip
    config = {
        "receivers": {"otlp": {}},
        "processors": {
            "tail_sampling": {},
            "evaluate": {"policies": ["late.yaml"], "late_signals": {"window": "5m", "max_traces": 100}},
        },
        "exporters": {"clickhouse": {"endpoint": f"chdb://{tmp_path / 'store'}"}},
        "service": {
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["tail_sampling", "evaluate"],
                    "exporters": ["clickhouse"],
                },
                "scores": {"processors": ["evaluate"], "exporters": ["clickhouse"]},
            }
        },
    }
    (tmp_path / "evalsi.yaml").write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "evalsi", "validate", "-c", str(tmp_path / "evalsi.yaml")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


# --- the late path ---------------------------------------------------------------------------------------------

LATE = policy_doc(
    "late",
    sampling={"rate": 0, "always": ["feedback.negative"]},
    cascade=[{"ref": "test/echo"}, {"ref": "test/keyword", "params": {"keyword": "Paris"}}],
    promote={"when": "feedback.negative", "dataset": "regressions"},
)


def test_a_sampled_out_trace_is_brought_in_by_negative_feedback_once(tmp_path: Path) -> None:
    ps = load(tmp_path, LATE)
    spans = fixture_spans("otel-openai-v2", "chat_simple")
    trace_id = spans[0].trace_id
    decisions: dict[str, PolicyDecision] = {}
    assert ps.evaluate_trace(spans, decisions=decisions, now=10) == []  # online: no feedback, rate 0
    assert decisions["late"].admitted is False
    st = ps.stats["late"]
    assert (st.sampled, st.not_sampled) == (0, 1)

    # positive feedback: still out
    feedback = [human("thumbs", trace_id, passed=True)]
    assert ps.evaluate_late(spans, feedback, decisions, now=20) == []
    assert (st.sampled, st.not_sampled) == (0, 1)

    feedback.append(human("thumbs_again", trace_id, passed=False))
    late = ps.evaluate_late(spans, feedback, decisions, now=30)
    assert sorted(s.name for s in late) == ["echo", "keyword"]
    assert {(s.trace_id, s.policy, s.source) for s in late} == {(trace_id, "late", "code")}
    assert (st.sampled, st.sampled_always, st.sampled_late, st.not_sampled) == (1, 1, 1, 0)

    # the same keys an online run gives when the feedback is already known
    online = load(tmp_path / "online", LATE).evaluate_trace(spans, feedback=feedback, now=30)
    assert sorted(s.key for s in late) == sorted(s.key for s in online)
    assert sorted((s.name, s.passed) for s in late) == sorted((s.name, s.passed) for s in online)

    # promoted, into the dataset, once
    rows = [json.loads(line) for line in (tmp_path / "datasets" / "regressions.jsonl").read_text().splitlines()]
    assert [r["trace_id"] for r in rows] == [trace_id]
    assert set(rows[0]["metadata"]["scores"]) == {"echo", "keyword"}

    # more negative feedback: nothing runs, counts or is promoted again
    feedback.append(human("stars", trace_id, value=0.0))
    assert ps.evaluate_late(spans, feedback, decisions, now=40) == []
    assert (st.sampled, st.stage_runs["echo"], st.promoted, st.promote_duplicates) == (1, 1, 1, 0)
    [window] = [w for w in ps.windows() if w.name == "echo"]
    assert window.n == 1
    assert ps.policies[0].window.count == 1


def test_an_evaluated_trace_runs_feedback_gated_stages_and_promotes_late(tmp_path: Path) -> None:
    doc = policy_doc(
        "gated",
        cascade=[
            {"ref": "test/echo"},
            {"ref": "test/attribute", "when": "feedback.negative"},
            {"ref": "test/keyword", "params": {"keyword": "x"}, "when": "scores['attribute'].passed == false"},
        ],
        promote={"when": "feedback.negative && scores['attribute'].passed == false", "dataset": "late"},
    )
    ps = load(tmp_path, doc)
    spans = [span("ab" * 16, attributes={"test.value": 0.1, "test.passed": False})]
    decisions: dict[str, PolicyDecision] = {}
    online = ps.evaluate_trace(spans, decisions=decisions, now=0)
    assert [s.name for s in online] == ["echo"]
    st = ps.stats["gated"]
    assert st.when_not_met == {"attribute": 1, "keyword": 1}

    late = ps.evaluate_late(spans, [human("ok", "ab" * 16, passed=False)], decisions, now=1)
    # echo is not run again; attribute now runs, and keyword after it (`scores` sees the late stage)
    assert [s.name for s in late] == ["attribute", "keyword"]
    assert late[1].outcome == "skipped"  # keyword needs output text; the span has none
    assert (st.stage_runs["echo"], st.stage_runs["attribute"], st.stage_runs["keyword"]) == (1, 1, 1)
    assert st.when_not_met == {"attribute": 0, "keyword": 0}
    assert (st.sampled, st.sampled_late) == (1, 0)  # it was evaluated online: not brought in late
    assert ps.policies[0].window.count == 1  # one trace, whatever ran late
    assert st.promote_no_content == 1  # promote.when held; a trace without content is not promoted, once
    assert ps.evaluate_late(spans, [human("ok", "ab" * 16, passed=False)] * 2, decisions, now=2) == []
    assert st.promote_no_content == 1


def test_traces_the_selector_left_out_are_not_remembered(tmp_path: Path) -> None:
    doc = policy_doc(
        "sel", selector="span.service_name == 'chat'", sampling={"rate": 0, "always": ["feedback.negative"]}
    )
    ps = load(tmp_path, doc)
    decisions: dict[str, PolicyDecision] = {}
    ps.evaluate_trace([span("cd" * 16, service_name="billing")], decisions=decisions, now=0)
    assert decisions == {}
