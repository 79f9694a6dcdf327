"""The tail_sampling processor with a fake clock: when a trace is complete, every policy, late spans, bounded
memory, sessions, shutdown and backpressure."""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from evalsi.collector.config import ConfigError, parse_config
from evalsi.component import Next, Refused, Settings
from evalsi.model.span import BatchKind, Span, SpanBatch, compact_content, held_input, held_output
from evalsi.processors.normalize import normalize_span
from evalsi.processors.tail_sampling import MAX_BATCH_SPANS, TailSampling, TailSamplingConfig
from evalsi.processors.tail_sampling.buffer import Trace, span_size
from evalsi.processors.tail_sampling.policies import PolicySet, _fnv1a, probability_threshold
from evalsi.receivers.otlp.decode_protobuf import decode_traces_protobuf
from evalsi.runtime.telemetry import SelfMetrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

T0 = 1_700_000_000_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sink:
    """The next consumer: records batches; refuses while `refuse` > 0 (counting down)."""

    def __init__(self) -> None:
        self.batches: list[SpanBatch] = []
        self.refuse = 0

    async def consume(self, batch: SpanBatch) -> None:
        if self.refuse:
            self.refuse -= 1
            raise Refused("queue full", retry_after=0.5)
        # what an exporter keeps is what it was handed at this moment
        self.batches.append(SpanBatch(list(batch.spans), batch.revision, batch.kind))

    def of(self, unit: str, revision: bool = False) -> list[SpanBatch]:
        return [b for b in self.batches if b.kind == unit and b.revision == revision]

    def span_ids(self, unit: str = "trace") -> list[str]:
        return [s.span_id for b in self.of(unit) for s in b.spans]


def span(
    trace: int, n: int, parent: int | None = 0, *, start_ms: int = 0, duration_ms: int = 10, **fields: Any
) -> Span:
    """Span n of trace `trace`; parent None makes it the root, else it hangs under span `parent`."""
    return Span(
        trace_id=f"{trace:032x}",
        span_id=f"{n + 1:016x}",
        parent_span_id="" if parent is None else f"{parent + 1:016x}",
        name=fields.pop("name", f"span {n}"),
        kind="INTERNAL",
        start_time_unix_nano=T0 + start_ms * 1_000_000,
        end_time_unix_nano=T0 + (start_ms + duration_ms) * 1_000_000,
        **fields,
    )


def make(
    clock: Clock | None = None, sink: Sink | None = None, **config: Any
) -> tuple[TailSampling, Sink, Clock, SelfMetrics]:
    clock = clock or Clock()
    sink = sink or Sink()
    nxt = Next()
    nxt.traces = sink
    metrics = SelfMetrics()
    settings = Settings("tail_sampling", metrics, logging.getLogger("test.tail_sampling"))
    config.setdefault("decision_wait", "1s")
    proc = TailSampling(TailSamplingConfig.model_validate(config), settings, nxt, clock=clock)
    return proc, sink, clock, metrics


def metric(metrics: SelfMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, {"processor": "tail_sampling", **labels})
    return value or 0.0


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def feed(proc: TailSampling, *batches: list[Span], revision: bool = False) -> None:
    for spans in batches:
        await proc.consume(SpanBatch(spans, revision=revision))


# --- when a trace is complete --------------------------------------------------------------------------------


def test_a_trace_is_handed_on_once_complete_when_its_root_arrived_last_and_decision_wait_passed() -> None:
    proc, sink, clock, metrics = make(decision_wait="1s")

    async def scenario() -> None:
        await feed(proc, [span(1, 3, 1), span(1, 2, 1)])
        clock.now += 0.5
        await feed(proc, [span(1, 1, 0)])
        clock.now += 5  # far past decision_wait, but no root yet: still buffered
        await proc.tick()
        assert sink.batches == []
        await feed(proc, [span(1, 0, None)])
        clock.now += 0.9
        await proc.tick()
        assert sink.batches == []
        clock.now += 0.2
        await proc.tick()

    run(scenario())
    [batch] = sink.batches
    assert batch.kind is BatchKind.TRACE and not batch.revision
    assert sorted(s.span_id for s in batch.spans) == [f"{i:016x}" for i in range(1, 5)]
    assert all(s.sampled for s in batch.spans)  # no policies: assembly only, everything is kept
    assert metric(metrics, "evalsi_tail_sampling_traces_completed_total", reason="quiet") == 1


