"""How the collector's heap is collected: tuned for many long-lived spans waiting in queues."""

from __future__ import annotations

import gc


def tune_gc() -> None:
    """Spans wait in queues by the tens of thousands; with CPython's default thresholds every full collection walks
    them all, which cost a third of ingest time (benchmarks/README.md). Start-up objects are frozen out of
    collections and young collections run less often; reference counting still frees almost everything."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
