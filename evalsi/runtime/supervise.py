"""Background tasks that never die silently: an unexpected exception is logged at once with its traceback, counted
in `evalsi_task_failures_total`, and the task is started again after a short, growing pause."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

RESTART_DELAY = 0.25
MAX_RESTART_DELAY = 5.0


def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    *,
    log: logging.Logger,
    metrics: Any = None,
    on_failure: Callable[[], None] | None = None,
) -> asyncio.Task[None]:
    """Start `run()` as a task that restarts on an unexpected exception. It ends when `run()` returns or when the
    task is cancelled. A failure counts under the task's `name` in `metrics` (the service's `SelfMetrics`, when
    given) and calls `on_failure` (e.g. an exporter's own error counter)."""
    failures = (
        metrics.counter(
            "evalsi_task_failures",
            "Unexpected exceptions in background tasks (each was logged and the task restarted).",
            ["task"],
        ).labels(name)
        if metrics is not None
        else None
    )

    async def supervised() -> None:
        delay = RESTART_DELAY
        while True:
            try:
                await run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                if failures is not None:
                    failures.inc()
                if on_failure is not None:
                    on_failure()
                log.exception("background task %r failed; restarting it in %.2fs", name, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RESTART_DELAY)

    return asyncio.create_task(supervised(), name=name)