def _chat(trace: int, n: int, parent: int | None, text: str) -> Span:
    return span(
        trace,
        n,
        parent,
        step_type="llm",
        input=[{"role": "user", "parts": [{"type": "text", "content": text}]}],
        output=[{"role": "assistant", "parts": [{"type": "text", "content": text[::-1]}]}],
    )


def test_a_waiting_span_holds_its_messages_as_json_and_what_is_handed_on_reads_them_as_they_were() -> None:
    proc, sink, clock, _ = make(decision_wait="1s")
    spans = [_chat(1, 0, None, "hello é€𝄞"), _chat(1, 1, 0, "a tool said 42")]
    sent = [(s.input, s.output) for s in spans]
    spans[1].details["odd"] = True
    spans[1].output = [{"role": "assistant", "parts": [], "n": 2**70}]  # JSON cannot hold it: kept parsed
    sent[1] = (sent[1][0], spans[1].output)

    async def scenario() -> None:
        await feed(proc, spans)
        assert type(held_input(spans[0])) is bytes and type(held_output(spans[0])) is bytes
        assert type(held_output(spans[1])) is list
        clock.now += 1.1
        await proc.tick()

    run(scenario())
    [batch] = sink.batches
    assert [(s.input, s.output) for s in batch.spans] == sent
    # read once, the messages are kept parsed: an evaluator's change to them is the span's
    batch.spans[0].input[0]["parts"].append({"type": "text", "content": "more"})
    assert batch.spans[0].input[0]["parts"][-1]["content"] == "more"


def test_waiting_spans_with_their_messages_as_json_take_less_memory() -> None:
    """What tail sampling's buffer saves on the spans of every capture (real instrumentation's content), decoded
    and normalized: their messages as one exact-size JSON `bytes` each (not orjson's own, which keeps the 4-8 KB
    buffer it wrote in) instead of lists, dicts and strings. ~8 MB is measured, so another thread's allocations
    in the meantime do not matter."""
    bodies = [p.read_bytes() for p in sorted(FIXTURES.glob("*/*.pb")) if not p.name.endswith(".logs.pb")]

    def held(compact: bool) -> float:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        spans = []
        for _ in range(5):
            for body in bodies:
                for s in decode_traces_protobuf(body).batch.spans:
                    normalize_span(s)
                    if compact:
                        compact_content(s)
                    spans.append(s)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert sum(1 for s in spans if s.input or s.output) > len(spans) / 2
        return (after - before) / len(spans)

    parsed, as_json = held(False), held(True)
    assert as_json < 0.95 * parsed, (parsed, as_json)  # bytes a span: ~6,100 against ~5,500


def test_spans_arriving_after_the_root_push_completion_back() -> None:
    proc, sink, clock, _ = make(decision_wait="1s")

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None)])
        for n in range(1, 4):
            clock.now += 0.8
            await feed(proc, [span(1, n)])
            await proc.tick()
            assert sink.batches == []
        clock.now += 1.0
        await proc.tick()

    run(scenario())
    assert len(sink.span_ids()) == 4


def test_a_trace_whose_root_never_arrives_completes_at_max_trace_duration() -> None:
    proc, sink, clock, metrics = make(decision_wait="1s", max_trace_duration="10s")

    async def scenario() -> None:
        await feed(proc, [span(1, 1)])
        for _ in range(9):
            clock.now += 1
            await feed(proc, [span(1, 2)])
            await proc.tick()
        assert sink.batches == []
        clock.now += 1
        await proc.tick()

    run(scenario())
    assert len(sink.span_ids()) == 10
    assert metric(metrics, "evalsi_tail_sampling_traces_completed_total", reason="max_trace_duration") == 1


def test_several_traces_complete_each_whole_and_in_one_batch() -> None:
    proc, sink, clock, _ = make(decision_wait="1s")
    spans = [span(t, n, None if n == 0 else 0) for t in range(1, 6) for n in range(3)]
    random.Random(4).shuffle(spans)

    async def scenario() -> None:
        await feed(proc, spans[:7], spans[7:])
        clock.now += 2
        await proc.tick()

    run(scenario())
    [batch] = sink.batches
    by_trace: dict[str, int] = {}
    for s in batch.spans:
        by_trace[s.trace_id] = by_trace.get(s.trace_id, 0) + 1
    assert by_trace == {f"{t:032x}": 3 for t in range(1, 6)}


