"""A model call the Anthropic SDK and an instrumentation both record, in two traces (no span of the app around the
call), through a real `evalsi serve`, in one process and with two pipeline workers (each trace of the pair goes to
a different worker): the two traces are evaluated as one, the call and its tokens counted once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from running_collector import FIXTURES, Collector, serve_config, start_collector, wait_until

from evalsi.model.span import trace_shard

POLICY = """apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: usage}
spec:
  cascade:
    - ref: builtin/tokens
      params: {measure: output}
"""

# each pair's two traces, sharded by trace id, land in different workers of two
PAIRS = [("anthropic-sdk/openllmetry", "chat_stream"), ("anthropic-sdk/openinference", "chat_stream")]


def _trace_ids(pb: Path) -> dict[str, str]:
    """trace id -> instrumentation scope of its spans."""
    doc = json.loads(pb.with_suffix(".json").read_text())
    return {
        s["traceId"]: ss["scope"]["name"] for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    }


def _metric(c: Collector, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(c.metrics).text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def _start(tmp: Path, wait: str, workers: int) -> Collector:
    (tmp / "policy.yaml").write_text(POLICY)
    cfg = serve_config(tmp / "store")
    cfg["processors"] = {
        "normalize": {},
        "tail_sampling": {"decision_wait": "300ms"},
        "evaluate": {"policies": [str(tmp / "policy.yaml")], "duplicate_calls": {"wait": wait}},
    }
    cfg["service"]["pipelines"]["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    cfg["service"]["pipelines"]["scores"] = {"exporters": ["clickhouse"]}
    cfg["service"]["workers"] = workers
    return start_collector(tmp, cfg)


def _post(c: Collector, pb: Path) -> None:
    _post_bytes(c, pb.read_bytes())


def _post_bytes(c: Collector, body: bytes) -> None:
    r = httpx.post(c.http + "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 200, r.text


def _service(pb: Path) -> str:
    request = ExportTraceServiceRequest.FromString(pb.read_bytes())
    (name,) = {a.value.string_value for rs in request.resource_spans for a in rs.resource.attributes
               if a.key == "service.name"}  # fmt: skip
    return name


def _lone_sdk_call(service: str) -> bytes:
    """The Anthropic SDK's capture of a plain chat (one span, a trace of its own) as sent by `service`, new ids."""
    request = ExportTraceServiceRequest.FromString((FIXTURES / "anthropic-sdk/sdk/chat_simple.pb").read_bytes())
    for rs in request.resource_spans:
        for a in rs.resource.attributes:
            if a.key == "service.name":
                a.value.string_value = service
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.trace_id, span.span_id = os.urandom(16), os.urandom(8)
    return request.SerializeToString()


def _scores(c: Collector) -> list[dict[str, Any]]:
    return httpx.get(c.api + "/api/v1/scores", params={"limit": 1000}).json()["scores"]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_call_recorded_in_two_traces_is_evaluated_once_with_the_apis_usage(tmp_path: Path, workers: int) -> None:
    c = _start(tmp_path, wait="10s", workers=workers)
    try:
        # a lone SDK call of each app first: its service sends them, so its root-level instrumentation calls wait
        # for a twin in every worker from then on (before that, one of a pair may be evaluated alone, at once)
        services = [_service(FIXTURES / stack / f"{scenario}.pb") for stack, scenario in PAIRS]
        for service in services:
            _post_bytes(c, _lone_sdk_call(service))
        processes = 1 if workers == 1 else 1 + workers
        armed = len(services) * processes
        assert wait_until(lambda: _metric(c, "evalsi_evaluate_duplicate_call_services") == armed, 10)
        expected: dict[str, float] = {}  # the instrumentation's trace id -> the output tokens the fake API returned
        for stack, scenario in PAIRS:
            pb = FIXTURES / stack / f"{scenario}.pb"
            ids = _trace_ids(pb)
            assert len(ids) == 2 and len({trace_shard(t, 2) for t in ids}) == 2  # two workers, one each
            (instrumented,) = [t for t, scope in ids.items() if scope != "com.anthropic.sdk.python"]
            meta = json.loads((FIXTURES / stack / "meta.json").read_text())
            expected[instrumented] = meta["scenarios"][scenario]["expected"]["output_tokens"]
            _post(c, pb)

        # a pair is evaluated as soon as both traces are in: well before the 10 s `wait`
        def tokens() -> dict[str, float]:
            return {s["trace_id"]: s["value"] for s in _scores(c) if s["name"] == "tokens" and s["trace_id"] in ids}

        ids = set(expected) | {t for stack, scenario in PAIRS for t in _trace_ids(FIXTURES / stack / f"{scenario}.pb")}
        assert wait_until(lambda: len(tokens()) >= 2, 8), _scores(c)
        # one score per call, on the instrumentation's trace, with the API's output tokens (OpenLLMetry's stream
        # span says 11, the SDK's 10: the SDK's copy of the API's usage counts)
        assert tokens() == expected
        assert _metric(c, "evalsi_evaluate_duplicate_call_traces_total") == 4

        # both traces of each pair are stored as they came (a worker's store flush may trail the other's score)
        def stored() -> set[str]:
            return {t["trace_id"] for t in httpx.get(c.api + "/api/v1/traces?limit=100").json()["traces"]}

        assert wait_until(lambda: ids <= stored(), 10), ids - stored()
    finally:
        c.stop()


def test_a_lone_sdk_call_is_evaluated_after_the_wait(tmp_path: Path) -> None:
    """The SDK alone (no instrumentation): its trace waits `duplicate_calls.wait` for a twin, then is evaluated."""
    c = _start(tmp_path, wait="1s", workers=1)
    try:
        pb = FIXTURES / "anthropic-sdk/sdk/chat_simple.pb"
        _post(c, pb)
        assert wait_until(lambda: _metric(c, "evalsi_evaluate_duplicate_call_waiting") == 1, 10)
        assert [s for s in _scores(c) if s["name"] == "tokens"] == []  # waiting for a twin
        assert wait_until(lambda: [s["value"] for s in _scores(c) if s["name"] == "tokens"] == [6.0], 10)
        assert _metric(c, "evalsi_evaluate_duplicate_call_traces_total") == 0
    finally:
        c.stop()
