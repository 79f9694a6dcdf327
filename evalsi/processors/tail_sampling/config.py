"""The tail_sampling config: the OTel Collector tail sampler's keys and policy vocabulary, plus `cel` and sessions."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from evalsi import cel
from evalsi.component import ComponentConfig
from evalsi.duration import Duration

PolicyType = Literal[
    "always_sample",
    "status_code",
    "latency",
    "string_attribute",
    "numeric_attribute",
    "boolean_attribute",
    "probabilistic",
    "rate_limiting",
    "span_count",
    "cel",
    "and",
    "drop",
    "composite",
]

# the field holding each policy type's own block (`and` is a Python keyword: the field is `and_`)
_FIELD = {t: ("and_" if t == "and" else t) for t in PolicyType.__args__ if t != "always_sample"}  # type: ignore[attr-defined]


class LatencyConfig(ComponentConfig):
    threshold_ms: int = Field(ge=0)
    """Sample traces lasting at least this long (earliest span start to latest span end)."""
    upper_threshold_ms: int = Field(default=0, ge=0)
    """0: no upper bound; else sample when threshold_ms < duration <= upper_threshold_ms."""

    @model_validator(mode="after")
    def _bounds(self) -> LatencyConfig:
        if self.upper_threshold_ms and self.upper_threshold_ms <= self.threshold_ms:
            raise ValueError("upper_threshold_ms must be greater than threshold_ms (or 0 for no upper bound)")
        return self


class StatusCodeConfig(ComponentConfig):
    status_codes: list[Literal["OK", "ERROR", "UNSET"]] = Field(min_length=1)


class StringAttributeConfig(ComponentConfig):
    key: str = Field(min_length=1)
    """A span or resource attribute, or a canonical field (`model`, `step_type`, ...; see the docs)."""
    values: list[str] = Field(min_length=1)
    enabled_regex_matching: bool = False
    """Values are regular expressions, matched anywhere in the value (as Go's MatchString does)."""
    cache_max_size: int = Field(default=0, ge=0)
    """Regex results remembered per distinct value (0: a default of 10,000)."""
    invert_match: bool = False
    """Sample when no span or resource has the key with a matching value (the key missing included)."""

    @model_validator(mode="after")
    def _patterns(self) -> StringAttributeConfig:
        if self.enabled_regex_matching:
            for i, value in enumerate(self.values):
                try:
                    re.compile(value)
                except re.error as e:
                    raise ValueError(f"values.{i}: invalid regular expression {value!r}: {e}") from None
        return self


class NumericAttributeConfig(ComponentConfig):
    key: str = Field(min_length=1)
    min_value: float | None = None
    max_value: float | None = None
    invert_match: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> NumericAttributeConfig:
        if self.min_value is None and self.max_value is None:
            raise ValueError("set min_value, max_value or both")
        if self.min_value is not None and self.max_value is not None and self.min_value > self.max_value:
            raise ValueError("min_value must not be greater than max_value")
        return self


class BooleanAttributeConfig(ComponentConfig):
    key: str = Field(min_length=1)
    value: bool
    invert_match: bool = False


class ProbabilisticConfig(ComponentConfig):
    sampling_percentage: float = Field(ge=0)
    """Percent of trace ids sampled; 100 or more samples all."""
    hash_salt: str = ""
    """Salt of the FNV-1a trace id hash (empty: the Collector's default, so both decide alike)."""


class RateLimitingConfig(ComponentConfig):
    spans_per_second: int = Field(gt=0)
    """Token bucket of spans refilled at this rate, holding up to twice it; a trace takes as many as it has spans."""


class SpanCountConfig(ComponentConfig):
    min_spans: int = Field(default=0, ge=0)
    max_spans: int = Field(default=0, ge=0)
    """0: no upper bound."""

    @model_validator(mode="after")
    def _bounds(self) -> SpanCountConfig:
        if self.max_spans and self.max_spans < self.min_spans:
            raise ValueError("max_spans must not be less than min_spans (or 0 for no upper bound)")
        return self


class CelConfig(ComponentConfig):
    condition: str
    """A CEL expression over `trace` (see evalsi/cel.py); true samples the trace."""

    @field_validator("condition")
    @classmethod
    def _compiles(cls, condition: str) -> str:
        cel.compile(condition, variables=("trace",), schema=cel.SCHEMA)
        return condition


class AndConfig(ComponentConfig):
    and_sub_policy: list[PolicyConfig] = Field(min_length=1)


class DropConfig(ComponentConfig):
    drop_sub_policy: list[PolicyConfig] = Field(min_length=1)


class RateAllocationConfig(ComponentConfig):
    policy: str
    percent: float = Field(ge=0, le=100)
    """Share of max_total_spans_per_second; 0: an equal share (max_total / number of sub-policies)."""


class CompositeConfig(ComponentConfig):
    max_total_spans_per_second: int = Field(gt=0)
    policy_order: list[str] = Field(default_factory=list)
    """Sub-policy names in evaluation order; empty: the order of composite_sub_policy."""
    composite_sub_policy: list[PolicyConfig] = Field(min_length=1)
    rate_allocation: list[RateAllocationConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names(self) -> CompositeConfig:
        names = [p.name for p in self.composite_sub_policy]
        _unique(names, "composite_sub_policy")
        for key, referenced in (
            ("policy_order", self.policy_order),
            ("rate_allocation", [a.policy for a in self.rate_allocation]),
        ):
            unknown = [n for n in referenced if n not in names]
            if unknown:
                raise ValueError(f"{key} names unknown sub-policies {unknown}; composite_sub_policy has {names}")
        if self.policy_order:
            _unique(self.policy_order, "policy_order")
            missing = [n for n in names if n not in self.policy_order]
            if missing:
                raise ValueError(f"policy_order leaves out sub-policies {missing}")
        if sum(a.percent for a in self.rate_allocation) > 100:
            raise ValueError("rate_allocation percents add up to more than 100")
        return self


class PolicyConfig(ComponentConfig):
    """One policy: `name`, `type`, and the block named after the type (none for always_sample)."""

    name: str = Field(min_length=1)
    type: PolicyType
    latency: LatencyConfig | None = None
    status_code: StatusCodeConfig | None = None
    string_attribute: StringAttributeConfig | None = None
    numeric_attribute: NumericAttributeConfig | None = None
    boolean_attribute: BooleanAttributeConfig | None = None
    probabilistic: ProbabilisticConfig | None = None
    rate_limiting: RateLimitingConfig | None = None
    span_count: SpanCountConfig | None = None
    cel: CelConfig | None = None
    and_: AndConfig | None = Field(default=None, alias="and")
    drop: DropConfig | None = None
    composite: CompositeConfig | None = None

    @model_validator(mode="after")
    def _one_block(self) -> PolicyConfig:
        if self.type != "always_sample" and getattr(self, _FIELD[self.type]) is None:
            raise ValueError(f"policy {self.name!r} of type {self.type} needs a `{self.type}:` block")
        others = [b for b, f in _FIELD.items() if b != self.type and getattr(self, f) is not None]
        if others:
            raise ValueError(f"policy {self.name!r} of type {self.type} has blocks of other types: {others}")
        return self


for _model in (AndConfig, DropConfig, CompositeConfig):
    _model.model_rebuild()


class DecisionCacheConfig(ComponentConfig):
    sampled_cache_size: int = Field(default=100_000, ge=0)
    """Trace ids of sampled traces remembered (LRU) so their late spans are sampled too; 0: off."""
    non_sampled_cache_size: int = Field(default=100_000, ge=0)
    """Trace ids of traces sampled out remembered (LRU) so their late spans are sampled out too; 0: off."""
    trace_cache_size: int = Field(default=1_000, ge=0)
    """With late_span_reevaluation: decided traces whose spans are kept (LRU) to hand on again with a late span."""


class TailSamplingConfig(ComponentConfig):
    """Trace assembly (when a trace is complete), the storage decision (policies), late spans and sessions."""

    decision_wait: Duration = 5.0
    """A trace whose root span has arrived is complete after this long with no new span."""
    max_trace_duration: Duration = 60.0
    """A trace is complete this long after its first span at the latest (root or not)."""
    num_traces: int = Field(default=50_000, gt=0)
    """Traces buffered at most; past it the oldest is decided early (evicted, counted)."""
    max_buffered_bytes: int = Field(default=512 * 1024 * 1024, gt=0)
    """Estimated bytes of buffered spans at most; past it the oldest traces are decided early (evicted, counted)."""
    expected_new_traces_per_sec: int = Field(default=0, ge=0)
    """Accepted so Collector configs load; has no effect here."""
    sample_on_first_match: bool = False
    """Stop at the first policy that samples (later policies, `drop` included, are not evaluated)."""
    decision_cache: DecisionCacheConfig = Field(default_factory=DecisionCacheConfig)
    late_span_reevaluation: bool = False
    """A late span of a trace still in decision_cache.trace_cache hands on the whole trace again as a revision."""
    session_timeout: Duration = 300.0
    """A session (traces sharing session_id) is complete after this long with no new trace or span in it."""
    max_sessions: int = Field(default=10_000, ge=0)
    """Open sessions at most (0: no session assembly); past it the quietest is completed early (counted)."""
    max_session_spans: int = Field(default=200_000, ge=0)
    """Spans held in open sessions at most; past it the quietest sessions are completed early (counted)."""
    policies: list[PolicyConfig] = Field(default_factory=list)
    """Empty: every trace is sampled (assembly only)."""

    @field_validator("decision_wait", "session_timeout")
    @classmethod
    def _positive(cls, seconds: float) -> float:
        if seconds <= 0:
            raise ValueError("must be greater than 0")
        return seconds

    @field_validator("max_trace_duration")
    @classmethod
    def _not_below_decision_wait(cls, seconds: float, info: ValidationInfo) -> float:
        wait = info.data.get("decision_wait")
        if wait is not None and seconds < wait:
            raise ValueError(f"must not be less than decision_wait ({wait:g}s)")
        return seconds

    @field_validator("policies")
    @classmethod
    def _unique_names(cls, policies: list[PolicyConfig]) -> list[PolicyConfig]:
        _unique([p.name for p in policies], "policies")
        return policies


def _unique(names: list[str], key: str) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{key}: names must be unique; repeated: {repeated}")