def test_many_traces_complete_at_once_go_in_batches_of_whole_traces_of_max_batch_spans_at_most() -> None:
    """What the next consumer (evaluate) takes at once is bounded: it takes a batch whenever its queue has room."""
    proc, sink, clock, _ = make(decision_wait="1s")
    traces = MAX_BATCH_SPANS  # five spans each: five batches' worth
    spans = [span(t, n, None if n == 0 else 0) for t in range(1, traces + 1) for n in range(5)]

    async def scenario() -> None:
        await feed(proc, spans)
        clock.now += 2
        await proc.tick()

    run(scenario())
    assert len(sink.batches) == 5 and all(len(b.spans) <= MAX_BATCH_SPANS for b in sink.batches)
    for b in sink.batches:
        ids = {s.trace_id for s in b.spans}
        assert len(b.spans) == 5 * len(ids), "a trace is never split over two batches"
    assert sorted(sink.span_ids()) == sorted(s.span_id for s in spans)


def test_a_revision_of_a_buffered_span_replaces_it() -> None:
    proc, sink, clock, _ = make()
    revised = span(1, 1)
    revised.content_captured = True

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None), span(1, 1)])
        await feed(proc, [revised], revision=True)
        clock.now += 2
        await proc.tick()

    run(scenario())
    [batch] = sink.batches
    assert len(batch.spans) == 2
    assert [s for s in batch.spans if s.span_id == revised.span_id] == [revised]


# --- policies ------------------------------------------------------------------------------------------------


def policy(kind: str, block: dict[str, Any] | None = None, name: str = "p") -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "type": kind}
    if block is not None:
        out[kind] = block
    return out


def decide(spans: list[Span], *policies: dict[str, Any], now: float = 0.0, **config: Any) -> bool:
    cfg = TailSamplingConfig.model_validate({"policies": list(policies), **config})
    trace = Trace(spans[0].trace_id, spans, 0.0, 0.0)
    return PolicySet(list(cfg.policies), cfg.sample_on_first_match).decide(trace, now)


def agent_trace(status: str = "OK", model: str = "gpt-4o-mini", duration_ms: int = 1200) -> list[Span]:
    root = span(7, 0, None, duration_ms=duration_ms, step_type="agent", session_id="conv-1", status_code="UNSET")
    root.resource_attributes = {"service.name": "support", "deployment.environment": "prod"}
    llm = span(
        7,
        1,
        start_ms=5,
        duration_ms=400,
        step_type="llm",
        model=model,
        input_tokens=900,
        output_tokens=120,
        status_code=status,
        attributes={"gen_ai.request.model": model, "http.status_code": 200, "retry": False, "llm.cached": True},
    )
    llm.resource_attributes = root.resource_attributes
    tool = span(7, 2, start_ms=500, step_type="tool", tool_name="lookup")
    return [root, llm, tool]


