"""Run gates: CEL conditions over a run's aggregates (`metric('task-success').passHatK(3) >= 0.8`,
`compare('task-success').delta >= -0.02`), each holding, failing, or unanswerable with the reason."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from evalsi import cel

VARIABLES = ("metric", "compare")
# metric('name') / compare("name") -> metric["name"]; .passHatK(3) / .passAtK(3) -> .passHatK[3]
_CALL = re.compile(r"""(?P<string>"(?:[^"\\]|\\.)*"(?!\s*\))|'(?:[^'\\]|\\.)*'(?!\s*\)))"""
                   r"""|\b(?P<fn>metric|compare)\(\s*(?P<arg>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\s*\)"""
                   r"""|\.(?P<k>passHatK|passAtK)\(\s*(?P<n>\d+)\s*\)""")  # fmt: skip


@dataclass(frozen=True)
class Gate:
    source: str
    program: cel.Program
    metrics: tuple[str, ...]
    compares: tuple[str, ...]
    ks: tuple[int, ...] = ()
    """The k of every passAtK(k) / passHatK(k) it reads."""


@dataclass(frozen=True)
class GateResult:
    gate: str
    passed: bool
    detail: str = ""
    """Why it could not be answered (a metric no evaluator produced, a comparison without a baseline)."""

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "passed": self.passed, "detail": self.detail}


def compile_gate(source: str) -> Gate:
    """Check a gate; raises ValueError with CEL's message (and the rewritten form when it differs)."""
    metrics: dict[str, None] = {}
    compares: dict[str, None] = {}
    ks: dict[int, None] = {}

    def rewrite(m: re.Match[str]) -> str:
        if m.group("string") is not None:
            return m.group(0)
        if m.group("fn") is not None:
            name = ast.literal_eval(m.group("arg"))
            (metrics if m.group("fn") == "metric" else compares)[name] = None
            return f"{m.group('fn')}[{m.group('arg')}]"
        ks[int(m.group("n"))] = None
        return f".{m.group('k')}[{m.group('n')}]"

    if not isinstance(source, str) or not source.strip():
        raise ValueError("empty gate")
    rewritten = _CALL.sub(rewrite, source)
    if not metrics and not compares:
        raise ValueError("a gate must read metric('name') or compare('name')")
    try:
        program = cel.compile(rewritten, variables=VARIABLES)
    except ValueError as e:
        shown = "" if rewritten == source else f" (read as {rewritten!r})"
        raise ValueError(f"{e}{shown}") from None
    return Gate(source, program, tuple(metrics), tuple(compares), tuple(ks))


def metric_fields(summary: dict[str, Any]) -> dict[str, Any]:
    """A metric summary (`stats.MetricSummary.to_dict()`) as gates read it."""
    out = {
        "n": summary.get("n", 0),
        "mean": summary.get("mean"),
        "low": summary.get("low"),
        "high": summary.get("high"),
        "p50": summary.get("p50"),
        "p95": summary.get("p95"),
        "variance": summary.get("variance_across_trials"),
        "errors": summary.get("errors", 0),
        "skipped": summary.get("skipped", 0),
        "passAtK": {int(k): v for k, v in (summary.get("pass_at_k") or {}).items()},
        "passHatK": {int(k): v for k, v in (summary.get("pass_hat_k") or {}).items()},
    }
    return {k: v for k, v in out.items() if v is not None}


def check_gates(
    gates: list[Gate], metrics: dict[str, dict[str, Any]], compare: dict[str, dict[str, Any]] | None
) -> list[GateResult]:
    """Each gate over the run's metric summaries (by score name) and, with a baseline, the comparison by score
    name. A gate reading a metric no evaluator produced, or a comparison without a baseline, fails and says so."""
    activation = {
        "metric": {name: metric_fields(s) for name, s in metrics.items()},
        "compare": {name: {k: v for k, v in c.items() if v is not None} for name, c in (compare or {}).items()},
    }
    results = []
    for gate in gates:
        missing = [m for m in gate.metrics if m not in metrics]
        if missing:
            known = ", ".join(sorted(metrics)) or "none"
            results.append(GateResult(gate.source, False, f"no scores named {missing[0]!r} (scored: {known})"))
            continue
        short = next(
            ((m, k) for m in gate.metrics for k in gate.ks if (metrics[m].get("pass_at_k") or {}).get(str(k)) is None),
            None,
        )
        if short is not None:
            m, k = short
            why = f"pass@{k} and pass^{k} of {m!r} need a task with {k} scored trials"
            results.append(GateResult(gate.source, False, why))
            continue
        if gate.compares and compare is None:
            results.append(GateResult(gate.source, False, "reads compare(...) but the run has no --baseline"))
            continue
        not_compared = next((m for m in gate.compares if m not in (compare or {})), None)
        if not_compared is not None:
            known = ", ".join(sorted(compare or {})) or "none"
            results.append(GateResult(gate.source, False, f"no comparison of {not_compared!r} (compared: {known})"))
            continue
        unpaired = next((m for m in gate.compares if (compare or {})[m].get("unpaired")), None)
        if unpaired is not None:
            why = f"{unpaired!r} has nothing to compare: {(compare or {})[unpaired]['unpaired']}"
            results.append(GateResult(gate.source, False, why))
            continue
        try:
            results.append(GateResult(gate.source, gate.program.holds(activation)))
        except ValueError as e:
            results.append(GateResult(gate.source, False, str(e)))
    return results
