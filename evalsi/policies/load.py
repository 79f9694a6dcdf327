"""Loading OnlineEvalPolicy files: YAML (several documents per file), checked in full before anything runs.

Every problem is reported at once, each as `<file>: <key.path>: message` (`<file>[n]` for the n-th document of a
file holding several): unknown keys, bad values, CEL that does not compile or reads a field its variables do not
have (with a did-you-mean), unknown evaluator refs, params an evaluator refuses, duplicate policy names.
"""

from __future__ import annotations

import difflib
import glob
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from evalsi.cel import ITEM, FieldError
from evalsi.env_vars import unset_variable
from evalsi.evaluators import Evaluator, load_evaluators
from evalsi.evaluators.judge_client import Judges
from evalsi.policies.conditions import (
    ALWAYS_VARIABLES,
    LATENCY,
    SPAN_VARIABLES,
    TRACE_VARIABLES,
    WHEN_VARIABLES,
    AlertRule,
    Condition,
    LatencyAbove,
    compile_alert,
)
from evalsi.policies.engine import PolicySet
from evalsi.policies.model import OnlineEvalPolicy
from evalsi.policies.policy import Policy, Promotion, Stage
from evalsi.policies.promote import dataset_path

__all__ = ["PolicyError", "load_policies", "parse_policy"]

