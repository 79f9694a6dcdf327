"""A real `phoenix serve` for tests (`arize-phoenix`: sqlite in a temporary working directory, loopback, free ports
for HTTP and OTLP/gRPC, its telemetry off). Used by the Phoenix pull receiver's and exporter's tests.

Phoenix lives in a venv of its own (`.venv-phoenix`, made by `.ci/run`; `EVALSI_TEST_PHOENIX_VENV` names another):
its GraphQL library needs a graphql-core newer than MLflow's graphene allows, so both cannot be in one environment.
The traces the tests write to it are made there too, with the OpenInference tracer it brings."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from local_server import free_port, running

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("EVALSI_TEST_PHOENIX_VENV", ROOT / ".venv-phoenix"))
PHOENIX = VENV / "bin" / "phoenix"
PYTHON = VENV / "bin" / "python"
"""The interpreter of Phoenix's venv: runs the scripts that write traces to Phoenix with its OpenInference tracer."""
INSTALLING = ROOT / ".venv-phoenix.installing"
"""Present while `.ci/run` installs Phoenix in the background (beside the main install and the first tests)."""
MISSING = (
    f"needs Arize Phoenix in {VENV}: `python3 -m venv .venv-phoenix && .venv-phoenix/bin/pip install "
    "arize-phoenix==20.26.1` (.ci/run does it)"
)


def installed(wait: float = 600) -> bool:
    """Whether Phoenix's venv is there, once `.ci/run`'s background install (if one is under way) has ended."""
    deadline = time.monotonic() + wait
    while INSTALLING.exists() and time.monotonic() < deadline:
        time.sleep(1)
    return PHOENIX.exists()


@contextmanager
def phoenix_server(tmp: Path) -> Iterator[str]:
    """Starts a Phoenix server storing under `tmp`; yields its URL (its OTLP/HTTP endpoint is `<url>/v1/traces`)."""
    port, grpc_port = free_port(), free_port()
    env = {
        "PHOENIX_WORKING_DIR": str(tmp),
        "PHOENIX_SQL_DATABASE_URL": f"sqlite:///{tmp}/phoenix.db",
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    }
    url = f"http://127.0.0.1:{port}"
    with running([str(PHOENIX), "serve"], tmp, env, url + "/healthz", "phoenix serve"):
        yield url
