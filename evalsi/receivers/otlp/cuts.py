"""Cutting a span, log record or resource to the receiver's `limits`: attribute values truncated, attributes,
events and links past a count dropped, and the item marked with what was cut."""

from __future__ import annotations

from typing import Any

from evalsi.model.span import SpanEvent, SpanLink
from evalsi.receivers.otlp.attributes import attributes, shortened, sized_attributes
from evalsi.receivers.otlp.config import Limits
from evalsi.receivers.otlp.decoded import DROPPED, TRUNCATED, Cuts


class ItemCut:
    """What the limits cut of one span or log record (or of a resource, for each of its items): the entries of its
    marker attributes and the counts."""

    __slots__ = ("attributes", "dropped", "events", "links", "truncated")

    def __init__(self) -> None:
        self.truncated: list[str] = []
        self.dropped: list[str] = []
        self.attributes = self.events = self.links = 0

    def __bool__(self) -> bool:
        return bool(self.truncated or self.dropped)

    def attrs(self, kvs: Any, max_count: int, max_length: int, where: str) -> dict[str, Any]:
        """Decode the first `max_count` attributes, their values truncated to `max_length` bytes; `where` prefixes
        what the markers name (`events[2].`)."""
        n = len(kvs)
        if n > max_count:
            self.dropped.append(f"{where}attributes:{n - max_count}")
            self.attributes += n - max_count
            kvs = kvs[:max_count]
        out = attributes(kvs)
        for key, value in out.items():
            cut = shortened(value, max_length)
            if cut is not value:
                out[key] = cut  # the same keys: safe while iterating
                self.truncated.append(where + key)
        return out

    def add(self, other: ItemCut | None) -> None:
        if other:
            self.truncated += other.truncated
            self.dropped += other.dropped
            self.attributes += other.attributes

    def mark(self, attrs: dict[str, Any], cuts: Cuts, what: str) -> None:
        """Mark the item's attributes (past the limit: the markers are extra) and count the cut in `cuts`."""
        if self.truncated:
            attrs[TRUNCATED] = self.truncated
        if self.dropped:
            attrs[DROPPED] = self.dropped
        cuts.items += 1
        cuts.truncated += len(self.truncated)
        cuts.dropped_attributes += self.attributes
        cuts.dropped_events += self.events
        cuts.dropped_links += self.links
        if not cuts.note:
            parts = [f"truncated {', '.join(self.truncated[:5])}" if self.truncated else ""]
            parts.append(f"dropped {', '.join(self.dropped[:5])}" if self.dropped else "")
            cuts.note = f"{what}: {'; '.join(p for p in parts if p)}"


def cut_resource(
    resource: Any, max_count: int, max_length: int, check_sizes: bool
) -> tuple[dict[str, Any], ItemCut | None]:
    """A resource's attributes, and what the limits cut of them (None: nothing)."""
    kvs = resource.attributes
    if len(kvs) <= max_count:
        out, long = sized_attributes(kvs, max_length) if check_sizes else (attributes(kvs), False)
        if not long:
            return out, None
    cut = ItemCut()
    out = cut.attrs(kvs, max_count, max_length, "resource.")
    return out, (cut or None)


def over_limits(items: list[SpanEvent] | list[SpanLink], max_count: int, max_length: int, check_sizes: bool) -> bool:
    """Whether an event or a link decoded the fast way holds more attributes than the limit (duplicate keys counted
    once: what is stored stays within it) or, with `check_sizes`, a value that may be too long."""
    for x in items:
        if len(x.attributes) > max_count:
            return True
        if check_sizes:
            for value in x.attributes.values():
                if shortened(value, max_length) is not value:
                    return True
    return False


def cut_span(s: Any, limits: Limits, cut: ItemCut) -> tuple[dict[str, Any], list[SpanEvent], list[SpanLink]]:
    """A span's attributes, events and links within the limits; what was cut goes into `cut`."""
    max_attrs, max_length = limits.max_attributes_per_span, limits.max_attribute_value_length
    span_attributes = cut.attrs(s.attributes, max_attrs, max_length, "")
    found = s.events
    if len(found) > limits.max_events_per_span:
        dropped = len(found) - limits.max_events_per_span
        cut.dropped.append(f"events:{dropped}")
        cut.events += dropped
        found = found[: limits.max_events_per_span]
    events = [
        SpanEvent(e.time_unix_nano, e.name, cut.attrs(e.attributes, max_attrs, max_length, f"events[{i}]."))
        for i, e in enumerate(found)
    ]
    found = s.links
    if len(found) > limits.max_links_per_span:
        dropped = len(found) - limits.max_links_per_span
        cut.dropped.append(f"links:{dropped}")
        cut.links += dropped
        found = found[: limits.max_links_per_span]
    links = [
        SpanLink(
            ln.trace_id.hex(),
            ln.span_id.hex(),
            ln.trace_state,
            cut.attrs(ln.attributes, max_attrs, max_length, f"links[{i}]."),
        )
        for i, ln in enumerate(found)
    ]
    return span_attributes, events, links
