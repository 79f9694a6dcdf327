"""A real `evalsi serve`: a regressed(...) alert reads last week's scores from its store and fires with the difference,
its interval and its test in the stored alert, the metrics and `policies stats` (API and CLI); people's feedback on
evaluated traces gives the judge's calibration in `policies stats` and the metrics."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from running_collector import Collector, send_chats, serve_config, start_collector, wait_until

ROOT = Path(__file__).resolve().parents[2]
REGRESSED = "regressed('contains', baseline: '7d', margin: 0.02)"
POLICY = f"""
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: answers}}
spec:
  cascade:
    - ref: builtin/contains
      params: {{any: [Paris]}}
  window: 1h
  alerts:
    - name: answers regressed
      when: "count('contains') >= 10 && {REGRESSED}"
"""

# last week's scores of the policy, written before the collector opens the store (chDB opens a path in one process)
BASELINE = """
import sys, time
from evalsi.exporters.clickhouse.backend import open_backend
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.model.score import Score
store = TraceStore(open_backend("chdb://" + sys.argv[1], database="default", create=True))
store.create_schema()
day_ago = time.time_ns() - 86_400 * 10**9
store.write_scores([
    Score("contains", passed=i % 20 != 0, trace_id=f"{0xBA5E << 64 | i:032x}", span_id="a1", policy="answers",
          evaluator="builtin/contains", timestamp_unix_nano=day_ago + i)
    for i in range(400)
])
store.close()
"""


def _send(c: Collector, first: int, answers: list[str]) -> list[str]:
    return send_chats(c.http, [0xA1 << 64 | n for n in range(first, first + len(answers))], answers)


def _metrics(c: Collector) -> dict[str, float]:
    out = {}
    for line in httpx.get(c.metrics).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _series(metrics: dict[str, float], name: str) -> list[float]:
    return [v for k, v in metrics.items() if k.startswith(name + "{")]


def test_a_regression_against_last_week_is_shown_wherever_the_alert_is(tmp_path: Path) -> None:
    store = tmp_path / "store"
    subprocess.run([sys.executable, "-c", BASELINE, str(store)], check=True, cwd=ROOT, timeout=120,
                   env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    (tmp_path / "policies.yaml").write_text(POLICY)
    cfg = serve_config(store)
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {"policies": ["policies.yaml"], "calibration": {"every": "1s"}}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    c = start_collector(tmp_path, cfg)
    try:
        # 95% passed last week; now half the answers are wrong
        first = _send(c, 1, ["Paris.", "No idea."] * 6)
        read = 'evalsi_baseline_reads_total{processor="evaluate",result="ok"}'
        assert wait_until(lambda: _metrics(c).get(read, 0) >= 1), c.log_path.read_text()[-3000:]
        _send(c, 100, ["Paris.", "Rome."] * 5)  # the next check sees the baseline
        assert wait_until(lambda: httpx.get(c.api + "/api/v1/alerts").json()["alerts"]), c.log_path.read_text()[-3000:]
        [row] = httpx.get(c.api + "/api/v1/alerts").json()["alerts"]
        shown = row["values"][REGRESSED]
        assert (row["alert"], shown["method"], shown["regressed"]) == ("answers regressed", "newcombe", True)
        assert shown["baseline"] == "7d" and shown["baseline_n"] == 400 and shown["baseline_mean"] == 0.95
        assert shown["high"] < -0.02 and shown["low"] < shown["difference"] < shown["high"]

        metrics = _metrics(c)
        labels = 'baseline="7d",policy="answers",processor="evaluate",score="contains"'
        assert metrics[f"evalsi_policy_difference{{{labels}}}"] < -0.2
        assert metrics[f"evalsi_policy_difference_high{{{labels}}}"] < -0.02
        assert metrics[f'evalsi_policy_regressed{{{labels},test="newcombe"}}'] == 1

        stats = httpx.get(
            c.api + "/api/v1/policies/stats", params={"window": "10m", "baseline": "7d", "margin": 0.02}
        ).json()
        [stat] = stats["stats"]
        assert stat["comparison"]["method"] == "newcombe" and stat["comparison"]["regressed"] is True
        assert stat["comparison"]["baseline_n"] == 400 and stat["comparison"]["current_n"] == stat["n"]
        bad = httpx.get(c.api + "/api/v1/policies/stats", params={"baseline": "last week"})
        assert bad.status_code == 400 and "baseline: invalid duration" in bad.text
        table = c.cli("policies", "stats", "--window", "10m", "--baseline", "7d", "--margin", "0.02").stdout
        assert "VS 7D" in table and "newcombe" in table and "yes" in table

        # people label six of the evaluated traces: the check agrees with them on five
        for trace_id, thumbs in zip(first[:6], [True, False, True, False, True, True], strict=True):
            resp = httpx.post(c.api + "/v1/feedback", json={"trace_id": trace_id, "name": "thumbs", "value": thumbs})
            assert resp.status_code < 300, resp.text

        def calibrations() -> list[dict[str, Any]]:
            return httpx.get(c.api + "/api/v1/policies/stats", params={"window": "10m"}).json()["calibration"]

        # the store writes what is short of a batch within its flush_interval, so the labels land over a second or
        # two and a check in between counts those stored by then: wait for all six
        assert wait_until(lambda: [x["n"] for x in calibrations()] == [6]), calibrations()
        [calibration] = calibrations()
        assert (calibration["policy"], calibration["evaluator"], calibration["feedback"]) == (
            "answers", "builtin/contains", "thumbs"
        )  # fmt: skip
        assert calibration["n"] == 6
        assert calibration["confusion"] == {
            "both_pass": 3, "both_fail": 2, "judge_pass_human_fail": 0, "judge_fail_human_pass": 1
        }  # fmt: skip
        assert calibration["kappa"]["low"] < calibration["kappa"]["kappa"] < calibration["kappa"]["high"]
        assert calibration["ppi"]["labeled"] == 6 and calibration["ppi"]["unlabeled"] == 16
        deadline = time.monotonic() + 20
        while _series(_metrics(c), "evalsi_judge_labeled") != [6] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _series(_metrics(c), "evalsi_judge_labeled") == [6]
        assert _series(_metrics(c), "evalsi_judge_kappa") == [calibration["kappa"]["kappa"]]
        judges = c.cli("policies", "stats", "--window", "10m").stdout
        assert "judges against people" in judges and "thumbs" in judges
    finally:
        assert c.stop() == 0
