"""Monitoring a live window: how often each alert rule fires on noise, and how fast it sees a real drop.

Simulates streams of pass/fail scores (a pass rate of 0.90) through one alert window, looked at every simulated
minute (`--every minute`, the alert check of a busy policy) or after every score (`--every score`), with the rule
"the pass rate is below 0.90":

- `naive`: the window's rate < 0.90 (with at least 20 scores), the threshold alert of today's tools;
- `fixed interval`: the window's 95% Wilson interval lies wholly below 0.90, looked at again and again;
- `anytime (CS)`: the window's 95% confidence sequence (`evalsi.policies.sequences`, PrPl-EB) lies wholly below 0.90.

With no change (the rate stays at 0.90, the boundary of the rule), any firing is a false alarm: the share of windows
in which a rule fires at least once is its false-alarm rate; the confidence sequence's must be at or below its
alpha (0.05; its one-sided error is at most 0.025). With a shift (the rate drops to 0.90 - SHIFT at minute 10 of the
window), the table gives the share of windows in which each rule fired before the window closed and the median
minutes from the shift to the first firing after it (firings before the shift are false alarms, counted
in the first column). `fixed interval, once at close` is the valid use of a fixed interval: one look, when the window
closes. The figures use the project's own interval code (Wilson from
`evalsi.policies.intervals`, the sequence run over all streams at once with numpy).

Run `python benchmarks/monitoring.py` (`--streams 1000 --minutes 60 --per-minute 10 --shift 0.05 0.1`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evalsi.model.score import Score
from evalsi.policies.intervals import wilson_interval
from evalsi.policies.sequences import BoundedMeanSequence
from evalsi.policies.window import Series

RATE = 0.90
SHIFT_AT_MINUTE = 10
MIN_N = 20


def simulate(
    rng: np.random.Generator, streams: int, minutes: int, per_minute: int, shift: float, every: str
) -> dict[str, np.ndarray]:
    """For each rule, the look (score count) at which it first fired in each stream (-1: never)."""
    total = minutes * per_minute
    rate = np.full(total, RATE)
    if shift:
        rate[SHIFT_AT_MINUTE * per_minute :] = RATE - shift
    x = (rng.random((streams, total)) < rate).astype(float)
    passes = np.cumsum(x, axis=1)
    looks = np.arange(1, total + 1) if every == "score" else np.arange(per_minute, total + 1, per_minute)
    names = ("naive", "fixed interval", "fixed interval, once at close", "anytime (CS)")
    first = {name: np.full(streams, -1) for name in names}
    start = SHIFT_AT_MINUTE * per_minute if shift else 0  # with a shift, only firings after it count
    cs = BoundedMeanSequence(0.05, xp=np)
    wilson_high = {}
    look_set = set(looks.tolist())
    for t in range(1, total + 1):
        cs.add(x[:, t - 1])
        if t not in look_set:
            continue
        if t <= start:
            continue
        k = passes[:, t - 1]
        fixed = np.array([_wilson_high(int(v), t, wilson_high) < RATE for v in k])
        fired = {
            "naive": (k / t < RATE) & (t >= MIN_N),
            "fixed interval": fixed,
            "fixed interval, once at close": fixed & (t == total),
            "anytime (CS)": cs.high < RATE,
        }
        for name, now in fired.items():
            new = now & (first[name] < 0)
            first[name][new] = t
    return first


def _wilson_high(k: int, n: int, cache: dict[tuple[int, int], float]) -> float:
    found = cache.get((k, n))
    if found is None:
        found = cache[(k, n)] = wilson_interval(k, n)[1]  # type: ignore[index]
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--minutes", type=int, default=60, help="window length in simulated minutes")
    ap.add_argument("--per-minute", type=int, default=10, help="scores per minute")
    ap.add_argument("--shift", type=float, nargs="*", default=[0.05, 0.10])
    ap.add_argument("--seed", type=int, default=37)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(
        f"{args.streams} streams, a {args.minutes}-minute window, {args.per_minute} scores a minute, pass rate {RATE}, "
        f"rule: rate below {RATE}; seed {args.seed}\n"
    )
    print("| looked at | rule | false alarms (no change) | " + " | ".join(
        f"drop of {s:g}: fired / median minutes to fire" for s in args.shift) + " |")  # fmt: skip
    print("|---|---|---|" + "---|" * len(args.shift))
    for every in ("minute", "score"):
        null = simulate(rng, args.streams, args.minutes, args.per_minute, 0.0, every)
        shifted = [simulate(rng, args.streams, args.minutes, args.per_minute, s, every) for s in args.shift]
        for name in null:
            cells = [f"{(null[name] >= 0).mean():.1%}"]
            for found in shifted:
                fired = found[name][found[name] >= 0]
                after = (fired - SHIFT_AT_MINUTE * args.per_minute) / args.per_minute
                median = f"{np.median(after):.1f}" if len(after) else "-"
                cells.append(f"{(found[name] >= 0).mean():.1%} / {median}")
            print(f"| every {every} | {name} | " + " | ".join(cells) + " |")
    # CPU per score of the sequence's update, beside Welford's mean/variance update (what every window does)
    values = rng.random(200_000).tolist()
    cs = BoundedMeanSequence(0.05)
    start = time.process_time()
    for v in values:
        cs.add(v)
    cs_us = (time.process_time() - start) / len(values) * 1e6
    n, mean, m2 = 0, 0.0, 0.0
    start = time.process_time()
    for v in values:
        n += 1
        delta = v - mean
        mean += delta / n
        m2 += delta * (v - mean)
    welford_us = (time.process_time() - start) / len(values) * 1e6
    print(
        f"\nCPU per score: sequence update {cs_us:.2f} µs, Welford update {welford_us:.2f} µs "
        f"(ratio {cs_us / welford_us:.1f}x)"
    )
    # what a window pays per score: a series of a fixed window and of an anytime one (four sequences: values and
    # verdicts, at alpha and alpha/2), fed the same scored scores with a value and a verdict
    scores = [Score("s", value=v, passed=v > 0.3, trace_id="t") for v in values[:50_000]]
    timed = {}
    for anytime in (False, True):
        series = Series("e", "s", anytime=anytime)
        start = time.process_time()
        for score in scores:
            series.add(score)
        timed[anytime] = (time.process_time() - start) / len(scores) * 1e6
    print(
        f"window series add per score: fixed {timed[False]:.2f} µs, anytime {timed[True]:.2f} µs "
        f"(ratio {timed[True] / timed[False]:.1f}x)"
    )


if __name__ == "__main__":
    main()
