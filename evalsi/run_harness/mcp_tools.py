"""MCP tool servers as tools of the built-in agent: starting (stdio) or connecting to (streamable HTTP) each server of
`OpenAITarget.mcp` with the official `mcp` SDK, and a `Tool` per MCP tool that calls it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any, TextIO, cast

import anyio
import httpx2
import mcp.types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from evalsi import __version__
from evalsi.run_harness.spec import McpServerSpec
from evalsi.run_harness.targets.base import TargetError
from evalsi.run_harness.tools import Tool

log = logging.getLogger(__name__)

INHERITED_ENV = ("PATH", "HOME", "LANG")
"""What a stdio server gets of our environment, before its spec's `env` (the SDK adds LOGNAME, SHELL, TERM and USER
when they are set)."""
STDERR_TAIL = 1500
"""Characters of a stdio server's stderr quoted when it fails."""
CLIENT_INFO = types.Implementation(name="evalsi", version=__version__)


class McpToolError(Exception):
    """A tool call the MCP server answered with an error (`isError`: the message is the server's text), or that got
    no answer (a timeout, a server that is gone)."""


class McpTools:
    """The tools of some MCP servers. `open` starts or connects to every server (at the same time), initializes
    each session and lists its tools; `aclose` stops them. `base_dir` is what relative paths are relative to (the run
    file's directory).

    Each server's connection is held by a task of its own (the SDK's transports and sessions are anyio task groups
    and cancel scopes, which one task must enter and leave), so `open` and `aclose` may be called from any task, and
    the tools may be called from many tasks at once, all on the event loop `open` ran on. A server that fails later
    does not disturb the caller: its tool calls raise `McpToolError`."""

    def __init__(self, specs: list[McpServerSpec], base_dir: Path) -> None:
        self.specs = list(specs)
        self.base_dir = Path(base_dir)
        self._servers: list[_Server] = []

    async def open(self) -> list[Tool]:
        """Start the servers and make one `Tool` per MCP tool (`ref` is `mcp:<server>/<tool>`). Every problem
        (a missing environment variable, a server that cannot start, exits, does not answer `initialize` within its
        `timeout`, lacks a tool of its `tools:` list, two servers offering the same tool name) is a line of one
        `TargetError` naming the server; nothing is left running then."""
        if self._servers:
            raise RuntimeError("McpTools.open called twice without aclose")
        problems: list[str] = []
        servers: list[_Server] = []
        names: set[str] = set()
        for spec in self.specs:
            if spec.name in names:
                problems.append(f"MCP server {spec.name!r}: two servers have this name")
                continue
            names.add(spec.name)
            try:
                servers.append(_Server(spec, self.base_dir))
            except TargetError as e:
                problems.append(str(e))
        if problems:
            raise TargetError("\n".join(problems))
        self._servers = servers
        try:
            results = await asyncio.gather(*(s.start() for s in servers), return_exceptions=True)
        except BaseException:  # cancelled: stop what started
            await self.aclose()
            raise
        for result in results:
            if isinstance(result, TargetError):
                problems.append(str(result))
            elif isinstance(result, BaseException):
                problems.append(f"{type(result).__name__}: {result}")
        tools: dict[str, Tool] = {}
        for server in servers:
            for listed in server.listed:
                tool = Tool(
                    listed.name,
                    server.function(listed.name),
                    listed.description or listed.title or "",
                    dict(listed.input_schema),
                    f"mcp:{server.name}/{listed.name}",
                )
                if listed.name in tools:
                    other = tools[listed.name].ref.removeprefix("mcp:").split("/", 1)[0]
                    problems.append(
                        f"MCP server {server.name!r}: its tool {listed.name!r} is a tool of MCP server {other!r} too"
                        " (keep one with `tools:`)"
                    )
                tools[listed.name] = tool
        if problems:
            await self.aclose()
            raise TargetError("\n".join(problems))
        return list(tools.values())

    async def aclose(self) -> None:
        """Stop every server (a stdio one: its stdin closed, then terminated if it lingers; an HTTP one: its session
        deleted). Quiet about servers already gone; calling it again does nothing."""
        servers, self._servers = self._servers, []
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)


