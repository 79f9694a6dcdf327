"""Serving an ASGI app on a config endpoint inside the service's event loop (OTLP/HTTP, the query API, /metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from typing import Any

import uvicorn

from evalsi.runtime.ports import parse_endpoint


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
            ws="none",  # no endpoint speaks WebSocket: else uvicorn loads the `websockets` library (~3 MB)
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
