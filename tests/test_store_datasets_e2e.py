"""The shipped shape on one replica with two pipeline workers: promoted traces (`promote_to: store`) reach the store
from the workers through the collector process, once each; `evalsi datasets list/export` read them through the API
and, with no collector running, from the store. The policy's window, read from the store (`windows.scope: store`),
holds every worker's traces and fires once. (A row promoted again keeping its first promotion:
tests/exporters/test_store_datasets.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
from running_collector import Collector, serve_config, start_collector, wait_until

POLICY = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: answers}
spec:
  selector: span.attributes['app.route'] == 'support'
  cascade:
    - ref: builtin/contains
      params: {any: [Paris]}
  window: 6s
  alerts:
    - name: wrong-answers
      when: count >= 10 && rate('contains') < 0.9
  promote:
    when: "!scores['contains'].passed"
    dataset: wrong-answers
"""


def _attr(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def _trace(i: int, answer: str) -> tuple[str, dict[str, Any]]:
    trace = f"{i + 1:032x}"
    now = time.time_ns()
    messages = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
    question = [{"role": "user", "parts": [{"type": "text", "content": "Capital of France?"}]}]
    root = {"traceId": trace, "spanId": f"{i + 1:016x}", "name": "handle request", "kind": 2,
            "startTimeUnixNano": str(now - 2_000_000), "endTimeUnixNano": str(now),
            "attributes": [_attr("app.route", "support")]}  # fmt: skip
    chat = {"traceId": trace, "spanId": f"{i + 1001:016x}", "parentSpanId": f"{i + 1:016x}", "name": "chat gpt-4o",
            "kind": 3, "startTimeUnixNano": str(now - 1_000_000), "endTimeUnixNano": str(now - 100_000),
            "attributes": [_attr("gen_ai.operation.name", "chat"), _attr("gen_ai.request.model", "gpt-4o"),
                           _attr("gen_ai.input.messages", json.dumps(question)),
                           _attr("gen_ai.output.messages", json.dumps(messages))]}  # fmt: skip
    resource = {"attributes": [_attr("service.name", "support")]}
    return trace, {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [root, chat]}]}]}


def _send(c: Collector, n: int) -> set[str]:
    wrong = set()
    for i in range(n):
        answer = "Lyon." if i % 3 == 0 else "Paris."
        trace, body = _trace(i, answer)
        assert httpx.post(c.http + "/v1/traces", json=body, timeout=10).status_code == 200
        if answer == "Lyon.":
            wrong.add(trace)
    return wrong


def _config(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "policies.yaml").write_text(POLICY)
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {
        "policies": ["policies.yaml"], "promote_to": "store", "windows": {"scope": "store", "poll_interval": "500ms"},
    }  # fmt: skip
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    cfg["service"]["workers"] = 2
    return cfg


def _promoted_rows_written(c: Collector) -> float:
    text = httpx.get(c.metrics, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("evalsi_promoted_rows_total{"))  # fmt: skip


def test_promoted_rows_and_store_windows_with_two_workers(tmp_path: Path) -> None:
    c = start_collector(tmp_path, _config(tmp_path))
    try:
        into = time.time() % 6  # early in a window, so that every trace is evaluated in it
        if into > 1:
            time.sleep(6 - into + 0.1)
        wrong = _send(c, 12)
        assert len(wrong) == 4
        assert wait_until(lambda: _promoted_rows_written(c) == 4, 30), "written from the workers"
        listed = json.loads(c.cli("datasets", "list", "--json").stdout)
        assert [(d["dataset"], d["rows"]) for d in listed] == [("wrong-answers", 4)]
        exported = [json.loads(line) for line in c.cli("datasets", "export", "wrong-answers").stdout.splitlines()]
        assert {r["trace_id"] for r in exported} == wrong

        def closed() -> list[dict[str, Any]]:
            logged = [e["window"] for e in c.logs() if e.get("msg") == "policy window closed"]
            return [w for w in logged if w["name"] == "contains" and w["n"]]

        # the window, read from the store in the collector process, has every worker's traces
        assert wait_until(closed, 20)
        (window,) = closed()
        assert (window["scope"], window["n"], window["passed"]) == ("store", 12, 8), window
        fired = [e for e in c.logs() if e.get("msg") == "alert fired"]
        assert [(e["alert"], e["project"]) for e in fired] == [("wrong-answers", "default")]
    finally:
        assert c.stop() == 0
    # no collector running: read the store
    listed = json.loads(c.cli("datasets", "list", "--json", api=False).stdout)
    assert [(d["project"], d["dataset"], d["rows"]) for d in listed] == [("default", "wrong-answers", 4)]
    exported = c.cli("datasets", "export", "wrong-answers", "-o", str(tmp_path / "out.jsonl"), api=False)
    assert "4 rows of wrong-answers" in exported.stdout
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["trace_id"] for r in rows) == sorted(wrong)
    assert all(r["output"] == "Lyon." and r["input"] == "Capital of France?" for r in rows)
    missing = c.cli("datasets", "export", "no-such", api=False, check=False)
    assert missing.returncode == 1 and "dataset 'no-such' has no rows" in missing.stderr
