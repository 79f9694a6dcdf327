"""Comparing two runs record by record: scores paired by task and trial; McNemar's test for pass/fail metrics, a
paired bootstrap for numeric ones; the difference with its 95% interval, and regressions flagged."""

from __future__ import annotations

import math
from typing import Any

from evalsi.run_harness.stats import mcnemar, paired_bootstrap

LOWER_IS_BETTER = frozenset({"duration_ms", "tokens", "cost_usd"})
SIGNIFICANCE = 0.05


def _by_pair(scores: list[dict[str, Any]]) -> dict[str, dict[tuple[str, int], dict[str, Any]]]:
    out: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    for s in scores:
        if s.get("outcome") == "scored":
            out.setdefault(s["name"], {})[(str(s["task_id"]), int(s["trial"]))] = s
    return out


def compare_scores(
    base: list[dict[str, Any]], new: list[dict[str, Any]], *, seed: int = 0, resamples: int = 10_000
) -> dict[str, dict[str, Any]]:
    """For each metric scored in both runs: `n` pairs, `delta` (new - base; for pass/fail, in pass rate), its
    interval `low`/`high` (paired bootstrap), `pValue` (McNemar for pass/fail, else the bootstrap's), and whether
    the change is a significant regression or improvement (p < 0.05; lower is better for duration, tokens, cost)."""
    a, b = _by_pair(base), _by_pair(new)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(a) & set(b)):
        keys = sorted(set(a[name]) & set(b[name]))
        if not keys:
            continue
        pass_fail = all(a[name][k].get("passed") is not None and b[name][k].get("passed") is not None for k in keys)
        entry: dict[str, Any] = {"n": len(keys), "test": "mcnemar" if pass_fail else "paired_bootstrap"}
        if pass_fail:
            was = [bool(a[name][k]["passed"]) for k in keys]
            now = [bool(b[name][k]["passed"]) for k in keys]
            diffs = [float(y) - float(x) for x, y in zip(was, now, strict=True)]
            lost = sum(1 for x, y in zip(was, now, strict=True) if x and not y)
            gained = sum(1 for x, y in zip(was, now, strict=True) if y and not x)
            entry.update(regressions=lost, fixes=gained)
            _, low, high, _ = paired_bootstrap(diffs, seed=seed, resamples=resamples)
            p = mcnemar(lost, gained)
        else:
            pairs = [(a[name][k].get("value"), b[name][k].get("value")) for k in keys]
            diffs = [float(y) - float(x) for x, y in pairs if _finite(x) and _finite(y)]
            if not diffs:
                continue
            entry["n"] = len(diffs)
            _, low, high, p = paired_bootstrap(diffs, seed=seed, resamples=resamples)
        delta = math.fsum(diffs) / len(diffs)
        better = -delta if name in LOWER_IS_BETTER else delta
        entry.update(
            delta=delta, low=low, high=high, pValue=p,
            regressed=p < SIGNIFICANCE and better < 0, improved=p < SIGNIFICANCE and better > 0,
        )  # fmt: skip
        out[name] = entry
    return out


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
