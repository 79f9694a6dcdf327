"""Background tasks that never die silently: an unexpected exception is logged at once with its traceback, counted
in `evalsi_task_failures_total`, and the task is started again after a short, growing pause."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

RESTART_DELAY = 0.1
MAX_RESTART_DELAY = 5.0


def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    *,
    log: logging.Logger,
    metrics: Any,
) -> asyncio.Task[None]:
    """Start `run()` as a task that restarts on an unexpected exception. It ends when `run()` returns or when the
    task is cancelled. `metrics` is the service's `SelfMetrics`: a failure counts under the task's `name`."""
    failures = metrics.counter(
        "evalsi_task_failures",
        "Unexpected exceptions in background tasks (each was logged and the task restarted).",
        ["task"],
    ).labels(name)

    async def supervised() -> None:
        delay = RESTART_DELAY
        while True:
            try:
                await run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                failures.inc()
                log.exception("background task %r failed; restarting it in %.1fs", name, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RESTART_DELAY)

    return asyncio.create_task(supervised(), name=name)