_ENV = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]*)")
_DATASET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class PolicyError(ValueError):
    """Policy files that cannot be used; `errors` lists every problem as `<file>: <key.path>: message`."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


def _path(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc) or "(document)"


def _files(globs: list[str], base_dir: Path, errors: list[str]) -> list[Path]:
    found: dict[Path, None] = {}
    for pattern in globs:
        full = Path(pattern).expanduser()
        full = full if full.is_absolute() else base_dir / full
        if glob.has_magic(str(full)):
            matches = sorted(Path(p) for p in glob.glob(str(full), recursive=True) if Path(p).is_file())
            if not matches:
                errors.append(f"{pattern}: no policy files match")
        elif full.is_file():
            matches = [full]
        else:
            errors.append(f"{pattern}: no such policy file ({full})")
            matches = []
        found.update(dict.fromkeys(matches))
    return list(found)


def _shown(path: Path, base_dir: Path) -> str:
    try:
        return str(path.relative_to(base_dir))
    except ValueError:
        return str(path)


def _cel_error(message: str, source: str, variables: tuple[str, ...]) -> str:
    if "feedback" not in variables and re.search(r"(?<![\w.])feedback\b", source):
        message += (
            " (`feedback` arrives after a trace is selected: use it in sampling.always, a cascade `when` or "
            "promote.when)"
        )
    return message


def _condition(source: Any, variables: tuple[str, ...], where: str, errors: list[str]) -> Condition | None:
    """The compiled condition, or None: when `source` is absent, not text (the shape check reports that) or bad."""
    if not isinstance(source, str) or not source.strip():
        return None
    try:
        return Condition(source, variables)
    except FieldError as e:  # fields the variables do not have (`conditions.SCHEMA`), scores' fields included
        errors.extend(f"{where}: {problem}" for problem in e.problems)
        return None
    except ValueError as e:
        errors.append(f"{where}: {_cel_error(str(e), source, variables)}")
        return None


def _score_ref_errors(condition: Condition, where: str, earlier: list[str], known: bool) -> list[str]:
    """What a condition reads of `scores` that is certainly wrong, beyond the fields no score has (refused as it
    compiles): when `known` (every name the earlier stages can produce is in `earlier`), a name none of them
    produces."""
    if not known:
        return []
    names = [r.path[1] for r in condition.program.reads if r.path[0] == "scores" and r.path[1:2] != (ITEM,)]
    out: list[str] = []
    for name in dict.fromkeys(names):
        shown = f"scores[{name!r}]"
        if name not in earlier:
            if not earlier:
                out.append(
                    f"{where}: reads {shown}, but no stage before it produces scores, so it never holds: move the "
                    "condition to a later stage, or remove it"
                )
            else:
                close = difflib.get_close_matches(name, earlier, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(map(repr, earlier))}"
                out.append(
                    f"{where}: reads {shown}, and no earlier stage of the cascade produces a score by that name "
                    f"(they produce {', '.join(map(repr, earlier))}): {hint}"
                )
    return out


def _produced(raw: dict[str, Any], evaluators: dict[str, Evaluator]) -> list[str] | None:
    """The names a stage's scores go by in later `scores`, or None when its evaluator does not say them statically
    (an evaluator may declare `score_names`): its key (`name:`, else the ref's last part), the ref's last part (its
    skipped and error scores) and the declared names."""
    ref = raw.get("ref")
    ev = evaluators.get(ref) if isinstance(ref, str) else None
    declared = getattr(ev, "score_names", None) if ev is not None else None
    if declared is None or isinstance(declared, str):
        return None
    name = raw.get("name")
    short = ref.rsplit("/", 1)[-1]  # type: ignore[union-attr]
    key = name if isinstance(name, str) and name else short
    return list(dict.fromkeys([key, short, *declared]))


def _params_errors(ev: Evaluator, raw: dict[str, Any], where: str) -> list[str]:
    try:
        ev.params.model_validate(raw)
    except ValidationError as e:
        out = []
        for err in e.errors():
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            loc = ".".join(str(p) for p in err["loc"])
            out.append(f"{where}{'.' + loc if loc else ''}: {msg}")
        return out
    return []


def _stage(
    i: int,
    raw: dict[str, Any],
    evaluators: dict[str, Evaluator],
    label: str,
    errors: list[str],
    keys: dict[str, int],
    earlier: list[str] | None = None,
) -> Stage | None:
    """One cascade stage; `earlier`: every score name the stages before it can produce, or None when some of them
    are not known statically (its `when` is then checked for score fields only)."""
    where = f"{label}: spec.cascade.{i}"
    ref, params = raw.get("ref"), raw.get("params") or {}
    ev = evaluators.get(ref) if isinstance(ref, str) else None
    problems: list[str] = []
    if ev is None and isinstance(ref, str) and ref.strip():
        close = difflib.get_close_matches(ref, list(evaluators), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else " (`evalsi evaluators list` shows them)"
        problems.append(f"{where}.ref: unknown evaluator {ref!r}{hint}")
    if ev is not None:
        if ev.scope not in ("span", "trace", "session"):
            problems.append(f"{where}.ref: {ref} has scope {ev.scope!r}, which online policies cannot run")
        if isinstance(params, dict):
            problems += _params_errors(ev, params, f"{where}.params")
    name = raw.get("name")
    key = name if isinstance(name, str) and name else (ref.rsplit("/", 1)[-1] if isinstance(ref, str) else "")
    if key and key in keys:
        problems.append(
            f"{where}: stage {keys[key]} is already known as {key!r} in `scores`; give one of them a `name:`"
        )
    keys.setdefault(key, i)
    when = _condition(raw.get("when"), WHEN_VARIABLES, f"{where}.when", problems)
    if when is not None:
        problems += _score_ref_errors(when, f"{where}.when", earlier or [], earlier is not None)
    spans = None
    if isinstance(raw.get("spans"), str):
        if ev is not None and ev.scope != "span":
            problems.append(f"{where}.spans: only for span-scope evaluators ({ref} has scope {ev.scope})")
        else:
            condition = _condition(raw["spans"], SPAN_VARIABLES, f"{where}.spans", problems)
            spans = condition.matches_span if condition is not None else None
    errors.extend(problems)
    if problems or ev is None:
        return None
    return Stage(ref, key, ev, ev.params.model_validate(params), when, spans)


def _notify(value: Any, where: str, errors: list[str]) -> str | None:
    if not isinstance(value, str):
        return None
    m = _ENV.fullmatch(value)
    if m is None:
        return value
    resolved = os.environ.get(m.group(1))
    if not resolved:
        errors.append(unset_variable(where, m.group(1)))
    return resolved


def _items(node: Any, key: str) -> list[Any]:
    value = node.get(key) if isinstance(node, dict) else None
    return value if isinstance(value, list) else []


def parse_policy(
    doc: Any,
    label: str,
    evaluators: dict[str, Evaluator],
    errors: list[str],
    *,
    base_dir: Path,
    datasets_dir: Path,
    alert_check_interval: float = 1.0,
) -> Policy | None:
    """Validate and compile one policy document; every problem goes to `errors`, prefixed with `label`.

    The shape (pydantic) and the meaning (CEL, refs, params) are both checked, so one run reports everything.
    """
    if not isinstance(doc, dict):
        errors.append(f"{label}: (document): must be a mapping with apiVersion, kind, metadata and spec")
        return None
    problems: list[str] = []
    model = None
    try:
        model = OnlineEvalPolicy.model_validate(doc)
    except ValidationError as e:
        for err in e.errors():
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            loc = tuple(err["loc"])
            raw_spec = doc.get("spec")
            if loc == ("spec", "window", "length") and not (
                isinstance(raw_spec, dict) and isinstance(raw_spec.get("window"), dict)
            ):
                loc = loc[:2]  # `window: 5m` names no `length`
            problems.append(f"{label}: {_path(loc)}: {msg}")
    # meaning, checked on the raw document so that a shape error elsewhere does not hide it
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    selector = _condition(spec.get("selector"), TRACE_VARIABLES, f"{label}: spec.selector", problems)
    always: list[Condition | LatencyAbove] = []
    for i, text in enumerate(_items(spec.get("sampling"), "always")):
        m = LATENCY.fullmatch(text) if isinstance(text, str) else None
        if m is not None:
            q = float(m.group(1))
            if not 0 < q < 100:
                problems.append(f"{label}: spec.sampling.always.{i}: percentile must be between 0 and 100")
            always.append(LatencyAbove(text, q))
            continue
        condition = _condition(text, ALWAYS_VARIABLES, f"{label}: spec.sampling.always.{i}", problems)
        if condition is not None:
            always.append(condition)
    keys: dict[str, int] = {}
    stages: list[Stage | None] = []
    earlier: list[str] | None = []  # the score names the stages so far produce; None: not known statically
    for i, raw in enumerate(_items(spec, "cascade")):
        if not isinstance(raw, dict):
            earlier = None
            continue
        stages.append(_stage(i, raw, evaluators, label, problems, keys, earlier))
        produced = _produced(raw, evaluators)
        earlier = None if earlier is None or produced is None else list(dict.fromkeys([*earlier, *produced]))
    alerts: list[AlertRule] = []
    for i, raw in enumerate(_items(spec, "alerts")):
        if not isinstance(raw, dict) or not isinstance(raw.get("when"), str):
            continue
        notify = _notify(raw.get("notify"), f"{label}: spec.alerts.{i}.notify", problems)
        try:
            alerts.append(compile_alert(raw["when"], name=raw.get("name"), notify=notify))
        except ValueError as e:
            problems.append(f"{label}: spec.alerts.{i}.when: {e}")
    promote = None
    raw_promote = spec.get("promote")
    if isinstance(raw_promote, dict):
        when = _condition(raw_promote.get("when"), WHEN_VARIABLES, f"{label}: spec.promote.when", problems)
        if when is not None:
            problems += _score_ref_errors(when, f"{label}: spec.promote.when", earlier or [], earlier is not None)
        dataset = raw_promote.get("dataset")
        if isinstance(dataset, str) and dataset.strip():
            if not dataset.endswith(".jsonl") and not _DATASET_NAME.fullmatch(dataset):
                problems.append(
                    f"{label}: spec.promote.dataset: {dataset!r} is neither a dataset name (letters, digits, '.', "
                    "'_', '-') nor a path ending in .jsonl"
                )
            elif when is not None:
                promote = Promotion(when, dataset_path(dataset, datasets_dir, base_dir), dataset)
    errors.extend(problems)
    if problems or model is None:
        return None
    for i, stage in enumerate(stages):
        if stage is not None and hasattr(stage.params, "_id"):  # a judge's budget slot: the same in every process
            stage.params._id = f"{model.metadata.name}#{i}"
    return Policy(
        model.metadata.name,
        stages=[s for s in stages if s is not None],
        selector=selector,
        rate=model.spec.sampling.rate,
        always=always,
        window=model.spec.window.length,
        interval=model.spec.window.interval,
        alerts=alerts,
        promote=promote,
        labels=model.metadata.labels,
        source=label,
        alert_check_interval=alert_check_interval,
    )


def load_policies(
    globs: list[str],
    base_dir: Path,
    *,
    datasets_dir: Path | None = None,
    alert_check_interval: float = 1.0,
    judges: Judges | None = None,
) -> PolicySet:
    """Load every policy the globs (relative to `base_dir`) name; raise PolicyError listing every problem.

    Promoted traces go under `datasets_dir` (default `<base_dir>/.evalsi/datasets`). Alerts are checked at most
    once per `alert_check_interval` seconds per policy while a window is open, and once more when it closes.
    `judges` is the judge runtime the policies' judge-based evaluators use (None: they are skipped).
    """
    base_dir = Path(base_dir)
    datasets_dir = datasets_dir if datasets_dir is not None else base_dir / ".evalsi" / "datasets"
    errors: list[str] = []
    files = _files(globs, base_dir, errors)
    evaluators = load_evaluators() if files else {}
    policies: list[Policy] = []
    defined: dict[str, str] = {}
    for path in files:
        shown = _shown(path, base_dir)
        try:
            docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        except OSError as e:
            errors.append(f"{shown}: cannot read: {e.strerror or e}")
            continue
        except yaml.YAMLError as e:
            errors.append(f"{shown}: invalid YAML: {' '.join(str(e).split())}")
            continue
        present = [(n, d) for n, d in enumerate(docs, 1) if d is not None]
        for n, doc in present:
            label = f"{shown}[{n}]" if len(present) > 1 else shown
            policy = parse_policy(
                doc, label, evaluators, errors, base_dir=base_dir, datasets_dir=datasets_dir,
                alert_check_interval=alert_check_interval,
            )  # fmt: skip
            if policy is None:
                continue
            if policy.name in defined:
                first = defined[policy.name]
                errors.append(f"{label}: metadata.name: policy {policy.name!r} is also defined in {first}")
                continue
            defined[policy.name] = label
            policies.append(policy)
    if errors:
        raise PolicyError(errors)
    return PolicySet(policies, datasets_dir=datasets_dir, sources=[str(p) for p in files], judges=judges)
