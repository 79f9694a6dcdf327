"""Pipelines in worker processes (`service.workers`): the answers, the metrics and a dying worker, through a real
`evalsi serve`. The end-to-end tests of test_serve, test_event_join and test_trace_assembly_e2e run with 2 workers too.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from otlp_requests import chain_request
from prometheus_client.parser import text_string_to_metric_families
from running_collector import EVALSI, Collector, serve_config, start_collector

from evalsi.collector.config import ConfigError, cores as config_cores, parse_config

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _request(trace_ids: list[bytes], per_trace: int = 2) -> ExportTraceServiceRequest:
    return chain_request(trace_ids, per_trace, service="workers-test")


def _trace_id(n: int) -> bytes:
    return (0xABC).to_bytes(8, "big") + n.to_bytes(8, "big")  # the low half picks the worker: n % workers


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[Collector]:
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = 2
    c = start_collector(tmp_path, cfg)
    yield c
    if c.proc.poll() is None:
        c.stop()


def _metrics(c: Collector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(c.metrics).text
    names = [f.name for f in text_string_to_metric_families(text)]
    assert len(names) == len(set(names)), "a metric family appears twice in the exposition"
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_ready_line_names_the_workers_and_spans_of_both_shards_are_stored(two_workers: Collector) -> None:
    c = two_workers
    assert len(c.ready["workers"]) == 2 and c.proc.pid not in c.ready["workers"]
    body = _request([_trace_id(n) for n in range(10)]).SerializeToString()
    r = httpx.post(c.http + "/v1/traces", content=body, headers=PROTOBUF)
    assert r.status_code == 200 and r.content == b""
    assert c.wait_stored(20) == 20
    listed = json.loads(c.cli("traces", "list", "--limit", "100", "--json").stdout)
    assert sorted(t["trace_id"] for t in listed) == sorted(_trace_id(n).hex() for n in range(10))
    assert all(t["span_count"] == 2 for t in listed)


@pytest.mark.parametrize("workers", [2, 1])
def test_a_large_request_arriving_in_many_chunks_is_stored_whole(tmp_path: Path, workers: int) -> None:
    """A protobuf body past 128 KiB is put together from its chunks in Arrow's memory pool and handed on as a view:
    the spans must arrive as they were sent, the write-ahead log's copy and the workers' too, whatever bytes the
    values hold (UTF-8 of every width: a view of signed bytes would compare wrongly with `bytes`)."""
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = workers
    cfg["service"]["durability"] = {"mode": "wal", "directory": str(tmp_path / "wal")}
    c = start_collector(tmp_path, cfg)
    try:
        req = _request([_trace_id(n) for n in range(150)])  # 300 spans
        for i, span in enumerate(req.resource_spans[0].scope_spans[0].spans):
            text = f"{i:04d} " + "é€𝄞x" * 300
            span.attributes.append(KeyValue(key="note", value={"string_value": text}))
        body = req.SerializeToString()
        assert len(body) > 4 * 128 * 1024
        r = httpx.post(c.http + "/v1/traces", content=body, headers=PROTOBUF)
        assert r.status_code == 200 and r.content == b""
        assert c.wait_stored(300) == 300
        shown = json.loads(c.cli("traces", "show", _trace_id(149).hex(), "--json").stdout)
        notes = sorted(s["attributes"]["note"] for s in shown["spans"])
        assert notes == [f"{i:04d} " + "é€𝄞x" * 300 for i in (298, 299)]
    finally:
        c.stop()


def _loaded_pandas(pid: int) -> bool:
    """Whether a process has pandas' compiled modules mapped: what importing pandas leaves in it (~45 MB)."""
    return "/pandas/" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/<pid>/maps")
def test_no_process_loads_pandas_though_pyarrow_would(two_workers: Collector) -> None:
    """pyarrow imports pandas on its first array built from Python objects when pandas is installed (chDB requires
    it); nothing in evalsi uses it, so no process of `evalsi serve` may carry it."""
    c = two_workers
    body = _request([_trace_id(n) for n in range(4)]).SerializeToString()
    assert httpx.post(c.http + "/v1/traces", content=body, headers=PROTOBUF).status_code == 200
    assert c.wait_stored(8) == 8  # every process converted rows to Arrow
    loaded = {pid: _loaded_pandas(pid) for pid in (c.proc.pid, *c.ready["workers"])}
    assert loaded == dict.fromkeys(loaded, False)