class _Server:
    """One MCP server: its connection held by a task, its tools, and calling them."""

    def __init__(self, spec: McpServerSpec, base_dir: Path) -> None:
        self.spec = spec
        self.name = spec.name
        self.timeout: float | None = spec.timeout or None
        self.listed: list[types.Tool] = []
        self.session: ClientSession | None = None
        self._gone: str | None = None  # why the connection ended, after a successful start
        self._stderr: IO[str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._scope: anyio.CancelScope | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # check what can be checked before anything starts
        self._params: StdioServerParameters | None = None
        self._headers: dict[str, str] = {}
        if spec.command is not None:
            self._params = self._stdio_params(spec, base_dir)
        else:
            self._headers = {key: self._value(f"headers.{key}", value) for key, value in spec.headers.items()}

    def _error(self, message: str) -> TargetError:
        return TargetError(f"MCP server {self.name!r}: {message}")

    def _value(self, key: str, value: str) -> str:
        """A value of `env` or `headers`: `env:VAR` reads the variable."""
        if not value.startswith("env:"):
            return value
        var = value[4:]
        if var not in os.environ:
            raise self._error(f"{key}: the environment variable {var} is not set")
        return os.environ[var]

    def _stdio_params(self, spec: McpServerSpec, base_dir: Path) -> StdioServerParameters:
        assert spec.command is not None
        env = {key: os.environ[key] for key in INHERITED_ENV if key in os.environ}
        problems = []
        for key, value in spec.env.items():
            try:
                env[key] = self._value(f"env.{key}", value)
            except TargetError as e:
                problems.append(str(e))
        cwd: Path | None = base_dir if base_dir.is_dir() else None
        if spec.cwd is not None:
            cwd = base_dir / spec.cwd
            if not cwd.is_dir():
                problems.append(str(self._error(f"cwd: {cwd} is not a directory")))
        if problems:
            raise TargetError("\n".join(problems))
        argv = [self._path(arg, base_dir) for arg in spec.command]
        if argv[0] in ("python", "python3"):  # the Python evalsi runs on (its venv, with `mcp` installed)
            argv[0] = sys.executable
        return StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=cwd)

    @staticmethod
    def _path(arg: str, base_dir: Path) -> str:
        """An argument naming a file of `base_dir` (relative to it) as an absolute path; any other as it is."""
        if not arg or arg.startswith("-") or os.path.isabs(arg):
            return arg
        candidate = base_dir / arg
        return os.path.abspath(candidate) if candidate.is_file() else arg

    # --- the connection ---

    async def start(self) -> None:
        """Connect, initialize, list the tools; a `TargetError` saying why not."""
        self._loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = self._loop.create_future()
        self._task = asyncio.create_task(self._hold(ready), name=f"mcp server {self.name}")
        await ready

    async def stop(self) -> None:
        task, self._task = self._task, None
        self.session = None
        if task is not None and not task.done():
            if task.get_loop() is asyncio.get_running_loop():
                if self._scope is not None:
                    self._scope.cancel()
                else:
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            # else: that loop is gone or elsewhere; its end cancels the task, which stops the server
        self._close_stderr()

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        """The connection's task: open it, say it is ready, wait until `stop`, close it."""
        phase = "start"
        try:
            with anyio.CancelScope() as self._scope:
                async with contextlib.AsyncExitStack() as stack:
                    read, write = await self._transport(stack)
                    session = ClientSession(read, write, read_timeout_seconds=self.timeout, client_info=CLIENT_INFO)
                    await stack.enter_async_context(session)
                    phase = "initialize"
                    await session.initialize()
                    phase = "tools/list"
                    self.listed = self._keep(await self._list_tools(session))
                    self.session = session
                    phase = "ready"
                    if not ready.done():
                        ready.set_result(None)
                    await anyio.sleep_forever()
        except Exception as e:
            why = self._why(e, phase)
            if phase != "ready":
                if not ready.done():
                    ready.set_exception(self._error(why))
            else:
                self._gone = why
                log.warning("MCP server %r: %s", self.name, why)
        finally:
            self.session = None
            if not ready.done():  # stopped (or the loop ends) before it was ready
                ready.set_exception(self._error("stopped before it was ready"))

    async def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        if self._params is not None:
            self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
            return await stack.enter_async_context(stdio_client(self._params, errlog=cast(TextIO, self._stderr)))
        assert self.spec.url is not None
        timeout = self.timeout or 300.0
        client = httpx2.AsyncClient(headers=self._headers, timeout=httpx2.Timeout(timeout, read=max(timeout, 300.0)))
        await stack.enter_async_context(client)
        return await stack.enter_async_context(streamable_http_client(self.spec.url, http_client=client))

    async def _list_tools(self, session: ClientSession) -> list[types.Tool]:
        listed = await session.list_tools()
        tools = list(listed.tools)
        while listed.next_cursor:
            listed = await session.list_tools(params=types.PaginatedRequestParams(cursor=listed.next_cursor))
            tools.extend(listed.tools)
        return tools

    def _keep(self, tools: list[types.Tool]) -> list[types.Tool]:
        wanted = self.spec.tools
        if wanted is None:
            return tools
        by_name = {t.name: t for t in tools}
        missing = [name for name in wanted if name not in by_name]
        if missing:
            has = ", ".join(sorted(by_name)) or "none"
            raise self._error(f"tools: it has no tool {', '.join(map(repr, missing))} (its tools: {has})")
        return [by_name[name] for name in dict.fromkeys(wanted)]

    def _why(self, error: BaseException, phase: str) -> str:
        """What went wrong, in words, with the end of a stdio server's stderr."""
        leaves = _leaves(error)
        for leaf in leaves:
            if isinstance(leaf, TargetError):
                return str(leaf).removeprefix(f"MCP server {self.name!r}: ")
        leaf = next((e for e in leaves if not isinstance(e, anyio.get_cancelled_exc_class())), leaves[0])
        if isinstance(leaf, OSError) and phase == "start" and self._params is not None:
            argv = " ".join([self._params.command, *self._params.args])
            why = f"cannot start `{argv}`: {leaf.strerror or leaf}"
        elif isinstance(leaf, MCPError) and leaf.code == types.REQUEST_TIMEOUT:
            why = f"no answer to {phase} within {self.timeout:g} s"
        elif isinstance(leaf, MCPError) and leaf.code == types.CONNECTION_CLOSED:
            why = f"the connection closed during {phase}" + (" (did it exit?)" if self._params else "")
        elif isinstance(leaf, httpx2.HTTPError):
            why = f"{phase}: {self.spec.url}: {type(leaf).__name__}: {leaf}"
        elif phase == "ready":
            why = f"the connection failed: {type(leaf).__name__}: {leaf}"
        else:
            why = f"{phase} failed: {type(leaf).__name__}: {leaf}"
        tail = self.stderr_tail()
        return f"{why}; its stderr ends:\n{tail}" if tail else why

    def stderr_tail(self) -> str:
        f = self._stderr
        if f is None or f.closed:
            return ""
        try:
            fd = f.fileno()
            size = os.fstat(fd).st_size
            data = os.pread(fd, STDERR_TAIL, max(0, size - STDERR_TAIL))
        except OSError:
            return ""
        text = data.decode("utf-8", "replace").strip()
        return ("..." if size > STDERR_TAIL else "") + text

    def _close_stderr(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    # --- the calls ---

    def function(self, tool: str) -> Callable[..., Awaitable[Any]]:
        async def call_mcp_tool(**arguments: Any) -> Any:
            return await self.call(tool, arguments)

        call_mcp_tool.__name__ = call_mcp_tool.__qualname__ = tool
        call_mcp_tool.__doc__ = f"The tool {tool!r} of MCP server {self.name!r}."
        return call_mcp_tool

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """The tool's result: its structured content when it has one, else its content as text; `McpToolError` when
        the server says the call failed or does not answer within the timeout."""
        session = self.session
        if session is None:
            raise McpToolError(f"MCP server {self.name!r} is " + (f"gone: {self._gone}" if self._gone else "closed"))
        if asyncio.get_running_loop() is not self._loop:
            raise McpToolError(f"MCP server {self.name!r} was opened on another event loop")
        try:
            result = await session.call_tool(tool, arguments, read_timeout_seconds=self.timeout)
        except MCPError as e:
            if e.code == types.REQUEST_TIMEOUT:
                raise McpToolError(f"no answer from MCP server {self.name!r} within {self.timeout:g} s") from None
            if e.code == types.CONNECTION_CLOSED:
                tail = self.stderr_tail()
                why = f"the connection to MCP server {self.name!r} is closed"
                raise McpToolError(f"{why}; its stderr ends:\n{tail}" if tail else why) from None
            raise McpToolError(e.message) from None
        if result.is_error:
            raise McpToolError(content_text(result.content) or f"{tool} failed (the server gave no message)")
        if result.structured_content is not None:
            return result.structured_content
        return content_text(result.content)


def content_text(blocks: list[types.ContentBlock]) -> str:
    """A tool result's content as text: the text blocks joined by newlines (a JSON text stays text), an embedded text
    resource's text, and a few words for anything else (an image, audio, a resource link, a binary resource)."""
    parts: list[str] = []
    for block in blocks:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.type}: {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link: {block.uri}" + (f" ({block.name})" if block.name else "") + "]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                parts.append(resource.text)
            else:
                mime = f", {resource.mime_type}" if resource.mime_type else ""
                parts.append(f"[resource: {resource.uri}{mime}, {len(resource.blob) * 3 // 4} bytes]")
        else:
            parts.append(f"[{getattr(block, 'type', type(block).__name__)} content]")
    return "\n".join(parts)


def _leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order; the error itself when it is none."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in _leaves(e)] or [error]
    return [error]
