"""Comparing two runs record by record: scores paired by task and trial; McNemar's test for pass/fail metrics, a
paired bootstrap for numeric ones; the difference with its 95% interval, which way is better, how many records got
worse or better, and regressions flagged. Every metric of either run is listed: one scored in a single run (or with
no record in common) says so instead of being left out."""

from __future__ import annotations

import math
from typing import Any

from evalsi.run_harness.run_metrics import RUN_ADDED
from evalsi.run_harness.stats import mcnemar, paired_bootstrap

LOWER_IS_BETTER = frozenset(RUN_ADDED)
"""Metrics where a decrease is the improvement: time, tokens, cost."""
SIGNIFICANCE = 0.05


def _by_pair(scores: list[dict[str, Any]]) -> dict[str, dict[tuple[str, int], dict[str, Any]]]:
    out: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    for s in scores:
        if s.get("outcome") == "scored":
            out.setdefault(s["name"], {})[(str(s["task_id"]), int(s["trial"]))] = s
    return out


def _unpaired(better: str, why: str) -> dict[str, Any]:
    """A metric with nothing to compare: no test, no difference, and why."""
    return {"n": 0, "better": better, "test": None, "delta": None, "low": None, "high": None, "pValue": None,
            "regressions": None, "fixes": None, "regressed": False, "improved": False, "unpaired": why}  # fmt: skip


def compare_scores(
    base: list[dict[str, Any]], new: list[dict[str, Any]], *, seed: int = 0, resamples: int = 10_000
) -> dict[str, dict[str, Any]]:
    """For each metric of either run: `n` pairs, which way is `better` (`lower` for duration, tokens, cost, else
    `higher`), the `test`, `delta` (new - base; for pass/fail, in pass rate), its interval `low`/`high` (paired
    bootstrap), `pValue` (McNemar for pass/fail, else the bootstrap's), the records that got worse (`regressions`: a
    pass lost, a value moved the worse way) and better (`fixes`), and whether the change is a significant regression
    or improvement (p < 0.05). A metric with no pair to compare (scored in one run only, no task and trial in
    common) has `n` 0, no test, and `unpaired` saying why."""
    a, b = _by_pair(base), _by_pair(new)
    names_a, names_b = {s["name"] for s in base}, {s["name"] for s in new}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(names_a | names_b):
        better = "lower" if name in LOWER_IS_BETTER else "higher"
        if name not in names_b or name not in names_a:
            out[name] = _unpaired(better, f"scored in the {'baseline' if name in names_a else 'new run'} only")
            continue
        keys = sorted(set(a.get(name, {})) & set(b.get(name, {})))
        if not keys:
            out[name] = _unpaired(better, "no task and trial scored in both runs")
            continue
        pass_fail = all(a[name][k].get("passed") is not None and b[name][k].get("passed") is not None for k in keys)
        entry: dict[str, Any] = {"n": len(keys), "better": better,
                                 "test": "mcnemar" if pass_fail else "paired_bootstrap"}  # fmt: skip
        if pass_fail:
            was = [bool(a[name][k]["passed"]) for k in keys]
            now = [bool(b[name][k]["passed"]) for k in keys]
            diffs = [float(y) - float(x) for x, y in zip(was, now, strict=True)]
            lost = sum(1 for x, y in zip(was, now, strict=True) if x and not y)
            gained = sum(1 for x, y in zip(was, now, strict=True) if y and not x)
            _, low, high, _ = paired_bootstrap(diffs, seed=seed, resamples=resamples)
            p = mcnemar(lost, gained)
        else:
            pairs = [(a[name][k].get("value"), b[name][k].get("value")) for k in keys]
            diffs = [float(y) - float(x) for x, y in pairs if _finite(x) and _finite(y)]
            if not diffs:
                out[name] = _unpaired(better, "no numeric value in both runs for the same task and trial")
                continue
            entry["n"] = len(diffs)
            sign = -1.0 if better == "lower" else 1.0  # a record is lost when it moved the worse way
            lost, gained = sum(1 for d in diffs if sign * d < 0), sum(1 for d in diffs if sign * d > 0)
            _, low, high, p = paired_bootstrap(diffs, seed=seed, resamples=resamples)
        delta = math.fsum(diffs) / len(diffs)
        gain = -delta if better == "lower" else delta
        entry.update(
            delta=delta, low=low, high=high, pValue=p, regressions=lost, fixes=gained,
            regressed=p < SIGNIFICANCE and gain < 0, improved=p < SIGNIFICANCE and gain > 0,
        )  # fmt: skip
        out[name] = entry
    return out


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
