"""Three `evalsi serve` replicas sharing one ClickHouse behind a router that hashes trace ids, against the same traffic
through one replica: the policy's window (read from the store, `windows.scope: store`) has the one replica's figures,
an alert the aggregate crosses, and no replica's share would, reaches a real Alertmanager once and stays active when a
replica is killed mid-window, and promoted rows land once in the store's datasets (`promote_to: store`).

The ClickHouse is `tests/clickhouse_http.py` (the real engine, chDB, behind ClickHouse's HTTP interface, in its own
process), and a real server where `EVALSI_TEST_CLICKHOUSE_URL` is set. Alertmanager is the real binary
(`apt-get install prometheus-alertmanager`); the test skips without it."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from clickhouse_http import start_stand_in
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from running_collector import EVALSI, Collector, serve_config, wait_until
from test_evaluation_e2e import _agent_trace

SERVER_URL = os.environ.get("EVALSI_TEST_CLICKHOUSE_URL", "")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
WINDOW = 10  # seconds: the traffic is sent early in one window, which closes during the test
REPLICAS = 3
TRACES, WRONG = 36, 12  # `count >= 30`: crossed by the 36 together, by no replica's share (about 12)

POLICY = f"""
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: support-answers, labels: {{team: support}}}}
spec:
  selector: span.attributes['app.route'] == 'support'
  cascade:
    - ref: builtin/contains
      params: {{any: [Paris]}}
    - ref: builtin/latency
      params: {{max_ms: 60000}}
  window: {WINDOW}s
  alerts:
    - name: wrong-answers
      when: count >= 30 && rate('contains') < 0.9
  promote:
    when: "!scores['contains'].passed"
    dataset: wrong-answers
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Recorder:
    """An HTTP server that records the JSON bodies POSTed to it (Alertmanager's webhook receiver)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.bodies.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class TraceRouter:
    """The routing tier in small: takes OTLP/HTTP protobuf exports and sends each trace's spans to one replica by a
    hash of its trace id (as the Collector's `load_balancing` exporter does), and the whole request to `mirror`."""

    def __init__(self, replicas: list[str], mirror: str) -> None:
        self.replicas, self.mirror = replicas, mirror
        self.traces: dict[str, int] = {}  # trace id -> the replica it went to
        self.client = httpx.Client(timeout=30)
        router = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = router.route(body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def route(self, body: bytes) -> int:
        request = ExportTraceServiceRequest.FromString(body)
        parts = [ExportTraceServiceRequest() for _ in self.replicas]
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    i = zlib.crc32(span.trace_id) % len(self.replicas)
                    self.traces[span.trace_id.hex()] = i
                    out_rs = parts[i].resource_spans.add()
                    out_rs.resource.CopyFrom(rs.resource)
                    out_ss = out_rs.scope_spans.add()
                    out_ss.scope.CopyFrom(ss.scope)
                    out_ss.spans.add().CopyFrom(span)
        headers = {"Content-Type": "application/x-protobuf"}
        sent = [(self.mirror + "/v1/traces", body)]
        sent += [(url + "/v1/traces", p.SerializeToString()) for url, p in zip(self.replicas, parts, strict=True)
                 if p.resource_spans]  # fmt: skip
        for url, payload in sent:
            if self.client.post(url, content=payload, headers=headers).status_code != 200:
                return 503
        return 200

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.client.close()


def _start_alertmanager(tmp: Path, hook: str) -> tuple[subprocess.Popen[bytes], str]:
    config = {
        "route": {
            "receiver": "hook", "group_by": ["alertname", "policy", "project"], "group_wait": "1s",
            "group_interval": "1s", "repeat_interval": "1h",
        },
        "receivers": [{"name": "hook", "webhook_configs": [{"url": hook, "send_resolved": False}]}],
    }  # fmt: skip
    (tmp / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    assert ALERTMANAGER is not None
    proc = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={tmp / 'alertmanager.yml'}", f"--storage.path={tmp / 'am-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=(tmp / "alertmanager.log").open("wb"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_until(ready, timeout=30):
        proc.kill()
        raise AssertionError("alertmanager did not start: " + (tmp / "alertmanager.log").read_text()[-2000:])
    return proc, url


def _start_all(configs: list[tuple[Path, dict[str, Any]]], timeout: float = 120) -> list[Collector]:
    """Start every `evalsi serve` at once (each in its folder, with the policy beside its config)."""
    started = []
    for folder, config in configs:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "policies.yaml").write_text(POLICY)
        path = folder / "evalsi.yaml"
        path.write_text(yaml.safe_dump(config))
        log = (folder / "serve.log").open("w")
        proc = subprocess.Popen([*EVALSI, "serve", "-c", str(path)], stdout=log, stderr=log, text=True, cwd=folder)
        started.append(Collector(proc, path, folder / "serve.log"))

    def all_ready() -> bool:
        for c in started:
            if c.proc.poll() is not None:
                for other in started:
                    other.proc.kill()
                raise AssertionError(f"evalsi serve exited {c.proc.returncode}:\n{c.log_path.read_text()[-3000:]}")
            if not c.ready:
                c.ready = next((e for e in c.logs() if e.get("msg") == "ready"), {})
        return all(c.ready for c in started)

    if not wait_until(all_ready, timeout=timeout):
        for c in started:
            c.proc.kill()
        raise AssertionError("evalsi serve not ready in time")
    return started


def _config(tmp: Path, evaluate: dict[str, Any], clickhouse: dict[str, Any]) -> dict[str, Any]:
    cfg = serve_config(tmp / "unused")
    cfg["exporters"]["clickhouse"] = {"flush_interval": "100ms", **clickhouse}
    cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
    cfg["processors"]["evaluate"] = {"policies": ["policies.yaml"], **evaluate}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    return cfg


def _closed_windows(c: Collector) -> dict[tuple[str, str], dict[str, Any]]:
    """The figures of the first window that closed with scores, by (evaluator, name)."""
    found: dict[float, dict[tuple[str, str], dict[str, Any]]] = {}
    for e in c.logs():
        if e.get("msg") == "policy window closed":
            w = e["window"]
            assert w["scope"] == ("process" if c.config_path.parent.name == "single" else "store"), w
            found.setdefault(w["start"], {})[(w["evaluator"], w["name"])] = w
    with_scores = [found[s] for s in sorted(found) if any(w["n"] for w in found[s].values())]
    return with_scores[0] if with_scores else {}


@pytest.fixture
def clickhouse(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    database = f"evalsi_replicas_{uuid.uuid4().hex[:8]}"
    if request.param == "stand-in":
        server = start_stand_in(tmp_path / "clickhouse")
        yield {"endpoint": server.url, "database": database}
        server.stop()
    elif SERVER_URL:
        yield {"endpoint": SERVER_URL, "database": database}
    else:
        pytest.skip("no ClickHouse server: set EVALSI_TEST_CLICKHOUSE_URL=http://user:password@host:8123 to run")


@pytest.mark.skipif(ALERTMANAGER is None, reason="no Alertmanager: apt-get install prometheus-alertmanager")
@pytest.mark.parametrize("clickhouse", ["stand-in", "clickhouse-server"], indirect=True)
def test_three_replicas_window_alert_and_datasets_equal_one_replica(tmp_path: Path, clickhouse: dict[str, Any]) -> None:
    hook = Recorder()
    am, am_url = _start_alertmanager(tmp_path, hook.url)
    store_scope = {
        "windows": {"scope": "store", "poll_interval": "500ms", "settle": "1s"},
        "alertmanager": {"url": am_url, "resend_interval": "1s"},
        "promote_to": "store",
    }
    configs = [(tmp_path / f"replica-{i}", _config(tmp_path, store_scope, clickhouse)) for i in range(REPLICAS)]
    single_dir = tmp_path / "single"
    single = _config(tmp_path, {"datasets_dir": str(single_dir / "datasets")}, {"endpoint": f"chdb://{single_dir}/s"})
    collectors: list[Collector] = []
    router: TraceRouter | None = None
    try:
        collectors = _start_all([*configs, (single_dir, single)])
        replicas, one = collectors[:REPLICAS], collectors[REPLICAS]
        router = TraceRouter([c.http for c in replicas], one.http)
        # early in a window, so that every trace is evaluated in it
        into = time.time() % WINDOW
        if into > 2:
            time.sleep(WINDOW - into + 0.2)
        provider = TracerProvider(resource=Resource.create({"service.name": "support"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=router.url)))
        answers = ["Lyon, I think." if i < WRONG else f"Paris, answer {i}." for i in range(TRACES)]
        traces = [_agent_trace(provider, "support", a) for a in answers]
        assert provider.force_flush(10_000)
        provider.shutdown()
        shares = [list(router.traces.values()).count(i) for i in range(REPLICAS)]
        assert sum(shares) == TRACES and max(shares) < 30, f"no replica's share crosses count >= 30: {shares}"

        def notified() -> bool:
            return any(b["status"] == "firing" for b in hook.bodies)

        assert wait_until(notified, timeout=WINDOW + 10), "Alertmanager notifies the alert the aggregate crosses"

        def all_scored() -> bool:
            listed = json.loads(replicas[1].cli("scores", "list", "--json", "--limit", "500").stdout)
            return {s["trace_id"] for s in listed if s["name"] == "contains"} >= set(traces)

        assert wait_until(all_scored, timeout=30), "every replica's scores are in the store"
        # a replica killed mid-window: the others still hold the whole window and keep the alert
        replicas[0].proc.kill()
        replicas[0].proc.wait(10)
        living = collectors[1:]

        def closed_everywhere() -> bool:
            return all(_closed_windows(c) for c in living)

        assert wait_until(closed_everywhere, timeout=WINDOW + 15), "the window closes in every process"
        time.sleep(3)  # replicas resent the alert every second since: Alertmanager must not notify again
        firing = [a for b in hook.bodies for a in b["alerts"] if a["status"] == "firing"]
        assert len(hook.bodies) == 1 and len(firing) == 1, hook.bodies
        active = httpx.get(am_url + "/api/v2/alerts", timeout=10).json()
        assert [(a["labels"]["alertname"], a["status"]["state"]) for a in active] == [("wrong-answers", "active")]
        assert firing[0]["labels"] == {
            "alertname": "wrong-answers", "policy": "support-answers", "project": "default", "team": "support"
        }  # fmt: skip
        assert json.loads(firing[0]["annotations"]["values"])["count"] >= 30
        fired_once = [e for e in one.logs() if e.get("msg") == "alert fired"]
        assert len(fired_once) == 1, "one replica's own window fires the same alert once"

        # the window's figures: the living replicas read the same from the store, and they are the one replica's
        figures = [_closed_windows(c) for c in living]
        assert set(figures[0]) == {("builtin/contains", "contains"), ("builtin/latency", "latency")}
        assert figures[0] == figures[1]
        for key, mine in figures[-1].items():
            theirs = figures[0][key]
            assert (theirs["n"], theirs["pass_n"], theirs["passed"], theirs["method"], theirs["start"]) == (
                mine["n"], mine["pass_n"], mine["passed"], mine["method"], mine["start"]
            )  # fmt: skip
            for field in ("mean", "low", "high", "pass_rate", "pass_low", "pass_high", "p50", "p95"):
                a, b = theirs[field], mine[field]
                assert (a is None and b is None) or math.isclose(a, b, rel_tol=1e-9), (key, field, a, b)
        assert figures[0][("builtin/contains", "contains")]["n"] == TRACES

        # promotion: the wrong answers once each in the store's dataset, read through any replica
        wrong = set(traces[:WRONG])
        listed = json.loads(replicas[1].cli("datasets", "list", "--json").stdout)
        assert [(d["dataset"], d["rows"]) for d in listed] == [("wrong-answers", WRONG)]
        exported = replicas[2].cli("datasets", "export", "wrong-answers").stdout.splitlines()
        rows = [json.loads(line) for line in exported]
        assert {r["trace_id"] for r in rows} == wrong and len(rows) == WRONG
        assert all(r["output"] == "Lyon, I think." and r["metadata"]["policy"] == "support-answers" for r in rows)
        files = (single_dir / "datasets" / "wrong-answers.jsonl").read_text().splitlines()
        assert {json.loads(line)["trace_id"] for line in files} == wrong, "the one replica promoted the same traces"
    finally:
        if router is not None:
            router.stop()
        for c in collectors:
            c.stop()
        am.terminate()
        am.wait(10)
        hook.stop()
