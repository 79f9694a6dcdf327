"""MCP tool servers as the built-in agent's tools (`McpTools`), against `mcp_server_for_tests.py` over stdio and
streamable HTTP: the tools and their schemas, results (text, structured, errors), `tools:` filters, env and cwd,
startup failures named by server, per-call timeouts, concurrent calls, closing; and the agent calling one."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalsi.run_harness.mcp_tools import McpToolError, McpTools
from evalsi.run_harness.model import Attempt, Task, ToolCall
from evalsi.run_harness.spec import McpServerSpec, OpenAITarget
from evalsi.run_harness.targets.base import AttemptContext, TargetError
from evalsi.run_harness.targets.openai import OpenAIAgent
from evalsi.run_harness.tools import Tool

SERVER = Path(__file__).with_name("mcp_server_for_tests.py")
NOTES_VAR = "EVALSI_TEST_MCP_NOTES"
CTX = AttemptContext(trial=0, timeout_s=30.0, traceparent="", run_id="run-1")


def server(name: str, **spec: Any) -> McpServerSpec:
    spec.setdefault("command", [sys.executable, str(SERVER)])
    return McpServerSpec(name=name, **spec)


def by_name(tools: list[Tool]) -> dict[str, Tool]:
    return {t.name: t for t in tools}


# --- stdio ---


def test_stdio_server_tools_results_errors_and_concurrency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the server script in the run file's directory, named relative to it, run in another directory (`cwd`), with
    # its notes file named by a variable of ours (`env:VAR`) relative to that directory
    shutil.copy(SERVER, tmp_path / "server.py")
    (tmp_path / "work").mkdir()
    monkeypatch.setenv(NOTES_VAR, "notes.txt")
    spec = server(
        "local",
        command=[sys.executable, "server.py"],
        cwd="work",
        env={"MCP_TEST_NOTES": f"env:{NOTES_VAR}"},
        tools=["get_weather", "add", "write_note", "wait", "crash"],  # not `ping`
    )

    async def main() -> None:
        mcp = McpTools([spec], tmp_path)
        tools = await mcp.open()
        try:
            assert [t.name for t in tools] == ["get_weather", "add", "write_note", "wait", "crash"]
            weather = by_name(tools)["get_weather"]
            assert weather.ref == "mcp:local/get_weather"
            assert weather.description.startswith("Get the current weather in a city.")
            assert weather.parameters["type"] == "object"
            assert weather.parameters["required"] == ["city"]
            assert weather.parameters["properties"]["city"]["type"] == "string"
            assert weather.definition()["function"]["name"] == "get_weather"

            assert await weather.call({"city": "Paris"}) == "sunny, 18°C"  # text content
            assert await by_name(tools)["add"].call({"a": 2, "b": 3}) == {"result": 5}  # structured content
            with pytest.raises(McpToolError, match="Atlantis is under the sea: no weather there"):
                await weather.call({"city": "Atlantis"})  # isError: the server's text
            with pytest.raises(McpToolError, match="city"):
                await weather.call({})  # arguments the server refuses

            assert "notes.txt" in await by_name(tools)["write_note"].call({"text": "hello"})
            assert (tmp_path / "work" / "notes.txt").read_text() == "hello\n"

            # calls from several tasks at once run at the same time over the one connection
            wait = by_name(tools)["wait"]
            start = time.monotonic()
            results = await asyncio.gather(
                *(asyncio.create_task(wait.call({"seconds": 0.4})) for _ in range(6)),
                asyncio.create_task(weather.call({"city": "Tokyo"})),
            )
            assert results == ["waited 0.4 s"] * 6 + ["rainy, 12°C"]
            assert time.monotonic() - start < 1.5

            # a server that dies: its calls fail, closing it is quiet
            with pytest.raises(McpToolError, match="the connection to MCP server 'local' is closed"):
                await by_name(tools)["crash"].call({})
            with pytest.raises(McpToolError, match="closed"):
                await weather.call({"city": "Paris"})
        finally:
            await mcp.aclose()
        await mcp.aclose()  # twice: nothing happens
        with pytest.raises(McpToolError, match="MCP server 'local' is closed"):
            await weather.call({"city": "Paris"})

    asyncio.run(main())


def test_startup_problems_name_their_server() -> None:
    specs = [
        server("ghost", command=["evalsi-no-such-mcp-server", "--stdio"]),
        server(
            "quitter",
            command=[sys.executable, "-c", "import sys; print('cannot load config', file=sys.stderr); exit(3)"],
        ),
        server("mute", command=[sys.executable, "-c", "import sys; sys.stdin.read()"], timeout=0.5),
        server("picky", tools=["get_weather", "fly"]),
        server("twin-a", tools=["add"]),
        server("twin-b", tools=["add"]),
    ]

    async def main() -> TargetError:
        mcp = McpTools(specs, Path.cwd())
        with pytest.raises(TargetError) as info:
            await mcp.open()
        await mcp.aclose()  # already closed by the failed open: quiet
        return info.value

    error = str(asyncio.run(main()))
    lines = error.splitlines()
    assert "MCP server 'ghost': cannot start `evalsi-no-such-mcp-server --stdio`: No such file or directory" in lines
    assert any(line.startswith("MCP server 'quitter': the connection closed during initialize") for line in lines)
    assert "cannot load config" in error  # the tail of its stderr
    assert "MCP server 'mute': no answer to initialize within 0.5 s" in lines
    assert (
        "MCP server 'picky': tools: it has no tool 'fly' (its tools: add, crash, get_weather, ping, wait, write_note)"
        in lines
    )
    assert any(
        line.startswith("MCP server 'twin-b': its tool 'add' is a tool of MCP server 'twin-a' too") for line in lines
    )


def test_unset_env_variable_is_an_error_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NOTES_VAR, raising=False)
    specs = [
        server("notes", env={"MCP_TEST_NOTES": f"env:{NOTES_VAR}"}),
        server("remote", command=None, url="http://127.0.0.1:9/mcp", headers={"authorization": f"env:{NOTES_VAR}"}),
        server("elsewhere", cwd="no/such/dir"),
    ]
    with pytest.raises(TargetError) as info:
        asyncio.run(McpTools(specs, Path.cwd()).open())
    assert str(info.value).splitlines() == [
        f"MCP server 'notes': env.MCP_TEST_NOTES: the environment variable {NOTES_VAR} is not set",
        f"MCP server 'remote': headers.authorization: the environment variable {NOTES_VAR} is not set",
        f"MCP server 'elsewhere': cwd: {Path.cwd() / 'no/such/dir'} is not a directory",
    ]


# --- streamable HTTP ---


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the MCP test server exited: {log.read().decode(errors='replace')}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_streamable_http_server(http_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NOTES_VAR, "Bearer test")
    spec = server("remote", command=None, url=http_server, headers={"authorization": f"env:{NOTES_VAR}"}, timeout=1.0)

    async def main() -> None:
        mcp = McpTools([spec], Path.cwd())
        tools = by_name(await mcp.open())
        try:
            assert set(tools) == {"get_weather", "add", "write_note", "wait", "ping", "crash"}
            assert tools["add"].ref == "mcp:remote/add"
            assert tools["add"].parameters["required"] == ["a", "b"]
            assert await tools["get_weather"].call({"city": "London"}) == "cloudy, 14°C"
            assert await tools["add"].call({"a": 40, "b": 2}) == {"result": 42}
            with pytest.raises(McpToolError, match="Atlantis is under the sea"):
                await tools["get_weather"].call({"city": "Atlantis"})
            results = await asyncio.gather(*(tools["wait"].call({"seconds": 0.3}) for _ in range(4)))
            assert results == ["waited 0.3 s"] * 4
            with pytest.raises(McpToolError, match="no answer from MCP server 'remote' within 1 s"):
                await tools["wait"].call({"seconds": 3})  # the per-call timeout
            assert await tools["get_weather"].call({"city": "Paris"}) == "sunny, 18°C"  # still fine after it
        finally:
            await mcp.aclose()
            await mcp.aclose()

    asyncio.run(main())


def test_http_server_that_is_not_there() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = server("nowhere", command=None, url=f"http://127.0.0.1:{port}/mcp", timeout=2.0)
    with pytest.raises(TargetError, match=r"^MCP server 'nowhere': initialize: http://127\.0\.0\.1:\d+/mcp: Connect"):
        asyncio.run(McpTools([spec], Path.cwd()).open())


# --- the agent ---


def test_agent_calls_an_mcp_tool() -> None:
    agent = OpenAIAgent(
        OpenAITarget(
            base_url="stub", model="stub", mcp=[McpServerSpec(name="weather", command=[sys.executable, str(SERVER)])]
        )
    )
    task = Task("t1", "What is the weather in Paris?")

    async def main() -> Attempt:
        await agent.prepare([task])
        try:
            assert "get_weather" in agent.tools
            return await agent.attempt(task, CTX)
        finally:
            await agent.close()

    attempt = asyncio.run(main())
    calls = [s for s in attempt.steps if isinstance(s, ToolCall)]
    assert len(calls) == 1
    assert calls[0].name == "get_weather"
    assert calls[0].arguments == {"city": "Paris"}
    assert calls[0].error is None
    assert calls[0].result == "sunny, 18°C"
    assert attempt.output == "The weather in Paris is sunny, 18°C."