@pytest.mark.parametrize(
    ("policies", "trace", "sampled"),
    [
        ([policy("always_sample")], agent_trace(), True),
        ([policy("status_code", {"status_codes": ["ERROR"]})], agent_trace(status="ERROR"), True),
        ([policy("status_code", {"status_codes": ["ERROR"]})], agent_trace(), False),
        ([policy("status_code", {"status_codes": ["OK", "ERROR"]})], agent_trace(), True),
        ([policy("latency", {"threshold_ms": 1000})], agent_trace(duration_ms=1200), True),
        ([policy("latency", {"threshold_ms": 1000})], agent_trace(duration_ms=900), False),
        ([policy("latency", {"threshold_ms": 1000, "upper_threshold_ms": 1100})], agent_trace(duration_ms=1200), False),
        ([policy("latency", {"threshold_ms": 1000, "upper_threshold_ms": 1500})], agent_trace(duration_ms=1200), True),
        # raw span attributes, resource attributes and canonical fields
        ([policy("string_attribute", {"key": "gen_ai.request.model", "values": ["gpt-4o-mini"]})], agent_trace(), True),
        ([policy("string_attribute", {"key": "deployment.environment", "values": ["prod"]})], agent_trace(), True),
        ([policy("string_attribute", {"key": "model", "values": ["gpt-4o-mini"]})], agent_trace(), True),
        ([policy("string_attribute", {"key": "model", "values": ["gpt-4o"]})], agent_trace(), False),
        ([policy("string_attribute", {"key": "step_type", "values": ["tool"]})], agent_trace(), True),
        (
            [policy("string_attribute", {"key": "model", "values": ["^gpt-4o"], "enabled_regex_matching": True})],
            agent_trace(),
            True,
        ),
        (
            [policy("string_attribute", {"key": "model", "values": ["claude"], "enabled_regex_matching": True})],
            agent_trace(),
            False,
        ),
        (
            [policy("string_attribute", {"key": "model", "values": ["claude"], "invert_match": True})],
            agent_trace(),
            True,
        ),
        (
            [policy("string_attribute", {"key": "model", "values": ["gpt-4o-mini"], "invert_match": True})],
            agent_trace(),
            False,
        ),
        (
            [policy("string_attribute", {"key": "no.such.key", "values": ["x"], "invert_match": True})],
            agent_trace(),
            True,
        ),
        (
            [policy("numeric_attribute", {"key": "http.status_code", "min_value": 200, "max_value": 299})],
            agent_trace(),
            True,
        ),
        ([policy("numeric_attribute", {"key": "http.status_code", "min_value": 400})], agent_trace(), False),
        ([policy("numeric_attribute", {"key": "input_tokens", "min_value": 500})], agent_trace(), True),
        ([policy("numeric_attribute", {"key": "input_tokens", "max_value": 500})], agent_trace(), False),
        ([policy("numeric_attribute", {"key": "retry", "min_value": 0})], agent_trace(), False),  # a bool is no number
        ([policy("boolean_attribute", {"key": "llm.cached", "value": True})], agent_trace(), True),
        ([policy("boolean_attribute", {"key": "retry", "value": True})], agent_trace(), False),
        ([policy("boolean_attribute", {"key": "retry", "value": True, "invert_match": True})], agent_trace(), True),
        ([policy("probabilistic", {"sampling_percentage": 100})], agent_trace(), True),
        ([policy("probabilistic", {"sampling_percentage": 0})], agent_trace(), False),
        ([policy("span_count", {"min_spans": 3})], agent_trace(), True),
        ([policy("span_count", {"min_spans": 4})], agent_trace(), False),
        ([policy("span_count", {"min_spans": 1, "max_spans": 2})], agent_trace(), False),
        ([policy("cel", {"condition": 'trace.spans.exists(s, s.model == "gpt-4o-mini")'})], agent_trace(), True),
        (
            [policy("cel", {"condition": "trace.root.step_type == 'agent' && trace.error_count > 0"})],
            agent_trace(),
            False,
        ),
        ([policy("cel", {"condition": "trace.error_count > 0"})], agent_trace(status="ERROR"), True),
        # a missing key is no match, not an error
        ([policy("cel", {"condition": 'trace.root.attributes["missing"] == 1'})], agent_trace(), False),
        (
            [policy("cel", {"condition": 'trace.session_id == "conv-1" && trace.duration_ns > 1000000000'})],
            agent_trace(),
            True,
        ),
        (
            [
                policy(
                    "and",
                    {
                        "and_sub_policy": [
                            policy("string_attribute", {"key": "model", "values": ["gpt-4o-mini"]}, "m"),
                            policy("status_code", {"status_codes": ["ERROR"]}, "e"),
                        ]
                    },
                )
            ],
            agent_trace(),
            False,
        ),
        (
            [
                policy(
                    "and",
                    {
                        "and_sub_policy": [
                            policy("string_attribute", {"key": "model", "values": ["gpt-4o-mini"]}, "m"),
                            policy("status_code", {"status_codes": ["ERROR"]}, "e"),
                        ]
                    },
                )
            ],
            agent_trace(status="ERROR"),
            True,
        ),
        # drop wins over any sample vote
        (
            [
                policy("always_sample", name="all"),
                policy(
                    "drop",
                    {"drop_sub_policy": [policy("string_attribute", {"key": "tool_name", "values": ["lookup"]})]},
                ),
            ],
            agent_trace(),
            False,
        ),
        # no policy votes to sample
        (
            [policy("status_code", {"status_codes": ["ERROR"]}, "e"), policy("span_count", {"min_spans": 10}, "n")],
            agent_trace(),
            False,
        ),
    ],
)
def test_policies_decide_as_the_collector_does(
    policies: list[dict[str, Any]], trace: list[Span], sampled: bool
) -> None:
    assert decide(trace, *policies) is sampled


def test_sample_on_first_match_stops_before_a_drop_policy() -> None:
    drop = policy("drop", {"drop_sub_policy": [policy("always_sample", name="x")]}, "d")
    assert decide(agent_trace(), policy("always_sample", name="a"), drop) is False
    assert decide(agent_trace(), policy("always_sample", name="a"), drop, sample_on_first_match=True) is True


