"""Alerts that compare a window with a baseline (`regressed(...)`, read from the scores table of a real embedded
store) and windows whose intervals stay valid however often they are looked at (`interval: anytime`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from policy_helpers import policy_doc, span, write

from evalsi.exporters.clickhouse.backend import open_backend
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.model.score import Score
from evalsi.policies import PolicyError, load_policies
from evalsi.policies.compare import newcombe_interval
from evalsi.policies.intervals import wilson_interval
from evalsi.processors.evaluate.baselines import StoreBaselines

NOW = 1_750_000_000.0  # the current window: [NOW - NOW % 3600, ...)
DAY = 86_400


def _trace(i: int, passed: bool, quality: float | None = None) -> list[Any]:
    attributes: dict[str, Any] = {"test.passed": passed}
    if quality is not None:
        attributes["test.quality"] = quality
    return [span(f"{i:032x}", attributes=attributes)]


def _baseline(store: TraceStore, policy: str, passed: list[bool], values: list[float] | None = None) -> None:
    """Scores of `policy` a day before NOW, as the evaluate processor would have stored them."""
    scores = []
    for i, p in enumerate(passed):
        scores.append(
            Score(
                "attribute", value=None if values is None else values[i], passed=p,
                trace_id=f"{0xBA5E << 64 | i:032x}", span_id="a1", policy=policy, evaluator="test/attribute",
                timestamp_unix_nano=int((NOW - DAY + i) * 1e9),
            )
        )  # fmt: skip
    store.write_scores(scores)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    found = TraceStore(open_backend(f"chdb://{tmp_path / 'store'}", database="default", create=True))
    found.create_schema()
    yield found
    found.close()


def _wait(baselines: StoreBaselines, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(baselines._known) < n:
        assert time.monotonic() < deadline, "the baselines were never read"
        time.sleep(0.05)


def test_regressed_fires_only_when_the_interval_of_the_difference_is_beyond_the_margin(
    tmp_path: Path, store: TraceStore
) -> None:
    """Two policies over the same traces: `drop` reads the verdicts (95% passed last week, 80% now: Newcombe's interval
    lies below -2 points, it fires); `quality` reads the values (0.81 last week, 0.80 now: Welch's interval does not lie
    wholly below -2 points, it does not fire)."""
    rng = np.random.default_rng(37)
    _baseline(store, "drop", (rng.random(2000) < 0.95).tolist())
    _baseline(store, "quality", [True] * 2000, rng.normal(0.81, 0.1, 2000).clip(0, 1).tolist())
    alert = "count('attribute') >= 50 && regressed('attribute', baseline: '7d', margin: 0.02)"
    write(
        tmp_path / "p.yaml",
        policy_doc("drop", cascade=[{"ref": "test/attribute"}], window="1h", alerts=[{"name": "drop", "when": alert}]),
        policy_doc(
            "quality", cascade=[{"ref": "test/attribute", "params": {"key": "test.quality"}}], window="1h",
            alerts=[{"name": "quality", "when": alert}],
        ),
    )  # fmt: skip
    policies = load_policies(["p.yaml"], tmp_path)
    baselines = StoreBaselines(lambda: store, "default")
    policies.use_baselines(baselines)
    try:
        passes = rng.random(300) < 0.80
        values = rng.normal(0.80, 0.1, 300).clip(0, 1)
        for i in range(100):  # (its reading thread not started: no baseline is known)
            policies.evaluate_trace(_trace(i, bool(passes[i]), float(values[i])), now=NOW + i)
        assert policies.drain_alerts() == []  # nothing holds before a baseline is known
        baselines.start()
        policies.evaluate_trace(_trace(100, bool(passes[100]), float(values[100])), now=NOW + 100)
        _wait(baselines, 2)  # that check asked for the baselines; the next ones see them
        for i in range(101, 300):
            policies.evaluate_trace(_trace(i, bool(passes[i]), float(values[i])), now=NOW + i)
        fired = policies.drain_alerts()
    finally:
        baselines.close()
    assert [a.alert for a in fired] == ["drop"]
    text = "regressed('attribute', baseline: '7d', margin: 0.02)"
    shown = fired[0].body()["values"][text]
    assert shown["method"] == "newcombe" and shown["regressed"] is True and shown["baseline"] == "7d"
    assert shown["baseline_n"] == 2000 and shown["current_mean"] < 0.9 < shown["baseline_mean"]
    assert shown["high"] < -0.02 and shown["low"] < shown["difference"] < shown["high"]
    # the interval is Newcombe's over the counts the window saw when it fired and the baseline's
    current_n, baseline_n = shown["current_n"], shown["baseline_n"]
    expected = newcombe_interval(
        round(shown["current_mean"] * current_n), current_n, round(shown["baseline_mean"] * baseline_n), baseline_n
    )
    assert (shown["low"], shown["high"]) == pytest.approx(expected, abs=1e-9)
    quality = {k: v for p in policies.policies if p.name == "quality" for k, v in p.window.comparisons.items()}
    [(_, comparison)] = quality.values()
    assert comparison.method == "welch" and not comparison.regressed
    assert comparison.low < -0.01 < comparison.high  # it holds the 1-point dip, and does not reach past -2 points
    assert comparison.high > -0.02


def test_the_baseline_is_the_period_before_the_window_of_the_same_policy_and_project(store: TraceStore) -> None:
    from evalsi.policies.baseline import parse_regressed

    _baseline(store, "drop", [True] * 30 + [False] * 10)
    older = [
        Score("attribute", passed=False, trace_id=f"{i:032x}", policy="drop", evaluator="test/attribute",
              timestamp_unix_nano=int((NOW - 9 * DAY) * 1e9))
        for i in range(50)
    ]  # fmt: skip
    other = [
        Score("attribute", passed=False, trace_id=f"{i:032x}", policy="drop", evaluator="test/attribute",
              project="other", timestamp_unix_nano=int((NOW - DAY) * 1e9))
        for i in range(50)
    ]  # fmt: skip
    store.write_scores(older + other)
    baselines = StoreBaselines(lambda: store, "default")
    week = baselines.read("drop", parse_regressed("'attribute', baseline: '7d'"), NOW)
    assert week is not None and (week.pass_n, week.passed) == (40, 30)  # not 9 days ago, not another project
    ten_days = baselines.read("drop", parse_regressed("'attribute', baseline: '10d'"), NOW)
    assert ten_days is not None and ten_days.pass_n == 90
    assert baselines.read("nobody", parse_regressed("'attribute', baseline: '7d'"), NOW) is None
    store.write_scores([Score("attribute", passed=True, trace_id=f"{i:032x}", run_id="nightly-1") for i in range(8)])
    run = baselines.read("drop", parse_regressed("'attribute', baseline: 'run:nightly-1'"), NOW)
    assert run is not None and (run.pass_n, run.passed) == (8, 8)


def test_an_anytime_window_shows_its_confidence_sequence(tmp_path: Path) -> None:
    write(
        tmp_path / "p.yaml",
        policy_doc("a", cascade=[{"ref": "test/attribute"}], window={"length": "1h", "interval": "anytime"},
                   alerts=[{"name": "low", "when": "count('attribute') >= 100 && high('attribute') < 0.9"}]),
        policy_doc("f", cascade=[{"ref": "test/attribute"}], window="1h",
                   alerts=[{"name": "low", "when": "count('attribute') >= 100 && high('attribute') < 0.9"}]),
    )  # fmt: skip
    policies = load_policies(["p.yaml"], tmp_path)
    rng = np.random.default_rng(3)
    passes = rng.random(400) < 0.7
    for i, p in enumerate(passes):
        policies.evaluate_trace(_trace(i, bool(p)), now=NOW + i)
    by_policy = {w.policy: w for w in policies.windows()}
    anytime, fixed = by_policy["a"], by_policy["f"]
    assert anytime.method == "eb-cs" and fixed.method == "wilson"
    assert (fixed.low, fixed.high) == pytest.approx(wilson_interval(int(passes.sum()), 400))
    assert anytime.low < anytime.mean < anytime.high  # the sequence holds the rate, and is wider than one look's
    assert anytime.low < fixed.low and anytime.high > fixed.high
    assert (anytime.pass_low, anytime.pass_high) == (anytime.low, anytime.high)
    # both fire (the rate is far below 0.9); `high(...)` read each window's own interval
    fired = policies.drain_alerts()
    assert sorted(a.policy for a in fired) == ["a", "f"]
    by = {a.policy: a.values for a in fired}
    assert by["a"]["high('attribute')"] < 0.9 and by["f"]["high('attribute')"] < 0.9
    assert by["a"]["count('attribute')"] >= by["f"]["count('attribute')"]  # the sequence needs as many scores or more


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"alerts": [{"when": "regressed('echo')"}]}, "spec.alerts.0.when: invalid alert condition: regressed('echo'"),
        ({"alerts": [{"when": "regressed('echo', baseline: 'soon')"}]}, "baseline: invalid duration 'soon'"),
        ({"alerts": [{"when": "regressed('echo', baseline: '7d', margn: 0.02)"}]}, "unknown key 'margn'"),
        ({"alerts": [{"when": "regressed('echo', baseline: '7d', worse: 'up')"}]}, "must be 'lower' or 'higher'"),
        ({"window": {"length": "5m", "interval": "sometimes"}}, "spec.window.interval: Input should be 'fixed' or"),
        ({"window": "0.5s"}, "p.yaml: spec.window: must be at least 1s"),
        ({"window": {"length": "0.5s"}}, "p.yaml: spec.window.length: must be at least 1s"),
    ],
)
def test_bad_regressed_and_window_options_are_refused_with_their_key(tmp_path: Path, spec: Any, error: str) -> None:
    write(tmp_path / "p.yaml", policy_doc("p", **spec))
    with pytest.raises(PolicyError) as e:
        load_policies(["p.yaml"], tmp_path)
    assert error in str(e.value), str(e.value)


def test_a_reload_that_changes_the_interval_gives_a_new_window(tmp_path: Path) -> None:
    """A window keeps its counts across a reload only when its length, alerts and interval are the same: sequences
    cannot start in the middle of a window."""
    write(tmp_path / "p.yaml", policy_doc("p", cascade=[{"ref": "test/attribute"}], window="1h"))
    old = load_policies(["p.yaml"], tmp_path)
    for i in range(5):
        old.evaluate_trace(_trace(i, True), now=NOW + i)
    same = load_policies(["p.yaml"], tmp_path)
    assert same.carry_over(old) == ["p"]
    write(tmp_path / "p.yaml", policy_doc("p", cascade=[{"ref": "test/attribute"}],
                                          window={"length": "1h", "interval": "anytime"}))  # fmt: skip
    anytime = load_policies(["p.yaml"], tmp_path)
    assert anytime.carry_over(same) == []
    anytime.evaluate_trace(_trace(9, False), now=NOW + 9)
    [stats] = anytime.windows()
    assert (stats.n, stats.method) == (1, "eb-cs")
