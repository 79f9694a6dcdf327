"""OTLP attribute values as plain Python values: the hottest loop of ingest, and the length checks the limits
need."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

SHARED_MAX = 8_192
"""Distinct strings `share` keeps (then it starts again): attribute names, and values as short as `SHARED_LENGTH`."""
SHARED_LENGTH = 64
"""A string value at most this long is shared: a model, a provider, an operation, a tool name repeat span after span;
content and most ids are longer, or seen once."""
_shared: dict[str, str] = {}


def share(text: str) -> str:
    """`text`, or the equal string decoded before: every span of a request decodes its attribute names (and most of
    its short values) as new strings, ~0.9 KB a span of `benchmarks/span_memory.py`'s spans for the names alone, kept
    as long as the span is held (tail sampling's `decision_wait`, evaluate's queue). Not `sys.intern`: since Python
    3.12 an interned string is never freed, and names and values come from senders. Bounded: past `SHARED_MAX` strings
    it forgets them all and starts again (a new name or value costs one lookup more)."""
    if len(text) > SHARED_LENGTH:
        return text
    if len(_shared) >= SHARED_MAX:
        _shared.clear()
    _shared[text] = text
    return text


def any_value(v: AnyValue) -> Any:
    """An OTLP AnyValue as a plain Python value (str, bool, int, float, bytes, list, dict or None)."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "int_value":
        return v.int_value
    if which == "bool_value":
        return v.bool_value
    if which == "double_value":
        return v.double_value
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values[:]]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values[:]}
    if which == "bytes_value":
        return v.bytes_value
    return None


def attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    seen = _shared.get
    # a repeated field is walked as a slice (a list, made in C): iterating the field itself ends in an IndexError
    # raised and caught, ~15% of this loop for a span's attributes (and so for arrays and maps everywhere here)
    for kv in kvs[:]:
        v = kv.value
        # the common cases inline: this loop is the hottest code of ingest. A non-empty string value can only be
        # the oneof's string: most values are, and so skip the `WhichOneof` call (~10% of this loop); a non-zero int,
        # the next most common value, likewise
        key = kv.key
        key = seen(key) or share(key)
        text = v.string_value
        if text:
            out[key] = text if len(text) > SHARED_LENGTH else seen(text) or share(text)
            continue
        number = v.int_value
        if number:
            out[key] = number
            continue
        which = v.WhichOneof("value")
        if which == "double_value":
            out[key] = v.double_value
        elif which == "bool_value":
            out[key] = v.bool_value
        elif which == "array_value":
            out[key] = [x.string_value or any_value(x) for x in v.array_value.values[:]]
        else:  # a map, bytes, an empty string, a zero, no value
            out[key] = any_value(v)
    return out


def sized_attributes(kvs: Any, max_length: int) -> tuple[dict[str, Any], bool]:
    """`attributes(kvs)`, and whether a value may be longer than `max_length` bytes (a string of more than a quarter
    of that many characters, measured on the slow path; bytes, an array or a map holding a longer one), found while
    decoding: for a request larger than the limit, where every value is looked at (~30 ns a string)."""
    quarter = max_length >> 2
    out: dict[str, Any] = {}
    seen = _shared.get
    long = False
    for kv in kvs[:]:
        v = kv.value
        key = kv.key
        key = seen(key) or share(key)
        text = v.string_value
        if text:  # as in `attributes`: a non-empty string is the oneof's string, a non-zero int its int
            text = out[key] = text if len(text) > SHARED_LENGTH else seen(text) or share(text)
            if len(text) > quarter:
                long = True
            continue
        number = v.int_value
        if number:
            out[key] = number
            continue
        which = v.WhichOneof("value")
        if which == "double_value":
            out[key] = v.double_value
        elif which == "bool_value":
            out[key] = v.bool_value
        elif which == "array_value":
            items = out[key] = [x.string_value or any_value(x) for x in v.array_value.values[:]]
            for x in items:
                if type(x) is str:
                    if len(x) > quarter:
                        long = True
                elif not long and shortened(x, max_length) is not x:
                    long = True
        else:
            value = out[key] = any_value(v)
            if not long and shortened(value, max_length) is not value:
                long = True
    return out, long


def shortened(value: Any, limit: int) -> Any:
    """`value` with every string or bytes in it (an array's or map's elements too) at most `limit` bytes long, a
    string cut at a UTF-8 character boundary; the same object when nothing in it is longer."""
    if isinstance(value, str):
        if len(value) * 4 <= limit:  # at most 4 bytes a character: short enough without encoding it
            return value
        if len(value) <= limit and len(value.encode("utf-8", "surrogatepass")) <= limit:
            return value
        # the first `limit` bytes lie within the first `limit` characters; a character cut in two is dropped
        return value[:limit].encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")
    if isinstance(value, bytes):
        return value[:limit] if len(value) > limit else value
    if isinstance(value, list):
        items = [shortened(v, limit) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        cut = {k: shortened(v, limit) for k, v in value.items()}
        return cut if any(cut[k] is not v for k, v in value.items()) else value
    return value
