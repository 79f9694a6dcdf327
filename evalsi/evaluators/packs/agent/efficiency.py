"""How much the agent did to get there: tool loops (a call repeated, a cycle) and budgets of steps, calls, tokens
and cost."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from pydantic import Field, model_validator

from evalsi.evaluators.base import Params, Target, evaluator
from evalsi.evaluators.packs.agent.calls import arguments_text, skip, steps_of, tool_calls_of
from evalsi.model.score import Score

# --- builtin/loop-detection --------------------------------------------------------------------------------------


class LoopDetectionParams(Params):
    max_repeats: int = Field(3, ge=2)  # one tool with the same arguments this many times is a loop
    ignore_arguments: bool = False  # compare calls by tool name alone
    detect_cycles: bool = True
    cycle_repeats: int = Field(2, ge=2)  # a block of calls repeated back to back this many times (A-B-A-B) is a loop
    max_cycle_length: int = Field(3, ge=2)  # longest block looked for


def _cycle(keys: list[Any], max_length: int, repeats: int) -> tuple[int, int, int] | None:
    """(start, length, times) of the first block of 2..max_length calls repeated back to back `repeats` times."""
    n = len(keys)
    for length in range(2, max_length + 1):
        if n < length * repeats:
            break
        run = 0
        j = length
        while j < n:
            run = run + 1 if keys[j] == keys[j - length] else 0
            if run >= length * (repeats - 1):
                start = j - length * repeats + 1
                if len(set(keys[start : start + length])) > 1:  # one call repeated is a repeat, not a cycle
                    while j + 1 < n and keys[j + 1] == keys[j + 1 - length]:
                        j, run = j + 1, run + 1
                    return start, length, (run + length) // length
            j += 1
    return None


@evaluator("builtin/loop-detection", requires=("trajectory",), params=LoopDetectionParams)
def loop_detection(target: Target, params: LoopDetectionParams) -> Score:
    """Tool loops: one call repeated with the same arguments, or a cycle (A-B-A-B); value is the most repeats."""
    name = "loop-detection"
    calls = tool_calls_of(target)
    if not calls:
        return Score.skipped(name, "no tool calls")
    keys: list[Any] = []
    unrecorded = 0
    for i, call in enumerate(calls):
        tool = str(call.get("name"))
        if params.ignore_arguments:
            keys.append((tool,))
        elif call.get("arguments") is None:
            unrecorded += 1
            keys.append((tool, None, i))  # unknown arguments never equal another call's
        else:
            keys.append((tool, arguments_text(call["arguments"], 10_000)))
    (top, most), *_ = Counter(keys).most_common(1)
    problems = []
    if most >= params.max_repeats:
        same = " (arguments not compared)" if params.ignore_arguments else f" with arguments {arguments_text(top[1])}"
        problems.append(f"{top[0]} called {most} times{same}")
    label = "repeated call" if problems else "no loop"
    if params.detect_cycles:
        cycle = _cycle(keys, params.max_cycle_length, params.cycle_repeats)
        if cycle is not None:
            start, length, times = cycle
            block = " → ".join(k[0] for k in keys[start : start + length])
            problems.append(f"cycle {block} repeated {times} times from tool call {start + 1}")
            label = "cycle" if label == "no loop" else "repeated call and cycle"
    if problems:
        explanation = "; ".join(problems)
    else:
        explanation = f"{len(calls)} tool call(s), no call repeated {params.max_repeats} times"
        if params.detect_cycles:
            explanation += " and no cycle"
    if unrecorded:
        explanation += f"; {unrecorded} call(s) without recorded arguments not compared (see ignore_arguments)"
    return Score(name, value=float(most), passed=not problems, label=label, explanation=explanation)


# --- builtin/step-efficiency -------------------------------------------------------------------------------------


class StepEfficiencyParams(Params):
    # any budget left unset is not judged
    max_steps: int | None = Field(None, ge=0)  # LLM, tool, retriever and embedding steps (not agent/chain spans)
    max_llm_calls: int | None = Field(None, ge=0)
    max_tool_calls: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=0)  # input + output tokens of every LLM call
    max_cost_usd: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _some_budget(self) -> StepEfficiencyParams:
        if all(getattr(self, f) is None for f in type(self).model_fields):
            raise ValueError(f"set at least one budget: {', '.join(type(self).model_fields)}")
        return self


_CONTAINERS = frozenset(("agent", "chain"))


def _total(llm_steps: list[dict[str, Any]], measure: Callable[[dict[str, Any]], float | None]) -> tuple[float, int]:
    """The sum over LLM calls of what they report, and how many report nothing."""
    values = [measure(s) for s in llm_steps]
    return sum(v for v in values if v is not None), sum(1 for v in values if v is None)


def _tokens(step: dict[str, Any]) -> float | None:
    if step.get("input_tokens") is None and step.get("output_tokens") is None:
        return None
    return (step.get("input_tokens") or 0) + (step.get("output_tokens") or 0)


@evaluator("builtin/step-efficiency", requires=("trajectory",), params=StepEfficiencyParams)
def step_efficiency(target: Target, params: StepEfficiencyParams) -> Score:
    """Steps, LLM calls, tool calls, tokens and cost vs budgets: share of budgets met (0..1, higher is better)."""
    name = "step-efficiency"
    steps = steps_of(target)
    llm_steps = [s for s in steps if s.get("type") == "llm"]
    tokens, tokens_unknown = _total(llm_steps, _tokens)
    cost, cost_unknown = _total(llm_steps, lambda s: s.get("cost_usd"))
    measures: list[tuple[str, float, int, float | None]] = [
        # (measure, total, LLM calls that did not report it, budget)
        ("steps", sum(1 for s in steps if s.get("type") not in _CONTAINERS), 0, params.max_steps),
        ("llm_calls", len(llm_steps), 0, params.max_llm_calls),
        ("tool_calls", len(tool_calls_of(target)), 0, params.max_tool_calls),
        ("tokens", tokens, tokens_unknown, params.max_tokens),
        ("cost_usd", cost, cost_unknown, params.max_cost_usd),
    ]
    met: list[str] = []
    exceeded: list[str] = []
    parts: list[str] = []
    unknown: list[str] = []
    for measure, total, missing, budget in measures:
        if budget is None:
            continue
        shown = f"{total:.6g}"
        if total > budget:  # even a partial sum over budget is over budget
            exceeded.append(measure)
            parts.append(f"{measure} {'at least ' if missing else ''}{shown} > {budget:g}")
        elif missing:
            unknown.append(measure)
            parts.append(f"{measure} not judged: {missing} of {len(llm_steps)} LLM calls report none")
        else:
            met.append(measure)
            parts.append(f"{measure} {shown} ≤ {budget:g}")
    judged = len(met) + len(exceeded)
    if not judged:
        return skip(name, f"no {' or '.join(m.removesuffix('_usd') for m in unknown)} data", "; ".join(parts))
    return Score(
        name,
        value=len(met) / judged,
        passed=not exceeded,
        label=f"exceeded: {', '.join(exceeded)}" if exceeded else "within budget",
        explanation="; ".join(parts),
        metadata={m: total for m, total, missing, _ in measures if not missing},
    )
