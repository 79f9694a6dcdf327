"""The `judge-calibration` section of a run: where the dataset carries people's verdicts on its tasks
(`reference.labels`: score name -> verdict), each evaluator's verdicts against them (Cohen's kappa, sensitivity,
specificity, the prediction-powered pass rate; `evalsi.policies.calibration`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from evalsi.model.score import Score
from evalsi.policies.calibration import calibrate
from evalsi.policies.feedback import verdict

__all__ = ["run_calibration", "task_labels"]


def task_labels(reference: Any) -> dict[str, bool]:
    """People's verdicts of a task: `reference.labels`, each a verdict (true/false), a number (below 0.5 fails) or a
    label (`pass`, `fail`, `thumbs_down`, ... as feedback reads them); others are left out."""
    raw = reference.get("labels") if isinstance(reference, dict) else None
    if not isinstance(raw, dict):
        return {}
    out = {}
    for name, value in raw.items():
        score = Score(str(name))
        if isinstance(value, bool):
            score.passed = value
        elif isinstance(value, int | float):
            score.value = float(value)
        elif isinstance(value, str):
            score.label = value
        found = verdict(score)
        if found is not None:
            out[str(name)] = found
    return out


def run_calibration(tasks: Iterable[Any], scores: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (evaluator, score name) that people labeled some tasks for: its scored verdicts on labeled tasks against
    the labels (every trial), and its verdicts on the other tasks for the prediction-powered rate. Empty when the
    dataset carries no labels."""
    labels = {t.id: found for t in tasks if (found := task_labels(getattr(t, "reference", None)))}
    if not labels:
        return []
    named = {name for found in labels.values() for name in found}
    groups: dict[tuple[str, str], tuple[list[tuple[bool, bool]], list[bool]]] = {}
    for s in scores:
        if s.get("outcome") != "scored" or s.get("passed") is None or s["name"] not in named:
            continue
        pairs, unlabeled = groups.setdefault((s.get("evaluator") or "", s["name"]), ([], []))
        human = labels.get(s["task_id"], {}).get(s["name"])
        if human is None:
            unlabeled.append(bool(s["passed"]))
        else:
            pairs.append((bool(s["passed"]), human))
    out = []
    for (evaluator, name), (pairs, unlabeled) in sorted(groups.items()):
        if pairs:
            found = calibrate("", evaluator, name, pairs, (sum(unlabeled), len(unlabeled)), feedback="labels")
            out.append(found.as_dict())
    return out
