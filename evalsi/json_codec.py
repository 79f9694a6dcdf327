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


def not_text_at(value: Any, path: str = "") -> str | None:
    """Where a parsed JSON document holds a string that is not text (a lone UTF-16 surrogate such as "\\ud800",
    which JSON's escapes allow and UTF-8 cannot encode), as a key path (`(body)` for the document itself); None
    when every string is text."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "(body)"
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            where = f"{path}.{k}" if path else str(k)
            found = not_text_at(k, where) or not_text_at(v, where)
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = not_text_at(v, f"{path}.{i}" if path else str(i))
            if found:
                return found
    return None
