"""Size and count limits in configs (the OTLP receiver's, the API's): whole numbers of at least 1, never a way to
switch a limit off, each a config error naming its key otherwise."""

from __future__ import annotations

from typing import Any

MIB = 1024 * 1024


def not_bool(value: Any) -> Any:
    """A size or count limit is a number (YAML's `true` is not 1)."""
    if isinstance(value, bool):
        raise ValueError("must be a whole number of at least 1, not true/false")
    return value


def at_least_one(value: int) -> int:
    """A size or count limit is at least 1: 0 or a negative number would silently turn it off (gRPC reads -1 as
    "unlimited") or refuse everything, so either is a config error naming the key."""
    if value < 1:
        raise ValueError(f"must be at least 1, got {value} (a limit cannot be switched off; raise it instead)")
    return value
