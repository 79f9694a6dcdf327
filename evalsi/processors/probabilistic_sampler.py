"""Head sampling: consistent probability sampling of spans by trace (OTEP 235), as the OpenTelemetry Collector's
probabilistic_sampler does it, recording the threshold applied in each kept span's W3C tracestate (`ot=th:...`)."""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from pydantic import field_validator, model_validator

from evalsi.component import ComponentConfig, Next, Settings, processor
from evalsi.model.span import BatchKind, Span, SpanBatch

# Randomness and rejection thresholds are 56-bit numbers: the 7 random bytes W3C Trace Context Level 2 puts at
# the end of a trace id. A span is kept when its randomness R >= the threshold T (T out of 2^56 are rejected).
MAX_ADJUSTED_COUNT = 1 << 56
NUM_HEX_DIGITS = 14
MIN_PROBABILITY = 1.0 / MAX_ADJUSTED_COUNT
ALWAYS_SAMPLE = 0
NEVER_SAMPLE = MAX_ADJUSTED_COUNT
ALL_PROBABILITIES_RANDOMNESS = MAX_ADJUSTED_COUNT - 1  # what missing randomness compares as

_HEX14 = re.compile(r"[0-9a-fA-F]{14}")
_HEX1_14 = re.compile(r"[0-9a-fA-F]{1,14}")
# W3C tracestate list member (https://www.w3.org/TR/trace-context/#tracestate-header-field-values)
_W3C_MEMBER = re.compile(
    r"(?P<key>[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
    r"=(?P<value>[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])"
)
# OpenTelemetry `ot` entry member (specification/trace/tracestate-handling.md)
_OT_MEMBER = re.compile(r"(?P<key>[a-z][a-z0-9]*):(?P<value>[a-zA-Z0-9._\-]*)")
_W3C_MAX_LENGTH = 1024
_W3C_MAX_MEMBERS = 32
_OT_MAX_LENGTH = 256


# --- thresholds and randomness -------------------------------------------------------------------------------


def probability_to_threshold(probability: float, precision: int = NUM_HEX_DIGITS) -> int:
    """The 56-bit rejection threshold for a sampling probability in [2^-56, 1], rounded to `precision` hex digits.

    The Collector's `pkg/sampling` arithmetic: precision grows by one digit per leading `f` (probabilities near 0)
    or leading `0` (near 1) so the relative error stays small at the extremes; rounding is half away from zero.
    """
    if not MIN_PROBABILITY <= probability <= 1:
        raise ValueError(f"sampling probability {probability!r} is outside [2^-56, 1]")
    if probability == 1:
        return ALWAYS_SAMPLE
    _, exp_p = math.frexp(probability)
    _, exp_r = math.frexp(1 - probability)
    # Go's integer division truncates toward zero
    precision = min(NUM_HEX_DIGITS, max(precision + int(exp_p / -4), precision + int(exp_r / -4)))
    scaled_float = probability * MAX_ADJUSTED_COUNT  # exact: a power-of-two scale
    scaled = math.floor(scaled_float)
    if scaled_float - scaled >= 0.5:
        scaled += 1
    threshold = MAX_ADJUSTED_COUNT - scaled
    shift = 4 * (NUM_HEX_DIGITS - precision)
    if shift:
        threshold = ((threshold + (1 << (shift - 1))) >> shift) << shift
    return threshold


def threshold_to_probability(threshold: int) -> float:
    return (MAX_ADJUSTED_COUNT - threshold) / MAX_ADJUSTED_COUNT


def encode_threshold(threshold: int) -> str:
    """The `th` value: 14 hex digits with trailing zeros removed; "0" keeps everything, "" means never sampled."""
    if threshold == ALWAYS_SAMPLE:
        return "0"
    if threshold >= NEVER_SAMPLE:
        return ""
    return format(threshold, "014x").rstrip("0")


def decode_threshold(th: str) -> int:
    """The threshold a `th` value encodes: 1 to 14 hex digits, extended with trailing zeros to 14."""
    if not _HEX1_14.fullmatch(th):
        raise ValueError(f"th {th!r} is not 1 to 14 hex digits")
    return int(th, 16) << (4 * (NUM_HEX_DIGITS - len(th)))


