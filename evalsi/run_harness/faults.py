"""Faults injected into tool calls on purpose (`faults:` in the run spec): which calls they hit (seeded, so the same
calls fail in every run with the same seed) and what they do to a call."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from evalsi.run_harness.model import Fault
from evalsi.run_harness.spec import FaultSpec


def _draw(*key: object) -> float:
    """A uniform number in [0, 1) fixed by the key."""
    digest = hashlib.sha256("\x1f".join(str(k) for k in key).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class AttemptFaults:
    """The faults of one attempt: counts each tool's calls and says which faults hit the next one."""

    def __init__(self, specs: list[FaultSpec], seed: int, task_id: str, trial: int) -> None:
        self.specs = specs
        self.key = (seed, task_id, trial)
        self.calls: dict[str, int] = {}

    def hits(self, tool: str) -> list[FaultSpec]:
        """The faults of `tool`'s next call (counted from 1 per tool)."""
        number = self.calls[tool] = self.calls.get(tool, 0) + 1
        out = []
        for i, spec in enumerate(self.specs):
            if spec.tool not in ("*", tool):
                continue
            if spec.calls is not None:
                hit = number in spec.calls
            else:
                hit = _draw(*self.key, tool, number, i) < (spec.rate or 0.0)
            if hit:
                out.append(spec)
        return out

    async def call(
        self, tool: str, run: Callable[[], Awaitable[tuple[Any, str | None]]]
    ) -> tuple[Any, str | None, list[Fault]]:
        """Run a tool call (`run()` gives its result and error) through the faults that hit it: (result, error,
        faults). Latency comes first; then the first failing fault decides: `error` and `timeout` fail without
        running the tool, `malformed` runs it and spoils its result."""
        hits = self.hits(tool)
        faults: list[Fault] = []
        for spec in hits:
            if spec.kind == "latency":
                faults.append(Fault("latency", f"{spec.latency:g}s added"))
                await asyncio.sleep(spec.latency)
        failing = next((s for s in hits if s.kind != "latency"), None)
        if failing is not None and failing.kind == "error":
            message = failing.message or f"injected fault: {tool} failed"
            faults.append(Fault("error", message))
            return None, message, faults
        if failing is not None and failing.kind == "timeout":
            await asyncio.sleep(failing.latency)
            message = failing.message or f"injected fault: {tool} timed out after {failing.latency:g}s"
            faults.append(Fault("timeout", message))
            return None, message, faults
        result, error = await run()
        if error is None and failing is not None and failing.kind == "malformed":
            text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
            spoiled = failing.message or (text[: len(text) // 2] + "\ufffd")
            faults.append(Fault("malformed", f"result replaced: {spoiled[:80]!r}"))
            return spoiled, None, faults
        return result, error, faults


class FaultPlan:
    """The run's faults; `for_attempt` gives each attempt its own call counts."""

    def __init__(self, specs: list[FaultSpec], seed: int) -> None:
        self.specs = list(specs)
        self.seed = seed

    def for_attempt(self, task_id: str, trial: int) -> AttemptFaults | None:
        return AttemptFaults(self.specs, self.seed, task_id, trial) if self.specs else None
