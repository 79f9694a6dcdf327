"""A real server process for tests (an `mlflow server`, a `phoenix serve`): started in its own session with its log
in the test's directory, waited for until its health check answers, and stopped with its children."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(cmd: list[str], tmp: Path, env: dict[str, str], health: str, what: str) -> Iterator[None]:
    """Runs `cmd` in `tmp` until the block ends; `health` is the URL that answers 200 once it serves."""
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=tmp, env={**os.environ, **env}, start_new_session=True)
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(health, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"{what} did not start:\n{(tmp / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