def th_to_probability(th: str) -> float:
    return threshold_to_probability(decode_threshold(th))


def trace_id_randomness(trace_id: str) -> int | None:
    """The least significant 56 bits of a hex trace id; None for an invalid (all-zero or malformed) id."""
    if len(trace_id) != 32:
        return None
    try:
        if int(trace_id, 16) == 0:
            return None
        return int(trace_id[18:], 16)
    except ValueError:
        return None


def _fnv1a32(data: bytes, seed: int) -> int:
    h = 0x811C9DC5
    for b in seed.to_bytes(4, "little") + data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def hash_seed_randomness(trace_id: str, seed: int) -> int | None:
    """The `hash_seed` mode's randomness: the Collector's 14-bit FNV-1a hash of the trace id, laid out as 56 bits
    so that `R >= T` makes the same decision as its original `hash < rate` test."""
    try:
        raw = bytes.fromhex(trace_id)
    except ValueError:
        return None
    if len(raw) != 16 or not any(raw):
        return None
    hashed32 = _fnv1a32(raw, seed)
    hashed = hashed32 & 0x3FFF
    unused18 = hashed32 >> 14
    mixed28 = unused18 ^ (unused18 << 10)
    return ((0x3FFF - hashed) << 42) | (mixed28 << 14) | hashed


