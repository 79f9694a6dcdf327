"""Windows read from the store (`windows.scope: store`): the same figures and alert verdicts as a process's window fed
the same scores, per project, on real chDB; fired once per window, resolved after a window without the condition."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalsi.exporters.clickhouse.backend import open_backend
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.model.score import Score
from evalsi.policies.alertmanager import alert_labels
from evalsi.policies.conditions import compile_alert
from evalsi.policies.store_window import StoreWindows
from evalsi.policies.window import PolicyWindow

T0 = 1_800_000_000.0  # a window start for 60 s windows (a multiple of 60)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[TraceStore]:
    s = TraceStore(open_backend(f"chdb://{tmp_path / 'store'}"))
    s.create_schema()
    yield s
    s.close()


def _scores(n: int, at: float, *, project: str = "default", seed: int = 1, policy: str = "quality") -> list[Score]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        trace = f"{seed:08x}{i:024x}"
        value = rng.random()
        stamp = int((at + i * 0.01) * 1e9)
        common = dict(trace_id=trace, policy=policy, project=project, timestamp_unix_nano=stamp)
        out.append(Score(name="relevance", evaluator="judge/relevance", value=value, passed=value > 0.3, **common))
        out.append(Score(name="latency", evaluator="builtin/latency", value=rng.uniform(100, 900), **common))
        if i % 7 == 0:
            out.append(Score(name="pii", evaluator="builtin/pii", outcome="skipped", **common))
    return out


def test_store_window_figures_equal_a_process_window_fed_the_same_scores(store: TraceStore) -> None:
    scores = _scores(300, T0 + 1)
    store.write_scores(scores)
    local = PolicyWindow("quality", 60, [])
    local.roll(T0 + 1)
    for trace in dict.fromkeys(s.trace_id for s in scores):
        local.add(trace, [s for s in scores if s.trace_id == trace])
    windows = StoreWindows(settle=0)
    windows.use({"quality": (60.0, [], {})})
    windows.poll(T0 + 30, store.policy_window)
    stored = {(s.evaluator, s.name): s for s in windows.snapshot("default")}
    mine = {(s.evaluator, s.name): s for s in local.snapshot()}
    assert set(stored) == set(mine) == {
        ("judge/relevance", "relevance"), ("builtin/latency", "latency"), ("builtin/pii", "pii")
    }  # fmt: skip
    for key, s in stored.items():
        m = mine[key]
        assert (s.n, s.pass_n, s.passed, s.kind, s.method, s.skipped) == (m.n, m.pass_n, m.passed, m.kind, m.method,
                                                                          m.skipped)  # fmt: skip
        for field in ("mean", "low", "high", "pass_rate", "pass_low", "pass_high", "p50", "p95"):
            a, b = getattr(s, field), getattr(m, field)
            assert (a is None and b is None) or math.isclose(a, b, rel_tol=1e-9), (key, field, a, b)
        assert s.project == "default" and (s.start, s.end) == (T0, T0 + 60)


def test_alert_fires_once_per_window_over_every_replicas_scores_and_resolves(store: TraceStore) -> None:
    rule = compile_alert("count >= 30 && rate('relevance') < 0.9", name="busy")
    # three replicas' shares of one window: 12 traces each, none reaching 30 alone
    for seed in (1, 2, 3):
        store.write_scores(_scores(12, T0 + seed, seed=seed))
    replicas = [StoreWindows(settle=1) for _ in range(3)]
    for w in replicas:
        w.use({"quality": (60.0, [rule], {"team": "search", "app.kubernetes.io/name": "x"})})
    polled = [w.poll(T0 + 20, store.policy_window) for w in replicas]
    fired = [e for events, _ in polled for e in events]
    assert [e.state for e in fired] == ["firing"] * 3, "each replica sees the aggregate cross"
    assert {e.count for e in fired} == {36}
    labels = [alert_labels(e, "default") for e in fired]
    assert labels[0] == labels[1] == labels[2] == {
        "alertname": "busy", "policy": "quality", "project": "default", "team": "search", "app_kubernetes_io_name": "x"
    }  # fmt: skip
    assert all(not w.poll(T0 + 40, store.policy_window)[0] for w in replicas), "once per window"
    # the next window has 5 traces: when it closes (after settle), the alert resolves
    store.write_scores(_scores(5, T0 + 61, seed=9))
    events, closed = replicas[0].poll(T0 + 60.5, store.policy_window)
    assert events == [] and closed == [], "the ended window closes only `settle` after its end"
    events, closed = replicas[0].poll(T0 + 62, store.policy_window)
    assert events == [] and {(c.name, c.n) for c in closed} == {("relevance", 36), ("latency", 36), ("pii", 0)}
    events, closed = replicas[0].poll(T0 + 122, store.policy_window)
    assert [(e.state, e.count, e.project) for e in events] == [("resolved", 5, "default")]


def test_store_windows_are_per_project(store: TraceStore) -> None:
    rule = compile_alert("count >= 10", name="busy")
    store.write_scores(_scores(12, T0 + 1, project="team-a", seed=1) + _scores(4, T0 + 1, project="team-b", seed=2))
    windows = StoreWindows(settle=0)
    windows.use({"quality": (60.0, [rule], {})})
    events, _ = windows.poll(T0 + 10, store.policy_window)
    assert [(e.project, e.count) for e in events] == [("team-a", 12)]
    assert {s.project for s in windows.snapshot("team-b")} == {"team-b"}
    assert {(s.name, s.n) for s in windows.snapshot("team-b")} == {("relevance", 4), ("latency", 4), ("pii", 0)}
