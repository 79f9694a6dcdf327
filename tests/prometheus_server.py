"""A real Prometheus server for tests: `prometheus` from PATH, its config and storage in a temporary directory,
listening on loopback, scraping its targets every second (exemplar storage on)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
import yaml

PROMETHEUS = shutil.which("prometheus")
MISSING = (
    "needs a Prometheus server binary on PATH: `apt-get install prometheus` (Debian/Ubuntu; .ci/run tries it) "
    "or a release from https://prometheus.io/download/"
)


@dataclass
class PrometheusProcess:
    """A running `prometheus` and its HTTP API's base URL."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


P = TypeVar("P", bound=PrometheusProcess)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prometheus(home: Path, targets: dict[str, str], kind: type[P] = PrometheusProcess) -> P:  # type: ignore[assignment]
    """Start `prometheus` scraping each target (job name to host:port) every second; return once it is ready."""
    assert PROMETHEUS is not None, MISSING
    home.mkdir()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [t]}]} for job, t in targets.items()],
    }
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = home / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={home / 'prometheus.yml'}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--enable-feature=exemplar-storage",
            ],
            stdout=log,
            stderr=log,
            cwd=home,
        )
    server = kind(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(server.url + "/-/ready", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.stop()
    raise AssertionError(f"prometheus not ready in 60s:\n{log_path.read_text()}")
