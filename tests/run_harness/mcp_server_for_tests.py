"""A small MCP tool server for `test_mcp_tools.py`: `python mcp_server_for_tests.py` serves stdio,
`python mcp_server_for_tests.py --http PORT` streamable HTTP on `http://127.0.0.1:PORT/mcp`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

NOTES_ENV = "MCP_TEST_NOTES"
"""The environment variable naming the file `write_note` appends to."""
WEATHER = {"Paris": "sunny, 18°C", "Tokyo": "rainy, 12°C", "London": "cloudy, 14°C"}

server = MCPServer("evalsi-test-tools", log_level="WARNING")


@server.tool(structured_output=False)
def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name, e.g. Paris.
    """
    if city == "Atlantis":
        raise ToolError("Atlantis is under the sea: no weather there")
    return WEATHER.get(city, "mild, 15°C")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(structured_output=False)
def write_note(text: str) -> str:
    """Append a line to the notes file (the one `MCP_TEST_NOTES` names)."""
    path = os.environ.get(NOTES_ENV)
    if not path:
        raise ToolError(f"{NOTES_ENV} is not set")
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(text + "\n")
    return f"noted in {path}"


@server.tool(structured_output=False)
async def wait(seconds: float) -> str:
    """Sleep, then say so (for timeouts and concurrency)."""
    import anyio

    await anyio.sleep(seconds)
    return f"waited {seconds:g} s"


@server.tool(structured_output=False)
def ping() -> str:
    """Answer pong."""
    return "pong"


@server.tool(structured_output=False)
def crash() -> str:
    """Exit the server process at once (a server that dies mid-run)."""
    os._exit(3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on this port")
    args = parser.parse_args()
    if args.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