def _float32(x: float) -> float:
    """The Collector reads `sampling_percentage` as a float32: the same rounding keeps thresholds identical."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


# --- W3C tracestate with its OpenTelemetry entry ------------------------------------------------------------------


class TraceStateError(ValueError):
    """A tracestate that does not parse; `reason` labels the error metric."""

    def __init__(self, message: str, reason: str = "invalid_tracestate") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TraceState:
    """A parsed W3C tracestate: the `ot` entry's `rv`, `th` and other sub-keys, and every other vendor's entry."""

    rv: str = ""
    th: str = ""
    ot_extra: tuple[tuple[str, str], ...] = ()
    members: tuple[tuple[str, str], ...] = ()

    def serialize(self, th: str | None = None, rv: str | None = None) -> str:
        """The tracestate text, `ot` first (W3C: a modified entry moves to the front), with `th`/`rv` replaced."""
        th = self.th if th is None else th
        rv = self.rv if rv is None else rv
        ot = []
        if rv:
            ot.append("rv:" + rv)
        if th:
            ot.append("th:" + th)
        ot.extend(f"{k}:{v}" for k, v in self.ot_extra)
        entries = ["ot=" + ";".join(ot)] if ot else []
        entries.extend(f"{k}={v}" for k, v in self.members)
        return ",".join(entries)


EMPTY_TRACE_STATE = TraceState()


def _parse_ot(value: str) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    if len(value) > _OT_MAX_LENGTH:
        raise TraceStateError(f"the ot entry is longer than {_OT_MAX_LENGTH} characters")
    rv = th = ""
    extra = []
    for member in value.split(";"):
        m = _OT_MEMBER.fullmatch(member)
        if m is None:
            raise TraceStateError(f"ot entry member {member!r} is not key:value")
        key, val = m.group("key"), m.group("value")
        if key == "rv":
            if not _HEX14.fullmatch(val):
                raise TraceStateError(f"rv {val!r} is not 14 hex digits", "invalid_randomness")
            rv = val
        elif key == "th":
            if not _HEX1_14.fullmatch(val):
                raise TraceStateError(f"th {val!r} is not 1 to 14 hex digits", "invalid_threshold")
            th = val
        else:
            extra.append((key, val))
    return rv, th, tuple(extra)


@lru_cache(maxsize=4096)
def parse_trace_state(text: str) -> TraceState:
    """Parse a W3C tracestate header value; raise TraceStateError when it or its `ot` entry is malformed.

    Spans of one trace usually share one tracestate, hence the cache.
    """
    if not text:
        return EMPTY_TRACE_STATE
    if len(text) > _W3C_MAX_LENGTH:
        raise TraceStateError(f"tracestate is longer than {_W3C_MAX_LENGTH} characters")
    pieces = text.split(",")
    if len(pieces) > _W3C_MAX_MEMBERS:
        raise TraceStateError(f"tracestate has more than {_W3C_MAX_MEMBERS} entries")
    ot: tuple[str, str, tuple[tuple[str, str], ...]] = ("", "", ())
    members = []
    for piece in pieces:
        piece = piece.strip(" \t")
        if not piece:
            continue  # W3C allows empty list members
        m = _W3C_MEMBER.fullmatch(piece)
        if m is None:
            raise TraceStateError(f"tracestate entry {piece[:40]!r} is not key=value")
        if m.group("key") == "ot":
            ot = _parse_ot(m.group("value"))
        else:
            members.append((m.group("key"), m.group("value")))
    return TraceState(ot[0], ot[1], ot[2], tuple(members))


# --- config ------------------------------------------------------------------------------------------------------


class ProbabilisticSamplerConfig(ComponentConfig):
    """The Collector's probabilistic_sampler settings, for traces."""

    sampling_percentage: float
    """Percentage of traces kept, 0 to 100 (0 keeps none but spans forced by `sampling.priority`)."""
    mode: Literal["proportional", "equalizing", "hash_seed"] | None = None
    """`proportional` multiplies an incoming `th` probability by the ratio; `equalizing` raises thresholds to the
    configured one; `hash_seed` is the Collector's legacy FNV hash. Unset: `hash_seed` when `hash_seed` is set,
    else `proportional` (the OTEP 235 rule; recent Collectors default to `hash_seed`)."""
    sampling_precision: int = 4
    """Hex digits used to encode the threshold, 1 to 14."""
    fail_closed: bool = True
    """Drop spans whose sampling information is missing or invalid; false keeps them (as `th:0` when possible)."""
    hash_seed: int = 0
    """Seed of the `hash_seed` mode's hash; every collector of one tier needs the same seed."""

    @field_validator("sampling_percentage", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"must be a number from 0 to 100, got {value!r}")
        return value

    @field_validator("sampling_percentage")
    @classmethod
    def _percentage(cls, value: float) -> float:
        if not math.isfinite(value) or not 0 <= value <= 100:
            raise ValueError(f"must be a percentage from 0 to 100, got {value!r}")
        if value > 0 and _float32(value) / 100 < MIN_PROBABILITY:
            raise ValueError(f"{value!r} is too small: the smallest sampling probability is 2^-56 ({100 / 2**56:.3g}%)")
        return value

    @field_validator("sampling_precision")
    @classmethod
    def _precision(cls, value: int) -> int:
        if not 1 <= value <= NUM_HEX_DIGITS:
            raise ValueError(f"must be 1 to {NUM_HEX_DIGITS} hex digits, got {value}")
        return value

    @field_validator("hash_seed")
    @classmethod
    def _seed(cls, value: int) -> int:
        if not 0 <= value <= 0xFFFFFFFF:
            raise ValueError(f"must be an unsigned 32-bit integer, got {value}")
        return value

    @model_validator(mode="after")
    def _seed_needs_hash_mode(self) -> ProbabilisticSamplerConfig:
        if self.hash_seed and self.mode not in (None, "hash_seed"):
            raise ValueError(f"hash_seed applies only to mode hash_seed, not {self.mode}; remove one of them")
        return self

    @property
    def effective_mode(self) -> str:
        if self.mode is not None:
            return self.mode
        return "hash_seed" if self.hash_seed else "proportional"


# --- the decision ------------------------------------------------------------------------------------------------


