"""The config keys of windows read from the store, Alertmanager and promotion into the store: typed, unknown keys
refused, and a setting that has no store to work with an error naming its key and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_config import errors_of, write

from evalsi.collector.config import load_config

POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: quality}
spec:
  cascade: [{ref: builtin/latency, params: {max_ms: 1000}}]
  alerts:
    - when: count >= 10
      notify: http://hooks.example/alert
  promote: {when: "true", dataset: slow}
"""


def _config(tmp_path: Path, evaluate: dict[str, Any], *, scores: bool = True) -> dict[str, Any]:
    (tmp_path / "policy.yaml").write_text(POLICY)
    pipelines: dict[str, Any] = {
        "traces": {"receivers": ["otlp"], "processors": ["tail_sampling", "evaluate"], "exporters": ["clickhouse"]},
    }
    if scores:
        pipelines["scores"] = {"exporters": ["clickhouse"]}
    else:
        pipelines["scores"] = {"exporters": ["prometheus"]}
    return {
        "receivers": {"otlp": None},
        "processors": {"tail_sampling": {}, "evaluate": {"policies": ["policy.yaml"], **evaluate}},
        "exporters": {"clickhouse": None, "prometheus": None},
        "service": {"pipelines": pipelines},
    }


def test_store_windows_and_promotion_need_a_store_in_the_scores_pipeline(tmp_path: Path) -> None:
    evaluate = {"windows": {"scope": "store"}, "alertmanager": {"url": "http://am:9093"}, "promote_to": "store"}
    assert load_config(write(tmp_path, _config(tmp_path, evaluate))).components  # valid
    errors = errors_of(tmp_path, _config(tmp_path, evaluate, scores=False))
    assert any(e.startswith("processors.evaluate.windows.scope: `store` reads") and "scope: process" in e
               for e in errors), errors  # fmt: skip
    assert any(e.startswith("processors.evaluate.promote_to: `store`") and "promote_to: files" in e for e in errors)


def test_store_windows_with_webhooks_and_no_alertmanager_is_refused(tmp_path: Path) -> None:
    errors = errors_of(tmp_path, _config(tmp_path, {"windows": {"scope": "store"}}))
    assert len(errors) == 1 and errors[0].startswith("processors.evaluate: "), errors
    assert "each would call the `notify` webhooks of quality" in errors[0] and "alertmanager: {url" in errors[0]


def test_unknown_and_bad_keys_are_named(tmp_path: Path) -> None:
    evaluate = {
        "windows": {"scope": "cluster", "poll": "1s"},
        "alertmanager": {"url": "alertmanager:9093", "timeout": "0s", "labels": {}},
    }
    errors = errors_of(tmp_path, _config(tmp_path, evaluate))
    keys = {e.split(":", 1)[0] for e in errors}
    assert {
        "processors.evaluate.windows.scope", "processors.evaluate.windows.poll", "processors.evaluate.alertmanager.url",
        "processors.evaluate.alertmanager.timeout", "processors.evaluate.alertmanager.labels",
    } <= keys, errors  # fmt: skip
