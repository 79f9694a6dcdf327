"""Session meeting: in the collector process with pipeline workers, every worker's completed traces that carry a
session id are held together until the session is quiet, then the whole session goes to evaluation. (Without
workers, tail sampling assembles sessions and hands them on as `BatchKind.SESSION` batches.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from evalsi.model.span import Span
from evalsi.processors.tail_sampling.buffer import SessionBuffer, session_of

SESSIONS_TICK_S = 0.25
"""How often quiet sessions go to evaluation."""


class SessionMeeting:
    """Assembles sessions from every worker's traces once `meet` is called (by the service, with the pipeline's
    tail_sampling session settings, when some policy evaluates sessions); `evaluate` queues a quiet session."""

    def __init__(self, evaluate: Callable[[list[Span]], None]) -> None:
        self.evaluate = evaluate
        self.buffer: SessionBuffer | None = None

    def meet(self, timeout: float, max_sessions: int, max_spans: int) -> None:
        self.buffer = SessionBuffer(timeout, max_sessions, max_spans)

    def take(self, spans: list[Span]) -> None:
        """A worker's completed trace of a session: held until the session is quiet (or evicted by the limits)."""
        if self.buffer is None:
            return
        session = session_of(spans)
        if session is not None:
            self.buffer.add(session, spans, time.monotonic())
            for session, _why in self.buffer.evict():
                self.evaluate(session.spans)

    async def run(self) -> None:
        """Quiet sessions to evaluation, until cancelled."""
        assert self.buffer is not None
        while True:
            await asyncio.sleep(SESSIONS_TICK_S)
            for session in self.buffer.due(time.monotonic()):
                self.evaluate(session.spans)

    def drain(self) -> None:
        """At shutdown: every open session to evaluation."""
        if self.buffer is not None:
            for session in self.buffer.drain():
                self.evaluate(session.spans)
