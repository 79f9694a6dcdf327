"""A real `mlflow server` for tests (sqlite backend, job execution off, loopback, a free port): ~535 MB, 20-90 s to
start. Used by the MLflow exporter's tests and the MLflow pull receiver's."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from local_server import free_port, running

__all__ = ["free_port", "mlflow_server"]


@contextmanager
def mlflow_server(tmp: Path) -> Iterator[str]:
    """Starts a tracking server storing under `tmp`; yields its URI; stops it."""
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "mlflow"), "server",
        "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db", "--default-artifact-root", str(tmp / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    with running(cmd, tmp, {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, uri + "/health", "mlflow server"):
        yield uri
