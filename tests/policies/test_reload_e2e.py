"""Policy reload on SIGHUP through a running `evalsi serve`, in one process and with pipeline workers: an edited
policy file scores the next traces, a broken one keeps the policies in use (and the log says why), a policy added to
the config's list is loaded, and an unchanged policy keeps its window."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from running_collector import Collector, serve_config, start_collector, wait_until


def _policy(name: str, word: str) -> str:
    """A policy scoring `contains` (passed when the answer holds `word`)."""
    return (
        f"apiVersion: evals.si/v1alpha1\nkind: OnlineEvalPolicy\nmetadata: {{name: {name}}}\nspec:\n  cascade:\n"
        f"    - ref: builtin/contains\n      params: {{any: [{word}]}}\n"
    )


def _send(c: Collector, n: int = 1) -> list[str]:
    provider = TracerProvider(resource=Resource.create({"service.name": "reload"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=c.http + "/v1/traces")))
    out = []
    for _ in range(n):
        with provider.get_tracer("t").start_as_current_span("chat gpt-4o-mini") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            reply = [{"role": "assistant", "parts": [{"type": "text", "content": "Paris, in France."}]}]
            chat.set_attribute("gen_ai.output.messages", json.dumps(reply))
            out.append(format(chat.get_span_context().trace_id, "032x"))
    assert provider.force_flush(10_000)
    provider.shutdown()
    return out


def _score_names(c: Collector, trace_id: str) -> set[tuple[str, bool]]:
    """(policy, passed) of the trace's `contains` scores."""
    scores = httpx.get(c.api + "/api/v1/scores", params={"trace_id": trace_id}).json()["scores"]
    return {(s["policy"], s["passed"]) for s in scores if s["name"] == "contains"}


OUTCOMES = ("policies reloaded", "policy reload failed; the policies in use stay")


def _hangup(c: Collector, count: int) -> list[dict[str, Any]]:
    """SIGHUP, then each processor's reload line once `count` processors (one per process) reported."""

    def outcomes() -> list[dict[str, Any]]:
        return [e for e in c.logs() if e.get("msg") in OUTCOMES]

    before = len(outcomes())
    c.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: len(outcomes()) >= before + count)
    return outcomes()[before:]


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_sighup_reloads_the_policies(tmp_path: Path, workers: int) -> None:
    (tmp_path / "capital.yaml").write_text(_policy("capital", "Paris"))
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = workers
    cfg["processors"]["tail_sampling"] = {"decision_wait": "200ms"}
    cfg["processors"]["evaluate"] = {"policies": ["capital.yaml"]}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    c = start_collector(tmp_path, cfg)
    processes = 1 + (workers if workers > 1 else 0)  # the collector's evaluate, and each worker's
    try:
        [first] = _send(c)
        assert wait_until(lambda: _score_names(c, first) == {("capital", True)})

        # the file edited: the next trace is scored by the new cascade
        (tmp_path / "capital.yaml").write_text(_policy("capital", "London"))
        lines = _hangup(c, processes)
        assert all(e["msg"] == "policies reloaded" for e in lines), lines
        [second] = _send(c)
        assert wait_until(lambda: _score_names(c, second) == {("capital", False)}), _score_names(c, second)

        # a broken file: the policies in use stay, and the log says which file and why
        (tmp_path / "capital.yaml").write_text("apiVersion: evals.si/v1alpha1\nkind: OnlineEvalPolicy\nspec: [")
        lines = _hangup(c, processes)
        assert all(e["msg"] == "policy reload failed; the policies in use stay" for e in lines), lines
        assert all("capital.yaml" in e["error"] for e in lines)
        [third] = _send(c)
        assert wait_until(lambda: _score_names(c, third) == {("capital", False)})

        # a policy added to the config's list (the file fixed too)
        (tmp_path / "capital.yaml").write_text(_policy("capital", "London"))
        (tmp_path / "city.yaml").write_text(_policy("city", "Paris"))
        cfg["processors"]["evaluate"]["policies"] = ["capital.yaml", "city.yaml"]
        c.config_path.write_text(yaml.safe_dump(cfg))
        lines = _hangup(c, processes)
        assert all(e["msg"] == "policies reloaded" for e in lines), lines
        # the unchanged policy's window goes on, in the process that aggregates windows (the collector's)
        assert [e["policies"].endswith("windows kept ['capital']") for e in lines].count(True) == 1, lines
        [fourth] = _send(c)
        want = {("capital", False), ("city", True)}
        assert wait_until(lambda: _score_names(c, fourth) == want), _score_names(c, fourth)
        ok = 'evalsi_policy_reloads_total{processor="evaluate",result="ok"}'
        assert wait_until(lambda: any(line.startswith(ok) for line in httpx.get(c.metrics).text.splitlines()))
    finally:
        assert c.stop() == 0