def test_probabilistic_policy_hashes_trace_ids_like_the_collector() -> None:
    # FNV-1a 64 test vectors and the Collector's threshold for 50%
    assert _fnv1a(b"") == 0xCBF29CE484222325
    assert _fnv1a(b"a") == 0xAF63DC4C8601EC8C
    assert _fnv1a(b"foobar") == 0x85944171F73967E8
    assert probability_threshold(0.5) == 2**63 - 1
    assert probability_threshold(1.0) == 2**64 - 1
    rng = random.Random(11)
    ids = [rng.getrandbits(128) for _ in range(10_000)]
    kept = sum(decide([span(t, 0, None)], policy("probabilistic", {"sampling_percentage": 25})) for t in ids)
    assert abs(kept / len(ids) - 0.25) < 0.02
    # the same ids with another salt: a different, equally sized share
    salted = [
        decide([span(t, 0, None)], policy("probabilistic", {"sampling_percentage": 25, "hash_salt": "x"})) for t in ids
    ]
    assert abs(sum(salted) / len(ids) - 0.25) < 0.02
    assert salted != [decide([span(t, 0, None)], policy("probabilistic", {"sampling_percentage": 25})) for t in ids]


def test_rate_limiting_spends_a_token_bucket_of_spans() -> None:
    cfg = TailSamplingConfig.model_validate({"policies": [policy("rate_limiting", {"spans_per_second": 10})]})
    policies = PolicySet(list(cfg.policies))
    trace = Trace("a" * 32, [span(1, n) for n in range(5)], 0, 0)
    # the bucket starts full at twice the rate: 4 traces of 5 spans pass, the 5th does not
    assert [policies.decide(trace, 100.0) for _ in range(5)] == [True, True, True, True, False]
    assert policies.decide(trace, 100.5) is True  # half a second refills 5 spans
    assert policies.decide(trace, 100.5) is False


def test_composite_allocates_spans_per_second_to_its_sub_policies_in_order() -> None:
    cfg = TailSamplingConfig.model_validate(
        {
            "policies": [
                policy(
                    "composite",
                    {
                        "max_total_spans_per_second": 10,
                        "policy_order": ["errors", "rest"],
                        "composite_sub_policy": [
                            policy("always_sample", name="rest"),
                            policy("status_code", {"status_codes": ["ERROR"]}, "errors"),
                        ],
                        "rate_allocation": [{"policy": "errors", "percent": 60}],
                    },
                )
            ]
        }
    )
    policies = PolicySet(list(cfg.policies))
    errors = Trace("e" * 32, [span(1, n, status_code="ERROR") for n in range(2)], 0, 0)
    ok = Trace("f" * 32, [span(2, n) for n in range(2)], 0, 0)
    # errors get 6 spans/s (3 traces), the rest the remaining 4 (2 traces); both counters restart each second
    assert [policies.decide(errors, 50.1) for _ in range(4)] == [True, True, True, False]
    assert [policies.decide(ok, 50.2) for _ in range(3)] == [True, True, False]
    assert policies.decide(errors, 51.0) is True


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"policies": [{"name": "e", "type": "status_code"}]}, "needs a `status_code:` block"),
        ({"policies": [policy("status_code", {"status_codes": ["FAILED"]})]}, "status_codes.0"),
        ({"policies": [policy("cel", {"condition": "trace.spans.exists(s, "})]}, "invalid CEL expression"),
        ({"policies": [policy("cel", {"condition": "spans.size() > 1"})]}, "undeclared reference to 'spans'"),
        ({"policies": [policy("cel", {"condition": "trace.span_count + 1"})]}, "must be a condition"),
        (
            {"policies": [policy("cel", {"condition": "trace.tool_cals > 1"})]},
            "trace.tool_cals: trace has no field 'tool_cals': did you mean 'tool_calls'?",
        ),
        (
            {"policies": [policy("cel", {"condition": "trace.spans.exists(s, s.modle == 'x')"})]},
            "s.modle: a span has no field 'modle': did you mean 'model'?",
        ),
        ({"policies": [policy("always_sample"), policy("always_sample")]}, "repeated: ['p']"),
        ({"decision_wait": "5x"}, "decision_wait"),
        ({"decision_wait": "10s", "max_trace_duration": "5s"}, "max_trace_duration"),
        ({"policies": [policy("latency", {"threshold_ms": 10, "upper_threshold_ms": 5})]}, "upper_threshold_ms"),
        (
            {"policies": [policy("string_attribute", {"key": "k", "values": ["("], "enabled_regex_matching": True})]},
            "invalid regular expression",
        ),
        (
            {
                "policies": [
                    policy(
                        "composite",
                        {
                            "max_total_spans_per_second": 5,
                            "composite_sub_policy": [policy("always_sample", name="a")],
                            "rate_allocation": [{"policy": "b", "percent": 50}],
                        },
                    )
                ]
            },
            "unknown sub-policies ['b']",
        ),
    ],
)
def test_config_errors_name_the_key(config: dict[str, Any], message: str) -> None:
    raw = {
        "receivers": {"otlp": None},
        "processors": {"tail_sampling": config},
        "exporters": {"clickhouse": None},
        "service": {
            "pipelines": {
                "traces": {"receivers": ["otlp"], "processors": ["tail_sampling"], "exporters": ["clickhouse"]}
            }
        },
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    [error] = info.value.errors
    assert error.startswith("processors.tail_sampling."), error
    assert message in error


# --- decisions handed on -------------------------------------------------------------------------------------


def test_every_complete_trace_goes_on_with_its_decision_on_each_span_and_is_counted() -> None:
    proc, sink, clock, metrics = make(policies=[policy("status_code", {"status_codes": ["ERROR"]})])

    async def scenario() -> None:
        await feed(
            proc, [span(1, 0, None), span(1, 1, status_code="ERROR")], [span(2, 0, None), span(2, 1), span(2, 2)]
        )
        clock.now += 2
        await proc.tick()

    run(scenario())
    spans = [s for b in sink.of("trace") for s in b.spans]
    assert {(s.trace_id[-1], s.sampled) for s in spans} == {("1", True), ("2", False)}
    assert len(spans) == 5
    assert metric(metrics, "evalsi_tail_sampling_traces_total", decision="sampled") == 1
    assert metric(metrics, "evalsi_tail_sampling_traces_total", decision="not_sampled") == 1
    assert metric(metrics, "evalsi_tail_sampling_spans_total", decision="sampled") == 2
    assert metric(metrics, "evalsi_tail_sampling_spans_total", decision="not_sampled") == 3
    votes = "evalsi_tail_sampling_policy_decisions_total"
    assert metric(metrics, votes, policy="p", decision="sampled") == 1
    assert metric(metrics, votes, policy="p", decision="not_sampled") == 1


def test_a_span_sampled_out_upstream_stays_out() -> None:
    proc, sink, clock, _ = make(policies=[policy("always_sample")])
    head_dropped = span(1, 1)
    head_dropped.sampled = False

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None), head_dropped])
        clock.now += 2
        await proc.tick()

    run(scenario())
    assert {s.span_id: s.sampled for s in sink.of("trace")[0].spans} == {f"{1:016x}": True, f"{2:016x}": False}


