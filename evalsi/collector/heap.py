"""How the collector's and the pipeline workers' heaps are kept: the garbage collector tuned for many long-lived spans
waiting in queues, glibc's malloc told to give large freed blocks back, and Arrow's buffers in jemalloc's pool."""

from __future__ import annotations

import ctypes
import gc
import os

MMAP_THRESHOLD = 128 * 1024
"""Blocks from this size up are mapped on their own and unmapped when freed (glibc's starting default, kept fixed)."""
_M_MMAP_THRESHOLD = -3  # mallopt's parameter numbers, from glibc's malloc.h


YOUNG_THRESHOLD = 1_000_000
"""Net allocations of tracked objects between two young collections (CPython's default: 700)."""


def tune_gc() -> None:
    """Spans wait in queues by the tens of thousands; with CPython's default thresholds every full collection walks
    them all, which cost a third of ingest time (benchmarks/README.md). Start-up objects are frozen out of
    collections and young collections run rarely: what the pipelines hold leaves no reference cycle
    (tests/processors/test_no_reference_cycles.py), so reference counting frees it, and a young collection only
    walks what a worker holds at the time. At 100,000 a busy worker ran one every ~9,000 spans, 50-120 ms each
    over the ~1,000,000 objects of the spans it held: 6-7% of its CPU (benchmarks/README.md). The threshold bounds
    what a cycle that does appear can hold before it is collected."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 50, 100)


def tune_malloc() -> bool:
    """Fix glibc's mmap threshold at 128 KiB. glibc raises it (up to 32 MiB) each time a mapped block is freed, after
    which request bodies (~0.8 MB), Arrow IPC buffers and large lists come from the heap, where one live block keeps
    the freed ones around it in the process's RSS. Whether this returns what it changed: True with glibc; a no-op
    (False) with another C library (musl, macOS) or when `MALLOC_MMAP_THRESHOLD_` in the environment chose already."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  # glibc only: its mallopt numbers are glibc's
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def tune_arrow_pool() -> str:
    """Take Arrow's buffers (the tables a worker builds and sends, the bodies and tables the collector reads into)
    from pyarrow's jemalloc pool instead of its default, mimalloc. Under `benchmarks/pipeline.py` (5 pairs) each
    worker peaked ~30 MB lower (267-303 against 298-330 MB) and the three processes ~70 MB lower (1,013-1,120 against
    1,107-1,210 MB PSS summed at one instant), for CPU within the noise (benchmarks/README.md, tenth pass).
    `ARROW_DEFAULT_MEMORY_POOL` in the environment chooses instead. The backend in use, returned."""
    import pyarrow as pa

    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a pyarrow built without it (Windows): its default stays
            pass
    return pa.default_memory_pool().backend_name
