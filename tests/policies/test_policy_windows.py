"""Window aggregates and their intervals (against scipy's values), alerts once per window, and the webhook."""

from __future__ import annotations

import email.utils
import json
import math
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from policy_helpers import policy_doc, span, write

from evalsi.policies import Notifier, load_policies
from evalsi.policies.conditions import compile_alert
from evalsi.policies.intervals import percentile, t_interval, t_quantile, wilson_interval
from evalsi.policies.notify import AlertEvent

# scipy 1.17.1: stats.t.ppf(p, df) for p = 0.975, 0.995, 0.9 (scipy is not a dependency of evalsi)
T_PPF = {
    1: (12.706204736174694, 63.656741162871526, 3.0776835371752544),
    2: (4.302652729749462, 9.924843200918287, 1.8856180831641272),
    3: (3.1824463052837078, 5.840909309733355, 1.637744353696209),
    4: (2.7764451051977934, 4.604094871349992, 1.533206274058944),
    5: (2.5705818356363146, 4.032142983555228, 1.4758840488244815),
    7: (2.364624251592784, 3.4994832973504924, 1.4149239276505086),
    9: (2.262157162798205, 3.249835541592126, 1.3830287383966329),
    10: (2.228138851986274, 3.16927267261695, 1.372183641110336),
    19: (2.0930240544083087, 2.8609346064649794, 1.3277282090267986),
    29: (2.045229642132703, 2.756385903670605, 1.311433647301551),
    30: (2.0422724563012378, 2.7499956535672254, 1.3104150253913955),
    49: (2.0095752371292392, 2.679951973631552, 1.29906878474775),
    99: (1.9842169515864174, 2.626405457280827, 1.2901614420344854),
    100: (1.9839715185235518, 2.6258905214380173, 1.290074761346516),
    999: (1.9623414611334493, 2.5807596372676365, 1.2823995700373971),
    1000: (1.9623390808264083, 2.580754698065951, 1.2823987214609247),
    1001: (1.9623367052808798, 2.5807497687505245, 1.2823978745810514),
    5000: (1.9604385517065073, 2.5768129665562802, 1.2817209053357184),
    100000: (1.9599877075346095, 2.575878469908375, 1.2815600314493614),
}
# scipy 1.17.1: stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
WILSON = {
    (0, 1): (0.0, 0.7934506856227626),
    (1, 1): (0.20654931437723745, 1.0),
    (0, 10): (0.0, 0.27753279986288926),
    (3, 10): (0.10779126740630102, 0.6032218525388546),
    (10, 10): (0.7224672001371109, 1.0),
    (45, 50): (0.7863976856252034, 0.9565242350681095),
    (812, 1000): (0.7866068125887821, 0.8350052901162314),
    (1, 3): (0.06149194472039626, 0.7923403991979523),
}
# scipy 1.17.1: stats.t.interval(0.95, n - 1, loc=mean, scale=sd / sqrt(n)) of these values
VALUES = [0.12, 0.55, 0.91, 0.33, 0.78, 0.64, 0.05, 0.47]
VALUES_INTERVAL = (0.48125, 0.2279702509606938, 0.7345297490393062)


@pytest.mark.parametrize("df", sorted(T_PPF))
def test_t_quantile_matches_scipy(df: int) -> None:
    for p, want in zip((0.975, 0.995, 0.9), T_PPF[df], strict=True):
        assert t_quantile(p, df) == pytest.approx(want, abs=1e-9, rel=0)
        assert t_quantile(1 - p, df) == pytest.approx(-want, abs=1e-9, rel=0)


def test_t_quantile_closed_forms_and_limits() -> None:
    # df = 4 has a closed form: t = sqrt(4 / sqrt(a) * cos(acos(sqrt(a)) / 3) - 4), a = 4p(1-p) (two-sided p)
    for p in (0.6, 0.9, 0.975, 0.999):
        a = 4 * p * (1 - p)
        exact = math.sqrt(4 / math.sqrt(a) * math.cos(math.acos(math.sqrt(a)) / 3) - 4)
        assert t_quantile(p, 4) == pytest.approx(exact, abs=1e-12)
    assert t_quantile(0.5, 7) == 0
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        t_quantile(0.9, 0)


@pytest.mark.parametrize(("k", "n"), sorted(WILSON))
def test_wilson_matches_scipy(k: int, n: int) -> None:
    low, high = wilson_interval(k, n)  # type: ignore[misc]
    assert (low, high) == pytest.approx(WILSON[k, n], abs=1e-9, rel=0)


def test_intervals_below_their_minimum_and_percentiles_match_numpy() -> None:
    assert t_interval(1.0, 0.0, 1) is None
    assert wilson_interval(0, 0) is None
    values = sorted(random.Random(3).gauss(100, 15) for _ in range(997))
    for q in (0, 1, 50, 90, 95, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-9)
    assert percentile([], 50) is None


# --- windows ---------------------------------------------------------------------------------------------------


def _load(tmp_path: Path, *docs: dict[str, Any], interval: float = 0.0) -> Any:
    write(tmp_path / "p.yaml", *docs)
    return load_policies(["p.yaml"], tmp_path, alert_check_interval=interval)