# --- late spans ----------------------------------------------------------------------------------------------


def test_late_spans_follow_their_traces_cached_decision() -> None:
    proc, sink, clock, metrics = make(policies=[policy("status_code", {"status_codes": ["ERROR"]})])

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None, status_code="ERROR")], [span(2, 0, None)])
        clock.now += 2
        await proc.tick()
        await feed(proc, [span(1, 5), span(2, 5, status_code="ERROR")])  # late; the error cannot flip trace 2
        clock.now += 100
        await proc.tick()

    run(scenario())
    [late] = sink.of("spans")
    assert {s.trace_id[-1]: s.sampled for s in late.spans} == {"1": True, "2": False}
    assert len(sink.of("trace")) == 1, "late spans never start a trace of their own"
    assert metric(metrics, "evalsi_tail_sampling_late_spans_total", decision="sampled") == 1
    assert metric(metrics, "evalsi_tail_sampling_late_spans_total", decision="not_sampled") == 1


def test_without_a_decision_cache_a_late_span_starts_a_new_trace() -> None:
    proc, sink, clock, _ = make(decision_cache={"sampled_cache_size": 0, "non_sampled_cache_size": 0})

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None)])
        clock.now += 2
        await proc.tick()
        await feed(proc, [span(1, 5)])
        clock.now += 100
        await proc.tick()

    run(scenario())
    assert [len(b.spans) for b in sink.of("trace")] == [1, 1]
    assert sink.of("spans") == []


def test_the_decision_cache_forgets_the_least_recently_used_trace() -> None:
    proc, sink, clock, _ = make(decision_cache={"sampled_cache_size": 2, "non_sampled_cache_size": 2})

    async def scenario() -> None:
        await feed(proc, [span(t, 0, None) for t in (1, 2, 3)])
        clock.now += 2
        await proc.tick()
        await feed(proc, [span(3, 5), span(1, 5)])
        clock.now += 100
        await proc.tick()

    run(scenario())
    assert [s.trace_id[-1] for s in sink.of("spans")[0].spans] == ["3"]
    assert [s.trace_id[-1] for s in sink.of("trace")[-1].spans] == ["1"]  # forgotten: a new trace


