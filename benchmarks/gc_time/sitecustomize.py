"""Garbage collections of every evalsi process, for a benchmark run.

Put this folder first on PYTHONPATH and set EVALSI_GC_LOG to a file, both absolute (the collector runs in another
directory). Each process appends one line at exit: its CPU seconds, and by generation the collections run after
`tune_gc` set its thresholds (start-up's are left out), their CPU seconds, the longest in ms, and the objects they
found unreachable (cyclic garbage):

    EVALSI_GC_LOG=/tmp/gc.log PYTHONPATH=$PWD/benchmarks/gc_time .venv/bin/python benchmarks/pipeline.py --spans 120000
    cat /tmp/gc.log

`EVALSI_GC_YOUNG=N` makes `tune_gc` set a young threshold of N instead (to compare thresholds in one checkout).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import time

_LOG = os.environ.get("EVALSI_GC_LOG")
_tuned = False
_started = 0.0
_by_generation: dict[int, list[float]] = {}


def _callback(phase: str, info: dict[str, int]) -> None:
    global _started
    if not _tuned:
        return
    if phase == "start":
        _started = time.thread_time()
        return
    took = time.thread_time() - _started
    n, seconds, longest, unreachable = _by_generation.get(info["generation"], [0, 0.0, 0.0, 0])
    _by_generation[info["generation"]] = [n + 1, seconds + took, max(longest, took), unreachable + info["collected"]]


def _set_threshold(young: int, *older: int, _set=gc.set_threshold) -> None:
    global _tuned
    if young >= 1000:  # `tune_gc`, not start-up's defaults
        _tuned = True
        young = int(os.environ.get("EVALSI_GC_YOUNG") or young)
    _set(young, *older)


def _report() -> None:
    gens = {
        g: {"collections": int(n), "cpu_s": round(s, 3), "longest_ms": round(longest * 1000, 1), "unreachable": int(u)}
        for g, (n, s, longest, u) in sorted(_by_generation.items())
    }
    line = {"pid": os.getpid(), "argv": " ".join(sys.argv)[-60:], "tuned": _tuned,
            "cpu_s": round(time.process_time(), 2), "threshold": gc.get_threshold(), "after_tune": gens}  # fmt: skip
    with open(_LOG, "a") as f:  # type: ignore[arg-type]
        f.write(json.dumps(line) + "\n")


if _LOG:
    gc.callbacks.append(_callback)
    gc.set_threshold = _set_threshold  # type: ignore[assignment]
    atexit.register(_report)