def _scored(i: int, value: float | None = None, passed: bool | None = None) -> list:
    attributes: dict[str, Any] = {}
    if value is not None:
        attributes["test.value"] = value
    if passed is not None:
        attributes["test.passed"] = passed
    return [span(f"{i:032x}", attributes=attributes)]


def test_window_aggregates_match_the_reference_intervals(tmp_path: Path) -> None:
    ps = _load(tmp_path, policy_doc("w", cascade=[{"ref": "test/attribute"}], window="1m"))
    for i, v in enumerate(VALUES):
        ps.evaluate_trace(_scored(i, value=v, passed=v >= 0.5), now=120 + i)
    ps.evaluate_trace([span("ff" * 16)], now=130)  # skipped: counts beside, never in n or the mean
    [stats] = ps.windows()
    assert (stats.policy, stats.evaluator, stats.name) == ("w", "test/attribute", "attribute")
    assert (stats.start, stats.end) == (120, 180)
    assert (stats.kind, stats.n, stats.skipped, stats.errors) == ("numeric", len(VALUES), 1, 0)
    mean, low, high = VALUES_INTERVAL
    assert (stats.mean, stats.low, stats.high) == pytest.approx((mean, low, high), abs=1e-9, rel=0)
    passed = sum(v >= 0.5 for v in VALUES)
    assert (stats.pass_n, stats.passed, stats.pass_rate) == (len(VALUES), passed, passed / len(VALUES))
    assert (stats.pass_low, stats.pass_high) == pytest.approx(wilson_interval(passed, len(VALUES)), abs=1e-12)
    assert stats.p50 == pytest.approx(float(np.percentile(VALUES, 50)))
    assert stats.p95 == pytest.approx(float(np.percentile(VALUES, 95)))
    # the failures come first among the examples
    failing = {f"{i:032x}" for i, v in enumerate(VALUES) if v < 0.5}
    assert set(stats.example_trace_ids[:3]) <= failing


def test_pass_fail_scores_use_wilson_and_windows_tumble(tmp_path: Path) -> None:
    ps = _load(tmp_path, policy_doc("pf", cascade=[{"ref": "test/attribute"}], window="1m"))
    for i in range(10):
        ps.evaluate_trace(_scored(i, passed=i < 3), now=59.0)
    assert ps.drain_windows() == []
    ps.evaluate_trace(_scored(10, passed=True), now=60.0)  # the next window: the first closes
    [closed] = ps.drain_windows()
    assert (closed.start, closed.end, closed.kind, closed.n, closed.mean) == (0, 60, "pass_fail", 10, 0.3)
    assert (closed.low, closed.high) == pytest.approx(WILSON[3, 10], abs=1e-9, rel=0)
    assert (closed.p50, closed.p95) == (None, None)
    [open_] = ps.windows()
    assert (open_.start, open_.n) == (60, 1)
    # a quiet policy's window closes on the timer; inf (shutdown) closes everything
    assert ps.close_windows(119.0) == []
    assert [w.start for w in ps.close_windows(math.inf)] == [60]
    assert ps.windows() == []


def test_error_scores_count_beside_not_in_n(tmp_path: Path) -> None:
    ps = _load(tmp_path, policy_doc("e", cascade=[{"ref": "test/boom"}]))
    ps.evaluate_trace(_scored(1), now=0)
    [stats] = ps.windows()
    assert (stats.n, stats.errors, stats.mean, stats.low) == (0, 1, None, None)


# --- alerts ----------------------------------------------------------------------------------------------------


def test_an_alert_fires_once_per_window_per_condition(tmp_path: Path) -> None:
    doc = policy_doc(
        "alerting",
        cascade=[{"ref": "test/attribute"}],
        window="1m",
        alerts=[
            {"name": "failing", "when": "count('attribute') >= 3 && rate('attribute') < 0.5"},
            {"when": "count >= 5"},
            {"when": "mean('nothing') > 0"},  # no such score: never holds
        ],
    )
    doc["metadata"]["labels"] = {"team": "t"}
    ps = _load(tmp_path, doc)
    for i in range(12):
        ps.evaluate_trace(_scored(i, value=0.1, passed=False), now=float(i))
    fired = ps.drain_alerts()
    assert [(a.alert, a.window_start, a.fired_at) for a in fired] == [("failing", 0, 2.0), ("count >= 5", 0, 4.0)]
    for i in range(12, 20):
        ps.evaluate_trace(_scored(i, value=0.1, passed=False), now=60.0 + i)
    assert [(a.alert, a.window_start) for a in ps.drain_alerts()] == [("failing", 60), ("count >= 5", 60)]
    assert ps.stats["alerting"].alerts == 4
    body = fired[0].body()
    assert body["policy"] == "alerting" and body["labels"] == {"team": "t"}
    assert body["condition"] == "count('attribute') >= 3 && rate('attribute') < 0.5"
    assert body["window"] == {"start": "1970-01-01T00:00:00Z", "end": "1970-01-01T00:01:00Z", "count": 3}
    agg = body["aggregates"]["attribute"]
    assert (agg["evaluator"], agg["n"], agg["pass_rate"], agg["mean"]) == ("test/attribute", 3, 0.0, pytest.approx(0.1))
    assert body["example_trace_ids"] == [f"{i:032x}" for i in range(3)]
    json.dumps(body)  # what the webhook gets is JSON