def test_late_span_reevaluation_hands_the_whole_trace_on_again_as_a_revision() -> None:
    proc, sink, clock, metrics = make(
        late_span_reevaluation=True, policies=[policy("status_code", {"status_codes": ["ERROR"]})]
    )

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None, status_code="ERROR"), span(1, 1)], [span(2, 0, None)])
        clock.now += 2
        await proc.tick()
        await feed(proc, [span(1, 2), span(2, 2)])

    run(scenario())
    revisions = sink.of("trace", revision=True)
    spans = {(s.trace_id[-1], s.span_id[-1], s.sampled) for b in revisions for s in b.spans}
    assert spans == {("1", "1", True), ("1", "2", True), ("1", "3", True), ("2", "1", False), ("2", "3", False)}
    assert sink.of("spans") == [], "the late span travels once, inside its trace's revision"
    assert metric(metrics, "evalsi_tail_sampling_traces_reemitted_total") == 2
    assert metric(metrics, "evalsi_tail_sampling_late_spans_total", decision="sampled") == 1


def test_a_revision_of_a_decided_span_follows_the_decision() -> None:
    proc, sink, clock, _ = make(policies=[policy("status_code", {"status_codes": ["ERROR"]})])

    async def scenario() -> None:
        await feed(proc, [span(2, 0, None), span(2, 1)])
        clock.now += 2
        await proc.tick()
        await feed(proc, [span(2, 1)], revision=True)

    run(scenario())
    [revision] = sink.of("spans", revision=True)
    assert [s.sampled for s in revision.spans] == [False]


# --- bounded memory ------------------------------------------------------------------------------------------


def test_a_flood_of_never_ending_traces_stays_bounded_and_every_eviction_is_counted() -> None:
    proc, sink, clock, metrics = make(num_traces=20, max_buffered_bytes=300_000, max_trace_duration="1h")
    sent = 0
    most_traces = most_bytes = 0

    async def scenario() -> None:
        nonlocal sent, most_traces, most_bytes
        for t in range(1, 2001):
            # children only, no root: none of these traces ever completes on its own; the second thousand carry
            # content, so the byte limit bites before num_traces does
            content = {"gen_ai.input.messages": "x" * 2000} if t > 1000 else {}
            batch = [span(t, n, attributes=dict(content)) for n in range(1, 4)]
            await feed(proc, batch)
            sent += len(batch)
            most_traces = max(most_traces, len(proc._buffer))
            most_bytes = max(most_bytes, proc._buffer.bytes)
            clock.now += 0.01
            await proc.tick()

    run(scenario())
    assert most_traces <= 20 and most_bytes <= 300_000
    by_count = metric(metrics, "evalsi_traces_evicted_total", reason="num_traces")
    by_bytes = metric(metrics, "evalsi_traces_evicted_total", reason="max_buffered_bytes")
    assert by_count > 900 and by_bytes > 900
    assert by_count + by_bytes == 2000 - len(proc._buffer)
    assert metric(metrics, "evalsi_tail_sampling_traces_completed_total", reason="evicted") == by_count + by_bytes
    # evicted traces were decided early and handed on whole, never dropped
    assert len(sink.span_ids()) == sent - sum(len(t.spans) for t in proc._buffer.traces.values())
    run(proc.shutdown())
    assert len(sink.span_ids()) == sent


def test_the_span_size_estimate_grows_with_content() -> None:
    small = span(1, 1)
    big = span(1, 2, attributes={"gen_ai.input.messages": "x" * 10_000})
    assert 500 < span_size(small) < span_size(big)
    assert span_size(big) >= 30_000


# --- sessions ------------------------------------------------------------------------------------------------


def test_traces_sharing_a_session_are_handed_on_together_after_session_timeout() -> None:
    proc, sink, clock, metrics = make(session_timeout="60s")

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None, session_id="s1"), span(1, 1)])
        clock.now += 2
        await proc.tick()
        clock.now += 30
        await feed(proc, [span(2, 0, None, session_id="s1")], [span(3, 0, None, session_id="s2")])
        clock.now += 2
        await proc.tick()
        clock.now += 40  # s1 last heard of 42 s ago
        await proc.tick()
        assert sink.of("session") == []
        clock.now += 20
        await proc.tick()

    run(scenario())
    sessions = {b.spans[0].session_id or b.spans[-1].session_id: b for b in sink.of("session")}
    assert set(sessions) == {"s1", "s2"}
    assert sorted((s.trace_id[-1], s.span_id[-1]) for s in sessions["s1"].spans) == [("1", "1"), ("1", "2"), ("2", "1")]
    assert metric(metrics, "evalsi_tail_sampling_sessions_total", reason="quiet") == 2


