"""The `langfuse` pull receiver against a local stand-in for Langfuse (no Langfuse server runs here: it needs
Postgres, ClickHouse, Redis and S3). `tests/fake_langfuse.py` serves `GET /api/public/v2/observations` as the
public API documents it (query parameters, field groups, cursor pages newest first) and takes scores as
`POST /api/public/scores` does, checking every request. Observations are written as the API returns them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fake_langfuse import PK, SK, FakeLangfuse
from pydantic import ValidationError
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.receivers.pull.langfuse import LangfuseReceiverConfig, messages, span_of, trace_id_of

POLICY = """apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {name: imported}
spec:
  selector: trace.service_name == 'langfuse'
  sampling: {rate: 1.0}
  cascade:
    - ref: builtin/latency
      params: {max_ms: 60000}
    - ref: builtin/tokens
      params: {max_total: 20000}
"""


def _at(seconds_ago: float) -> str:
    return (
        (datetime.now(UTC) - timedelta(seconds=seconds_ago)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def agent_trace(trace_id: str, ids: list[str], ago: float, *, running: bool = False) -> list[dict[str, Any]]:
    """An agent run as Langfuse's v2 observations API returns it: AGENT root, GENERATION asking for a tool, TOOL."""
    root, gen, tool = ids
    return [
        {"id": root, "traceId": trace_id, "type": "AGENT", "name": "support-agent", "startTime": _at(ago),
         "endTime": None if running else _at(ago - 0.5), "parentObservationId": None, "isRootObservation": True,
         "sessionId": "conv-1", "userId": "u-7", "input": json.dumps({"question": "weather in Paris?"}),
         "output": json.dumps("sunny in Paris"), "level": "DEFAULT"},
        {"id": gen, "traceId": trace_id, "type": "GENERATION", "name": "chat", "startTime": _at(ago - 0.1),
         "endTime": _at(ago - 0.2), "parentObservationId": root, "model": "gpt-4o-mini",
         "usageDetails": {"input": 10, "output": 5, "total": 15}, "totalCost": 0.0000045,
         "input": json.dumps([{"role": "user", "content": "weather in Paris?"}]),
         "output": json.dumps({"role": "assistant", "content": None, "tool_calls": [
             {"id": "call_1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]}),
         "level": "DEFAULT"},
        {"id": tool, "traceId": trace_id, "type": "TOOL", "name": "get_weather", "startTime": _at(ago - 0.3),
         "endTime": _at(ago - 0.4), "parentObservationId": root, "input": json.dumps({"location": "Paris"}),
         "output": json.dumps("sunny in Paris"), "level": "DEFAULT"},
    ]  # fmt: skip


def otel_ids() -> tuple[str, list[str]]:
    return uuid.uuid4().hex, [uuid.uuid4().hex[:16] for _ in range(3)]


def legacy_ids() -> tuple[str, list[str]]:
    """Langfuse SDK v2 and earlier: UUIDs, not OTel ids."""
    return str(uuid.uuid4()), [str(uuid.uuid4()) for _ in range(3)]


@pytest.fixture
def langfuse() -> Any:
    fake = FakeLangfuse().start()
    yield fake
    fake.stop()


def config(tmp: Path, fake: FakeLangfuse) -> dict[str, Any]:
    (tmp / "policy.yaml").write_text(POLICY)
    cfg = serve_config(tmp / "store")
    keys = {"public_key": PK, "secret_key": SK}
    cfg["receivers"] = {
        "langfuse": {"host": fake.host, **keys, "poll_interval": "300ms", "lookback": "1h", "settle": "0s"}
    }
    cfg["processors"] = {
        "normalize": {},
        "tail_sampling": {"decision_wait": "300ms"},
        "evaluate": {"policies": [str(tmp / "policy.yaml")]},
    }
    cfg["exporters"]["langfuse"] = {"host": fake.host, **keys}
    cfg["service"]["pipelines"] = {
        "traces": {
            "receivers": ["langfuse"],
            "processors": ["normalize", "tail_sampling", "evaluate"],
            "exporters": ["clickhouse"],
        },
        "scores": {"exporters": ["clickhouse", "langfuse"]},
    }
    return cfg


def stored(c: Collector) -> dict[str, int]:
    traces = httpx.get(c.api + "/api/v1/traces?limit=1000").json()["traces"]
    return {t["trace_id"]: t["span_count"] for t in traces}


def scores_on(fake: FakeLangfuse, trace_id: str) -> dict[tuple[str, str | None], Any]:
    return {(b["name"], b.get("observationId")): b["value"] for b in fake.stored.values() if b["traceId"] == trace_id}


def test_observations_become_spans_the_otel_genai_mapper_reads() -> None:
    trace_id, ids = otel_ids()
    root, gen, _ = (span_of(o) for o in agent_trace(trace_id, ids, 10))
    assert root.trace_id.hex() == trace_id and gen.parent_span_id.hex() == ids[0]  # OTel ids kept as they are
    attrs = {kv.key: kv.value for kv in gen.attributes}
    assert attrs["gen_ai.operation.name"].string_value == "chat"
    assert attrs["gen_ai.usage.input_tokens"].int_value == 10
    assert json.loads(attrs["gen_ai.output.messages"].string_value) == [
        {"role": "assistant", "parts": [
            {"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": {"location": "Paris"}}]}
    ]  # fmt: skip
    assert attrs["langfuse.observation.type"].string_value == "GENERATION"  # Langfuse's own fields kept
    legacy, _ = legacy_ids()
    assert trace_id_of(legacy).hex() == legacy.replace("-", "")
    assert len(trace_id_of("my-own-trace-id")) == 16
    assert messages("hello", "user") == [{"role": "user", "parts": [{"type": "text", "content": "hello"}]}]


def test_traces_are_imported_evaluated_and_scored_back_on_the_same_traces(tmp_path: Path, langfuse: Any) -> None:
    otel, otel_obs = otel_ids()
    legacy, legacy_obs = legacy_ids()
    running, running_obs = otel_ids()
    langfuse.observations += agent_trace(otel, otel_obs, 30) + agent_trace(legacy, legacy_obs, 20)
    langfuse.observations += agent_trace(running, running_obs, 10, running=True)
    c = start_collector(tmp_path, config(tmp_path, langfuse))
    try:
        legacy_hex = legacy.replace("-", "")
        assert wait_until(lambda: stored(c) == {otel: 3, legacy_hex: 3}, 60), stored(c)
        spans = httpx.get(c.api + f"/api/v1/traces/{otel}").json()["spans"]
        by_type = {s["step_type"]: s for s in spans}
        assert set(by_type) == {"agent", "llm", "tool"}
        assert (by_type["llm"]["input_tokens"], by_type["llm"]["output_tokens"]) == (10, 5)
        assert by_type["tool"]["tool_name"] == "get_weather"
        assert {s["session_id"] for s in spans} == {"conv-1"}  # the trace's session, on each of its spans
        # scores go back on the very traces: OTel ids as they are, a legacy trace under its own (UUID) id
        assert wait_until(lambda: ("tokens", otel_obs[0]) in scores_on(langfuse, otel), 60), langfuse.stored
        assert scores_on(langfuse, otel)[("tokens", otel_obs[0])] == 15
        assert wait_until(lambda: ("latency", legacy_obs[0]) in scores_on(langfuse, legacy), 60), langfuse.stored
        assert not langfuse.violations
        # the running trace is read once it ends
        assert running not in stored(c)
        for o in langfuse.observations:
            if o["traceId"] == running and o["endTime"] is None:
                o["endTime"] = _at(1)
        assert wait_until(lambda: stored(c).get(running) == 3, 30), stored(c)
    finally:
        c.stop()
    queries = langfuse.observation_queries
    assert all(q.get("limit") == "1000" for q in queries)
    assert any(q.get("isRootObservation") == "true" and "fromStartTime" in q for q in queries)


def test_a_kill_in_the_middle_neither_skips_nor_duplicates(tmp_path: Path, langfuse: Any) -> None:
    first = [otel_ids() for _ in range(3)]
    for i, (t, obs) in enumerate(first):
        langfuse.observations += agent_trace(t, obs, 60 - i)
    cfg = config(tmp_path, langfuse)
    c = start_collector(tmp_path, cfg)
    try:
        assert wait_until(lambda: len(stored(c)) == 3, 60)
        assert wait_until(lambda: all(("tokens", obs[0]) in scores_on(langfuse, t) for t, obs in first), 60)
    finally:
        c.stop(signal.SIGKILL)
    later = [otel_ids() for _ in range(2)]
    for i, (t, obs) in enumerate(later):
        langfuse.observations += agent_trace(t, obs, 5 - i)
    attempts_before = len(langfuse.attempts)
    c = start_collector(tmp_path, cfg)
    try:
        assert wait_until(lambda: len(stored(c)) == 5, 60), stored(c)
        assert stored(c) == {t: 3 for t, _ in first + later}
        assert wait_until(lambda: all(("tokens", obs[0]) in scores_on(langfuse, t) for t, obs in later), 60)
        time.sleep(1)  # any duplicate write would have been sent by now
    finally:
        c.stop()
    # the first three were not evaluated again: no score of theirs was sent a second time
    resent = [b for b in langfuse.attempts[attempts_before:] if b.get("traceId") in {t for t, _ in first}]
    assert resent == []


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValidationError, match="host"):
        LangfuseReceiverConfig(host="langfuse:3000", public_key="pk", secret_key="sk")
    with pytest.raises(ValidationError, match="public_key"):
        LangfuseReceiverConfig(host="http://langfuse:3000", public_key=" ", secret_key="sk")


def test_evalsi_import_langfuse_counts_on_a_dry_run_and_lands_the_same_counts_once(
    tmp_path: Path, langfuse: Any
) -> None:
    """`evalsi import langfuse`: a one-off backfill through the config's pipeline (an in-process collector here),
    read with the receiver's source from the local stand-in (no live Langfuse here)."""
    otel, otel_obs = otel_ids()
    legacy, legacy_obs = legacy_ids()
    running, running_obs = otel_ids()
    langfuse.observations += agent_trace(otel, otel_obs, 30) + agent_trace(legacy, legacy_obs, 20)
    langfuse.observations += agent_trace(running, running_obs, 10, running=True)
    cfg = config(tmp_path, langfuse)
    cfg["receivers"] = serve_config(tmp_path / "store")["receivers"]  # the import hands its spans to the otlp one
    cfg["service"]["pipelines"]["traces"]["receivers"] = ["otlp"]
    config_path = tmp_path / "import.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    evalsi = [str(Path(sys.executable).parent / "evalsi")]
    env = {**os.environ, "LANGFUSE_PUBLIC_KEY": PK, "LANGFUSE_SECRET_KEY": SK}

    def run_import(*extra: str) -> dict[str, Any]:
        args = ["import", "langfuse", "--host", langfuse.host, "--since", "1h", "--settle", "0s", "--json"]
        res = subprocess.run(
            [*evalsi, *args, "-c", str(config_path), *extra],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def stored_traces() -> dict[str, int]:
        res = subprocess.run(
            [*evalsi, "traces", "list", "--json", "-c", str(config_path)], capture_output=True, text=True, timeout=120
        )
        assert res.returncode == 0, res.stderr
        return {t["trace_id"]: t["span_count"] for t in json.loads(res.stdout)}

    want = {otel: 3, legacy.replace("-", ""): 3}
    dry = run_import("--dry-run")
    assert (dry["traces"], dry["spans"], dry["sent"], dry["running"], dry["dry_run"]) == (2, 6, 0, 1, True)
    assert not (tmp_path / "store").exists() or stored_traces() == {}
    assert langfuse.stored == {}

    done = run_import()
    assert (done["traces"], done["spans"], done["sent"], done["stored_already"]) == (2, 6, 6, 0)
    assert stored_traces() == want
    assert scores_on(langfuse, otel)[("tokens", otel_obs[0])] == 15  # scored, and written back by the exporter

    again = run_import()
    assert (again["traces"], again["sent"], again["stored_already"]) == (2, 0, 6)
    assert stored_traces() == want
    assert not langfuse.violations