def test_alerts_are_checked_at_most_once_per_interval_and_at_window_close(tmp_path: Path) -> None:
    doc = policy_doc("slow", cascade=[{"ref": "test/attribute"}], window="1m", alerts=[{"when": "count >= 3"}])
    ps = _load(tmp_path, doc, interval=1e9)
    for i in range(5):
        ps.evaluate_trace(_scored(i, passed=True), now=float(i))
    assert ps.drain_alerts() == []  # the first check saw one trace; no other check within the interval
    ps.close_windows(60.0)
    [alert] = ps.drain_alerts()
    assert (alert.count, alert.fired_at) == (5, 60.0)


def test_alert_conditions_are_cel_over_the_window() -> None:
    rule = compile_alert("""mean('a') > 1 && rate("b") < 0.5 && count('c') > 2 && count > 3 && 'mean(\\'x\\')' != ''""")
    assert rule.uses == (("mean", "a"), ("rate", "b"), ("n", "c"))
    assert not rule.whole
    assert compile_alert("window.p95['a'] > 2").whole
    assert rule.program.matches({"window": {"mean": {"a": 2}, "rate": {"b": 0.1}, "n": {"c": 3}, "count": 4}})
    with pytest.raises(ValueError, match="invalid CEL expression"):
        compile_alert("mean('a') >")
    with pytest.raises(ValueError, match=r"undeclared reference to 'trace\.error'"):
        compile_alert("trace.error")


# --- webhooks --------------------------------------------------------------------------------------------------


class _Hook(BaseHTTPRequestHandler):
    answers: list[int | tuple[int, str]] = []  # a status, or (status, Retry-After)
    received: list[dict[str, Any]] = []
    times: list[float] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body))
        type(self).times.append(time.monotonic())
        answer = type(self).answers.pop(0) if type(self).answers else 200
        status, after = answer if isinstance(answer, tuple) else (answer, None)
        self.send_response(status)
        if after is not None:
            self.send_header("Retry-After", after)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"answers": [], "received": [], "times": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", handler
    server.shutdown()
    server.server_close()


def _event(url: str) -> AlertEvent:
    return AlertEvent(
        policy="p", alert="a", condition="count > 1", notify=url, window_start=0, window_end=60, count=2,
        aggregates={}, example_trace_ids=["ab" * 16], labels={}, fired_at=30,
    )  # fmt: skip


def test_webhooks_are_posted_in_the_background_with_retries(hook: tuple[str, type[_Hook]]) -> None:
    url, handler = hook
    handler.answers = [503, 429, 200, 400]
    notifier = Notifier(retries=3, backoff=0.01)
    notifier.send(_event(url))  # 503, 429, then 200: sent on the third try
    notifier.send(_event(url))  # 400: a client error is not retried
    notifier.send(_event(""))  # nowhere to send
    notifier.close()
    assert (notifier.sent, notifier.failed) == (1, 1)
    assert len(handler.received) == 4
    assert handler.received[0]["example_trace_ids"] == ["ab" * 16]
    assert handler.received[0]["window"]["count"] == 2


def test_a_webhook_retry_waits_as_long_as_retry_after_says(hook: tuple[str, type[_Hook]]) -> None:
    """The notifier shares the exporters' backoff policy: Retry-After in seconds or as an HTTP date is honoured."""
    url, handler = hook
    in_four_seconds = email.utils.formatdate(time.time() + 4, usegmt=True)  # whole seconds: 3-4 s ahead
    handler.answers = [(503, "1"), (429, in_four_seconds), 200]
    notifier = Notifier(retries=3, backoff=0.01)
    notifier.send(_event(url))
    notifier.close()
    assert (notifier.sent, notifier.failed) == (1, 0)
    first, second, third = handler.times
    assert 0.9 <= second - first < 1.9  # not the 0.01 s backoff: the server's 1 s
    assert 1.5 <= third - second < 3.5  # the date was 2-3 s ahead when the 429 came, 1 s later


def test_an_unreachable_webhook_fails_after_its_retries() -> None:
    notifier = Notifier(retries=2, backoff=0.01, timeout=0.5)
    notifier.send(_event("http://127.0.0.1:9/nowhere"))
    notifier.close()
    assert (notifier.sent, notifier.failed) == (0, 1)


def test_notify_may_name_an_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALSI_TEST_HOOK", "https://hooks.example.com/x")
    doc = policy_doc("env", alerts=[{"when": "count >= 1", "notify": "env:EVALSI_TEST_HOOK"}])
    ps = _load(tmp_path, doc)
    ps.evaluate_trace(_scored(1), now=0)
    [alert] = ps.drain_alerts()
    assert alert.notify == "https://hooks.example.com/x"