def test_sessions_are_bounded_and_evictions_counted() -> None:
    proc, sink, clock, metrics = make(max_sessions=3, max_session_spans=100)

    async def scenario() -> None:
        await feed(proc, [span(t, 0, None, session_id=f"s{t}") for t in range(1, 11)])
        clock.now += 2
        await proc.tick()

    run(scenario())
    assert len(proc._sessions) == 3
    assert len(sink.of("session")) == 7
    assert metric(metrics, "evalsi_sessions_evicted_total", reason="max_sessions") == 7


def test_max_sessions_0_turns_sessions_off() -> None:
    proc, sink, clock, _ = make(max_sessions=0)

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None, session_id="s1")])
        clock.now += 2
        await proc.tick()
        await proc.shutdown()

    run(scenario())
    assert sink.of("session") == [] and len(sink.of("trace")) == 1


# --- lifecycle and backpressure ------------------------------------------------------------------------------


def test_shutdown_decides_and_hands_on_every_buffered_trace_and_open_session() -> None:
    proc, sink, _, metrics = make(policies=[policy("status_code", {"status_codes": ["ERROR"]})])

    async def scenario() -> None:
        await proc.start()
        await feed(proc, [span(1, 1, session_id="s"), span(1, 2)], [span(2, 0, None, status_code="ERROR")])
        await proc.shutdown()
        with pytest.raises(Refused):  # nothing taken after shutdown could ever be decided
            await feed(proc, [span(3, 0, None)])

    run(scenario())
    assert sorted((s.trace_id[-1], s.span_id[-1], s.sampled) for s in [*sink.of("trace")[0].spans]) == [
        ("1", "2", False),
        ("1", "3", False),
        ("2", "1", True),
    ]
    assert len(sink.of("session")) == 1
    assert metric(metrics, "evalsi_tail_sampling_traces_completed_total", reason="shutdown") == 2
    assert metric(metrics, "evalsi_tail_sampling_traces_buffered") == 0


def test_the_background_task_decides_without_being_asked() -> None:
    clock = Clock()
    proc, sink, _, _ = make(clock, decision_wait="50ms")

    async def scenario() -> None:
        await proc.start()
        await feed(proc, [span(1, 0, None)])
        clock.now += 1
        for _ in range(50):
            await asyncio.sleep(0.02)
            if sink.batches:
                break
        await proc.shutdown()

    run(scenario())
    assert len(sink.of("trace")) == 1


def test_a_refused_batch_is_kept_and_retried_and_new_spans_are_refused_meanwhile() -> None:
    proc, sink, clock, _ = make()
    sink.refuse = 2

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None)])
        clock.now += 2
        await proc.tick()  # refused once
        with pytest.raises(Refused):
            await feed(proc, [span(2, 0, None)])
        await proc.tick()  # refused again
        assert sink.batches == []
        await proc.tick()  # taken
        await feed(proc, [span(2, 0, None)])
        clock.now += 2
        await proc.tick()

    run(scenario())
    assert [b.spans[0].trace_id[-1] for b in sink.of("trace")] == ["1", "2"]


def test_new_spans_are_refused_for_the_reason_the_next_consumer_gave() -> None:
    """A store that is down (503 / UNAVAILABLE) stays so at the receivers, not a full queue (429)."""
    proc, sink, clock, _ = make()

    async def store_down(batch: SpanBatch) -> None:
        raise Refused("the store refuses writes (NOT_ENOUGH_SPACE)", unavailable=True, retry_after=10)

    sink.consume = store_down  # type: ignore[method-assign]

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None)])
        clock.now += 2
        await proc.tick()
        with pytest.raises(Refused) as refused:
            await feed(proc, [span(2, 0, None)])
        assert refused.value.unavailable and refused.value.retry_after == 10
        assert "NOT_ENOUGH_SPACE" in str(refused.value)

    run(scenario())


def test_shutdown_waits_for_a_refusing_consumer_to_take_the_rest() -> None:
    proc, sink, _, metrics = make()
    sink.refuse = 3

    async def scenario() -> None:
        await feed(proc, [span(1, 0, None)])
        await proc.shutdown()

    run(scenario())
    assert len(sink.span_ids()) == 1
    assert metric(metrics, "evalsi_tail_sampling_spans_lost_total") == 0
