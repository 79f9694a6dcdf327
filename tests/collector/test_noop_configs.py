"""Configs where a component would silently do nothing are refused, each error naming its key path and the fix:
`evaluate` with nothing assembling traces before it, scores with no scores pipeline to take them, a policy `when`
reading a score field (or a score name) that cannot exist, a `redact` with no rule, a `tail_sampling` whose policies
never sample."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from running_collector import EVALSI

from evalsi.collector.config import ConfigError, parse_config
from evalsi.evaluators import load_evaluators
from evalsi.policies.load import parse_policy

BASE: dict[str, Any] = {
    "receivers": {"otlp": {}},
    "processors": {"normalize": {}, "tail_sampling": {}, "evaluate": {"policies": ["base.yaml"]}},
    "exporters": {"clickhouse": {}},
    "service": {
        "pipelines": {
            "traces": {
                "receivers": ["otlp"],
                "processors": ["normalize", "tail_sampling", "evaluate"],
                "exporters": ["clickhouse"],
            },
            "scores": {"exporters": ["clickhouse"]},
        }
    },
}


def config(**changes: Any) -> dict[str, Any]:
    """BASE (a valid evaluating config) with `changes`: `traces`/`scores` replace a pipeline (None removes it),
    anything else replaces a processor's settings."""
    doc = copy.deepcopy(BASE)
    pipelines = doc["service"]["pipelines"]
    for key, value in changes.items():
        if key in ("traces", "scores"):
            if value is None:
                pipelines.pop(key)
            else:
                pipelines[key] = value
        else:
            doc["processors"][key] = value
    return doc


@pytest.fixture(autouse=True)
def _in_a_directory_with_a_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BASE's policy file, in the directory relative policy paths are read from (no base_dir: the working one)."""
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(policy([LATENCY])))
    monkeypatch.chdir(tmp_path)


def errors_of(doc: dict[str, Any], base_dir: Path | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(doc, base_dir=base_dir)
    return info.value.errors


def test_the_base_config_is_valid() -> None:
    parse_config(config())


# --- 1. evaluate needs trace assembly before it ---------------------------------------------------------------


def test_evaluate_without_tail_sampling_before_it_is_refused() -> None:
    traces = {"receivers": ["otlp"], "processors": ["normalize", "evaluate"], "exporters": ["clickhouse"]}
    [error] = errors_of(config(traces=traces))
    assert error.startswith("service.pipelines.traces.processors.1: processor 'evaluate' acts on trace batches")
    assert "put tail_sampling before it" in error
    traces["processors"] = ["normalize", "evaluate", "tail_sampling"]  # after it is no better
    [error] = errors_of(config(traces=traces))
    assert error.startswith("service.pipelines.traces.processors.1:")
    traces["processors"] = ["normalize", "tail_sampling", "evaluate"]
    parse_config(config(traces=traces))


# --- 2. scores need a scores pipeline ----------------------------------------------------------------------------


def test_evaluate_without_a_scores_pipeline_is_refused() -> None:
    [error] = errors_of(config(scores=None))
    assert error.startswith("service.pipelines.traces.processors.2: processor 'evaluate' produces scores")
    assert 'add `scores: {exporters: ["clickhouse"]}`' in error
    assert '`scores: {processors: ["evaluate"], exporters: ["clickhouse"]}`' in error


@pytest.mark.parametrize(
    "scores",
    [{"exporters": ["clickhouse"]}, {"processors": ["evaluate"], "exporters": ["clickhouse"]}],
    ids=["exporters-only", "evaluate-listed"],
)
def test_either_scores_pipeline_shape_is_accepted(scores: dict[str, Any]) -> None:
    parse_config(config(scores=scores))


def test_evaluate_in_a_logs_pipeline_only_needs_a_scores_pipeline_too() -> None:
    doc = config(scores=None, evaluate={})  # external evaluations need no policies
    doc["processors"].pop("tail_sampling")
    doc["service"]["pipelines"]["traces"]["processors"] = ["normalize"]
    logs = {"receivers": ["otlp"], "processors": ["evaluate"], "exporters": ["clickhouse"]}
    doc["service"]["pipelines"]["logs"] = logs
    [error] = errors_of(doc)
    assert error.startswith("service.pipelines.logs.processors.0: processor 'evaluate' produces scores")
    doc["service"]["pipelines"]["scores"] = {"exporters": ["clickhouse"]}
    parse_config(doc)


def test_evaluate_with_no_policies_in_a_traces_pipeline_is_refused() -> None:
    [error] = errors_of(config(evaluate={}))
    assert error.startswith("service.pipelines.traces.processors.2: processor 'evaluate' has no policies")
    assert 'add `policies: ["policies/*.yaml"]` to processors.evaluate' in error
    parse_config(config(evaluate={"policies": ["base.yaml"]}))


def test_a_config_without_evaluate_needs_no_scores_pipeline() -> None:
    parse_config(
        {
            "receivers": {"otlp": {}},
            "exporters": {"clickhouse": {}},
            "service": {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}}},
        }
    )


