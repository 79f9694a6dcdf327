"""One reading per score name, online and offline: a run's `mean` is the mean of the scores' values, as an online
window's `mean(...)` and the policy stats API say, and its `pass_rate` the share that passed, as `rate(...)` says.
`tool-call-error-rate` (a value of 1 means every call failed) was the case found: a run's "mean 1.000" read as a
pass rate."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from running_collector import Collector

from evalsi.evaluators import Target, load_evaluators, parse_params, run as evaluate
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.model.trajectory import build_trajectory
from evalsi.policies.window import Series
from evalsi.run_harness.stats import Observation, aggregate

from .test_run_e2e import evalsi, run_file, run_json

AGENT = '''
def tools(question):
    """`question` is how many of two lookups fail: 0, 1 or 2."""
    failed = int(question)
    steps = [{"type": "llm", "model": "m", "input": question, "output": "looking up", "input_tokens": 5,
              "output_tokens": 2}]
    for i in range(2):
        steps.append({"type": "tool", "name": "lookup", "arguments": {"i": i}, "result": "ok",
                      "error": "upstream 503" if i < failed else None})
    return {"output": "done", "trajectory": steps}
'''


def test_a_run_and_the_online_stats_read_tool_call_error_rate_the_same_way(
    tmp_path: Path, collector: Collector
) -> None:
    data = [{"id": f"t{n}", "input": str(n)} for n in range(3)]
    path = run_file(tmp_path, data=data, trials=2, function="agent:tools", gates=[
        "metric('tool-call-error-rate').mean == 0.5", "metric('tool-call-error-rate').passRate < 0.34"])  # fmt: skip
    (tmp_path / "agent.py").write_text(AGENT)
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["name"] = "one-reading"
    doc["spec"]["evaluators"] = [{"ref": "builtin/tool-call-error-rate"}]
    path.write_text(yaml.safe_dump(doc))
    res = evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path)
    run = run_json(res)
    offline = run["metrics"]["tool-call-error-rate"]
    # the online reading of the same stored scores: what a dashboard or an alert's mean('...') / rate('...') reads
    stats = httpx.get(f"{collector.api}/api/v1/policies/stats", params={"policy": "run:one-reading", "window": "1h"})
    [online] = [s for s in stats.json()["stats"] if s["name"] == "tool-call-error-rate"]
    assert online["mean"] == pytest.approx(0.5)  # the error rate: half the calls failed
    assert online["pass_rate"] == pytest.approx(1 / 3)  # only t0 had no failed call
    assert offline["mean"] == pytest.approx(online["mean"]), "a run's mean is the error rate, as online"
    assert offline["pass_rate"] == pytest.approx(online["pass_rate"])
    assert offline["pass_at_k"]["2"] == pytest.approx(1 / 3)  # pass@k still reads the verdicts
    assert res.returncode == 0, [g for g in run["gates"] if not g["passed"]]


def _trajectory_target(failed: int, calls: int = 2, repeated: int = 1) -> Target:
    """An agent's trace with `calls` tool calls, the first `failed` failing and the first `repeated` identical."""
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    spans = [Span(trace_id, f"{1:016x}", "", "invoke_agent a", "INTERNAL", 1_000_000, 1_500_000, step_type="agent")]
    for n in range(2, calls + 2):
        i = n - 2
        call = {"type": "tool_call", "id": f"call_{n}", "name": "lookup", "arguments": {"i": 0 if i < repeated else i}}
        spans.append(Span(
            trace_id, f"{n:016x}", f"{1:016x}", "execute_tool lookup", "INTERNAL", 1_000_000 * n, 1_000_000 * n + 1,
            step_type="tool", tool_name="lookup", input=[{"role": "assistant", "parts": [call]}],
            status_code="ERROR" if i < failed else "UNSET", error_type="upstream 503" if i < failed else None,
        ))  # fmt: skip
    return Target(spans, span=spans[0], trajectory=build_trajectory(spans), reference={})


@pytest.mark.parametrize("ref, params", [
    ("builtin/tool-call-error-rate", {}),
    ("builtin/tool-call-error-rate", {"max_rate": 0.5}),
    ("builtin/loop-detection", {"max_repeats": 3}),
])  # fmt: skip
def test_every_reading_of_a_builtin_score_is_the_same_in_a_window_and_in_a_run(ref: str, params: dict) -> None:
    ev = load_evaluators()[ref]
    p = parse_params(ev, params)
    cases = [(0, 2, 1), (1, 2, 1), (2, 2, 1), (1, 4, 4), (0, 3, 3)]  # (failed, calls, repeated)
    scores: list[Score] = [s for case in cases for s in evaluate(ev, _trajectory_target(*case), p)]
    assert all(s.outcome == "scored" and s.value is not None and s.passed is not None for s in scores)
    window = Series(ref, scores[0].name)
    for s in scores:
        window.add(s)
    run = aggregate(scores[0].name, [Observation(f"t{i}", 0, s.value, s.passed, "scored") for i, s in
                                     enumerate(scores)])  # fmt: skip
    assert run.mean == pytest.approx(window.mean)
    assert run.pass_rate == pytest.approx(window.pass_rate)


def test_a_value_that_is_its_verdict_keeps_the_pass_fail_statistics() -> None:
    """`task-success`, `trajectory-match`: value 1 passed, 0 failed; the mean is the pass rate, with Wilson."""
    obs = [Observation("a", k, float(k != 1), k != 1, "scored") for k in range(3)]
    summary = aggregate("task-success", obs)
    assert (summary.kind, summary.interval) == ("pass_fail", "wilson")
    assert summary.mean == summary.pass_rate == pytest.approx(2 / 3)
    inverse = aggregate("pii-leak", [o._replace(value=1 - o.value) for o in obs])  # 1 = a leak found
    assert (inverse.kind, inverse.mean, inverse.pass_rate) == ("numeric", pytest.approx(1 / 3), pytest.approx(2 / 3))
