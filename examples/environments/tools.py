"""The example's tool: a weather lookup."""

WEATHER = {"Paris": "sunny, 18°C", "Tokyo": "rainy, 12°C"}


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city's name, e.g. Paris.
    """
    if city not in WEATHER:
        raise ValueError(f"unknown city {city!r}")
    return WEATHER[city]