# --- 3. policy conditions reading scores ------------------------------------------------------------------------


def policy(cascade: list[dict[str, Any]], promote: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"cascade": cascade}
    if promote is not None:
        spec["promote"] = promote
    return {"apiVersion": "evals.si/v1alpha1", "kind": "OnlineEvalPolicy", "metadata": {"name": "p"}, "spec": spec}


LATENCY = {"ref": "builtin/latency", "params": {"max_ms": 100}}


def cascade_with(when: str) -> list[dict[str, Any]]:
    return [LATENCY, {"ref": "builtin/json-valid", "when": when}]


def policy_errors(doc: dict[str, Any], evaluators: dict[str, Any] | None = None) -> list[str]:
    errors: list[str] = []
    parse_policy(doc, "p.yaml", evaluators or load_evaluators(), errors, base_dir=Path("."), datasets_dir=Path("."))
    return errors


def test_a_typo_in_a_score_field_is_refused_through_the_config(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(policy(cascade_with("scores['latency'].passd"))))
    [error] = errors_of(config(evaluate={"policies": ["p.yaml"]}), base_dir=tmp_path)
    assert error.startswith("processors.evaluate:")
    assert (
        "p.yaml: spec.cascade.1.when: scores['latency'].passd: a score has no field 'passd': did you mean 'passed'?"
        in error
    )
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(policy(cascade_with("scores['latency'].passed"))))
    parse_config(config(evaluate={"policies": ["p.yaml"]}), base_dir=tmp_path)


@pytest.mark.parametrize(
    "when",
    [
        "scores.latency.vlaue > 3.0",
        'scores["latency"].outcom == "scored"',
        "scores['latency'].passed && scores['latency'].reasn == ''",
    ],
)
def test_unknown_score_fields_are_refused(when: str) -> None:
    [error] = policy_errors(policy(cascade_with(when)))
    assert error.startswith("p.yaml: spec.cascade.1.when: scores['latency'].")
    assert "did you mean" in error


def test_a_typo_in_promote_when_is_refused() -> None:
    [error] = policy_errors(policy([LATENCY], promote={"when": "scores.latency.lable == 'x'", "dataset": "d"}))
    assert (
        error
        == "p.yaml: spec.promote.when: scores['latency'].lable: a score has no field 'lable': did you mean 'label'?"
    )


def test_the_first_stage_reading_scores_is_refused() -> None:
    doc = policy([{"ref": "builtin/json-valid", "when": "scores['latency'].passed"}, LATENCY])
    [error] = policy_errors(doc)
    assert error.startswith("p.yaml: spec.cascade.0.when: reads scores['latency'], but no stage before it")


@pytest.mark.parametrize(
    "when",
    [
        "scores['latency'].passed",
        "scores.latency.value > 3.0 && scores.latency.n == 1",
        "scores['latency'].outcome == 'scored' || scores['latency'].reason == 'x' || scores['latency'].label == 'y'",
        "scores.exists(k, k == 'latency')",  # a macro, not a score name
        "'latency' in scores && has(scores.latency)",
        "trace.service_name == \"scores['x'].nope\"",  # in a string
        "scores['other'].passed",  # an evaluator's score names are not known statically: not flagged
    ],
)
def test_what_may_be_right_is_not_flagged(when: str) -> None:
    assert policy_errors(policy(cascade_with(when))) == []


