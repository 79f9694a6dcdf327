"""A condition remembers its result per distinct tuple of the values it reads (`Condition.matches`), and `trace`
carries only the keys conditions name: over varied traces (every fixture, random ones with hostile attribute
values) each condition decides as CEL does over the activation built in full, its memo stays within `MEMO_SIZE`,
and a value CEL cannot take anywhere in what a condition is handed still makes it false."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import pytest
from running_collector import FIXTURES

from evalsi import cel
from evalsi.model.span import Span
from evalsi.policies import conditions
from evalsi.policies.conditions import TRACE_VARIABLES, Condition
from evalsi.policies.trace_view import TraceView
from evalsi.processors.normalize.files import normalize_files

SELECTORS = [
    "trace.service_name == 'support-bot'",
    "span.attributes['app.route'] == 'support' && trace.llm_calls > 0",
    "trace.llm_calls + trace.tool_calls > 2 || trace.error_count > 0",
    "trace.input_tokens > 500 && trace.cost_usd >= 0.0",
    "trace.duration_ns > 2000000000 || trace.span_count == 3",
    "trace.session_id == 'conv-1' || trace.user_id != null",
    "has(span.attributes.tier) && span.attributes.tier == 1",
    "span.attributes['n'] == 1",
    "span.attributes['n'] == 1.0",
    "span.attributes['n'] == true",
    "'app.route' in span.attributes",
    "size(span.attributes) > 3",
    "span.attributes[span.name] == 'x'",
    "resource['service.name'] == 'support-bot' && session.id != null",
    "trace.spans.exists(s, s.model == 'gpt-4o-mini')",
    "trace.models.exists(m, m == 'gpt-4o-mini') && trace.start_time_unix_nano > 0",
    "'search' in trace.tool_names",
    "trace.root.name.startsWith('invoke')",
    "trace.error && trace.steps['llm'] > 1",
    "1.0 / double(span.attributes['n']) > 0.0",
    "span.name == 'chat' && trace.trace_id != ''",
]

HOSTILE = [2**70, -(2**63) - 1, 2**64, "\ud800", {"k": "\udfff"}, [1, [2, {"c": 2**80}]], (1, 2)]
"""Values CEL refuses: anywhere in what a condition is handed, the condition is false."""
PLAIN = ["support", "billing", 1, 1.0, True, 0, 0.0, -0.0, math.nan, None, b"\xff", [1, "a"], {"x": 1}, "x"]


def _random_trace(rng: random.Random, n: int) -> list[Span]:
    trace_id = f"{n:032x}"
    start = 1_700_000_000_000_000_000 + rng.randint(0, 10**9)
    spans = []
    for i in range(rng.randint(1, 5)):
        attributes: dict[str, Any] = {}
        if rng.random() < 0.7:
            attributes["app.route"] = rng.choice(["support", "billing", 1, None])
        if rng.random() < 0.5:
            attributes["n"] = rng.choice(PLAIN)
        if rng.random() < 0.3:
            attributes["tier"] = rng.choice([1, 1.0, True, "1"])
        if rng.random() < 0.15:
            attributes["other"] = rng.choice(HOSTILE)
        if rng.random() < 0.2:
            attributes["x"] = rng.choice(PLAIN)
        step = rng.choice(["llm", "tool", "agent", "other"])
        span = Span(
            trace_id, f"{n:08x}{i:08x}", "" if i == 0 else f"{n:08x}{0:08x}",
            rng.choice(["chat", "invoke_agent x", "x", "execute_tool"]), "INTERNAL",
            start + i * 10**8, start + i * 10**8 + rng.randint(0, 3 * 10**9),
            status_code=rng.choice(["UNSET", "OK", "ERROR"]),
            service_name=rng.choice(["support-bot", "billing-bot", ""]), attributes=attributes,
            resource_attributes={"service.name": rng.choice(["support-bot", "other"])}, step_type=step,  # type: ignore[arg-type]
            model=rng.choice([None, "gpt-4o-mini", "claude"]) if step == "llm" else None,
            input_tokens=rng.choice([None, 100, 900]), output_tokens=rng.choice([None, 20]),
            tool_name=rng.choice(["search", "lookup"]) if step == "tool" else None,
            session_id=rng.choice([None, "conv-1", "conv-2"]), user_id=rng.choice([None, "u1"]),
        )  # fmt: skip
        spans.append(span)
    return spans


def _fixture_traces() -> list[list[Span]]:
    out: list[list[Span]] = []
    for path in sorted(FIXTURES.glob("*/*.pb")):
        if path.name.endswith(".logs.pb"):
            continue
        logs = path.with_name(path.name.removesuffix(".pb") + ".logs.pb")
        spans = normalize_files([p for p in (path, logs) if p.exists()]).spans
        by_trace: dict[str, list[Span]] = {}
        for s in spans:
            by_trace.setdefault(s.trace_id, []).append(s)
        out.extend(by_trace.values())
    return out


def _view(condition: Condition, spans: list[Span]) -> TraceView:
    """The view the policy engine builds for a policy set holding only `condition` (`PolicySet._view`)."""
    program = condition.program
    return TraceView(
        spans,
        trace_fields=program.fields if program.trace_spans else frozenset(),
        span_fields=program.fields,
        trace_span_maps=program.trace_spans,
        trace_keys=None if program.trace_spans else program.names,
    )


def _in_full(condition: Condition, view: TraceView) -> bool:
    """CEL over the variables built as before the memo: `trace` counted in full, then cut to the keys named."""
    data = {}
    for v in condition.uses:
        if v != "trace":
            data[v] = view.variable(v)
            continue
        keys = view._trace_keys
        trace = cel.trace_activation(view.spans, view.trace_id, view._trace_fields, span_maps=view._trace_span_maps)
        trace = trace["trace"]
        trace["error"] = any(s.status_code == "ERROR" for s in view.spans)
        trace["steps"] = dict(Counter(s.step_type for s in view.spans))
        data["trace"] = trace if keys is None else {k: x for k, x in trace.items() if k in keys}
    return condition.program.matches(data)


@pytest.fixture(scope="module")
def traces() -> list[list[Span]]:
    rng = random.Random(35)
    return _fixture_traces() + [_random_trace(rng, n) for n in range(600)]


@pytest.mark.parametrize("selector", SELECTORS)
def test_memoized_condition_decides_as_cel_over_the_full_activation(
    selector: str, traces: list[list[Span]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conditions, "MEMO_SIZE", 16)  # small, so the memo starts afresh during the run
    condition = Condition(selector, TRACE_VARIABLES)
    decisions = Counter()
    for _ in range(2):  # the second pass answers from the memo where it can
        for spans in traces:
            view = _view(condition, spans)
            got = condition.matches(view)
            assert got == _in_full(condition, view), (selector, spans)
            decisions[got] += 1
            assert condition._memo is None or len(condition._memo) <= 16
    assert decisions[True] and decisions[False], decisions  # the traces tell both ways


def test_which_conditions_remember() -> None:
    assert Condition("trace.service_name == 'a'", TRACE_VARIABLES)._memo is not None
    assert Condition("span.attributes['a'] == 1 && trace.llm_calls > 0", TRACE_VARIABLES)._memo is not None
    for looping in ("trace.spans.exists(s, s.model == 'x')", "trace.models[0] == 'x'", "true"):
        assert Condition(looping, TRACE_VARIABLES)._memo is None


def test_memo_is_bounded_and_a_value_cel_refuses_is_never_remembered_as_a_match() -> None:
    condition = Condition("span.attributes['k'] != 'no'", TRACE_VARIABLES)
    for n in range(3 * conditions.MEMO_SIZE):
        spans = [Span(f"{n:032x}", "a" * 16, "", "x", "INTERNAL", 0, 1, attributes={"k": f"v{n}"})]
        assert condition.matches(_view(condition, spans))
        assert condition._memo is not None and len(condition._memo) <= conditions.MEMO_SIZE
    for bad in HOSTILE:
        spans = [Span("b" * 32, "a" * 16, "", "x", "INTERNAL", 0, 1, attributes={"k": "v1", "z": bad})]
        assert not condition.matches(_view(condition, spans))  # as CEL itself: the attributes do not convert
    spans = [Span("c" * 32, "a" * 16, "", "x", "INTERNAL", 0, 1, attributes={"k": "v1"})]
    assert condition.matches(_view(condition, spans))


def test_uncounted_trace_keys_equal_the_full_activation_cut() -> None:
    rng = random.Random(7)
    cheap = ["trace_id", "start_time_unix_nano", "duration_ns", "span_count", "session_id", "user_id", "service_name"]
    for n in range(300):
        spans = _random_trace(rng, n) if n else []
        keys = frozenset([*rng.sample(cheap, rng.randint(1, len(cheap))), "unrelated"])
        full = cel.trace_activation(spans, None, span_maps=False)["trace"]
        assert cel.trace_activation(spans, None, span_maps=False, keys=keys)["trace"] == {
            k: v for k, v in full.items() if k in keys
        }
