"""Durations in config, written the way the OpenTelemetry Collector writes them: `5s`, `100ms`, `1m30s`."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """Seconds from `5s`, `250ms`, `1h30m` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"invalid duration {value!r}: must not be negative")
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        pos, total = 0, 0.0
        for m in _PART.finditer(text):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _UNIT[m.group(2)]
            pos = m.end()
        if text and pos == len(text):
            return total
    raise ValueError(f"invalid duration {value!r} (use e.g. 500ms, 5s, 1m30s)")


def _format(seconds: float) -> str:
    if seconds and seconds < 1:
        return f"{round(seconds * 1000, 3):g}ms"
    return f"{seconds:g}s"


# A duration field holds seconds as a float.
Duration = Annotated[float, BeforeValidator(parse_duration), PlainSerializer(_format, return_type=str)]