class _Declared:
    """An evaluator that declares the names of its scores (`score_names`)."""

    def __init__(self, inner: Any, names: tuple[str, ...]) -> None:
        self._inner = inner
        self.score_names = names

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_score_name_no_earlier_stage_produces_is_refused_when_every_name_is_known() -> None:
    evaluators = dict(load_evaluators())
    evaluators["test/declared"] = _Declared(evaluators["builtin/latency"], ("latency_ms",))
    cascade = [{"ref": "test/declared", "params": {"max_ms": 100}}, {"ref": "builtin/json-valid", "when": ""}]
    cascade[1]["when"] = "scores['latency_m'].passed"
    [error] = policy_errors(policy(cascade), evaluators)
    assert error.startswith("p.yaml: spec.cascade.1.when: reads scores['latency_m'], and no earlier stage")
    assert error.endswith("did you mean 'latency_ms'?")
    for name in ("latency_ms", "declared"):  # a declared name, the stage's key
        cascade[1]["when"] = f"scores['{name}'].passed"
        assert policy_errors(policy(cascade), evaluators) == []


# --- 4. components with nothing to do ----------------------------------------------------------------------------


def test_a_redact_with_no_rule_is_refused() -> None:
    doc = config(redact={"default_rules": []})
    doc["service"]["pipelines"]["traces"]["processors"] = ["normalize", "redact", "tail_sampling", "evaluate"]
    [error] = errors_of(doc)
    assert error.startswith("processors.redact: redact has no rule")
    assert "remove default_rules: []" in error
    for fixed in ({}, {"default_rules": ["email"]}, {"default_rules": [], "blocked_values": ["x+"]}):
        doc["processors"]["redact"] = fixed
        parse_config(doc)


@pytest.mark.parametrize(
    "policies",
    [
        [{"name": "d", "type": "drop", "drop": {"drop_sub_policy": [{"name": "e", "type": "always_sample"}]}}],
        [{"name": "none", "type": "probabilistic", "probabilistic": {"sampling_percentage": 0}}],
    ],
    ids=["drop-only", "zero-percent"],
)
def test_a_tail_sampling_that_never_samples_is_refused(policies: list[dict[str, Any]]) -> None:
    [error] = errors_of(config(tail_sampling={"policies": policies}))
    assert error.startswith("processors.tail_sampling.policies: no policy can ever sample a trace")
    assert "add a policy that samples" in error
    parse_config(config(tail_sampling={"policies": [*policies, {"name": "all", "type": "always_sample"}]}))
    parse_config(config(tail_sampling={"policies": []}))  # none: every trace is sampled


# --- end to end ---------------------------------------------------------------------------------------------------


def test_evalsi_validate_names_the_key_path_and_the_fix(tmp_path: Path) -> None:
    doc = config(scores=None, evaluate={"policies": ["p.yaml"]})
    doc["service"]["pipelines"]["traces"]["processors"] = ["normalize", "evaluate"]
    doc["service"]["workers"] = 1
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(policy(cascade_with("scores['latency'].passd"))))
    path = tmp_path / "evalsi.yaml"
    path.write_text(yaml.safe_dump(doc))

    def validate() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*EVALSI, "validate", "-c", str(path)], capture_output=True, text=True, cwd=tmp_path, timeout=120
        )

    res = validate()
    assert res.returncode == 1, res.stdout + res.stderr
    assert "service.pipelines.traces.processors.1: processor 'evaluate' acts on trace batches" in res.stderr
    assert "put tail_sampling before it" in res.stderr
    assert "service.pipelines.traces.processors.1: processor 'evaluate' produces scores" in res.stderr
    assert 'add `scores: {exporters: ["clickhouse"]}`' in res.stderr
    assert "spec.cascade.1.when: scores['latency'].passd: a score has no field 'passd': did you mean 'passed'?" in (
        res.stderr
    )

    (tmp_path / "p.yaml").write_text(yaml.safe_dump(policy(cascade_with("scores['latency'].passed"))))
    path.write_text(yaml.safe_dump(config(evaluate={"policies": ["p.yaml"]})))
    res = validate()
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("OK:")
