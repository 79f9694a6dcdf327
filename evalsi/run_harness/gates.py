"""Run gates: CEL conditions over a run's aggregates (`metric('task-success').passHatK(3) >= 0.8`,
`compare('task-success').delta >= -0.02`), each holding, failing, or unanswerable with the reason, and each with
the values it read and, for `quantity OP number`, its threshold: what a report shows beside the verdict."""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from typing import Any

from evalsi import cel

VARIABLES = ("metric", "compare")
# metric('name') / compare("name") -> metric["name"]; .passHatK(3) / .passAtK(3) -> .passHatK[3]
_CALL = re.compile(r"""(?P<string>"(?:[^"\\]|\\.)*"(?!\s*\))|'(?:[^'\\]|\\.)*'(?!\s*\)))"""
                   r"""|\b(?P<fn>metric|compare)\(\s*(?P<arg>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\s*\)"""
                   r"""|\.(?P<k>passHatK|passAtK)\(\s*(?P<n>\d+)\s*\)""")  # fmt: skip
# one quantity a gate reads: metric('name').field, metric('name').passHatK(3), compare('name').field
_READ = (r"""\b(?:metric|compare)\(\s*(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\s*\)\s*\.\s*\w+"""
         r"""(?:\(\s*\d+\s*\))?""")  # fmt: skip
_READ_PARTS = re.compile(r"""(?P<fn>metric|compare)\(\s*(?P<arg>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\s*\)\s*\.\s*"""
                         r"""(?P<field>\w+)(?:\(\s*(?P<k>\d+)\s*\))?""")  # fmt: skip
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_OP = r"<=|>=|==|!=|<|>"
_THRESHOLD = re.compile(rf"\s*(?P<read>{_READ})\s*(?P<op>{_OP})\s*(?P<number>{_NUMBER})\s*")
_THRESHOLD_FIRST = re.compile(rf"\s*(?P<number>{_NUMBER})\s*(?P<op>{_OP})\s*(?P<read>{_READ})\s*")
_MIRRORED = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "==", "!=": "!="}


@dataclass(frozen=True)
class Gate:
    source: str
    program: cel.Program
    metrics: tuple[str, ...]
    compares: tuple[str, ...]
    ks: tuple[int, ...] = ()
    """The k of every passAtK(k) / passHatK(k) it reads."""
    reads: tuple[str, ...] = ()
    """Every quantity it reads, as written (`metric('duration_ms').p95`)."""
    op: str | None = None
    threshold: float | None = None
    """For a gate `quantity OP number` (or `number OP quantity`, mirrored): the comparison and the number."""


@dataclass(frozen=True)
class GateResult:
    gate: str
    passed: bool
    detail: str = ""
    """Why it could not be answered (a metric no evaluator produced, a comparison without a baseline)."""
    seen: dict[str, Any] = field(default_factory=dict)
    """Each quantity the gate read, as written, with the value it had (None: the run has no such value)."""
    op: str | None = None
    threshold: float | None = None

    @property
    def value(self) -> Any:
        """The value of the one quantity the gate reads; None when it reads several (see `seen`)."""
        return next(iter(self.seen.values())) if len(self.seen) == 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {"gate": self.gate, "passed": self.passed, "detail": self.detail, "value": self.value,
                "op": self.op, "threshold": self.threshold, "seen": self.seen}  # fmt: skip


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4f}".rstrip("0") if abs(value) >= 0.01 else f"{value:.3g}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def gate_reading(g: dict[str, Any]) -> tuple[str, str]:
    """What a stored gate (`GateResult.to_dict()`) saw and needed, as text: (`0.3333`, `>= 0.9`); with several
    quantities, each named (`metric('a').mean = 0.5, metric('b').p95 = 12`). Empty when not known."""
    seen = g.get("seen") or {}
    if len(seen) == 1:
        saw = _shown(next(iter(seen.values())))
    else:
        saw = ", ".join(f"{k} = {_shown(v)}" for k, v in seen.items())
    needs = f"{g['op']} {_shown(g['threshold'])}" if g.get("op") and g.get("threshold") is not None else ""
    return saw, needs


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
    reads = tuple(dict.fromkeys(re.sub(r"\s+", "", m.group(0)) for m in re.finditer(_READ, source)))
    if not metrics and not compares:
        raise ValueError("a gate must read metric('name') or compare('name')")
    try:
        program = cel.compile(rewritten, variables=VARIABLES)
    except ValueError as e:
        shown = "" if rewritten == source else f" (read as {rewritten!r})"
        raise ValueError(f"{e}{shown}") from None
    op, threshold = _threshold(source)
    return Gate(source, program, tuple(metrics), tuple(compares), tuple(ks), reads, op, threshold)


def _threshold(source: str) -> tuple[str | None, float | None]:
    if m := _THRESHOLD.fullmatch(source):
        return m.group("op"), float(m.group("number"))
    if m := _THRESHOLD_FIRST.fullmatch(source):
        return _MIRRORED[m.group("op")], float(m.group("number"))
    return None, None


def _read(read: str, activation: dict[str, Any]) -> Any:
    """The value of one quantity (`metric('x').passHatK(3)`) in the gates' activation; None when absent."""
    m = _READ_PARTS.fullmatch(read)
    if m is None:
        return None
    found = activation[m.group("fn")].get(ast.literal_eval(m.group("arg")), {}).get(m.group("field"))
    if m.group("k") is not None:
        return found.get(int(m.group("k"))) if isinstance(found, dict) else None
    return None if isinstance(found, dict) else found


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
        "passRate": summary.get("pass_rate"),
        "passLow": summary.get("pass_low"),
        "passHigh": summary.get("pass_high"),
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
        seen = {r: _read(r, activation) for r in gate.reads}
        result = functools.partial(GateResult, gate.source, seen=seen, op=gate.op, threshold=gate.threshold)
        missing = [m for m in gate.metrics if m not in metrics]
        if missing:
            known = ", ".join(sorted(metrics)) or "none"
            results.append(result(False, f"no scores named {missing[0]!r} (scored: {known})"))
            continue
        short = next(
            ((m, k) for m in gate.metrics for k in gate.ks if (metrics[m].get("pass_at_k") or {}).get(str(k)) is None),
            None,
        )
        if short is not None:
            m, k = short
            why = f"pass@{k} and pass^{k} of {m!r} need a task with {k} scored trials"
            results.append(result(False, why))
            continue
        if gate.compares and compare is None:
            results.append(result(False, "reads compare(...) but the run has no --baseline"))
            continue
        not_compared = next((m for m in gate.compares if m not in (compare or {})), None)
        if not_compared is not None:
            known = ", ".join(sorted(compare or {})) or "none"
            results.append(result(False, f"no comparison of {not_compared!r} (compared: {known})"))
            continue
        unpaired = next((m for m in gate.compares if (compare or {})[m].get("unpaired")), None)
        if unpaired is not None:
            why = f"{unpaired!r} has nothing to compare: {(compare or {})[unpaired]['unpaired']}"
            results.append(result(False, why))
            continue
        try:
            results.append(result(gate.program.holds(activation)))
        except ValueError as e:
            results.append(result(False, str(e)))
    return results
