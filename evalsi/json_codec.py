"""JSON on the hot path (content attributes, store columns): orjson, with the stdlib for what orjson refuses."""

from __future__ import annotations

import json
from typing import Any

import orjson

_COMPACT = (",", ":")


def loads(text: str | bytes) -> Any:
    """Parse JSON; raises ValueError (orjson's error is one) on malformed input."""
    return orjson.loads(text)


def dumps(value: Any) -> str:
    """Compact JSON text; objects JSON does not know become their `str`."""
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:  # integers past 64 bits, non-string keys: the stdlib takes them
        return json.dumps(value, separators=_COMPACT, ensure_ascii=False, default=str)
