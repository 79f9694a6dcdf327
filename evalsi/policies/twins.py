"""One model call recorded in two traces (a vendor SDK's lone span beside an instrumentation's root span, when no
span of the app is around the call): the evaluate processor holds such traces briefly so the two meet and are
evaluated as one trace, the call counted once (`trajectory.join_twins` does the same offline)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from evalsi.model.span import Span, TraceKey, trace_key
from evalsi.model.trajectory import lone_sdk_call, same_call_across_traces, twin_candidates


@dataclass
class _Held:
    spans: list[Span]
    completed: float  # monotonic: when the trace was complete upstream (freshness counts the wait here)
    due: float  # monotonic: evaluated alone from then on
    sdk: Span | None  # the lone SDK call; None for an instrumentation trace
    roots: list[Span] = field(default_factory=list)  # an instrumentation trace's root llm spans

    key: TraceKey = field(init=False)
    """The trace's project and id."""
    origin: tuple[str, str] = field(init=False)
    """One call's two traces come from one process: the same service of one project (a response id alone is not
    unique enough: two services calling one deterministic fake model server see the same ids)."""

    def __post_init__(self) -> None:
        self.key = trace_key(self.spans[0])
        self.origin = (self.key.project, self.spans[0].service_name)

    def response_ids(self) -> list[str]:
        spans = [self.sdk] if self.sdk is not None else self.roots
        return [s.details["response_id"] for s in spans if s.details.get("response_id")]


Ready = tuple[list[Span], float]
"""A trace to evaluate now (a joined pair: the instrumentation's spans first) and when it was complete upstream."""


ARMED_S = 3600.0
"""A service's root-level instrumentation calls wait for a twin only while it sent a lone SDK call within this
long: a service whose SDK records no spans of its own (turned off, or an older SDK) never waits."""
MAX_SERVICES = 10_000


class TwinBuffer:
    """Lone SDK calls and root-level instrumentation calls of the providers whose SDKs record their own spans,
    each held until its twin arrives (both are then handed on as one trace at once) or `wait` passes (then alone).
    Only such traces wait, and an instrumentation's call only from a service that sent lone SDK calls in the last
    `ARMED_S`: every other trace goes to evaluation without delay."""

    def __init__(self, wait: float, vendors: frozenset[str], max_traces: int) -> None:
        self.wait, self.vendors, self.max_traces = wait, vendors, max_traces
        self._held: OrderedDict[TraceKey, _Held] = OrderedDict()  # by arrival: the first due first
        # (is the SDK's, (project, service), response id) -> the held trace
        self._by_response: dict[tuple[bool, tuple[str, str], str], TraceKey] = {}
        self._without_id: dict[bool, set[TraceKey]] = {True: set(), False: set()}  # held traces with no response id
        self.joined = 0
        self._armed: OrderedDict[str, float] = OrderedDict()  # service -> when it last sent a lone SDK call

    def __len__(self) -> int:
        return len(self._held)

    def wants(self, spans: list[Span], now: float) -> bool:
        """Whether the trace may have a twin in another trace (it then goes through `add`): a lone SDK call (which
        arms its service), or a root-level instrumentation call from an armed service."""
        service = spans[0].service_name
        if lone_sdk_call(spans) is not None:
            self.arm(service, now)
            return True
        return self.armed(service, now) and bool(twin_candidates(spans, self.vendors))

    def arm(self, service: str, now: float) -> bool:
        """`service` sent a lone SDK call at `now`: its root-level instrumentation calls wait for a twin from now
        on. Whether it was not armed, or armed more than half of `ARMED_S` ago (worth telling other processes)."""
        before = self._armed.get(service)
        self._armed[service] = now
        self._armed.move_to_end(service)
        if len(self._armed) > MAX_SERVICES:
            self._armed.popitem(last=False)
        return before is None or now - before > ARMED_S / 2

    def armed_services(self, now: float) -> int:
        return sum(1 for at in self._armed.values() if now - at <= ARMED_S)

    def armed(self, service: str, now: float) -> bool:
        at = self._armed.get(service)
        return at is not None and now - at <= ARMED_S

    def add(self, spans: list[Span], completed: float, now: float) -> list[Ready]:
        """A trace `wants` took: its joined pair when its twin waits here, else nothing (it is held), plus the
        oldest held traces when more than `max_traces` wait."""
        sdk = lone_sdk_call(spans)
        item = _Held(spans, completed, now + self.wait, sdk, [] if sdk is not None else twin_candidates(spans))
        twin = self._twin_of(item)
        if twin is not None:
            other = self._pop(twin)
            self.joined += 1
            first, second = (other, item) if sdk is not None else (item, other)
            return [(first.spans + second.spans, min(item.completed, other.completed))]
        tid = item.key
        out: list[Ready] = []
        if tid in self._held:  # spans of a trace already waiting (arriving late): the earlier ones go on alone
            out.append(self._ready(self._pop(tid)))
        self._held[tid] = item
        is_sdk = sdk is not None
        keys = item.response_ids()
        for k in keys:
            self._by_response[(is_sdk, item.origin, k)] = tid
        if not keys:
            self._without_id[is_sdk].add(tid)
        while len(self._held) > self.max_traces:
            out.append(self._ready(self._pop(next(iter(self._held)))))
        return out

    def due(self, now: float) -> list[Ready]:
        """Held traces whose twin did not come in `wait`: evaluated alone."""
        out: list[Ready] = []
        while self._held:
            tid, item = next(iter(self._held.items()))
            if item.due > now:
                break
            out.append(self._ready(self._pop(tid)))
        return out

    def drain(self) -> list[Ready]:
        """Everything held (on shutdown)."""
        return [self._ready(self._pop(tid)) for tid in list(self._held)]

    @staticmethod
    def _ready(item: _Held) -> Ready:
        return item.spans, item.completed

    def _twin_of(self, item: _Held) -> TraceKey | None:
        """The held trace of the other kind that records the same call, if any."""
        look_for = item.sdk is None  # an instrumentation trace looks for an SDK call, and the other way round
        for k in item.response_ids():
            tid = self._by_response.get((look_for, item.origin, k))
            if tid is not None and tid in self._held:
                return tid
        # a response id on one side only (OpenInference's stream records none) or on neither (a failed call)
        candidates = self._without_id[look_for] if item.response_ids() else [t for t, h in self._held.items()
                                                                     if (h.sdk is not None) == look_for]  # fmt: skip
        for tid in candidates:
            held = self._held[tid]
            if held.origin != item.origin:
                continue
            sdk, roots = (held.sdk, item.roots) if look_for else (item.sdk, held.roots)
            if sdk is not None and any(same_call_across_traces(sdk, r) for r in roots):
                return tid
        return None

    def _pop(self, tid: TraceKey) -> _Held:
        item = self._held.pop(tid)
        is_sdk = item.sdk is not None
        for k in item.response_ids():
            if self._by_response.get((is_sdk, item.origin, k)) == tid:
                del self._by_response[(is_sdk, item.origin, k)]
        self._without_id[is_sdk].discard(tid)
        return item
