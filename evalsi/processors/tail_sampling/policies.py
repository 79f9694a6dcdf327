"""Sampling policies in the OTel Collector tail sampler's vocabulary, plus `cel`, and how their votes combine."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any, Protocol

from evalsi import cel
from evalsi.model.span import Span
from evalsi.processors.tail_sampling.buffer import Trace
from evalsi.processors.tail_sampling.config import PolicyConfig


class Decision(enum.Enum):
    SAMPLED = "sampled"
    NOT_SAMPLED = "not_sampled"
    DROPPED = "dropped"


SAMPLED, NOT_SAMPLED, DROPPED = Decision.SAMPLED, Decision.NOT_SAMPLED, Decision.DROPPED

# Keys that attribute policies read from the canonical span instead of the raw attributes.
CANONICAL_KEYS = frozenset(
    (
        "name", "kind", "status_code", "status_message", "service_name", "scope_name", "step_type", "model",
        "provider", "input_tokens", "output_tokens", "tool_name", "session_id", "agent_name", "user_id", "cost_usd",
        "error_type", "content_captured", "convention", "duration_ns",
    )
)  # fmt: skip


class Policy(Protocol):
    name: str

    def evaluate(self, trace: Trace, now: float) -> Decision: ...


def _vote(hit: bool) -> Decision:
    return SAMPLED if hit else NOT_SAMPLED


def _values(spans: list[Span], key: str) -> Iterator[Any]:
    """Every value of `key` in the trace: a canonical field, else span and resource attributes."""
    if key in CANONICAL_KEYS:
        for span in spans:
            yield getattr(span, key)
        return
    seen_resources: set[int] = set()
    for span in spans:
        attributes = span.attributes
        if key in attributes:
            yield attributes[key]
        resource = span.resource_attributes
        if key in resource and id(resource) not in seen_resources:
            seen_resources.add(id(resource))  # spans of one resource share its dict
            yield resource[key]


class _Matching:
    """A policy that samples when any span or resource value of `key` passes `hit` (or, inverted, when none does)."""

    def __init__(self, name: str, key: str, invert: bool) -> None:
        self.name = name
        self.key = key
        self.invert = invert

    def hit(self, value: Any) -> bool:
        raise NotImplementedError

    def evaluate(self, trace: Trace, now: float) -> Decision:
        hit = self.hit
        found = any(hit(v) for v in _values(trace.spans, self.key))
        return _vote(found != self.invert)


class AlwaysSample:
    def __init__(self, name: str) -> None:
        self.name = name

    def evaluate(self, trace: Trace, now: float) -> Decision:
        return SAMPLED


class StatusCode:
    def __init__(self, name: str, codes: list[str]) -> None:
        self.name = name
        self.codes = frozenset(codes)

    def evaluate(self, trace: Trace, now: float) -> Decision:
        codes = self.codes
        return _vote(any(s.status_code in codes for s in trace.spans))


class Latency:
    """The trace's duration is its earliest span start to its latest span end."""

    def __init__(self, name: str, threshold_ms: int, upper_threshold_ms: int) -> None:
        self.name = name
        self.lower_ns = threshold_ms * 1_000_000
        self.upper_ns = upper_threshold_ms * 1_000_000

    def evaluate(self, trace: Trace, now: float) -> Decision:
        spans = trace.spans
        duration = max(s.end_time_unix_nano for s in spans) - min(s.start_time_unix_nano for s in spans)
        # the Collector compares whole milliseconds
        duration -= duration % 1_000_000
        if not self.upper_ns:
            return _vote(duration >= self.lower_ns)
        return _vote(self.lower_ns < duration <= self.upper_ns)


class StringAttribute(_Matching):
    def __init__(self, name: str, key: str, values: list[str], regex: bool, cache_size: int, invert: bool) -> None:
        super().__init__(name, key, invert)
        self.values = frozenset(values)
        self.patterns = [re.compile(v) for v in values] if regex else None
        self._cache: dict[str, bool] = {}
        self._cache_size = cache_size or 10_000

    def hit(self, value: Any) -> bool:
        if type(value) is not str:
            return False
        if self.patterns is None:
            return value in self.values
        found = self._cache.get(value)
        if found is None:
            found = any(p.search(value) for p in self.patterns)
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[value] = found
        return found


class NumericAttribute(_Matching):
    def __init__(self, name: str, key: str, lower: float | None, upper: float | None, invert: bool) -> None:
        super().__init__(name, key, invert)
        self.lower = float("-inf") if lower is None else lower
        self.upper = float("inf") if upper is None else upper

    def hit(self, value: Any) -> bool:
        return type(value) in (int, float) and self.lower <= value <= self.upper