def _sampling_priority(value: Any) -> int:
    """OpenTracing's `sampling.priority`: 0 forces not sampled (-1), > 0 forces sampled (1), else no say (0)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, str):
        if value != value.strip():
            return 0
        try:
            value = float(value)
        except ValueError:
            return 0
    if isinstance(value, int | float):
        if value == 0:
            return -1
        if value > 0:
            return 1
    return 0


@dataclass(frozen=True, slots=True)
class Decision:
    sampled: bool
    error: str | None = None  # why the span's sampling information could not be used (fail_closed decided)


_KEPT = Decision(True)
_DROPPED = Decision(False)


class ConsistentSampler:
    """The per-span decision, a pure function of the span's trace id, tracestate and `sampling.priority`: every
    replica with the same config decides the same. Kept spans get their tracestate rewritten in place."""

    def __init__(self, config: ProbabilisticSamplerConfig) -> None:
        self.mode = config.effective_mode
        self.fail_closed = config.fail_closed
        self.precision = config.sampling_precision
        self.seed = config.hash_seed
        pct = _float32(config.sampling_percentage)
        self.never = pct == 0
        self.ratio = max(pct / 100, MIN_PROBABILITY)
        if self.never:
            self.threshold = NEVER_SAMPLE
        elif self.mode == "hash_seed":
            # the Collector's original arithmetic: float32 product, truncated
            scaled = int(_float32(pct * _float32(0x4000 / 100)))
            self.threshold = NEVER_SAMPLE if scaled == 0 else (0x4000 - scaled) << 42
            self.never = scaled == 0
        else:
            self.threshold = probability_to_threshold(self.ratio, self.precision)
        self.th = encode_threshold(self.threshold)
        self._plain = "ot=th:" + self.th if self.th else ""  # the tracestate of a kept span that arrived without one
        self._products: dict[int, int] = {}

    def _proportional(self, incoming: int) -> int:
        found = self._products.get(incoming)
        if found is None:
            try:
                found = probability_to_threshold(threshold_to_probability(incoming) * self.ratio, self.precision)
            except ValueError:
                found = NEVER_SAMPLE  # the product fell below 2^-56: not sampled
            if len(self._products) < 1024:
                self._products[incoming] = found
        return found

    def decide(self, span: Span) -> Decision:
        attributes = span.attributes
        priority = _sampling_priority(attributes["sampling.priority"]) if "sampling.priority" in attributes else 0
        text = span.trace_state
        if not text and not priority and self.mode != "hash_seed" and not self.never:
            # the common case, kept cheap: no tracestate, randomness from the trace id
            rnd = trace_id_randomness(span.trace_id)
            if rnd is not None:
                if rnd >= self.threshold:
                    span.trace_state = self._plain
                    return _KEPT
                return _DROPPED
        return self._decide(span, priority)

    def _decide(self, span: Span, priority: int) -> Decision:
        error: str | None = None
        state: TraceState | None = None
        rnd: int | None = None
        set_rv = ""
        try:
            state = parse_trace_state(span.trace_state)
        except TraceStateError as e:
            error = e.reason
        if self.never:
            rnd = ALL_PROBABILITIES_RANDOMNESS  # no randomness is needed to decide "never"
        elif self.mode == "hash_seed":
            rnd = hash_seed_randomness(span.trace_id, self.seed)
            if state is not None and state.rv:
                error, state = "randomness_in_use", None  # consistent sampling is already in use upstream
            elif state is not None and state.th:
                error, state = "threshold_in_use", None
            elif rnd is not None:
                set_rv = format(rnd, "014x")
        elif state is not None:
            rnd = int(state.rv, 16) if state.rv else trace_id_randomness(span.trace_id)

        incoming: int | None = None
        if error is None:
            if rnd is None:
                error = "missing_randomness"
            elif state is not None and state.th:
                incoming = decode_threshold(state.th)
                if incoming > rnd:
                    # the span should not have been sampled upstream: erase the threshold, as the spec recommends
                    error, incoming = "inconsistent_threshold", None
                    state = TraceState(state.rv, "", state.ot_extra, state.members)

        if error is not None:
            threshold = NEVER_SAMPLE if self.fail_closed else ALWAYS_SAMPLE
        elif self.never:
            threshold = NEVER_SAMPLE
        elif self.mode == "proportional":
            threshold = self.threshold if incoming is None else self._proportional(incoming)
        elif self.mode == "equalizing":
            threshold = incoming if incoming is not None and incoming > self.threshold else self.threshold
        else:
            threshold = self.threshold
        if priority:
            threshold = ALWAYS_SAMPLE if priority > 0 else NEVER_SAMPLE

        sampled = threshold <= (ALL_PROBABILITIES_RANDOMNESS if rnd is None else rnd)
        if sampled and state is not None:
            # a threshold is only ever raised: a lower one would claim a higher probability than was applied
            th = state.th if state.th and decode_threshold(state.th) > threshold else encode_threshold(threshold)
            span.trace_state = state.serialize(th=th, rv=set_rv or None)
        return Decision(sampled, error)


# --- the processor -----------------------------------------------------------------------------------------------


@processor("probabilistic_sampler", config=ProbabilisticSamplerConfig)
class ProbabilisticSampler:
    """Keeps the spans the consistent sampling rule selects and hands them on; drops and counts the others.

    Revision batches carry copies of spans already decided here: they follow that decision (a dropped span is
    marked `sampled = False`) and are never sampled twice, which in proportional mode would compound. Session
    batches are spans already handed on as traces: they pass unchanged.
    """

    def __init__(self, config: ProbabilisticSamplerConfig, settings: Settings, next: Next) -> None:
        self.config = config
        self.settings = settings
        self.next = next
        self.sampler = ConsistentSampler(config)
        spans = settings.metrics.counter(
            "evalsi_sampler_spans",
            "Spans decided by the probabilistic sampler: sampled (handed on) or not_sampled (dropped).",
            ["processor", "decision"],
        )
        self._sampled = spans.labels(settings.id, "sampled")
        self._not_sampled = spans.labels(settings.id, "not_sampled")
        self._errors = settings.metrics.counter(
            "evalsi_sampler_span_errors",
            "Spans whose sampling randomness or tracestate was missing, invalid or inconsistent; fail_closed "
            "decided them.",
            ["processor", "error"],
        )
        self._logged: set[str] = set()

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass  # holds nothing

    async def consume(self, batch: SpanBatch) -> None:
        if batch.kind is BatchKind.SESSION:
            await self.next.consume(batch)
            return
        if batch.revision:
            revised = [s for s in batch.spans if s.sampled]
            if revised:
                await self.next.consume(SpanBatch(revised, True, batch.kind))
            return
        decide = self.sampler.decide
        kept: list[Span] = []
        dropped: list[Span] = []
        errors: dict[str, int] = {}
        before = [span.trace_state for span in batch.spans]
        for span in batch.spans:
            decision = decide(span)
            if decision.sampled:
                kept.append(span)
            else:
                dropped.append(span)
            if decision.error is not None:
                errors[decision.error] = errors.get(decision.error, 0) + 1
                if decision.error not in self._logged:
                    self._log_error(span, decision)
        if kept:
            try:
                await self.next.consume(batch if not dropped else SpanBatch(kept, False, batch.kind))
            except BaseException:
                # refused: nothing was taken, and the same spans may come back (deciding a rewritten tracestate
                # again would compound the probability), so leave them as they came
                for span, trace_state in zip(batch.spans, before, strict=True):
                    span.trace_state = trace_state
                raise
        # counted once the batch is handed on: a refused batch comes back and is decided again
        for span in dropped:
            span.sampled = False
        self._sampled.inc(len(kept))
        if dropped:
            self._not_sampled.inc(len(dropped))
        for error, n in errors.items():
            self._errors.labels(self.settings.id, error).inc(n)

    def _log_error(self, span: Span, decision: Decision) -> None:
        self._logged.add(decision.error or "")
        self.settings.logger.warning(
            "probabilistic_sampler: span %s of trace %s: %s (tracestate %r); fail_closed=%s so it was %s "
            "(logged once per kind; counted in evalsi_sampler_span_errors_total)",
            span.span_id,
            span.trace_id,
            decision.error,
            span.trace_state[:100],
            self.config.fail_closed,
            "kept" if decision.sampled else "dropped",
        )
