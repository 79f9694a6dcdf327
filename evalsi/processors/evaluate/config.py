"""The `evaluate` processor's configuration: the policy files, the evaluation queue's bound and overload mode, the
late-feedback buffer and the wait for duplicate model calls; and loading the policy set the config names."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from evalsi.component import ComponentConfig
from evalsi.duration import Duration
from evalsi.evaluators.judge_client import Judges
from evalsi.policies import PolicyError, PolicySet, load_policies
from evalsi.replicas import ReplicasConfig


class LateSignalsConfig(ComponentConfig):
    """How long completed traces stay at hand for feedback that arrives after them."""

    window: Duration = 900.0
    """A completed trace stays buffered this long (default 15m); feedback after it is counted as unmatched."""
    max_traces: int = Field(default=5_000, ge=0)
    """Buffered traces at most; past it the oldest leaves early. 0 turns the late path off. A buffered trace costs
    about 3-4 KB per span of the fixture captures, more with long messages (benchmarks/late_signals.py)."""
    negative_below: float = 0.5
    """A numeric feedback value below this is `feedback.negative`, at or above it `feedback.positive`."""


class DuplicateCallsConfig(ComponentConfig):
    """A model call a vendor SDK and an instrumentation both record, in two traces (no span of the app around the
    call: docs/conventions.md, "Duplicate model calls"): both wait here for each other, to be evaluated as one."""

    wait: Duration = 2.0
    """How long a vendor SDK's lone call (one span, a trace of its own), or a trace whose root is an instrumentation's
    call to a provider whose SDK records its own spans (Anthropic), waits for its twin before it is evaluated alone.
    A pair is evaluated as soon as both are here; every other trace never waits. 0 evaluates each trace at once,
    alone: a call recorded in two traces then counts twice."""
    max_traces: int = Field(default=10_000, gt=0)
    """Traces waiting for a twin at most; past it the oldest is evaluated alone at once."""


class CalibrationConfig(ComponentConfig):
    """How often judge calibration (judges against people's feedback) is read from the store for the metrics."""

    every: Duration = 60.0
    """Read the store this often (default 1m)."""
    over: Duration = 7 * 86_400.0
    """The judge verdicts of this long back (default 7d), with people's feedback on the same traces."""

    @field_validator("every", "over")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be longer than 0s")
        return value
class WindowsConfig(ComponentConfig):
    """Where the policies' windows (their aggregates, intervals and alerts) are computed."""

    scope: Literal["process", "store"] = "process"
    """`process`: over the traces this process evaluated (one machine). `store`: over every replica's scores, read
    from the store (`evalsi_scores FINAL`) per project and policy every `poll_interval`, so several replicas writing
    one ClickHouse agree on each window (docs/scale-out.md); pair it with `alertmanager`, which turns the same
    crossing sent by every replica into one notification."""
    poll_interval: Duration = Field(default=5.0, gt=0)
    """With `scope: store`: how often each policy's current window is read from the store and its alerts checked."""
    settle: Duration = Field(default=2.0, ge=0)
    """With `scope: store`: how long after its end a window is read a last time and closed, so the replicas' last
    writes (their `flush_interval`) are in it."""


class AlertmanagerConfig(ComponentConfig):
    """Alerts sent to an Alertmanager (API v2) instead of the policies' `notify` webhooks."""

    url: str = Field(pattern=r"^https?://[^\s/]+\S*$")
    """The Alertmanager's base URL, e.g. `http://alertmanager:9093` (alerts go to `<url>/api/v2/alerts`)."""
    timeout: Duration = Field(default=5.0, gt=0)
    """One request's timeout."""
    resend_interval: Duration = Field(default=30.0, gt=0)
    """A firing alert is sent again this often, with `endsAt` four intervals ahead: Alertmanager resolves it by
    itself if no replica sends it any more."""
    generator_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+\S*$")
    """The `generatorURL` of every alert (e.g. your evalsi API or dashboard)."""


class EvaluateConfig(ComponentConfig):
    policies: list[str] = Field(default_factory=list)
    """Globs of OnlineEvalPolicy files, relative to the config file's directory (the working directory when
    there is no file)."""
    project: str = "default"
    datasets_dir: str = ".evalsi/datasets"
    """Where `promote` appends its JSONL datasets (`promote_to: files`)."""
    promote_to: Literal["files", "store"] = "files"
    """`files`: JSONL files under `datasets_dir` (one machine). `store`: the store's `evalsi_datasets` table, one row
    per project, dataset and trace whichever replica promoted it (`evalsi datasets list/export`)."""
    queue_size: int = Field(default=1_000, gt=0)
    """Completed traces waiting for (or in) evaluation at most; past it, `overload` says what happens. Under load it
    bounds score freshness: traces waiting / traces evaluated per second."""
    overload: Literal["backpressure", "shed"] = "backpressure"
    """With `queue_size` traces waiting: `backpressure` refuses more (tail sampling keeps them, and past its own
    limits the receivers answer 429/503 with Retry-After), `shed` leaves the trace out of evaluation, counted in
    `evalsi_evaluate_traces_shed_total` and in each policy's window (`shed`), so its intervals say what they miss."""
    late_signals: LateSignalsConfig = Field(default_factory=LateSignalsConfig)
    """The buffer of recent traces for policies that read `feedback` (only those policies' selected traces)."""
    duplicate_calls: DuplicateCallsConfig = Field(default_factory=DuplicateCallsConfig)
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    """Judge calibration metrics (`evalsi_judge_kappa`, ...), read from the store."""
    """Traces that may record a call another trace records too wait briefly for each other."""
    replicas: ReplicasConfig | None = None
    """This evalsi as one of several replicas sharing one store (docs/scale-out.md): judge budgets and rate limits
    hold across them, and each session is evaluated once, by the replica that owns it. None: one replica owns
    every budget and every session."""

    windows: WindowsConfig = Field(default_factory=WindowsConfig)
    """Where the policies' windows and alerts are computed: this process, or the store (every replica's scores)."""
    alertmanager: AlertmanagerConfig | None = None
    """Send alerts to this Alertmanager (deduplicated across replicas, grouped, silenced and routed there) instead of
    the policies' `notify` webhooks."""

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @model_validator(mode="after")
    def _policies_load(self, info: ValidationInfo) -> EvaluateConfig:
        base_dir = (info.context or {}).get("base_dir")
        if base_dir is not None:
            self._base_dir = Path(base_dir)
        # `evalsi validate` checks policy files too: CEL compiles, refs exist, params are valid
        policies = load_policy_set(self)
        if self.windows.scope == "store" and self.alertmanager is None:
            hooks = sorted({p.name for p in policies.policies for a in p.window.alerts if a.notify})
            if hooks:
                raise ValueError(
                    f"windows.scope: store evaluates every replica's window in each replica, so each would call the "
                    f"`notify` webhooks of {', '.join(hooks)}: set `alertmanager: {{url: ...}}` (it turns the same "
                    "alert from several replicas into one notification), or use scope: process"
                )
        return self


def load_policy_set(config: EvaluateConfig, judges: Judges | None = None) -> PolicySet:
    """The policies `config` names, with `judges` as their judge runtime; a file that fails raises `ValueError`
    naming it."""
    try:
        return load_policies(config.policies, config._base_dir, datasets_dir=Path(config.datasets_dir), judges=judges)
    except PolicyError as e:
        raise ValueError(str(e)) from None
