"""A model call recorded in two traces (the Anthropic SDK's lone span, an instrumentation's root span): the twin
buffer the evaluate processor holds them in, and the token and cost evaluators counting a call once."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from running_collector import FIXTURES

from evalsi.evaluators import REGISTRY, Target, load_evaluators, parse_params
from evalsi.evaluators.base import run
from evalsi.model.span import VENDOR_SDK, Span
from evalsi.model.trajectory import build_trajectory
from evalsi.policies.twins import ARMED_S, TwinBuffer
from evalsi.processors.normalize.files import normalize_files

TWINS = [
    ("anthropic-sdk/openllmetry", "chat_simple"),
    ("anthropic-sdk/openllmetry", "chat_stream"),
    ("anthropic-sdk/openllmetry", "chat_error"),  # a failed call: no response ids, paired by model and time
    ("anthropic-sdk/openinference", "chat_stream"),  # OpenInference's stream span records no response id
]


def _spans(stack: str, scenario: str) -> list[Span]:
    files = [FIXTURES / stack / f"{scenario}.pb"]
    logs: Path = FIXTURES / stack / f"{scenario}.logs.pb"
    return normalize_files(files + ([logs] if logs.exists() else [])).spans


def _traces(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans:
        out.setdefault(s.trace_id, []).append(s)
    return out


def _expected(stack: str, scenario: str) -> dict[str, Any]:
    meta = json.loads((FIXTURES / stack / "meta.json").read_text())
    expected: dict[str, Any] = meta["scenarios"][scenario]["expected"]
    return expected


def _buffer(wait: float = 2.0, max_traces: int = 100) -> TwinBuffer:
    return TwinBuffer(wait, frozenset({"anthropic"}), max_traces)


@pytest.mark.parametrize("sdk_first", [True, False], ids=["SDK's trace first", "instrumentation's first"])
@pytest.mark.parametrize(("stack", "scenario"), TWINS, ids=["/".join(t) for t in TWINS])
def test_the_two_traces_of_one_call_meet_and_are_one_trace_with_the_call_once(
    stack: str, scenario: str, sdk_first: bool
) -> None:
    traces = list(_traces(_spans(stack, scenario)).values())
    assert len(traces) == 2
    traces.sort(key=lambda t: not t[0].details.get(VENDOR_SDK), reverse=not sdk_first)
    twins = _buffer()
    sdk_trace = next(t for t in traces if t[0].details.get(VENDOR_SDK))
    assert twins.wants(sdk_trace, now=9.0)  # a lone SDK call, which arms its service
    assert all(twins.wants(t, now=9.5) for t in traces)
    assert twins.add(traces[0], completed=5.0, now=10.0) == []  # held for its twin
    assert len(twins) == 1
    ((joined, completed),) = twins.add(traces[1], completed=6.0, now=10.5)  # at once, no wait
    assert completed == 5.0  # freshness counts from the first of the two
    assert len(twins) == 0 and twins.joined == 1
    assert not joined[0].details.get(VENDOR_SDK)  # the instrumentation's trace is the trace: its id, its root
    trajectory = build_trajectory(joined)
    expected = _expected(stack, scenario)
    assert trajectory["trace_id"] == joined[0].trace_id
    assert trajectory["llm_calls"] == expected["llm_calls"] == 1
    assert trajectory["output_tokens"] == expected["output_tokens"]
    assert trajectory["input_tokens"] == expected.get("input_tokens_including_cache", expected["input_tokens"])
    assert trajectory["final_output"] == expected["final_answer"]


def test_a_trace_without_a_twin_waits_then_is_evaluated_alone() -> None:
    (lone,) = _traces(_spans("anthropic-sdk/sdk", "chat_simple")).values()  # the SDK alone: no instrumentation
    twins = _buffer(wait=2.0)
    assert twins.wants(lone, now=10.0)
    assert twins.add(lone, completed=1.0, now=10.0) == []
    assert twins.due(11.9) == []
    assert twins.due(12.0) == [(lone, 1.0)]
    assert len(twins) == 0 and twins.joined == 0


def test_other_traces_never_wait() -> None:
    # the SDK's span inside the instrumentation's trace (OpenInference makes its span current): folded in the trace
    (nested,) = _traces(_spans("anthropic-sdk/openinference", "chat_simple")).values()
    # the tool runner: SDK and instrumentation spans under the runner's span, in one trace
    (runner,) = _traces(_spans("anthropic-sdk/openllmetry", "chat_tool_runner")).values()
    # another provider's root-level call: its SDK records no spans of its own
    (openai,) = _traces(_spans("otel-openai-v2-latest", "chat_simple")).values()
    twins = _buffer()
    for t in (nested, runner, openai):  # their services armed: they still do not wait
        twins.arm(t[0].service_name, 0.0)
    assert not any(twins.wants(t, now=1.0) for t in (nested, runner, openai))


def test_a_root_level_instrumentation_call_waits_only_while_its_service_sends_lone_sdk_calls() -> None:
    """A service whose SDK records no spans of its own (turned off, as docs/conventions.md advises) never waits."""
    traces = list(_traces(_spans("anthropic-sdk/openllmetry", "chat_simple")).values())
    (instrumented,) = [t for t in traces if not t[0].details.get(VENDOR_SDK)]
    (lone,) = [t for t in traces if t[0].details.get(VENDOR_SDK)]
    twins = _buffer()
    assert not twins.wants(instrumented, now=0.0)  # no lone SDK call from its service yet
    assert twins.wants(lone, now=1.0)
    assert twins.wants(instrumented, now=2.0)
    assert not twins.wants(instrumented, now=1.0 + ARMED_S + 1)  # none for an hour: at once again
    other = [replace(s, service_name="billing") for s in instrumented]
    assert not twins.wants(other, now=2.0)  # armed per service


MS = 1_000_000


def _call(trace: str, response_id: str | None, start: int, end: int, *, sdk: bool) -> list[Span]:
    """A one-span trace of a call from `start` to `end` ms."""
    details: dict[str, Any] = {VENDOR_SDK: "anthropic"} if sdk else {}
    if response_id:
        details["response_id"] = response_id
    return [
        Span(
            trace_id=trace,
            span_id=trace[:16],
            parent_span_id="",
            name="call",
            kind="CLIENT",
            start_time_unix_nano=start * MS,
            end_time_unix_nano=end * MS,
            step_type="llm",
            model="claude-sonnet-4-5",
            provider="anthropic",
            output_tokens=10,
            details=details,
        )
    ]


def test_calls_made_at_once_pair_by_response_id_not_by_time() -> None:
    twins = _buffer()
    a_inst, b_inst = _call("a" * 32, "msg_a", 0, 100, sdk=False), _call("b" * 32, "msg_b", 0, 100, sdk=False)
    a_sdk, b_sdk = _call("c" * 32, "msg_a", 1, 99, sdk=True), _call("d" * 32, "msg_b", 1, 99, sdk=True)
    assert twins.add(a_inst, 0.0, 0.0) == [] and twins.add(b_inst, 0.0, 0.0) == []
    ((joined_b, _),) = twins.add(b_sdk, 0.0, 0.0)
    ((joined_a, _),) = twins.add(a_sdk, 0.0, 0.0)
    assert [s.trace_id for s in joined_b] == ["b" * 32, "d" * 32]
    assert [s.trace_id for s in joined_a] == ["a" * 32, "c" * 32]


def test_a_response_id_pairs_only_within_one_service() -> None:
    """One call's two traces come from one process. Two services calling a model server that answers with the same
    response id (a deterministic fake, as in the captures) made two calls: each pairs with its own SDK trace."""
    twins = _buffer()

    def of(service: str, spans: list[Span]) -> list[Span]:
        return [replace(s, service_name=service) for s in spans]

    a_inst = of("shop", _call("a" * 32, "msg_same", 0, 100, sdk=False))
    b_sdk = of("bank", _call("d" * 32, "msg_same", 201, 299, sdk=True))
    a_sdk = of("shop", _call("c" * 32, "msg_same", 1, 99, sdk=True))
    assert twins.add(a_inst, 0.0, 0.0) == []
    assert twins.add(b_sdk, 0.0, 0.0) == []  # the same id from another service: not shop's call
    ((joined, _),) = twins.add(a_sdk, 0.0, 0.0)
    assert [s.trace_id for s in joined] == ["a" * 32, "c" * 32]
    assert len(twins) == 1  # bank's SDK call waits for its own twin


def test_a_call_outside_the_other_calls_time_is_no_twin() -> None:
    twins = _buffer()
    assert twins.add(_call("a" * 32, None, 0, 100, sdk=False), 0.0, 0.0) == []
    assert twins.add(_call("c" * 32, None, 150, 180, sdk=True), 0.0, 0.0) == []  # after it: another call
    assert len(twins) == 2


def test_a_trace_waiting_again_hands_on_what_waited_and_its_twin_still_finds_it() -> None:
    twins = _buffer()
    first = _call("a" * 32, "msg_a", 0, 100, sdk=True)
    again = _call("a" * 32, "msg_a", 0, 100, sdk=True)  # the same trace id in a later batch (late spans)
    assert twins.add(first, 1.0, 0.0) == []
    assert twins.add(again, 2.0, 0.5) == [(first, 1.0)]
    assert len(twins) == 1
    ((joined, _),) = twins.add(_call("b" * 32, "msg_a", 0, 100, sdk=False), 3.0, 1.0)
    assert [s.trace_id for s in joined] == ["b" * 32, "a" * 32]
    assert len(twins) == 0


def test_past_max_traces_the_oldest_is_evaluated_alone_at_once() -> None:
    twins = _buffer(max_traces=2)
    first = _call("a" * 32, "msg_a", 0, 100, sdk=True)
    assert twins.add(first, 1.0, 0.0) == []
    assert twins.add(_call("b" * 32, "msg_b", 0, 100, sdk=True), 2.0, 0.0) == []
    assert twins.add(_call("c" * 32, "msg_c", 0, 100, sdk=True), 3.0, 0.0) == [(first, 1.0)]
    assert len(twins) == 2
    # its twin, arriving later, finds nothing to join and waits alone (the next oldest is evaluated alone for it)
    late = _call("d" * 32, "msg_a", 0, 100, sdk=False)
    assert [spans[0].trace_id for spans, _ in twins.add(late, 4.0, 0.0)] == ["b" * 32]
    assert twins.joined == 0


@pytest.mark.parametrize("stack", ["anthropic-sdk/openllmetry", "anthropic-sdk/openinference"])
def test_token_and_cost_evaluators_count_a_call_recorded_twice_once(stack: str) -> None:
    """The tool runner's calls, each recorded by the SDK and the instrumentation in one trace."""
    spans = _spans(stack, "chat_tool_runner")
    expected = _expected(stack, "chat_tool_runner")
    for s in spans:  # as the price table would: each record of a call at the call's price
        if s.step_type == "llm":
            s.cost_usd = (s.output_tokens or 0) * 1e-5
    load_evaluators()
    tokens, cost = REGISTRY["builtin/tokens"], REGISTRY["builtin/cost"]
    target = Target(spans, span=spans[0])
    (score,) = run(tokens, target, parse_params(tokens, {"measure": "output"}))
    assert score.value == expected["output_tokens"]
    assert score.metadata["calls"] == expected["llm_calls"]
    (usd,) = run(cost, target, parse_params(cost, {}))
    assert usd.value == pytest.approx(expected["output_tokens"] * 1e-5)
