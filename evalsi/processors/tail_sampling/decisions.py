"""What is kept of decided traces: their decision (late spans follow it) and, for re-evaluation, their spans."""

from __future__ import annotations

from collections import OrderedDict

from evalsi.model.span import Span, trace_key


class DecisionCache:
    """Two LRU sets of trace ids, as in the Collector: sampled and not sampled, each of its own size (0: off)."""

    def __init__(self, sampled_size: int, non_sampled_size: int) -> None:
        self._sizes = {True: sampled_size, False: non_sampled_size}
        self._ids: dict[bool, OrderedDict[str, None]] = {True: OrderedDict(), False: OrderedDict()}

    def put(self, trace_id: str, sampled: bool) -> None:
        size = self._sizes[sampled]
        if not size:
            return
        self._ids[not sampled].pop(trace_id, None)
        ids = self._ids[sampled]
        ids[trace_id] = None
        ids.move_to_end(trace_id)
        if len(ids) > size:
            ids.popitem(last=False)

    def get(self, trace_id: str) -> bool | None:
        """The trace's decision, or None when it was never decided or has been forgotten."""
        for sampled in (True, False):
            ids = self._ids[sampled]
            if trace_id in ids:
                ids.move_to_end(trace_id)
                return sampled
        return None

    def __len__(self) -> int:
        return len(self._ids[True]) + len(self._ids[False])


class DecidedTraces:
    """The spans of the most recently decided traces (LRU, `size` traces), kept so a late span can hand its whole
    trace on again for re-evaluation."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._spans: OrderedDict[str, list[Span]] = OrderedDict()

    def put(self, trace_id: str, spans: list[Span]) -> None:
        if not self.size:
            return
        self._spans[trace_id] = spans
        self._spans.move_to_end(trace_id)
        if len(self._spans) > self.size:
            self._spans.popitem(last=False)

    def get(self, trace_id: str) -> list[Span] | None:
        spans = self._spans.get(trace_id)
        if spans is not None:
            self._spans.move_to_end(trace_id)
        return spans

    def revise(self, span: Span) -> None:
        """A revision of a kept span takes its place."""
        spans = self._spans.get(trace_key(span))
        if spans is None:
            return
        for i, held in enumerate(spans):
            if held.span_id == span.span_id:
                spans[i] = span
                return

    def __len__(self) -> int:
        return len(self._spans)
