"""Serving an ASGI app on a config endpoint inside the service's event loop (OTLP/HTTP, the query API, /metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Generator
from typing import Any

import uvicorn


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`, or `:port` for all interfaces) as (host, port)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid endpoint {endpoint!r}: expected host:port, e.g. 127.0.0.1:4318")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def bind(endpoint: str) -> socket.socket:
    """A listening TCP socket on the endpoint; port 0 picks a free port. Errors name the endpoint."""
    host, port = parse_endpoint(endpoint)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {endpoint}: {e.strerror}; free the port or set another endpoint") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def taken(endpoints: list[tuple[str, str]]) -> list[str]:
    """Of (config key, endpoint) pairs, those something else listens on, each as `key: endpoint is in use; ...`.

    Checked before anything starts, so a clash names the key to change and leaves nothing behind (no store, no
    write-ahead log); port 0 is never taken."""
    busy = []
    for key, endpoint in endpoints:
        host, port = parse_endpoint(endpoint)
        if port == 0:
            continue
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as `bind` does: TIME_WAIT is free
            try:
                sock.bind((host, port))
            except OSError as e:
                why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be listened on: {e.strerror}"
                busy.append(f"{key}: {endpoint} {why}; stop what listens there or set another endpoint")
    return busy


def bound_endpoint(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Server(uvicorn.Server):
    # the service owns SIGTERM/SIGINT and stops servers in its own order
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class AsgiServer:
    """One uvicorn server on one endpoint, started and stopped by its owner."""

    def __init__(self, app: Any, endpoint: str, *, graceful_timeout: float = 10.0) -> None:
        self._sock = bind(endpoint)
        self.endpoint = bound_endpoint(self._sock)
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            http="httptools",
            timeout_graceful_shutdown=int(graceful_timeout),
            timeout_keep_alive=30,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError(f"server on {self.endpoint} stopped during start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish, then return."""
        if self._task is None:
            self._sock.close()
            return
        self._server.should_exit = True
        await self._task
        self._task = None
