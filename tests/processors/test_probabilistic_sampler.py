"""Consistent probability sampling (OTEP 235): the spec's threshold encodings, the Collector's probabilistic_sampler
decisions and tracestate rewrites, replica agreement, fail_closed, config errors, and a real `evalsi serve`."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
import time
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from running_collector import serve_config, start_collector

from evalsi.collector.config import ConfigError, parse_config
from evalsi.component import Next, Refused, Settings
from evalsi.model.span import Span, SpanBatch
from evalsi.processors.probabilistic_sampler import (
    ConsistentSampler,
    ProbabilisticSampler,
    ProbabilisticSamplerConfig,
    decode_threshold,
    encode_threshold,
    parse_trace_state,
    probability_to_threshold,
    th_to_probability,
)
from evalsi.runtime.telemetry import SelfMetrics

ALWAYS_KEPT_ID = "0" * 18 + "f" * 14  # randomness 2^56-1: kept at every probability
HALF_ID = "fefefefefefefefefe80000000000000"  # randomness exactly 0x80000000000000: kept at 50%, not at 49%


class Recorder:
    def __init__(self, refuse: int = 0) -> None:
        self.batches: list[SpanBatch] = []
        self.refuse = refuse

    async def consume(self, batch: SpanBatch) -> None:
        if self.refuse:
            self.refuse -= 1
            raise Refused("queue full")
        self.batches.append(batch)

    @property
    def spans(self) -> list[Span]:
        return [s for b in self.batches for s in b.spans]


def make(refuse: int = 0, **config: Any) -> tuple[ProbabilisticSampler, Recorder, SelfMetrics]:
    metrics = SelfMetrics()
    recorder = Recorder(refuse)
    nxt = Next()
    nxt.traces = recorder
    settings = Settings("probabilistic_sampler", metrics, logging.getLogger("test.sampler"))
    return ProbabilisticSampler(ProbabilisticSamplerConfig(**config), settings, nxt), recorder, metrics


def span(trace_id: str = HALF_ID, trace_state: str = "", span_id: str = "00000000fefefefe", **attributes: Any) -> Span:
    return Span(trace_id, span_id, "", "op", "INTERNAL", 1, 2, trace_state=trace_state, attributes=attributes)


def run(sampler: ProbabilisticSampler, *spans: Span, revision: bool = False) -> None:
    asyncio.run(sampler.consume(SpanBatch(list(spans), revision)))


def counted(metrics: SelfMetrics, decision: str) -> float:
    value = metrics.registry.get_sample_value(
        "evalsi_sampler_spans_total", {"processor": "probabilistic_sampler", "decision": decision}
    )
    return value or 0.0


def errors_counted(metrics: SelfMetrics, error: str) -> float:
    value = metrics.registry.get_sample_value(
        "evalsi_sampler_span_errors_total", {"processor": "probabilistic_sampler", "error": error}
    )
    return value or 0.0


def random_ids(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.getrandbits(128):032x}" for _ in range(n)]


# --- threshold encoding: the spec's table ------------------------------------------------------------------------

# "TraceState: Probability Sampling", Algorithms: thresholds for 1-in-N sampling at precision 3, 4 and 5
SPEC_TABLE = {
    1: ("0", "0", "0"),
    2: ("8", "8", "8"),
    3: ("aab", "aaab", "aaaab"),
    4: ("c", "c", "c"),
    5: ("ccd", "cccd", "ccccd"),
    8: ("e", "e", "e"),
    10: ("e66", "e666", "e6666"),
    16: ("f", "f", "f"),
    100: ("fd71", "fd70a", "fd70a4"),
    1000: ("ffbe7", "ffbe77", "ffbe76d"),
    10000: ("fff972", "fff9724", "fff97247"),
    100000: ("ffff584", "ffff583a", "ffff583a5"),
    1000000: ("ffffef4", "ffffef39", "ffffef391"),
}


@pytest.mark.parametrize("n", list(SPEC_TABLE))
def test_spec_threshold_table(n: int) -> None:
    for precision, expected in zip((3, 4, 5), SPEC_TABLE[n], strict=True):
        assert encode_threshold(probability_to_threshold(1 / n, precision)) == expected, (n, precision)


def test_spec_one_percent_example() -> None:
    # "(1-0.01) * 2^56 ≈ 71337018784743424 = 0xfd70a400000000 ... the th key has fd70a4 as the value"
    threshold = probability_to_threshold(0.01, 5)
    assert threshold == 0xFD70A400000000 == 71337018784743424
    assert encode_threshold(threshold) == "fd70a4"


def test_thresholds_round_half_away_from_zero_as_the_collector() -> None:
    # probability * 2^56 is rounded with Go's math.Round: 1.5 → 2 and 2.5 → 3 (Python's round() would give 2)
    assert probability_to_threshold(3 * 2**-57) == 2**56 - 2
    assert probability_to_threshold(5 * 2**-57) == 2**56 - 3


def _kept_trace_state(**config: Any) -> str:
    sampler, recorder, _ = make(**config)
    run(sampler, span(ALWAYS_KEPT_ID))
    return recorder.spans[0].trace_state


@pytest.mark.parametrize(
    ("percentage", "precision", "trace_state"),
    [
        (100, 4, "ot=th:0"),
        (50, 4, "ot=th:8"),
        (25, 4, "ot=th:c"),
        (10, 4, "ot=th:e666"),
        (1, 4, "ot=th:fd70a"),
        (1, 5, "ot=th:fd70a4"),  # the spec's example: 1% with 5 digits of precision
        (0.1, 4, "ot=th:ffbe77"),
        (0.1, 5, "ot=th:ffbe76d"),
        (100 / 3, 4, "ot=th:aaab"),
        (100 / 3, 5, "ot=th:aaaab"),
    ],
)
def test_sampling_percentage_is_written_as_the_spec_threshold(
    percentage: float, precision: int, trace_state: str
) -> None:
    for mode in ("proportional", "equalizing"):
        got = _kept_trace_state(sampling_percentage=percentage, sampling_precision=precision, mode=mode)
        assert got == trace_state, mode


@pytest.mark.parametrize(
    ("percentage", "th"),
    # the Collector's hash_seed vectors: its 14-bit hash rounds 10% to e668 (not e666) and 1/3 to aaac
    [(100, "0"), (75, "4"), (50, "8"), (25, "c"), (10, "e668"), (100 / 3, "aaac")],
)
def test_hash_seed_mode_thresholds_and_randomness(percentage: float, th: str) -> None:
    sampler, recorder, _ = make(sampling_percentage=percentage, hash_seed=22)
    run(sampler, *(span(t) for t in random_ids(200, seed=7)))
    assert recorder.spans
    for s in recorder.spans:
        state = parse_trace_state(s.trace_state)
        assert state.th == th
        assert decode_threshold(state.th) <= int(state.rv, 16)  # the rv it records explains the decision


# the Collector's TestHashingFunction: (seed, trace id, sampled at 50%) made before it refactored its hash
HASH_SEED_50_PERCENT = [
    (653, "474a03c76d75951a4b4c537ced8f1122", True),
    (563, "53a518291e91307e43cd8467bb06f986", True),
    (142, "a56a02f843b9bc6ee0b13889249e90e6", True),
    (904, "4e40762d3ee97a1c0932e4fa584f89a8", False),
    (445, "5224507db93db513f0ea2a4b4e0578c8", True),
    (38, "0c8717ced36216037af657e9d7f8b35b", True),
    (561, "2a8aa76c18d08e1e8be935541f9318c7", False),
    (757, "9e3d0f9481dc422cb613ea550897ae71", False),
    (22, "66a66c516ac22054673e5da5e6492545", False),
    (172, "84a1ce7bcea3e66194e72b4aa2694e31", True),
    (552, "a811a7def34ca4b98d8e320afd115fad", False),
    (546, "e3a345cc8dbb6f014bfa1edad3981820", True),
    (790, "7629ecbea89398bfd9752a2f51c2c137", True),
    (147, "a8a5c3bb9205883fae17ead6675b2450", False),
]


def test_hash_seed_mode_decides_as_the_collector() -> None:
    for seed, trace_id, sampled in HASH_SEED_50_PERCENT:
        sampler = ConsistentSampler(ProbabilisticSamplerConfig(sampling_percentage=50, hash_seed=seed))
        assert sampler.decide(span(trace_id)).sampled is sampled, (seed, trace_id)


@pytest.mark.parametrize(
    ("th", "probability"),
    [
        ("0", 1.0),
        ("8", 0.5),
        ("80000000000000", 0.5),
        ("c", 0.25),
        ("e666", 0.100006103515625),
        ("fd70a", 0.010000228881835938),
        ("fd70a4", 0.009999990463256836),
        ("aaab", 0.3333282470703125),
        ("ffbe77", 0.0009999871253967285),
    ],
)
def test_th_decodes_back_to_its_probability(th: str, probability: float) -> None:
    # the "Actual probability" column of the spec's table
    assert th_to_probability(th) == probability


@pytest.mark.parametrize("bad", ["", "abababababababab", "-1", "0x8", "8_0", "g"])
def test_invalid_th_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_threshold(bad)


# --- decisions and tracestate: the Collector's cases -------------------------------------------------------------

IMPROBABLE_ID = "111111111111111111ffffffffffffff"

# (name, trace id, config, incoming tracestate, {mode or "*": (sampled, outgoing tracestate)}); from the Collector's
# Test_tracesamplerprocessor_TraceState
COLLECTOR_CASES: list[tuple[str, str, dict[str, Any], str, dict[str, tuple[bool, str]]]] = [
    ("25% sampled", "ddddddddddddddddddc0000000000000", {"sampling_percentage": 25}, "", {"*": (True, "ot=th:c")}),
    ("25% not sampled", "ddddddddddddddddddb0000000000000", {"sampling_percentage": 25}, "", {"*": (False, "")}),
    ("49% not sampled", HALF_ID, {"sampling_percentage": 49}, "", {"*": (False, "")}),
    (
        "rv decides, kept as written",
        HALF_ID,
        {"sampling_percentage": 1, "sampling_precision": 14},
        "ot=rv:FD70A3D70A3D71",
        {"*": (True, "ot=rv:FD70A3D70A3D71;th:fd70a3d70a3d71")},
    ),
    (
        "rv at precision 4",
        HALF_ID,
        {"sampling_percentage": 1},
        "ot=rv:FD70A3D70A3D71",
        {"*": (True, "ot=rv:FD70A3D70A3D71;th:fd70a")},
    ),
    (
        "rv at precision 3 rounds up",
        HALF_ID,
        {"sampling_percentage": 1, "sampling_precision": 3},
        "ot=rv:FD70A3D70A3D71",
        {"*": (False, "")},
    ),
    (
        "rv one below",
        HALF_ID,
        {"sampling_percentage": 1, "sampling_precision": 14},
        "ot=rv:FD70A3D70A3D70",
        {"*": (False, "")},
    ),
    (
        "incoming 50% at 50%",
        HALF_ID,
        {"sampling_percentage": 50},
        "ot=rv:90000000000000;th:80000000000000",
        {"equalizing": (True, "ot=rv:90000000000000;th:8"), "proportional": (False, "")},
    ),
    ("incoming 50% at 25%", HALF_ID, {"sampling_percentage": 25}, "ot=th:8", {"*": (False, "")}),
    (
        "incoming 50% at 25%, sampled",
        "ffffffffffffffffffffffffffffffff",
        {"sampling_percentage": 25},
        "ot=th:8",
        {"equalizing": (True, "ot=th:c"), "proportional": (True, "ot=th:e")},
    ),
    (
        "equalizing vs proportional",
        HALF_ID,
        {"sampling_percentage": 50},
        "ot=rv:c0000000000000;th:8",
        {"equalizing": (True, "ot=rv:c0000000000000;th:8"), "proportional": (True, "ot=rv:c0000000000000;th:c")},
    ),
    (
        "40% precision 3",
        HALF_ID,
        {"sampling_percentage": 40, "sampling_precision": 3},
        "ot=rv:a0000000000000",
        {"*": (True, "ot=rv:a0000000000000;th:99a")},
    ),
    (
        "arriving 50% at 40% precision 6",
        "a0a0a0a0a0a0a0a0a0d0000000000000",
        {"sampling_percentage": 40, "sampling_precision": 6},
        "ot=th:8",
        {"proportional": (True, "ot=th:cccccd"), "equalizing": (True, "ot=th:99999a")},
    ),
    (
        "arriving 50% at 40%, partly sampled",
        "a0a0a0a0a0a0a0a0a0b0000000000000",
        {"sampling_percentage": 40, "sampling_precision": 3},
        "ot=th:8",
        {"proportional": (False, ""), "equalizing": (True, "ot=th:99a")},
    ),
    (
        "tiny probability",
        IMPROBABLE_ID,
        {"sampling_percentage": 100 * 2**-14},
        "ot=th:fffc",
        {"equalizing": (True, "ot=th:fffc"), "proportional": (True, "ot=th:fffffff")},
    ),
    (
        "almost 100%",
        IMPROBABLE_ID,
        {"sampling_percentage": (1 - 8e-7) * 100, "sampling_precision": 10},
        "",
        {"*": (True, "ot=th:00000cccccccd")},
    ),
    (
        "probability underflow",
        IMPROBABLE_ID,
        {"sampling_percentage": 2**-4},
        "ot=th:fffffffffffff8",
        {"equalizing": (True, "ot=th:fffffffffffff8"), "proportional": (False, "")},
    ),
]


@pytest.mark.parametrize("mode", ["proportional", "equalizing"])
@pytest.mark.parametrize("case", COLLECTOR_CASES, ids=[c[0] for c in COLLECTOR_CASES])
def test_decisions_and_tracestate_match_the_collector(mode: str, case: Any) -> None:
    _, trace_id, config, incoming, expected = case
    sampled, outgoing = expected.get(mode, expected.get("*"))
    sampler, recorder, metrics = make(mode=mode, **config)
    run(sampler, span(trace_id, incoming))
    assert [s.trace_state for s in recorder.spans] == ([outgoing] if sampled else [])
    assert counted(metrics, "sampled" if sampled else "not_sampled") == 1


def test_tracestate_rewrite_keeps_other_vendors_and_ot_subkeys() -> None:
    incoming = " congo=t61rcWkgMzE ,, ot=k1:13;rv:c0000000000000;p:8 ,rojo=00f067aa0ba902b7"
    sampler, recorder, _ = make(sampling_percentage=50)
    run(sampler, span(HALF_ID, incoming))
    # ot moves to the front (a modified W3C entry does), rv first then th, other sub-keys and vendors kept in order
    assert (
        recorder.spans[0].trace_state == "ot=rv:c0000000000000;th:8;k1:13;p:8,congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    )


def test_other_vendors_without_ot_get_an_ot_entry() -> None:
    sampler, recorder, _ = make(sampling_percentage=25)
    run(sampler, span(ALWAYS_KEPT_ID, "congo=t61rcWkgMzE"))
    assert recorder.spans[0].trace_state == "ot=th:c,congo=t61rcWkgMzE"


def test_rv_takes_precedence_over_the_trace_id() -> None:
    low_id = "ffffffffffffffffff00000000000001"  # its trace id alone would be dropped at 50%
    sampler, recorder, _ = make(sampling_percentage=50)
    run(sampler, span(low_id, "ot=rv:c0000000000000", span_id="1" * 16), span(ALWAYS_KEPT_ID, "ot=rv:10000000000000"))
    assert [(s.trace_id, s.trace_state) for s in recorder.spans] == [(low_id, "ot=rv:c0000000000000;th:8")]


def test_an_incoming_threshold_is_never_lowered() -> None:
    # sampling.priority forces a keep (threshold 0), yet the span was sampled at 50% upstream: th stays 8
    sampler, recorder, _ = make(sampling_percentage=100)
    run(sampler, span(ALWAYS_KEPT_ID, "ot=th:8", **{"sampling.priority": 1}))
    assert recorder.spans[0].trace_state == "ot=th:8"
    # proportional: 50% upstream times 50% here = 25%, written as th:c; never back to 8
    sampler, recorder, _ = make(sampling_percentage=50, mode="proportional")
    run(sampler, span(ALWAYS_KEPT_ID, "ot=th:8"))
    assert recorder.spans[0].trace_state == "ot=th:c"
    assert th_to_probability("c") == th_to_probability("8") * 0.5


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        (2, True),
        (1.0, True),
        ("1", True),
        (0, False),
        (0.0, False),
        ("0.0", False),
        (-1, None),
        ("NaN", None),
        (True, None),
    ],
)
def test_sampling_priority_overrides_the_probability(value: Any, kept: bool | None) -> None:
    for percentage, default in ((0, False), (100, True)):
        sampler, recorder, _ = make(sampling_percentage=percentage)
        run(sampler, span(HALF_ID, **{"sampling.priority": value}))
        assert bool(recorder.spans) is (default if kept is None else kept), (value, percentage)


# --- consistency across replicas and the kept share -------------------------------------------------------------


@pytest.mark.parametrize("mode", ["proportional", "equalizing", "hash_seed"])
def test_two_independent_instances_decide_the_same_for_each_trace(mode: str) -> None:
    ids = random_ids(3000, seed=11)
    kept = []
    for _ in range(2):
        sampler, recorder, _ = make(sampling_percentage=30, mode=mode)
        # each replica sees the trace's spans in its own order and batches
        spans = [span(t, span_id=f"{i:016x}") for t in ids for i in range(2)]
        random.Random(len(kept)).shuffle(spans)
        for start in range(0, len(spans), 250):
            run(sampler, *spans[start : start + 250])
        by_trace: dict[str, set[str]] = {}
        for s in recorder.spans:
            by_trace.setdefault(s.trace_id, set()).add(s.span_id)
        assert all(len(v) == 2 for v in by_trace.values()), "a trace was split"
        kept.append(set(by_trace))
    assert kept[0] == kept[1]
    if mode != "hash_seed":
        threshold = probability_to_threshold(0.3, 4)
        assert kept[0] == {t for t in ids if int(t[18:], 16) >= threshold}


@pytest.mark.parametrize("percentage", [50, 33.3, 25, 10, 1])
def test_kept_share_is_within_one_percent_of_the_ratio(percentage: float) -> None:
    sampler, recorder, metrics = make(sampling_percentage=percentage)
    run(sampler, *(span(t) for t in random_ids(10_000, seed=int(percentage * 10))))
    share = len(recorder.spans) / 10_000
    assert abs(share - percentage / 100) < 0.01, share
    assert counted(metrics, "sampled") + counted(metrics, "not_sampled") == 10_000
    assert counted(metrics, "not_sampled") == 10_000 - len(recorder.spans)


# --- fail_closed -------------------------------------------------------------------------------------------------

BROKEN = [
    ("0" * 32, "", "missing_randomness"),
    (HALF_ID, "ot=rv:abababababababab", "invalid_randomness"),  # 16 digits
    (HALF_ID, "ot=th:abababababababab", "invalid_threshold"),
    (HALF_ID, "ot=th:-1", "invalid_threshold"),
    (HALF_ID, "ot=th:8;", "invalid_tracestate"),
    (HALF_ID, "Bad Key=1", "invalid_tracestate"),
    ("ffffffffffffffffff70000000000000", "ot=th:8", "inconsistent_threshold"),  # R below th: not sampled upstream
    (HALF_ID, "ot=th:8;rv:70000000000000", "inconsistent_threshold"),
]


@pytest.mark.parametrize(("trace_id", "trace_state", "error"), BROKEN, ids=[b[2] + ":" + b[1] for b in BROKEN])
def test_fail_closed_drops_spans_without_usable_randomness(trace_id: str, trace_state: str, error: str) -> None:
    for mode in ("proportional", "equalizing"):
        sampler, recorder, metrics = make(sampling_percentage=100, mode=mode)
        run(sampler, span(trace_id, trace_state))
        assert recorder.spans == []
        assert counted(metrics, "not_sampled") == 1
        assert errors_counted(metrics, error) == 1


def test_fail_open_keeps_them_and_never_claims_a_probability_it_cannot_back() -> None:
    sampler, recorder, metrics = make(sampling_percentage=1, fail_closed=False)
    run(
        sampler,
        span("0" * 32, "", span_id="1" * 16),
        span(HALF_ID, "ot=rv:xyz,congo=t61", span_id="2" * 16),  # unparseable: passed on untouched
        span(HALF_ID, "ot=rv:40000000000000;th:8", span_id="3" * 16),  # inconsistent th: erased, then th:0
    )
    assert [s.trace_state for s in recorder.spans] == ["ot=th:0", "ot=rv:xyz,congo=t61", "ot=rv:40000000000000;th:0"]
    assert counted(metrics, "sampled") == 3
    for error in ("missing_randomness", "invalid_randomness", "inconsistent_threshold"):
        assert errors_counted(metrics, error) == 1


def test_hash_seed_mode_leaves_consistent_sampling_alone() -> None:
    sampler, recorder, metrics = make(sampling_percentage=100, hash_seed=1)
    run(sampler, span(HALF_ID, "ot=th:8", span_id="1" * 16), span(HALF_ID, "ot=rv:c0000000000000", span_id="2" * 16))
    assert recorder.spans == []
    assert errors_counted(metrics, "threshold_in_use") == errors_counted(metrics, "randomness_in_use") == 1


# --- the processor: dropping, counting, revisions, refusals ------------------------------------------------------


def test_dropped_spans_are_not_handed_on_and_are_counted() -> None:
    sampler, recorder, metrics = make(sampling_percentage=50)
    low, high = "ffffffffffffffffff10000000000000", "ffffffffffffffffffc0000000000000"
    run(sampler, span(low, span_id="1" * 16), span(high, span_id="2" * 16), span(low, span_id="3" * 16))
    assert [s.span_id for s in recorder.spans] == ["2" * 16]
    assert (counted(metrics, "sampled"), counted(metrics, "not_sampled")) == (1, 2)
    run(sampler, span(low))  # a batch with nothing kept hands on nothing
    assert len(recorder.batches) == 1
    assert counted(metrics, "not_sampled") == 3


def test_revisions_follow_the_first_decision_and_are_not_sampled_again() -> None:
    sampler, recorder, metrics = make(sampling_percentage=50)
    kept, dropped = span(HALF_ID, span_id="1" * 16), span("f" * 18 + "0" * 14, span_id="2" * 16)
    run(sampler, kept, dropped)
    assert recorder.spans == [kept] and kept.trace_state == "ot=th:8"
    # normalize revises copies of the spans it handed on, tracestate included
    run(sampler, copy.copy(kept), copy.copy(dropped), revision=True)
    revised = recorder.batches[-1]
    assert revised.revision and [(s.span_id, s.trace_state) for s in revised.spans] == [("1" * 16, "ot=th:8")]
    assert counted(metrics, "sampled") + counted(metrics, "not_sampled") == 2


def test_a_refused_batch_is_left_as_it_came_and_decided_the_same_when_retried() -> None:
    sampler, recorder, metrics = make(refuse=1, sampling_percentage=50)
    spans = [span(HALF_ID, "congo=t61", span_id="1" * 16), span("f" * 32, span_id="2" * 16)]
    with pytest.raises(Refused):
        run(sampler, *spans)
    assert [s.trace_state for s in spans] == ["congo=t61", ""]
    assert counted(metrics, "sampled") == counted(metrics, "not_sampled") == 0
    run(sampler, *spans)  # the same objects come back (normalize retries them)
    assert [s.trace_state for s in recorder.spans] == ["ot=th:8,congo=t61", "ot=th:8"]


# --- config ------------------------------------------------------------------------------------------------------


def _config_errors(body: dict[str, Any]) -> list[str]:
    doc = {
        "receivers": {"otlp": {}},
        "processors": {"probabilistic_sampler": body},
        "exporters": {"clickhouse": {}},
        "service": {
            "pipelines": {
                "traces": {"receivers": ["otlp"], "processors": ["probabilistic_sampler"], "exporters": ["clickhouse"]}
            }
        },
    }
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    return info.value.errors


@pytest.mark.parametrize(
    ("body", "key", "says"),
    [
        ({"sampling_percentage": 150}, "sampling_percentage", "from 0 to 100, got 150"),
        ({"sampling_percentage": -1}, "sampling_percentage", "from 0 to 100"),
        ({"sampling_percentage": float("nan")}, "sampling_percentage", "from 0 to 100"),
        ({"sampling_percentage": True}, "sampling_percentage", "must be a number"),
        ({"sampling_percentage": 1e-16}, "sampling_percentage", "too small"),
        ({"sampling_percentage": 1e-50}, "sampling_percentage", "too small"),  # 0 as a float32: not "never"
        ({}, "sampling_percentage", "Field required"),
        ({"sampling_percentage": 10, "sampling_precision": 0}, "sampling_precision", "1 to 14"),
        ({"sampling_percentage": 10, "sampling_precision": 15}, "sampling_precision", "1 to 14"),
        ({"sampling_percentage": 10, "mode": "downsample"}, "mode", "proportional"),
        ({"sampling_percentage": 10, "hash_seed": -1}, "hash_seed", "unsigned 32-bit"),
        ({"sampling_percentage": 10, "hash_seed": 5, "mode": "equalizing"}, "", "hash_seed applies only"),
        ({"sampling_percentage": 10, "samplingpercentage": 10}, "samplingpercentage", "unknown key"),
    ],
)
def test_config_errors_name_the_key(body: dict[str, Any], key: str, says: str) -> None:
    errors = _config_errors(body)
    where = "processors.probabilistic_sampler" + ("." + key if key else "")
    assert any(e.startswith(where + ":") and says in e for e in errors), errors


def test_config_defaults() -> None:
    config = ProbabilisticSamplerConfig(sampling_percentage=10)
    assert (config.effective_mode, config.sampling_precision, config.fail_closed) == ("proportional", 4, True)
    assert ProbabilisticSamplerConfig(sampling_percentage=10, hash_seed=22).effective_mode == "hash_seed"


# --- end to end: a real `evalsi serve` ---------------------------------------------------------------------------


def _request(traces: list[tuple[bytes, str]]) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "sampler-e2e"
    ss = rs.scope_spans.add()
    now = time.time_ns()
    for n, (trace_id, trace_state) in enumerate(traces):
        root_id = (2 * n + 1).to_bytes(8, "big")
        for span_id, parent in ((root_id, b""), ((2 * n + 2).to_bytes(8, "big"), root_id)):
            s = ss.spans.add()
            s.trace_id, s.span_id, s.parent_span_id, s.trace_state = trace_id, span_id, parent, trace_state
            s.name, s.kind = "step", 1
            s.start_time_unix_nano, s.end_time_unix_nano = now, now + 1_000_000
    return req


def test_serve_stores_exactly_the_traces_the_spec_rule_keeps(tmp_path: Any) -> None:
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["probabilistic_sampler"] = {"sampling_percentage": 50}
    cfg["service"]["pipelines"]["traces"]["processors"] = ["normalize", "probabilistic_sampler"]
    c = start_collector(tmp_path, cfg)
    try:
        ids = [bytes.fromhex(t) for t in random_ids(80, seed=2024)]
        # plus two traces whose explicit randomness overrides their id: one kept by rv, one dropped by it
        by_rv_kept = bytes.fromhex("abcdef" * 3 + "00" * 7)
        by_rv_dropped = bytes.fromhex("abcdef" * 3 + "ff" * 7)
        traces = [(t, "") for t in ids] + [
            (by_rv_kept, "congo=t61rcWkgMzE,ot=rv:c0000000000000"),
            (by_rv_dropped, "ot=rv:10000000000000"),
        ]
        for start in range(0, len(traces), 20):
            body = _request(traces[start : start + 20]).SerializeToString()
            r = httpx.post(c.http + "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"})
            assert r.status_code == 200, r.text

        expected = {t.hex() for t in ids if int.from_bytes(t[9:], "big") >= 0x80000000000000} | {by_rv_kept.hex()}
        assert 25 < len(expected) < 57  # the random ids give both outcomes
        assert c.wait_stored(2 * len(expected)) == 2 * len(expected)

        def decided() -> dict[str, float]:
            out = {}
            for line in httpx.get(c.metrics).text.splitlines():
                if line.startswith("evalsi_sampler_spans_total{"):
                    out[line.split('decision="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
            return out

        deadline = time.monotonic() + 10
        while sum(decided().values()) < 2 * len(traces) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert decided() == {"sampled": 2 * len(expected), "not_sampled": 2 * (len(traces) - len(expected))}
        time.sleep(0.5)  # nothing else arrives late
        stored = httpx.get(c.api + "/api/v1/traces?limit=10000").json()["traces"]
        assert {t["trace_id"] for t in stored} == expected
        assert all(t["span_count"] == 2 for t in stored)

        for trace_id in expected - {by_rv_kept.hex()}:
            spans = httpx.get(f"{c.api}/api/v1/traces/{trace_id}").json()["spans"]
            assert [s["trace_state"] for s in spans] == ["ot=th:8", "ot=th:8"]
        shown = json.loads(c.cli("traces", "show", by_rv_kept.hex(), "--json").stdout)
        assert {s["trace_state"] for s in shown["spans"]} == {"ot=rv:c0000000000000;th:8,congo=t61rcWkgMzE"}
        some = sorted(expected)[0]
        shown = json.loads(c.cli("traces", "show", some, "--json").stdout)
        assert [s["trace_state"] for s in shown["spans"]] == ["ot=th:8", "ot=th:8"]
    finally:
        assert c.stop() == 0