class BooleanAttribute(_Matching):
    def __init__(self, name: str, key: str, value: bool, invert: bool) -> None:
        super().__init__(name, key, invert)
        self.value = value

    def hit(self, value: Any) -> bool:
        return type(value) is bool and value is self.value


_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MAX_UINT64 = 2**64 - 1


def _fnv1a(data: bytes, h: int = _FNV_OFFSET) -> int:
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MAX_UINT64
    return h


def probability_threshold(ratio: float) -> int:
    """MaxUint64 * ratio as the Collector computes it (a 64-bit big.Float product, truncated to an integer)."""
    if ratio <= 0:
        return 0
    if ratio >= 1:
        return _MAX_UINT64
    exact = Fraction(_MAX_UINT64) * Fraction(ratio)
    exponent = exact.numerator.bit_length() - exact.denominator.bit_length()
    if Fraction(2) ** exponent > exact:
        exponent -= 1
    quantum = Fraction(2) ** (exponent - 63)  # 64 significant bits, rounded to nearest even
    return int(round(exact / quantum) * quantum)


class Probabilistic:
    """Samples a share of trace ids: FNV-1a 64 of salt + trace id bytes at or below MaxUint64 * ratio, exactly as
    the Collector's tail sampler does, so both decide alike for one trace id and salt."""

    def __init__(self, name: str, sampling_percentage: float, hash_salt: str) -> None:
        self.name = name
        self.threshold = probability_threshold(sampling_percentage / 100)
        self._salted = _fnv1a((hash_salt or "default-hash-seed").encode())

    def evaluate(self, trace: Trace, now: float) -> Decision:
        try:
            trace_bytes = bytes.fromhex(trace.trace_id)
        except ValueError:
            trace_bytes = trace.trace_id.encode()
        return _vote(_fnv1a(trace_bytes, self._salted) <= self.threshold)


class RateLimiting:
    """A token bucket of spans: refilled at spans_per_second, holding up to twice that; a trace takes one token per
    span, and one larger than the bucket never passes (as in the Collector)."""

    def __init__(self, name: str, spans_per_second: int) -> None:
        self.name = name
        self.rate = float(spans_per_second)
        self.burst = 2.0 * spans_per_second
        self.tokens = self.burst
        self.at: float | None = None

    def evaluate(self, trace: Trace, now: float) -> Decision:
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        n = len(trace.spans)
        if n <= self.tokens:
            self.tokens -= n
            return SAMPLED
        return NOT_SAMPLED


class SpanCount:
    def __init__(self, name: str, min_spans: int, max_spans: int) -> None:
        self.name = name
        self.min_spans = min_spans
        self.max_spans = max_spans

    def evaluate(self, trace: Trace, now: float) -> Decision:
        n = len(trace.spans)
        return _vote(n >= self.min_spans and (not self.max_spans or n <= self.max_spans))


class Cel:
    """Samples when the CEL condition over `trace` is true; any evaluation error (a missing key...) is no match."""

    def __init__(self, name: str, condition: str) -> None:
        self.name = name
        self.program = cel.compile(condition, variables=("trace",))
        self.fields = self.program.fields

    def evaluate(self, trace: Trace, now: float) -> Decision:
        return _vote(self.program.matches(trace.activation(self.fields)))


class And:
    """Samples when every sub-policy samples."""

    def __init__(self, name: str, subs: list[Policy]) -> None:
        self.name = name
        self.subs = subs

    def evaluate(self, trace: Trace, now: float) -> Decision:
        return _vote(all(p.evaluate(trace, now) is SAMPLED for p in self.subs))


class Drop:
    """Drops the trace (whatever other policies vote) when every sub-policy samples it."""

    def __init__(self, name: str, subs: list[Policy]) -> None:
        self.name = name
        self.subs = subs

    def evaluate(self, trace: Trace, now: float) -> Decision:
        return DROPPED if all(p.evaluate(trace, now) is SAMPLED for p in self.subs) else NOT_SAMPLED


