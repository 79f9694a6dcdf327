"""The agent pack's `tool-error-recovery` and `expected-actions` on trajectories built from spans: an agent that
retries a failing tool vs one that gives up, and τ-bench-style expected actions and outputs (arguments compared as
JSON, order, extra writes), on constructed traces and on every capture with a tool loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from running_collector import FIXTURES

from evalsi.evaluators import REGISTRY, Target, load_evaluators, parse_params, run
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.model.trajectory import build_trajectory
from evalsi.processors.normalize.files import normalize_files

load_evaluators()

TOOL_LOOP_FOLDERS = [
    "otel-openai-v2", "otel-openai-v2-latest", "openinference", "openllmetry-0.54", "openlit", "mlflow",
]  # fmt: skip
TRACE_ID = "5cf92f3577b34da6a3ce929d0e0e4737"
ROOT_ID = f"{1:016x}"


def _score(ref: str, target: Target, **params: Any) -> Score:
    ev = REGISTRY[f"builtin/{ref}"]
    (score,) = run(ev, target, parse_params(ev, params))
    assert score.evaluator == f"builtin/{ref}" and score.name == ref
    return score


# --- constructed traces: an agent span with LLM and tool spans under it ------------------------------------------


def _span(n: int, step_type: str, name: str, parent: str | None = ROOT_ID, **fields: Any) -> Span:
    return Span(
        TRACE_ID, f"{n:016x}", "" if n == 1 else parent or "", name, "INTERNAL", 1_000_000 * n,
        1_000_000 * n + 500_000, step_type=step_type, **fields,
    )  # fmt: skip


def say(text: str) -> dict[str, Any]:
    """An LLM call that answers (or thinks aloud) in text."""
    return {"type": "llm", "text": text}


def think() -> dict[str, Any]:
    """An LLM call whose output is only the tool call that follows it (no text)."""
    return {"type": "llm", "text": None}


def tool(name: str, arguments: Any = None, error: str | None = None) -> dict[str, Any]:
    return {"type": "tool", "name": name, "arguments": {} if arguments is None else arguments, "error": error}


def unrecorded(name: str) -> dict[str, Any]:
    """A tool call whose arguments were not recorded (content capture off)."""
    return {"type": "tool", "name": name, "arguments": None, "error": None}


def _spans(*steps: dict[str, Any], agent_error: str | None = None, captured: bool = True) -> list[Span]:
    root = _span(
        1, "agent", "invoke_agent support", agent_name="support", content_captured=captured,
        status_code="ERROR" if agent_error else "UNSET", error_type=agent_error,
    )  # fmt: skip
    spans = [root]
    for n, step in enumerate(steps, start=2):
        if step["type"] == "llm":
            parts = [{"type": "text", "content": step["text"]}] if step["text"] is not None else []
            output = [{"role": "assistant", "parts": parts}]
            spans.append(_span(n, "llm", "chat gpt-4o", model="gpt-4o", output=output, content_captured=captured))
        else:
            call_input = None
            if step["arguments"] is not None:
                part = {"type": "tool_call", "id": f"call_{n}", "name": step["name"], "arguments": step["arguments"]}
                call_input = [{"role": "assistant", "parts": [part]}]
            span = _span(
                n, "tool", f"execute_tool {step['name']}", tool_name=step["name"], input=call_input,
                status_code="ERROR" if step["error"] else "UNSET", error_type=step["error"],
                content_captured=captured and call_input is not None,
            )  # fmt: skip
            spans.append(span)
    return spans


def _trace(
    *steps: dict[str, Any],
    agent_error: str | None = None,
    captured: bool = True,
    reference: dict[str, Any] | None = None,
) -> Target:
    spans = _spans(*steps, agent_error=agent_error, captured=captured)
    return Target(spans, span=spans[0], trajectory=build_trajectory(spans), reference=reference or {})


# --- builtin/tool-error-recovery ---------------------------------------------------------------------------------


def test_an_agent_that_retries_the_failing_tool_recovers() -> None:
    target = _trace(
        think(), tool("search_orders", {"q": "W123"}, error="TimeoutError"),
        think(), tool("search_orders", {"q": "W123"}),
        say("Your order W123 ships on Monday."),
    )  # fmt: skip
    assert target.trajectory is not None and target.trajectory["final_output"] == "Your order W123 ships on Monday."
    score = _score("tool-error-recovery", target)
    assert (score.outcome, score.value, score.passed, score.label) == ("scored", 1.0, True, "1/1 recovered")
    assert score.explanation == "1 of 1 failed tool call(s) recovered (search_orders)"
    assert score.metadata == {"failed": 1, "recovered": 1}


def test_an_agent_that_gives_up_does_not_recover() -> None:
    target = _trace(
        think(), tool("search_orders", {"q": "W123"}, error="TimeoutError"),
        say("Sorry, I cannot look up your order right now."),
    )  # fmt: skip
    # it still answered: only the missing retry makes the difference
    assert target.trajectory is not None and target.trajectory["final_output"]
    score = _score("tool-error-recovery", target)
    assert (score.outcome, score.value, score.passed, score.label) == ("scored", 0.0, False, "0/1 recovered")
    assert score.explanation == (
        "0 of 1 failed tool call(s) recovered; not recovered: search_orders (no later successful call of the same tool)"
    )


def test_a_different_tool_succeeding_recovers_only_with_any_tool() -> None:
    target = _trace(
        think(), tool("search_orders", {"q": "W123"}, error="TimeoutError"),
        think(), tool("get_order", {"id": "W123"}),
        say("Your order W123 ships on Monday."),
    )  # fmt: skip
    assert _score("tool-error-recovery", target).passed is False
    anything = _score("tool-error-recovery", target, any_tool=True)
    assert (anything.value, anything.passed) == (1.0, True)
    # a success before the failure is no recovery from it
    before = _trace(tool("get_order", {"id": "W1"}), tool("search_orders", {"q": "W1"}, error="E"), say("Done."))
    assert _score("tool-error-recovery", before, any_tool=True).value == 0.0


def test_each_failure_counts_and_min_rate() -> None:
    target = _trace(
        tool("search", {"q": "a"}, error="TimeoutError"), tool("search", {"q": "a"}, error="TimeoutError"),
        tool("search", {"q": "a"}), tool("refund", {"order": "W1"}, error="PermissionError"),
        say("I found the order but could not refund it."),
    )  # fmt: skip
    score = _score("tool-error-recovery", target)
    assert score.value == pytest.approx(2 / 3) and score.passed is False and score.label == "2/3 recovered"
    assert score.explanation == (
        "2 of 3 failed tool call(s) recovered (search (x2)); "
        "not recovered: refund (no later successful call of the same tool)"
    )
    assert _score("tool-error-recovery", target, min_rate=0.6).passed is True


def test_a_retry_does_not_count_when_the_run_fails_or_never_answers() -> None:
    steps = (tool("search", {"q": "a"}, error="TimeoutError"), tool("search", {"q": "a"}))
    crashed = _score("tool-error-recovery", _trace(*steps, say("Found it."), agent_error="RuntimeError"))
    assert (crashed.value, crashed.passed) == (0.0, False)
    assert crashed.explanation == (
        "0 of 1 failed tool call(s) recovered; not recovered: search (agent step 'invoke_agent support' failed "
        "(RuntimeError))"
    )
    silent = _score("tool-error-recovery", _trace(*steps, think()))
    assert (silent.value, silent.passed) == (0.0, False)
    assert "not recovered: search (the run ended without a final output)" in (silent.explanation or "")
    # content not captured: whether it answered is unknown, so it is not judged
    uncaptured = _score("tool-error-recovery", _trace(*steps, think(), captured=False))
    assert (uncaptured.outcome, uncaptured.reason) == ("skipped", "no content")


def test_a_failed_subagent_is_not_the_run_failing() -> None:
    # support (ok) -> lookup subagent (failed, its tool failed); support retries the tool itself and answers
    spans = [
        _span(1, "agent", "invoke_agent support", agent_name="support", content_captured=True),
        _span(2, "agent", "invoke_agent lookup", agent_name="lookup", status_code="ERROR", error_type="ToolError"),
        _span(3, "tool", "execute_tool search", parent=f"{2:016x}", tool_name="search", status_code="ERROR"),
        _span(4, "tool", "execute_tool search", tool_name="search"),
        _span(5, "llm", "chat", output=[{"role": "assistant", "parts": [{"type": "text", "content": "Found."}]}]),
    ]
    target = Target(spans, span=spans[0], trajectory=build_trajectory(spans))
    score = _score("tool-error-recovery", target)
    assert (score.value, score.passed) == (1.0, True)


def test_no_failed_tool_call_is_skipped() -> None:
    ok = _score("tool-error-recovery", _trace(tool("search", {"q": "a"}), say("Found.")))
    assert (ok.outcome, ok.reason) == ("skipped", "no failed tool calls")
    assert ok.explanation == "none of 1 executed tool call(s) failed"
    no_tools = _score("tool-error-recovery", _trace(say("Hello.")))
    assert (no_tools.reason, no_tools.explanation) == ("no failed tool calls", "no tool calls")
    empty = _score("tool-error-recovery", Target([], trajectory=build_trajectory([])))
    assert (empty.outcome, empty.reason) == ("skipped", "no trajectory")


# --- builtin/expected-actions ------------------------------------------------------------------------------------

# a τ-bench retail task: look the user up (read-only), cancel one order (a write), tell the refund amount
CANCEL = {"order_id": "#W2378156", "reason": "no longer needed"}
REFERENCE = {
    "expected_actions": [
        {"name": "find_user_id_by_email", "kwargs": {"email": "yusuf.rossi@example.com"}},
        {"name": "cancel_pending_order", "kwargs": CANCEL},
    ],
    "expected_outputs": ["1234.5"],
}


def _cancelling(*extra: dict[str, Any], answer: str = "Order #W2378156 is cancelled: $1,234.50 back.") -> Target:
    return _trace(
        think(), tool("find_user_id_by_email", {"email": "yusuf.rossi@example.com"}),
        think(), tool("get_order_details", {"order_id": "#W2378156"}),
        think(), tool("cancel_pending_order", CANCEL), *extra, say(answer), reference=REFERENCE,
    )  # fmt: skip


def test_every_expected_action_and_output_found() -> None:
    score = _score("expected-actions", _cancelling(answer="Done: order #W2378156 is cancelled, refund $1,234.5."))
    assert (score.outcome, score.value, score.passed, score.label) == ("scored", 1.0, True, "3/3 matched")
    assert score.explanation == "all 3 expected found: 2 action(s) taken, 1 output(s) given"
    assert score.metadata == {"actions": 2, "actions_matched": 2, "outputs": 1, "outputs_found": 1, "extra": 0}


def test_wrong_arguments_are_missing_and_shown_compactly() -> None:
    target = _trace(
        tool("find_user_id_by_email", {"email": "yusuf.rossi@example.com"}),
        tool("cancel_pending_order", {"order_id": "#W2378156", "reason": "ordered by mistake"}),
        say("Cancelled; you get 1234.5 back."), reference=REFERENCE,
    )  # fmt: skip
    score = _score("expected-actions", target)
    assert score.value == pytest.approx(2 / 3) and score.passed is False and score.label == "2/3 matched"
    assert score.explanation == 'missing: cancel_pending_order({"order_id":"#W2378156","reason":"no longer needed"})'


@pytest.mark.parametrize(
    ("actual", "expected", "equal"),
    [
        ('{"amount": 10.0, "ids": [1, 2]}', {"amount": 10, "ids": [1.0, 2]}, True),  # JSON text, int vs float
        ({"ids": [2, 1]}, {"ids": [1, 2]}, False),  # list order matters
        ({"notify": True}, {"notify": 1}, False),  # true is not 1
        ({"amount": "10"}, {"amount": 10}, False),  # a string is not a number
        ({"a": 1, "b": {"c": None}}, {"b": {"c": None}, "a": 1.0}, True),  # key order does not matter
        ({"a": 1, "b": 2}, {"a": 1}, False),  # equal, not a superset
    ],
)
def test_arguments_compare_as_json(actual: Any, expected: dict[str, Any], equal: bool) -> None:
    target = _trace(tool("refund", actual), say("ok"))
    score = _score("expected-actions", target, expected_actions=[{"name": "refund", "arguments": expected}])
    assert score.passed is equal


def test_an_action_without_arguments_takes_any_and_pairs_with_its_own_call() -> None:
    target = _trace(tool("refund", {"order": "W1"}), tool("refund", {"order": "W2"}), say("ok"))
    # the action with arguments takes W1, so the one without them takes W2, not W1
    actions = [{"name": "refund"}, {"name": "refund", "arguments": {"order": "W1"}}]
    assert _score("expected-actions", target, expected_actions=actions).value == 1.0
    # two expected, one taken
    twice = [{"name": "refund", "arguments": {"order": "W1"}}] * 2
    score = _score("expected-actions", target, expected_actions=twice)
    assert score.value == 0.5 and score.explanation == 'missing: refund({"order":"W1"})'


def test_ordered_actions() -> None:
    a, b, x = ({"name": n, "arguments": {"k": n}} for n in ("a", "b", "x"))
    target = _trace(tool("b", {"k": "b"}), tool("a", {"k": "a"}), say("ok"))
    assert _score("expected-actions", target, expected_actions=[a, b]).passed is True
    ordered = _score("expected-actions", target, expected_actions=[a, b], ordered=True)
    assert (ordered.value, ordered.passed) == (0.5, False)
    assert ordered.explanation == 'out of order: b({"k":"b"})'
    # the longest run in order is kept, not the first match: x then a, b would find x alone
    late_x = _trace(tool("a", {"k": "a"}), tool("b", {"k": "b"}), tool("x", {"k": "x"}), say("ok"))
    score = _score("expected-actions", late_x, expected_actions=[x, a, b], ordered=True)
    assert score.value == pytest.approx(2 / 3) and score.explanation == 'out of order: x({"k":"x"})'
    # calls in between do not break the order
    between = _trace(tool("a", {"k": "a"}), tool("lookup", {}), tool("b", {"k": "b"}), say("ok"))
    assert _score("expected-actions", between, expected_actions=[a, b], ordered=True).passed is True


def test_extra_writes_fail_only_when_not_allowed() -> None:
    other = {"order_id": "#W9999999", "reason": "no longer needed"}
    target = _cancelling(tool("cancel_pending_order", other), answer="Both cancelled, 1234.5 back.")
    assert _score("expected-actions", target).passed is True
    strict = _score("expected-actions", target, allow_extra=False)
    assert (strict.value, strict.passed, strict.label) == (1.0, False, "3/3 matched, 1 extra")
    assert strict.explanation == 'extra: cancel_pending_order({"order_id":"#W9999999","reason":"no longer needed"})'
    # the read-only lookup (get_order_details) is not among the expected actions' tools: never extra
    assert _score("expected-actions", _cancelling(answer="1234.5"), allow_extra=False).passed is True


def test_a_failed_call_is_not_an_action_taken() -> None:
    target = _trace(
        tool("find_user_id_by_email", {"email": "yusuf.rossi@example.com"}),
        tool("cancel_pending_order", CANCEL, error="OrderLocked"),
        say("I could not cancel it; 1234.5 stays charged."), reference=REFERENCE,
    )  # fmt: skip
    score = _score("expected-actions", target)
    assert score.value == pytest.approx(2 / 3) and "missing: cancel_pending_order(" in (score.explanation or "")


def test_outputs_anywhere_the_agent_spoke_ignoring_case_and_commas() -> None:
    target = _trace(
        say("The refund will be $1,234.50."), tool("cancel_pending_order", CANCEL), say("All done, Yusuf."),
        reference={"expected_outputs": ["$1234.50", "YUSUF"]},
    )  # fmt: skip
    assert _score("expected-actions", target).passed is True
    missing = _score("expected-actions", target, expected_outputs=["1234.50", "W2378156", "refund of 20"])
    assert missing.value == pytest.approx(1 / 3) and missing.label == "1/3 matched"
    assert missing.explanation == 'output not found: "W2378156", "refund of 20"'


def test_params_win_over_the_reference() -> None:
    target = _cancelling(answer="1234.5")
    only_cancel = _score(
        "expected-actions", target, expected_actions=[{"name": "cancel_pending_order", "kwargs": CANCEL}]
    )
    assert only_cancel.label == "2/2 matched"  # the reference's outputs still apply
    no_outputs = _score("expected-actions", target, expected_outputs=[])
    assert no_outputs.label == "2/2 matched"


def test_what_cannot_be_judged_is_skipped() -> None:
    bare = _score("expected-actions", _trace(tool("x"), say("ok")))
    assert (bare.outcome, bare.reason) == ("skipped", "no reference")
    empty = _score("expected-actions", _trace(tool("x"), say("ok"), reference={"expected_actions": []}))
    assert (empty.outcome, empty.reason) == ("skipped", "nothing expected")
    blind = _trace(unrecorded("cancel_pending_order"), say("ok"), reference=REFERENCE)
    assert _score("expected-actions", blind).reason == "no tool arguments"
    # names only: judged without arguments
    by_name = _score(
        "expected-actions", blind, expected_actions=[{"name": "cancel_pending_order"}], expected_outputs=[]
    )
    assert (by_name.outcome, by_name.value) == ("scored", 1.0)
    dark = _trace(tool("cancel_pending_order", CANCEL), say("ok"), captured=False, reference=REFERENCE)
    assert _score("expected-actions", dark).reason == "no content"


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ({"expected_actions": [{"kwargs": {}}]}, "[0].name: Field required"),
        ({"expected_actions": [{"name": "x", "kwargs": [1]}]}, "[0].kwargs: Input should be a valid dictionary"),
        ({"expected_actions": [{"name": "x", "arguments": "[1]"}]}, "[0].arguments: a JSON array, not an object"),
        ({"expected_actions": [{"name": "x", "args": {}}]}, "[0].args: Extra inputs are not permitted"),
        ({"expected_actions": {"name": "x"}}, ": Input should be a valid list"),
        ({"expected_outputs": "1234.5"}, 'reference.expected_outputs must be a list of strings, got "1234.5"'),
    ],
)
def test_a_bad_reference_is_an_error_naming_the_field(reference: dict[str, Any], message: str) -> None:
    score = _score("expected-actions", _trace(tool("x", {}), say("ok"), reference=reference))
    if not message.startswith("reference."):
        message = "reference.expected_actions" + message
    assert (score.outcome, score.reason, score.explanation) == ("error", "ValueError", message)


def test_params_are_validated() -> None:
    ev = REGISTRY["builtin/expected-actions"]
    with pytest.raises(ValueError, match=r"expected_actions\.0\.name: Field required"):
        parse_params(ev, {"expected_actions": [{"arguments": {}}]})
    with pytest.raises(ValueError, match="orderd"):
        parse_params(ev, {"orderd": True})
    with pytest.raises(ValueError, match="min_rate"):
        parse_params(REGISTRY["builtin/tool-error-recovery"], {"min_rate": 1.5})


def test_both_are_registered_with_honest_declarations() -> None:
    for ref in ("tool-error-recovery", "expected-actions"):
        ev = REGISTRY[f"builtin/{ref}"]
        assert ev.scope == "trace" and ev.requires == ("trajectory",) and ev.description and ev.version


# --- the captures: one get_weather(location=Paris) call that succeeded, then an answer -----------------------------


def _fixture(folder: str, reference: dict[str, Any] | None = None) -> Target:
    files = [FIXTURES / folder / "chat_tools.pb"]
    logs: Path = FIXTURES / folder / "chat_tools.logs.pb"
    spans = normalize_files(files + ([logs] if logs.exists() else [])).spans
    root = next(s for s in spans if not s.parent_span_id)
    return Target(spans, span=root, trajectory=build_trajectory(spans), reference=reference or {})


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_capture_expected_actions(folder: str) -> None:
    completion = json.loads((FIXTURES / folder / "meta.json").read_text())["scenarios"]["chat_tools"]["markers"]
    reference = {
        "expected_actions": [{"name": "get_weather", "kwargs": {"location": "Paris"}}],
        "expected_outputs": [completion["completion"].upper()],
    }
    score = _score("expected-actions", _fixture(folder, reference), allow_extra=False, ordered=True)
    assert (score.value, score.passed) == (1.0, True)
    lyon_weather = [{"name": "get_weather", "arguments": {"location": "Lyon"}}]
    lyon = _score("expected-actions", _fixture(folder), expected_actions=lyon_weather)
    assert (lyon.value, lyon.passed, lyon.explanation) == (0.0, False, 'missing: get_weather({"location":"Lyon"})')


@pytest.mark.parametrize("folder", TOOL_LOOP_FOLDERS)
def test_capture_has_no_failed_tool_call(folder: str) -> None:
    score = _score("tool-error-recovery", _fixture(folder))
    assert (score.outcome, score.reason) == ("skipped", "no failed tool calls")
