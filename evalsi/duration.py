"""The one duration syntax of evalsi, and the times written with it: config keys, CLI options and API
parameters all read durations here (`500ms`, `5s`, `1m30s`, `2h`, `7d`: the OpenTelemetry Collector's units plus
days), and a time as a duration back from now or an ISO-8601 time."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
SYNTAX = "500ms, 5s, 1m30s, 2h, 7d"
"""The examples every message about a duration gives."""
MAX_SECONDS = 2**63 / 1e9
"""The longest duration: what an Int64 of nanoseconds holds (292 years)."""


def parse_duration(value: Any) -> float:
    """Seconds from `500ms`, `5s`, `1m30s`, `2h`, `7d` (units ns, us, ms, s, m, h, d, combined) or a bare number
    of seconds (a number, as YAML reads `5`). Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"invalid duration {value!r}: must not be negative")
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        pos, seconds = 0, 0.0
        for m in _PART.finditer(text):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _UNIT[m.group(2)]
            pos = m.end()
        if not text or pos != len(text):
            raise ValueError(f"invalid duration {value[:80]!r} (use e.g. {SYNTAX})")
    else:
        raise ValueError(f"invalid duration {value!r} (use e.g. {SYNTAX})")
    if not seconds < MAX_SECONDS:  # inf and NaN too: 400 digits of hours read as a float are inf
        raise ValueError(f"invalid duration {str(value)[:80]!r}: longer than {MAX_SECONDS:.0f}s (292 years)")
    return seconds


def parse_time(text: str, now_ns: int) -> int:
    """A time in ns since 1970 from a duration back from now (`15m`, `2h`, `7d`) or an ISO-8601 time (UTC unless it
    says otherwise: `2026-05-01`, `2026-05-01T12:00:00Z`). Raises ValueError."""
    try:
        return max(0, now_ns - int(parse_duration(text) * 1e9))
    except ValueError:
        pass
    try:
        at = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text[:80]!r} is neither a duration back from now ({SYNTAX}) nor an ISO-8601 time "
            "(2026-05-01, 2026-05-01T12:00:00Z)"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    ns = (at - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1) * 1000
    if not 0 <= ns < 2**63:
        raise ValueError(f"{text[:80]!r} is not a time from 1970 to 2262")
    return ns


def _format(seconds: float) -> str:
    if seconds and seconds < 1:
        return f"{round(seconds * 1000, 3):g}ms"
    return f"{seconds:g}s"


# A duration field holds seconds as a float.
Duration = Annotated[float, BeforeValidator(parse_duration), PlainSerializer(_format, return_type=str)]
