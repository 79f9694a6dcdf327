"""The core's packages (`evalsi.model`, `evalsi.runtime`, `evalsi.auth`) export what their `__init__` lists, and
`evalsi.runtime`'s lazy exports keep its light modules light: the ports check of `evalsi serve` runs before uvicorn
or prometheus_client is loaded."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["evalsi.model", "evalsi.runtime", "evalsi.auth"])
def test_every_exported_name_resolves_to_a_name_of_a_module_inside(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__all__, f"{package} exports nothing"
    for name in module.__all__:
        value = getattr(module, name)
        owner = getattr(value, "__module__", None)
        if owner is not None and owner.startswith("evalsi."):
            assert owner.startswith(package + "."), f"{package}.{name} comes from {owner}"


def test_a_name_the_runtime_does_not_export_is_an_attribute_error() -> None:
    runtime = importlib.import_module("evalsi.runtime")
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        runtime.Nothing  # noqa: B018


def _loaded_after(statement: str) -> list[str]:
    heavy = ("uvicorn", "prometheus_client")
    code = f"{statement}; import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return ast.literal_eval(res.stdout)


def test_the_ports_load_without_the_server_or_the_metrics_library() -> None:
    assert _loaded_after("from evalsi.runtime.ports import claimed_in, taken") == []
    assert _loaded_after("from evalsi.runtime import backoff, held, supervise") == []
    # the check can fail: the runtime's serving and telemetry do load them
    assert "uvicorn" in _loaded_after("from evalsi.runtime import AsgiServer")
    assert "prometheus_client" in _loaded_after("from evalsi.runtime import SelfMetrics")


SERVE_ONCE = """
import asyncio, sys, urllib.request
from evalsi.runtime import AsgiServer

async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})

async def main():
    server = AsgiServer(app, "127.0.0.1:0")
    await server.start()
    answer = await asyncio.to_thread(urllib.request.urlopen, f"http://{server.endpoint}/")
    await server.stop()
    print(answer.status, sorted(m for m in ("websockets", "wsproto") if m in sys.modules))

asyncio.run(main())
"""


def test_a_server_of_the_runtime_answers_without_loading_a_websocket_library() -> None:
    """No listener speaks WebSocket: uvicorn, left to choose, loads the `websockets` library (~3 MB a process)."""
    res = subprocess.run([sys.executable, "-c", SERVE_ONCE], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["204", "[]"]
