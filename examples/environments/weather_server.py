"""An MCP tool server (stdio) for the MCP example: the same weather lookup, served over the Model Context Protocol."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("weather")
WEATHER = {"Paris": "sunny, 18°C", "Tokyo": "rainy, 12°C"}


@server.tool()
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    if city not in WEATHER:
        raise ValueError(f"unknown city {city!r}")
    return WEATHER[city]


if __name__ == "__main__":
    server.run()
