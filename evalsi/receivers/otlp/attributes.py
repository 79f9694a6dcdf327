"""OTLP attribute values as plain Python values: the hottest loop of ingest, and the length checks the limits
need."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue


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
    # a repeated field is walked as a slice (a list, made in C): iterating the field itself ends in an IndexError
    # raised and caught, ~15% of this loop for a span's attributes (and so for arrays and maps everywhere here)
    for kv in kvs[:]:
        v = kv.value
        # the common cases inline: this loop is the hottest code of ingest. A non-empty string value can only be
        # the oneof's string: most values are, and so skip the `WhichOneof` call (~10% of this loop); a non-zero int,
        # the next most common value, likewise
        text = v.string_value
        if text:
            out[kv.key] = text
            continue
        number = v.int_value
        if number:
            out[kv.key] = number
            continue
        which = v.WhichOneof("value")
        if which == "double_value":
            out[kv.key] = v.double_value
        elif which == "bool_value":
            out[kv.key] = v.bool_value
        elif which == "array_value":
            out[kv.key] = [x.string_value or any_value(x) for x in v.array_value.values[:]]
        else:  # a map, bytes, an empty string, a zero, no value
            out[kv.key] = any_value(v)
    return out


def sized_attributes(kvs: Any, max_length: int) -> tuple[dict[str, Any], bool]:
    """`attributes(kvs)`, and whether a value may be longer than `max_length` bytes (a string of more than a quarter
    of that many characters, measured on the slow path; bytes, an array or a map holding a longer one), found while
    decoding: for a request larger than the limit, where every value is looked at (~30 ns a string)."""
    quarter = max_length >> 2
    out: dict[str, Any] = {}
    long = False
    for kv in kvs[:]:
        v = kv.value
        text = v.string_value
        if text:  # as in `attributes`: a non-empty string is the oneof's string, a non-zero int its int
            out[kv.key] = text
            if len(text) > quarter:
                long = True
            continue
        number = v.int_value
        if number:
            out[kv.key] = number
            continue
        which = v.WhichOneof("value")
        if which == "double_value":
            out[kv.key] = v.double_value
        elif which == "bool_value":
            out[kv.key] = v.bool_value
        elif which == "array_value":
            items = out[kv.key] = [x.string_value or any_value(x) for x in v.array_value.values[:]]
            for x in items:
                if type(x) is str:
                    if len(x) > quarter:
                        long = True
                elif not long and shortened(x, max_length) is not x:
                    long = True
        else:
            value = out[kv.key] = any_value(v)
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
