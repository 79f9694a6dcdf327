"""The `regressed('name', baseline: '7d', margin: 0.02)` alert condition: what it names (`Regression`), and the port
through which a window reads its baseline's past scores (`Baselines`: the store's scores table, read off the
evaluation thread).

A baseline is a past period ending where the current window starts (`'7d'`: the seven days before it), or an offline
run's scores (`'run:<run id>'`). The condition holds only when the interval of the difference (current - baseline)
lies wholly beyond the margin on the worse side (`compare.compare`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Protocol

from evalsi.duration import parse_duration
from evalsi.policies.compare import Sample

__all__ = ["Baselines", "Regression", "parse_baseline", "parse_regressed"]

_STRING = r"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\""
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ARG = re.compile(rf"\s*,\s*(?P<key>\w+)\s*:\s*(?P<value>{_STRING}|{_NUMBER})")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_KEYS = ("baseline", "margin", "worse")


@dataclass(frozen=True, slots=True)
class Regression:
    """One `regressed(...)` of an alert condition."""

    name: str
    """The score name, as in `mean('name')`."""
    baseline: str
    """As written: a duration (`7d`) or `run:<run id>`."""
    seconds: float | None
    """The baseline period's length, for a past period."""
    run_id: str | None
    """The offline run, for a run baseline."""
    margin: float
    worse: str
    """`lower` (a drop regresses: the default) or `higher` (a rise does: latency, cost)."""
    text: str
    """How `values` and the notification spell it: `regressed('faithfulness', baseline: '7d', margin: 0.02)`."""

    @property
    def key(self) -> str:
        """Its key in `window.regressed`."""
        return f"{self.name}|{self.baseline}|{self.margin:g}|{self.worse}"


def parse_baseline(text: str) -> tuple[float | None, str | None]:
    """(seconds, None) for a past period (`7d`), (None, run id) for `run:<run id>`; ValueError otherwise."""
    if text.startswith("run:"):
        if not _RUN_ID.fullmatch(text[4:]):
            raise ValueError(f"{text!r} names no run id")
        return None, text[4:]
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise ValueError(f"{e}, or 'run:<run id>'") from None
    if seconds <= 0:
        raise ValueError("must be longer than 0s")
    return seconds, None


def parse_regressed(arguments: str) -> Regression:
    """The text between `regressed(` and `)`: a quoted score name, then `key: value` pairs (`baseline` required,
    `margin` default 0, `worse` default 'lower'). Raises ValueError saying what is wrong."""
    head = re.match(rf"\s*(?P<name>{_STRING})", arguments)
    if head is None:
        raise ValueError("regressed(...): the first argument must be a quoted score name: regressed('name', ...)")
    name = ast.literal_eval(head.group("name"))
    options: dict[str, object] = {}
    pos = head.end()
    while pos < len(arguments.rstrip()):
        m = _ARG.match(arguments, pos)
        if m is None:
            raise ValueError(
                f"regressed({arguments.strip()}): expected `, key: value` after the name at {arguments[pos:].strip()!r}"
                " (keys: baseline, margin, worse)"
            )
        key = m.group("key")
        if key not in _KEYS:
            raise ValueError(f"regressed(...): unknown key {key!r} (use baseline, margin, worse)")
        if key in options:
            raise ValueError(f"regressed(...): {key!r} given twice")
        options[key] = ast.literal_eval(m.group("value"))
        pos = m.end()
    baseline = options.get("baseline")
    if not isinstance(baseline, str) or not baseline.strip():
        raise ValueError(f"regressed('{name}', ...): needs baseline: '7d' (a past period) or baseline: 'run:<run id>'")
    try:
        seconds, run_id = parse_baseline(baseline)
    except ValueError as e:
        raise ValueError(f"regressed('{name}', ...): baseline: {e}") from None
    margin = options.get("margin", 0.0)
    if isinstance(margin, bool) or not isinstance(margin, int | float) or margin < 0:
        raise ValueError(f"regressed('{name}', ...): margin: must be a number >= 0, not {margin!r}")
    worse = options.get("worse", "lower")
    if worse not in ("lower", "higher"):
        raise ValueError(f"regressed('{name}', ...): worse: must be 'lower' or 'higher', not {worse!r}")
    parts = [repr(name), f"baseline: {baseline!r}"]
    if margin:
        parts.append(f"margin: {margin:g}")
    if worse != "lower":
        parts.append(f"worse: {worse!r}")
    text = f"regressed({', '.join(parts)})"
    return Regression(name, baseline, seconds, run_id, float(margin), str(worse), text)


class Baselines(Protocol):
    """Where windows read their baselines. Called on the evaluation thread, so it never waits: it answers what it
    knows (None until the store was read) and reads the store on a thread of its own."""

    def sample(self, policy: str, regression: Regression, before: float) -> Sample | None:
        """The scored scores of `regression.name` in `policy` over its baseline: the period of `regression.seconds`
        ending at `before` (epoch seconds, the current window's start), or the run `regression.run_id`."""
        ...
