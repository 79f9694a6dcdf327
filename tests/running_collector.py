"""A real `evalsi serve` process for tests: started on port 0 with JSON logs, driven through its API and CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from evalsi_cli import evalsi_cli
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

# real captures, copied from the project's shared/fixtures so a bare checkout can run the suite
FIXTURES = Path(__file__).resolve().parent / "fixtures"

EVALSI = [sys.executable, "-m", "evalsi"]


def serve_config(store: Path) -> dict[str, Any]:
    """A config for tests: every endpoint on port 0, JSON logs, a short flush interval."""
    return {
        "receivers": {
            "otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}
        },
        "processors": {"normalize": {}},
        "exporters": {"clickhouse": {"endpoint": f"chdb://{store}", "flush_interval": "100ms"}},
        "service": {
            "pipelines": {
                "traces": {"receivers": ["otlp"], "processors": ["normalize"], "exporters": ["clickhouse"]},
                "logs": {"receivers": ["otlp"], "processors": ["normalize"], "exporters": ["clickhouse"]},
            },
            "api": {"endpoint": "127.0.0.1:0"},
            "telemetry": {"metrics": {"address": "127.0.0.1:0"}, "logs": {"encoding": "json"}},
            "workers": 1,  # one process unless a test asks for workers (the default, auto, is tested on its own)
        },
    }


@dataclass
class Collector:
    """A running `evalsi serve` and where it listens."""

    proc: subprocess.Popen[str]
    config_path: Path
    log_path: Path
    ready: dict[str, Any] = field(default_factory=dict)

    @property
    def http(self) -> str:
        return "http://" + self.ready["receivers"]["otlp"]["http"]

    @property
    def grpc(self) -> str:
        return self.ready["receivers"]["otlp"]["grpc"]

    @property
    def api(self) -> str:
        return "http://" + self.ready["api"]

    @property
    def metrics(self) -> str:
        return "http://" + self.ready["metrics"] + "/metrics"

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def cli(self, *args: str, api: bool = True, check: bool = True) -> subprocess.CompletedProcess[str]:
        """`evalsi ARGS --api <this collector>` in this process (it only speaks HTTP), or `evalsi ARGS -c <config>`
        (`api=False`) in a process of its own: that reads the embedded store, and chDB opens one path per process."""
        if api:
            res = evalsi_cli(*args, "--api", self.api)
        else:
            res = subprocess.run([*EVALSI, *args, "-c", str(self.config_path)], capture_output=True, text=True,
                                 timeout=120)  # fmt: skip
        if check and res.returncode != 0:
            raise AssertionError(f"evalsi {' '.join(args)} failed ({res.returncode}): {res.stderr}")
        return res

    def stored_spans(self) -> int:
        return sum(t["span_count"] for t in httpx.get(self.api + "/api/v1/traces?limit=10000").json()["traces"])

    def wait_stored(self, n: int, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        got, pause = 0, 0.05
        while time.monotonic() < deadline:
            got = self.stored_spans()
            if got >= n:
                return got
            time.sleep(pause)
            pause = min(0.5, pause * 1.5)  # each look is a query of the store: look often only at first
        return got

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def wait_until(condition: Any, timeout: float = 30, interval: float = 0.2) -> bool:
    """Poll `condition()` until it is true (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False


def start_collector(tmp: Path, config: dict[str, Any], timeout: float = 60) -> Collector:
    config_path = tmp / "evalsi.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp / "serve.log"
    log = log_path.open("w")
    proc = subprocess.Popen([*EVALSI, "serve", "-c", str(config_path)], stdout=log, stderr=log, text=True, cwd=tmp)
    c = Collector(proc, config_path, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in c.logs():
            if entry.get("msg") == "ready":
                c.ready = entry
                return c
        if proc.poll() is not None:
            raise AssertionError(f"evalsi serve exited {proc.returncode}:\n{log_path.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"evalsi serve not ready in {timeout}s:\n{log_path.read_text()}")


def fixture_files(folder: str, suffix: str) -> list[Path]:
    return sorted(p for p in (FIXTURES / folder).glob(f"*{suffix}") if ".logs." not in p.name)


class ChosenIds(RandomIdGenerator):
    """An OpenTelemetry SDK id generator whose trace ids come from a list (which worker owns each trace, and which
    trace a score is of, are then known); span ids are random."""

    def __init__(self, trace_ids: list[int]) -> None:
        self._traces = iter(trace_ids)

    def generate_trace_id(self) -> int:
        return next(self._traces)


def send_chats(http: str, trace_ids: list[int], answers: list[str], service: str = "support") -> list[str]:
    """One GenAI chat span per answer, trace ids in order, sent with the real OTel SDK's OTLP/HTTP exporter to
    `http`; the trace ids as hex."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}), id_generator=ChosenIds(trace_ids))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=http + "/v1/traces")))
    tracer = provider.get_tracer("support.app")
    for answer in answers:
        with tracer.start_as_current_span("chat gpt-4o-mini") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "gpt-4o-mini")
            reply = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
            chat.set_attribute("gen_ai.output.messages", json.dumps(reply))
    assert provider.force_flush(10_000)
    provider.shutdown()
    return [f"{i:032x}" for i in trace_ids]
