"""The receiver's shutdown drain: new requests are refused with retry information while those in flight finish."""

from __future__ import annotations

import asyncio
import time

SHUTTING_DOWN = "the collector is shutting down; retry (another replica takes it, or this one once it restarts)"
# seconds a sender refused while the receiver drains is asked to wait (as the exporter's queue asks once it stops)
RETRY_AFTER = 5.0
# The listeners close once no request came (refused or answered) for this long: senders on kept-alive connections
# and load balancers still routing here get a 503 / UNAVAILABLE saying when to retry, not a closed connection, yet
# an idle receiver stops at once.
QUIET = 0.25
# ... and at the latest after this long, whatever is still in flight or still arriving.
GRACE = 10.0


class Drain:
    """The requests a receiver took and has not answered yet, on all its transports, and whether it still takes new
    ones. Touched from the event loop only."""

    def __init__(self) -> None:
        self.closing = False
        self.in_flight = 0
        self.refused = 0  # requests refused while closing
        self._last = 0.0  # monotonic time a request was last refused or answered while closing

    def admit(self) -> bool:
        """Whether to take a request: then `release()` it once answered. False once closing: refuse it with
        `SHUTTING_DOWN` and `RETRY_AFTER`."""
        if self.closing:
            self.refused += 1
            self._last = time.monotonic()
            return False
        self.in_flight += 1
        return True

    def release(self) -> None:
        self.in_flight -= 1
        self._last = time.monotonic()

    async def close(self, *, quiet: float = QUIET, grace: float = GRACE) -> bool:
        """Refuse new requests from now on; return once those in flight are answered and none came for `quiet`
        seconds, or after `grace` seconds (then False if some are still in flight)."""
        self.closing = True
        now = self._last = time.monotonic()
        deadline = now + grace
        while now < deadline:
            if not self.in_flight and now - self._last >= quiet:
                return True
            await asyncio.sleep(min(0.05, quiet))
            now = time.monotonic()
        return not self.in_flight
