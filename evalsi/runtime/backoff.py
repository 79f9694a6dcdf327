"""The one retry policy every sender shares (exporters, the judge client, the alert notifier): exponential backoff
with jitter, capped, and a server's `Retry-After` (delta-seconds or an HTTP date) honoured when it gives one."""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass

RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
"""The HTTP statuses worth retrying (the OTLP spec's list, which most HTTP APIs share)."""


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time()) if when else None


@dataclass
class Backoff:
    """Waits between attempts: `initial`, doubling up to `maximum`, each within ±`jitter` (so many senders that
    failed together do not retry together). A server's Retry-After, when given, replaces the next wait (capped by
    `max_retry_after`, so a hostile or broken header cannot park a sender for a day)."""

    initial: float = 1.0
    maximum: float = 30.0
    jitter: float = 0.2
    max_retry_after: float = 300.0
    _next: float | None = None

    def next_wait(self, server_says: float | None = None) -> float:
        """The wait before the next attempt; call once per failed attempt."""
        base = self.initial if self._next is None else self._next
        self._next = min(base * 2, self.maximum)
        if server_says is not None:
            return min(max(server_says, 0.0), self.max_retry_after)
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)

    def reset(self) -> None:
        """After a success: the next failure waits `initial` again."""
        self._next = None