def test_what_a_worker_imports_leaves_out_pandas_chdb_fastapi_and_grpc() -> None:
    """A worker process imports its module, the service and every built-in component; none of them may pull in what
    only the collector process uses (chDB, FastAPI for the API, grpc for the OTLP/gRPC listener and the `otlp`
    exporter's gRPC sender) or nothing uses (pandas): ~9-250 MB a worker."""
    script = """
import sys
import evalsi.collector.service, evalsi.collector.workers.worker
from evalsi.collector.builtin import load_builtin_components
load_builtin_components()
print(sorted(m for m in ("chdb", "fastapi", "grpc", "pandas") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


WORKER_SIDE = """
import asyncio, pickle, queue, sys, threading
from evalsi.collector.service import Service
from evalsi.collector.workers.link import StoreLink
from evalsi.collector.workers.worker import _row_encoder

config = pickle.loads(open(sys.argv[1], "rb").read())  # as the pool hands it to a worker it spawns
link = StoreLink(_row_encoder(config), queue.SimpleQueue(), threading.Semaphore(4))

async def main():
    service = Service(config, worker_store=link)
    await service.start()
    await service.shutdown()

asyncio.run(main())
print(sorted(m for m in ("uvicorn", "httpx", "jsonschema", "fastapi", "starlette", "chdb", "grpc") if m in sys.modules))
"""


def test_a_worker_running_the_full_pipeline_loads_no_server_http_client_or_schema_library(tmp_path: Path) -> None:
    """What a worker runs of the README's full pipeline (normalize, redact, tail sampling, evaluate with a policy,
    the store and a Prometheus scores exporter): started and stopped, it must not have loaded uvicorn or starlette (it
    serves nothing), httpx (no judge or webhook runs there until one is configured and called) or jsonschema (until a
    policy's evaluator compiles a schema): ~10 MB of each worker's memory."""
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "p.yaml").write_text(
        "apiVersion: evals.si/v1alpha1\nkind: OnlineEvalPolicy\nmetadata: {name: p}\n"
        "spec:\n  selector: \"true\"\n  cascade:\n    - ref: builtin/latency\n      params: {max_ms: 60000}\n"
    )
    cfg = serve_config(tmp_path / "store")
    cfg["processors"] = {
        "normalize": {}, "redact": {}, "tail_sampling": {"decision_wait": "1s"},
        "evaluate": {"policies": [str(tmp_path / "policies" / "*.yaml")]},
    }  # fmt: skip
    cfg["exporters"]["prometheus"] = {"endpoint": "127.0.0.1:0"}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "redact", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse", "prometheus"]}
    cfg["service"]["workers"] = 2
    path = tmp_path / "config.pickle"
    path.write_bytes(pickle.dumps(parse_config(cfg)))
    run = subprocess.run([sys.executable, "-c", WORKER_SIDE, str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[]"


def test_invalid_spans_get_partial_success_and_the_rest_is_stored(two_workers: Collector) -> None:
    c = two_workers
    req = _request([_trace_id(1), _trace_id(2)])
    req.resource_spans[0].scope_spans[0].spans[1].trace_id = b"\x01" * 15  # not 16 bytes
    r = httpx.post(c.http + "/v1/traces", content=req.SerializeToString(), headers=PROTOBUF)
    assert r.status_code == 200
    answer = ExportTraceServiceResponse.FromString(r.content)
    assert answer.partial_success.rejected_spans == 1
    assert "trace id must be 16 bytes, got 15" in answer.partial_success.error_message
    assert c.wait_stored(3) == 3
    time.sleep(0.5)
    assert c.stored_spans() == 3, "the rejected span must not be stored by any worker"
    # OTLP/JSON is checked in the collector process and decoded in the workers too
    doc = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {"traceId": _trace_id(7).hex(), "spanId": "00000000000000aa", "name": "json span"},
                            {"traceId": "zz", "spanId": "00000000000000bb", "name": "bad id"},
                        ]
                    }
                ]
            }
        ]
    }
    r = httpx.post(c.http + "/v1/traces", json=doc)
    assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert c.wait_stored(4) == 4
    r = httpx.post(c.http + "/v1/traces", content=b"\x0a\xff\xff", headers=PROTOBUF)
    assert r.status_code == 400


def test_metrics_sum_the_workers_into_one_exposition(tmp_path: Path) -> None:
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = 2
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["service"]["pipelines"]["traces"]["processors"] = ["normalize", "tail_sampling"]
    c = start_collector(tmp_path, cfg)
    try:
        for i in range(3):
            body = _request([_trace_id(10 * i + n) for n in range(4)]).SerializeToString()
            assert httpx.post(c.http + "/v1/traces", content=body, headers=PROTOBUF).status_code == 200
        assert c.wait_stored(24) == 24
        labels = (("processor", "tail_sampling"), ("reason", "quiet"))
        completed = ("evalsi_tail_sampling_traces_completed_total", labels)
        deadline = time.monotonic() + 10
        while True:  # workers report every second
            m = _metrics(c)
            if m.get(completed) == 12 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # each worker assembled its own traces; the one series is their sum
        assert m.get(completed) == 12
        by_worker = {labels: v for (name, labels), v in m.items() if name == "evalsi_worker_spans_total"}
        assert by_worker == {(("worker", "0"),): 12.0, (("worker", "1"),): 12.0}
        assert m[("otelcol_receiver_accepted_spans_total", (("receiver", "otlp"), ("transport", "http")))] == 24
        assert m[("otelcol_exporter_sent_spans_total", (("exporter", "clickhouse"),))] == 24
    finally:
        assert c.stop() == 0


def test_the_collector_shard_takes_a_third_of_the_traces_in_the_collector_process(tmp_path: Path) -> None:
    """`service.collector_shard`: with two workers, the collector process runs the first shard itself (one slot of
    four: `low64(trace_id) % 4 == 0`) and one worker process the rest; everything is stored, the ready line names
    the one worker process, and a stop drains both."""
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = 2
    cfg["service"]["collector_shard"] = True
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["service"]["pipelines"]["traces"]["processors"] = ["normalize", "tail_sampling"]
    c = start_collector(tmp_path, cfg)
    try:
        [worker] = c.ready["workers"]
        assert worker != c.proc.pid
        body = _request([_trace_id(n) for n in range(32)]).SerializeToString()
        assert httpx.post(c.http + "/v1/traces", content=body, headers=PROTOBUF).status_code == 200
        assert c.wait_stored(64) == 64
        expected = {(("worker", "0"),): 16.0, (("worker", "1"),): 48.0}  # traces 0, 4, ..., 28: 8 of 32
        deadline = time.monotonic() + 10
        while True:  # each shard reports its counts every second (its series shows 0 from its start)
            m = _metrics(c)
            by_worker = {labels: v for (name, labels), v in m.items() if name == "evalsi_worker_spans_total"}
            if by_worker == expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert by_worker == expected
        body = _request([_trace_id(n) for n in range(100, 128)]).SerializeToString()
        assert httpx.post(c.http + "/v1/traces", content=body, headers=PROTOBUF).status_code == 200
    finally:
        assert c.stop() == 0  # both shards drain what tail sampling holds into the store, then the store drains
    stopped = [e for e in c.logs() if "pipeline worker did not drain" in e.get("msg", "")]
    assert not stopped
    again = start_collector(tmp_path, cfg)
    try:
        assert again.wait_stored(120) == 120  # 64 + 56
    finally:
        again.stop()


def test_collector_shard_with_one_process_is_refused_by_key_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from evalsi.collector import config as config_module

    base = serve_config(Path("/tmp/unused"))
    base["service"]["collector_shard"] = True
    with pytest.raises(ConfigError) as e:
        parse_config(base)  # the tests' config asks for one process
    assert any(err.startswith("service.collector_shard: ") and "workers is 1" in err for err in e.value.errors)
    base["service"]["workers"] = 2
    assert parse_config(base).service.collector_shard
    del base["service"]["workers"]  # auto: on one core there is nothing to share, and the note says so
    monkeypatch.setattr(config_module, "cores", lambda: 1)
    chosen = parse_config(base)
    assert chosen.service.workers == 1
    assert chosen.workers_note == "workers: auto -> one process (one core); collector_shard has nothing to take"
    monkeypatch.setattr(config_module, "cores", lambda: 2)
    assert parse_config(base).workers_note.endswith("pipeline shards (2 cores), the first in the collector process")


def test_a_worker_that_dies_is_restarted_and_the_collector_goes_on(two_workers: Collector) -> None:
    c = two_workers
    victim = c.ready["workers"][1]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        restarted = [e for e in c.logs() if e.get("msg") == "pipeline worker ready" and e.get("worker") == 1]
        if len(restarted) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert any(e.get("msg", "").startswith("pipeline worker died") for e in c.logs())
    assert len(restarted) == 2 and restarted[-1]["pid"] != victim
    body = _request([_trace_id(n) for n in range(100, 110)]).SerializeToString()
    assert httpx.post(c.http + "/v1/traces", content=body, headers=PROTOBUF).status_code == 200
    assert c.wait_stored(20) == 20, "both shards are stored after the restart"
    m = _metrics(c)
    assert m[("evalsi_worker_restarts_total", (("worker", "1"),))] == 1
    assert c.stop() == 0


def test_evaluate_runs_in_workers_and_bad_worker_counts_are_refused_by_key_path() -> None:
    base = serve_config(Path("/tmp/unused"))
    base["service"]["workers"] = 2
    base["processors"]["tail_sampling"] = {}
    base["processors"]["evaluate"] = {"policies": [str(Path(__file__).parents[2] / "deploy/policies/*.yaml")]}
    base["service"]["pipelines"]["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    base["service"]["pipelines"]["scores"] = {"exporters": ["clickhouse"]}
    assert parse_config(base).service.workers == 2
    for bad in (65, -1, "many"):
        base["service"]["workers"] = bad
        with pytest.raises(ConfigError) as e:
            parse_config(base)
        assert any(err.startswith("service.workers:") for err in e.value.errors), e.value.errors
    base["service"]["workers"] = 0  # no workers: one process
    assert parse_config(base).service.workers == 1


def test_workers_auto_is_the_default_and_says_what_it_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    from evalsi.collector import config as config_module

    base = serve_config(Path("/tmp/unused"))
    del base["service"]["workers"]
    monkeypatch.setattr(config_module, "cores", lambda: 4)
    chosen = parse_config(base)
    assert (chosen.service.workers, chosen.workers_note) == (4, "workers: auto -> 4 pipeline workers (4 cores)")
    monkeypatch.setattr(config_module, "cores", lambda: 1)
    chosen = parse_config(base)
    assert (chosen.service.workers, chosen.workers_note) == (1, "workers: auto -> one process (one core)")
    # a config that cannot run in workers runs in one process, saying why
    monkeypatch.setattr(config_module, "cores", lambda: 2)
    base["exporters"]["clickhouse/second"] = {"endpoint": "chdb:///tmp/unused-2"}
    base["service"]["pipelines"]["logs"]["exporters"] = ["clickhouse/second"]
    chosen = parse_config(base)
    assert chosen.service.workers == 1 and "one store, not 2" in chosen.workers_note


@pytest.mark.skipif(config_cores() < 2, reason="workers: auto runs one process on one core (runs with 2+)")
def test_serve_runs_the_pipelines_in_workers_by_default(tmp_path: Path) -> None:
    cfg = serve_config(tmp_path / "store")
    del cfg["service"]["workers"]  # the default: auto
    c = start_collector(tmp_path, cfg)
    try:
        assert c.ready is not None
        n = config_cores()
        assert c.ready["workers_chosen"] == f"workers: auto -> {n} pipeline workers ({n} cores)"
        assert len(c.ready["workers"]) == config_cores()
    finally:
        assert c.stop() == 0


def test_validate_says_what_workers_auto_chose(tmp_path: Path) -> None:
    cfg = serve_config(tmp_path / "store")
    del cfg["service"]["workers"]
    (tmp_path / "evalsi.yaml").write_text(yaml.safe_dump(cfg))
    res = subprocess.run([*EVALSI, "validate", "-c", "evalsi.yaml"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    n = config_cores()
    chosen = f"workers: auto -> {n} pipeline workers ({n} cores)" if n > 1 else "workers: auto -> one process"
    assert chosen in res.stdout


def test_what_a_worker_drops_at_its_end_counts_in_the_collectors_unstored(tmp_path: Path) -> None:
    """A worker's last message says what its processors took and could not hand on; `evalsi serve` sums it with
    the exporters' and exits saying so."""
    from evalsi.collector.workers.pool import WorkerPool, _Worker
    from evalsi.runtime.telemetry import SelfMetrics

    base = serve_config(tmp_path / "store")
    base["service"]["workers"] = 2
    pool = WorkerPool(parse_config(base), None, SelfMetrics(), pipeline=lambda *a, **k: None)  # type: ignore[arg-type]
    first, second = _Worker(0), _Worker(1)
    pool._on_message(first, ("drained", {"spans": 3}))
    pool._on_message(second, ("drained", {"spans": 1, "logs": 2}))
    pool._on_message(second, ("drained", {}))
    assert first.drained.is_set() and second.drained.is_set()
    assert pool.unstored == {"spans": 4, "logs": 2}