class Composite:
    """Sub-policies in order, each with a share of `max_total_spans_per_second`: the first that samples the trace
    decides, sampling it only while its share and the total for the current second still hold the trace's spans.

    Shares follow `rate_allocation` (percent 0: an equal share); a sub-policy left out of it shares what the
    listed ones leave, equally (the Collector gives it nothing, which its own README contradicts).
    """

    def __init__(
        self, name: str, max_total: int, subs: list[Policy], allocation: dict[str, float], order: list[str]
    ) -> None:
        self.name = name
        self.max_total = max_total
        if order:
            by_name = {p.name: p for p in subs}
            subs = [by_name[n] for n in order]
        equal = max_total / len(subs)
        listed = {n: (pct / 100 * max_total if pct > 0 else equal) for n, pct in allocation.items()}
        rest = [p.name for p in subs if p.name not in listed]
        left = max(0.0, max_total - sum(listed.values()))
        self.subs = [(p, listed.get(p.name, left / len(rest) if rest else 0.0)) for p in subs]
        self.second: int | None = None
        self.used = [0] * len(subs)
        self.total = 0

    def evaluate(self, trace: Trace, now: float) -> Decision:
        second = int(now)
        if second != self.second:
            self.second = second
            self.used = [0] * len(self.subs)
            self.total = 0
        n = len(trace.spans)
        for i, (policy, share) in enumerate(self.subs):
            if policy.evaluate(trace, now) is SAMPLED:
                if self.used[i] + n <= share and self.total + n <= self.max_total:
                    self.used[i] += n
                    self.total += n
                    return SAMPLED
                return NOT_SAMPLED
        return NOT_SAMPLED


def build_policy(config: PolicyConfig) -> Policy:
    """The policy a config entry describes (validated already by the config model)."""
    name, kind = config.name, config.type
    if kind == "always_sample":
        return AlwaysSample(name)
    if kind == "status_code":
        assert config.status_code is not None
        return StatusCode(name, list(config.status_code.status_codes))
    if kind == "latency":
        assert config.latency is not None
        return Latency(name, config.latency.threshold_ms, config.latency.upper_threshold_ms)
    if kind == "string_attribute":
        c = config.string_attribute
        assert c is not None
        return StringAttribute(name, c.key, c.values, c.enabled_regex_matching, c.cache_max_size, c.invert_match)
    if kind == "numeric_attribute":
        n = config.numeric_attribute
        assert n is not None
        return NumericAttribute(name, n.key, n.min_value, n.max_value, n.invert_match)
    if kind == "boolean_attribute":
        b = config.boolean_attribute
        assert b is not None
        return BooleanAttribute(name, b.key, b.value, b.invert_match)
    if kind == "probabilistic":
        assert config.probabilistic is not None
        return Probabilistic(name, config.probabilistic.sampling_percentage, config.probabilistic.hash_salt)
    if kind == "rate_limiting":
        assert config.rate_limiting is not None
        return RateLimiting(name, config.rate_limiting.spans_per_second)
    if kind == "span_count":
        assert config.span_count is not None
        return SpanCount(name, config.span_count.min_spans, config.span_count.max_spans)
    if kind == "cel":
        assert config.cel is not None
        return Cel(name, config.cel.condition)
    if kind == "and":
        assert config.and_ is not None
        return And(name, [build_policy(p) for p in config.and_.and_sub_policy])
    if kind == "drop":
        assert config.drop is not None
        return Drop(name, [build_policy(p) for p in config.drop.drop_sub_policy])
    assert kind == "composite" and config.composite is not None
    c2 = config.composite
    allocation = {a.policy: a.percent for a in c2.rate_allocation}
    subs = [build_policy(p) for p in c2.composite_sub_policy]
    return Composite(name, c2.max_total_spans_per_second, subs, allocation, c2.policy_order)


class PolicySet:
    """The configured policies and the final decision: dropped by any `drop` → not sampled; else sampled by any
    policy → sampled; else not sampled. No policies at all: every trace is sampled (assembly only).

    `invert_match` gives a plain vote (the Collector's `disableinvertdecisions` behaviour): sampled when no span or
    resource carries a matching value.
    """

    def __init__(self, configs: list[PolicyConfig], sample_on_first_match: bool = False) -> None:
        self.policies: list[Policy] = [build_policy(c) for c in configs]
        self.sample_on_first_match = sample_on_first_match

    def decide(self, trace: Trace, now: float, votes: Callable[[str, Decision], None] | None = None) -> bool:
        """Whether to sample `trace`; `votes(policy, decision)` hears each top-level policy's vote."""
        if not self.policies:
            return True
        sampled = dropped = False
        for policy in self.policies:
            decision = policy.evaluate(trace, now)
            if votes is not None:
                votes(policy.name, decision)
            if decision is SAMPLED:
                sampled = True
                if self.sample_on_first_match:
                    return True
            elif decision is DROPPED:
                dropped = True
        return sampled and not dropped
