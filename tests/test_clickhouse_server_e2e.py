"""End to end on the ClickHouse server path: `evalsi serve` writes through clickhouse-connect to a server's HTTP
interface. Here that is `tests/clickhouse_http.py`, a stand-in answered by the real ClickHouse engine (chDB) in its own
process (see its docstring for what it does not model); with `EVALSI_TEST_CLICKHOUSE_URL` set, a real server too."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from clickhouse_http import start_stand_in
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from running_collector import serve_config, start_collector, wait_until
from test_evaluation_e2e import POLICY, _agent_trace

from evalsi.exporters.clickhouse.backend import open_backend

SERVER_URL = os.environ.get("EVALSI_TEST_CLICKHOUSE_URL", "")


@pytest.mark.parametrize("where", ["stand-in", "clickhouse-server"])
def test_spans_and_scores_reach_a_server_and_are_read_back(tmp_path: Path, where: str) -> None:
    database = f"evalsi_e2e_{uuid.uuid4().hex[:8]}"
    if where == "stand-in":
        server = start_stand_in(tmp_path / "clickhouse", password="pw")
        url, stop = server.url, server.stop
    elif SERVER_URL:
        url, stop = SERVER_URL, lambda: None
    else:
        pytest.skip("no ClickHouse server: set EVALSI_TEST_CLICKHOUSE_URL=http://user:password@host:8123 to run")
    try:
        (tmp_path / "policies").mkdir()
        (tmp_path / "policies" / "support.yaml").write_text(POLICY)
        cfg = serve_config(tmp_path / "unused")
        cfg["exporters"]["clickhouse"] = {
            "endpoint": url,
            "database": database,
            "password": "${env:E2E_CLICKHOUSE_PASSWORD}",
            "ttl": "720h",
            "flush_interval": "100ms",
        }
        if where == "clickhouse-server":
            del cfg["exporters"]["clickhouse"]["password"]  # the URL carries the credentials
        else:
            os.environ["E2E_CLICKHOUSE_PASSWORD"] = "pw"  # the collector inherits the environment
        cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
        cfg["processors"]["evaluate"] = {"policies": ["policies/*.yaml"]}
        pipelines = cfg["service"]["pipelines"]
        pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
        pipelines["scores"] = {"exporters": ["clickhouse"]}
        c = start_collector(tmp_path, cfg)
        try:
            provider = TracerProvider(resource=Resource.create({"service.name": "support"}))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=c.grpc, insecure=True)))
            traces = [_agent_trace(provider, "support", f"Paris, answer {i}.") for i in range(20)]
            assert provider.force_flush(10_000)
            provider.shutdown()

            def scored() -> bool:
                listed = json.loads(c.cli("scores", "list", "--json", "--limit", "500").stdout)
                return {s["trace_id"] for s in listed} >= set(traces)

            assert wait_until(scored, timeout=60), "every trace gets its scores"
            listed = {t["trace_id"]: t for t in json.loads(c.cli("traces", "list", "--json", "--limit", "50").stdout)}
            assert set(traces) <= set(listed)
            assert all(listed[t]["span_count"] == 2 and listed[t]["llm_calls"] == 1 for t in traces)
            shown = json.loads(c.cli("traces", "show", traces[0], "--json").stdout)
            assert [s["name"] for s in shown["spans"]] == ["handle request", "chat gpt-4o-mini"]
            ready = [e for e in c.logs() if e.get("msg") == "store open"]
            assert ready and ready[0]["store"].startswith("ClickHouse server at http://127.0.0.1:"), ready
        finally:
            assert c.stop() == 0
        # after shutdown: every span and score is in the server, once
        backend = open_backend(url, database=database, password="pw" if where == "stand-in" else "", create=False)
        try:
            spans = backend.query("SELECT count() AS n FROM otel_traces")[0]["n"]
            scores = backend.query("SELECT count() AS n FROM evalsi_scores FINAL")[0]["n"]
            ttl = backend.query("SELECT engine_full FROM system.tables WHERE name = 'evalsi_scores' "
                                "AND database = currentDatabase()")[0]["engine_full"]  # fmt: skip
        finally:
            if where == "clickhouse-server":
                backend.command(f"DROP DATABASE IF EXISTS `{database}`")
            backend.close()
        assert spans == 40
        assert scores == 20 * 3
        assert "toIntervalSecond(2592000)" in ttl
    finally:
        os.environ.pop("E2E_CLICKHOUSE_PASSWORD", None)
        stop()
