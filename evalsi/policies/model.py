"""The OnlineEvalPolicy file format (`apiVersion: evals.si/v1alpha1`): what a policy file may say, as pydantic models.

The models check shape only (types, ranges, unknown keys); `load.py` checks meaning: CEL compiles, refs exist,
params are valid for their evaluator.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evalsi.duration import Duration

API_VERSION = "evals.si/v1alpha1"
KIND = "OnlineEvalPolicy"

_NAME = re.compile(r"[a-z0-9]([a-z0-9._-]{0,251}[a-z0-9])?")
_URL = re.compile(r"https?://[^\s/]+\S*")
_ENV = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]*)")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _nonempty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


class Metadata(_Strict):
    name: str
    """The policy's name: lowercase letters, digits, `-`, `_`, `.`; unique among the loaded policies."""
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a policy name: use lowercase letters, digits, '-', '_' and '.' "
                "(starting and ending with a letter or digit)"
            )
        return value


class Sampling(_Strict):
    rate: float = Field(1.0, ge=0, le=1)
    """The share of selected traces to evaluate, decided by a hash of the trace id (every replica agrees)."""
    always: list[str] = Field(default_factory=list)
    """Conditions that evaluate a selected trace whatever the rate: CEL, or the shorthand `latency > p95`."""


class Stage(_Strict):
    ref: str
    """The evaluator, e.g. `builtin/contains`."""
    params: dict[str, Any] = Field(default_factory=dict)
    when: str | None = None
    """CEL: run this stage only when true; sees `scores` of the earlier stages."""
    name: str | None = None
    """The key this stage's scores are known by in later `scores[...]` (default: the ref's last part)."""
    spans: str | None = None
    """Span-scope evaluators only, CEL over `span`: the spans to run on (default: LLM calls)."""

    @field_validator("ref")
    @classmethod
    def _ref(cls, value: str) -> str:
        return _nonempty(value)


class Alert(_Strict):
    name: str | None = None
    """What the notification calls this alert (default: the condition text)."""
    when: str
    """CEL over the window's aggregates: `mean('name')`, `rate('name')`, `count`, `count('name')`, `p95('name')`,
    `low('name')`, `high('name')`, `regressed('name', baseline: '7d', margin: 0.02)`."""
    notify: str | None = None
    """A webhook URL (http or https) that gets a JSON POST, or `env:VAR` naming one; without it the alert is only
    recorded."""

    @field_validator("notify")
    @classmethod
    def _notify(cls, value: str | None) -> str | None:
        if value is None or _ENV.fullmatch(value):
            return value
        if not _URL.fullmatch(value):
            raise ValueError(f"{value!r} is not a webhook URL (http:// or https://) nor env:VAR")
        return value


class Promote(_Strict):
    when: str
    """CEL over the trace and this policy's `scores`: traces where it holds are appended to the dataset."""
    dataset: str
    """A dataset name (`<datasets dir>/<name>.jsonl`) or a path ending in `.jsonl`."""

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str) -> str:
        return _nonempty(value)


class Window(_Strict):
    """`window: 5m`, or with options `window: {length: 5m, interval: anytime}`."""

    length: Duration = 300.0
    """Tumbling window of the aggregates and alerts (default 5m)."""
    interval: Literal["fixed", "anytime"] = "fixed"
    """`fixed`: intervals valid for one look (Wilson, t); `anytime`: confidence sequences for pass rates and values
    within [0, 1], valid however often the alerts look (docs/policies.md, *Which interval*)."""

    @model_validator(mode="before")
    @classmethod
    def _length_alone(cls, value: Any) -> Any:
        return value if isinstance(value, dict) else {"length": value}

    @field_validator("length")
    @classmethod
    def _length(cls, value: float) -> float:
        if value < 1:
            raise ValueError("must be at least 1s")
        return value


class Spec(_Strict):
    selector: str | None = None
    """CEL: the traces this policy looks at (default: every trace)."""
    sampling: Sampling = Field(default_factory=Sampling)
    cascade: list[Stage] = Field(min_length=1)
    window: Window = Field(default_factory=Window)
    """Tumbling window of the aggregates and alerts (default 5m), and its intervals."""
    alerts: list[Alert] = Field(default_factory=list)
    promote: Promote | None = None


class OnlineEvalPolicy(_Strict):
    apiVersion: Literal["evals.si/v1alpha1"]
    kind: Literal["OnlineEvalPolicy"]
    metadata: Metadata
    spec: Spec
