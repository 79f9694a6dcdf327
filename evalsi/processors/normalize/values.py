"""Reading attribute values defensively: text, counts, numbers, JSON — never raising on what the wire sends.

Every mapper reads its attributes through these: a value may arrive as the type the convention names, as a
string (spans re-read from the store, emitters that stringify everything), or as something else entirely.
Each reader returns its kind or None (or, for `loads`, the malformed marker) and never raises.
They run for every span: keep them to a few type checks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import orjson

_MALFORMED = object()


def loads(raw: str) -> Any:
    """The JSON value of `raw` (orjson), or the malformed marker (test it with `is_malformed`). What orjson refuses
    but the stdlib reads (integers past 64 bits, NaN and Infinity as Python writes them) is read: a usage object
    with one absurd count is still a usage object, and the count is judged on its own."""
    try:
        return orjson.loads(raw)  # `json_codec.loads`, without its call
    except (ValueError, RecursionError):
        try:
            return json.loads(raw)
        except (ValueError, RecursionError, TypeError):
            return _MALFORMED


def is_malformed(value: Any) -> bool:
    """Whether `value` is the marker `loads` returns for text that is not JSON."""
    return value is _MALFORMED


def text(value: Any) -> str | None:
    """A non-empty string, or None; other scalars as their str(). A dict or list is no text: None."""
    if isinstance(value, str):
        return value or None
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)


def as_text(value: Any) -> str:
    """Any value as content text: a string as it is, anything else as its JSON (non-ASCII kept), else its str()."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, TypeError, RecursionError):
        return str(value)


def count(value: Any) -> int | None:
    """A count (tokens, a seed, a status code): ints pass; numeric strings and whole floats are tolerated."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                found = float(value)
            except ValueError:
                return None
            return int(found) if found.is_integer() else None
    return None


# token counts the store's UInt64 columns take, and that sum without overflow in Int64 aggregates
MAX_TOKENS = (1 << 63) - 1


def token_count(unparsed: list[str], field: str, *values: Any) -> int | None:
    """The first of `values` that is a token count (a `count` from 0 to 2^63 - 1). When none is but one was sent
    (`""`, `"NaN"`, `"1e30"`, the double 1e25, a negative number), None, and `field` is listed in `unparsed`."""
    sent = False
    for value in values:
        if value is None:
            continue
        sent = True
        found = count(value)
        if found is not None and 0 <= found <= MAX_TOKENS:
            return found
    if sent and field not in unparsed:
        unparsed.append(field)
    return None


def number(value: Any) -> float | None:
    """A finite measured quantity (seconds, USD, a score): ints and floats pass, numeric strings are tolerated.

    NaN and the infinities are None: no quantity on a span is either.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        if isinstance(value, bool):
            return None
        try:
            return float(value)
        except OverflowError:  # an int past the float range
            return None
    if isinstance(value, str):
        try:
            found = float(value)
        except ValueError:
            return None
        return found if math.isfinite(found) else None
    return None


def number_or_int(value: Any) -> int | float | None:
    """A parameter as sent (a temperature, a top_k): an int stays an int, a float or numeric text is a `number`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return number(value)


def flag(value: Any) -> bool | None:
    """A boolean, or its text `"true"` / `"false"` (as the store keeps it); anything else is None."""
    if isinstance(value, bool):
        return value
    if value == "true" or value == "false":
        return value == "true"
    return None


def strings(value: Any) -> list[str] | None:
    """A string-array attribute: a list, its JSON text (as the store keeps arrays), or one plain string."""
    if isinstance(value, str):
        if not value:
            return None
        if value.startswith("["):
            parsed = loads(value)
            return strings(parsed) if isinstance(parsed, list) else [value]
        return [value]
    if isinstance(value, (list, tuple)):
        found = [v if isinstance(v, str) else str(v) for v in value if v is not None]
        return found or None
    return None


def objects(value: Any) -> list[dict[str, Any]] | None:
    """A list of JSON objects (tool definitions): a list (its dicts), one dict, or either as JSON text.

    None when there is no object, or the text is not JSON.
    """
    if isinstance(value, str):
        value = loads(value)
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list):
        return [d for d in value if isinstance(d, dict)] or None
    return None


def first(attributes: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    """The value of the first of `names` that `attributes` holds (not None), else None."""
    for name in names:
        value = attributes.get(name)
        if value is not None:
            return value
    return None
