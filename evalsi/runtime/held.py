"""What pipeline components hold: when the oldest span or log record they hold reached a receiver, which tells the
write-ahead log (`evalsi/wal.py`) which of its segments nothing depends on any more."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def earliest(values: Iterable[float | None]) -> float | None:
    """The smallest of the values that are set (None when none is)."""
    found: float | None = None
    for v in values:
        if v is not None and (found is None or v < found):
            found = v
    return found


def arrived_of(items: Iterable[Any]) -> float | None:
    """When the oldest of these spans or log records reached a receiver (0.0, i.e. never stamped, counts as unset)."""
    found: float | None = None
    for item in items:
        a = item.arrived
        if a and (found is None or a < found):
            found = a
    return found


class InFlight:
    """Batches inside a consumer's `consume` call (`Next` reports them here when a log is kept): between two
    holders, they are in none."""

    __slots__ = ("_inside", "_next")

    def __init__(self) -> None:
        self._inside: dict[int, float] = {}
        self._next = 0

    def enter(self, items: Iterable[Any]) -> int:
        self._next += 1
        arrived = arrived_of(items)
        if arrived is not None:
            self._inside[self._next] = arrived
        return self._next

    def leave(self, token: int) -> None:
        self._inside.pop(token, None)

    def held_since(self) -> float | None:
        return min(self._inside.values()) if self._inside else None


def stamp(batch: Any, arrived: float) -> None:
    """Mark every span or log record of a batch as reached a receiver at `arrived` (monotonic)."""
    for item in getattr(batch, "spans", None) or getattr(batch, "records", None) or ():
        item.arrived = arrived


def stamp_project(batch: Any, project: str) -> None:
    """Put every span or log record of a batch in `project` (the `evalsi.project` resource attribute), whatever
    project its sender named: a credential writes to its own project only. The `default` project is the attribute's
    absence, so a single-team collector stores what it was sent, attribute for attribute."""
    from evalsi.model.span import PROJECT_ATTRIBUTE

    default = project == "default"
    for item in getattr(batch, "spans", None) or getattr(batch, "records", None) or ():
        if default:
            item.resource_attributes.pop(PROJECT_ATTRIBUTE, None)
        else:
            item.resource_attributes[PROJECT_ATTRIBUTE] = project
