"""Tools for the reference agent's tests: plain Python functions whose JSON schemas come from their type hints and
docstrings, as a user's would."""

from __future__ import annotations

import threading
import time
from typing import Literal

WEATHER = {"Paris": "sunny, 18°C", "Tokyo": "rainy, 12°C", "London": "cloudy, 14°C"}
SLEEP_S = 0.2
CALLS: list[str] = []
"""The cities `get_weather` was asked about, in order."""
_lock = threading.Lock()


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name, e.g. Paris.
        unit: The temperature's unit.
    """
    with _lock:
        CALLS.append(city)
    time.sleep(SLEEP_S)
    if city not in WEATHER:
        raise ValueError(f"unknown city {city!r}")
    return WEATHER[city]


def search_docs(
    query: str, tags: list[str], mode: Literal["fast", "exact"], limit: int = 5, since: str | None = None
) -> list[str]:
    """Search the documentation.

    More words that are not the description.

    Args:
        query: What to look for.
        tags: Only documents with all of
            these tags.
        limit: At most this many results.
    """
    return [query][:limit]


def lookup(key: str) -> str:
    """Not this description: the schema attribute wins."""
    return key


lookup.__tool_schema__ = {  # type: ignore[attr-defined]
    "name": "kv_lookup",
    "description": "Read a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
}


def takes_bytes(blob: bytes) -> int:
    """A parameter type with no JSON schema."""
    return len(blob)
