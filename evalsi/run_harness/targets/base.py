"""The target interface: prepare once, attempt a task per trial, close; errors that are the infrastructure's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from evalsi.run_harness.model import (
    Attempt,
    AttemptFailed as AttemptFailed,  # a target raises it: part of the interface
    Task,
)

if TYPE_CHECKING:
    from evalsi.run_harness.cassette import Tape
    from evalsi.run_harness.faults import AttemptFaults


class TargetError(Exception):
    """The target cannot run this dataset at all (unreachable, an input its schema refuses): the run stops before
    it starts, with this message (each problem on its own line)."""


@dataclass(frozen=True)
class AttemptContext:
    """What the runner gives each attempt: its trial, how long it may take, and the W3C `traceparent` of the
    attempt's root span (an instrumented target joins the trace with it: the `TRACEPARENT` environment variable
    for a command, the `traceparent` argument for a Python callable that takes it)."""

    trial: int
    timeout_s: float
    traceparent: str
    run_id: str
    workdir: Path | None = None
    """The task folder's working directory for this attempt (set up by its `setup` script, checked after)."""
    tape: Tape | None = None
    """Where the built-in agent records or replays its model and tool calls (`--record`, `--replay`)."""
    faults: AttemptFaults | None = None
    """The faults injected into this attempt's tool calls."""


class AgentTarget(Protocol):
    identity: str
    """What the manifest records of the target (kind and where: `python:pkg.mod:fn`, `http:https://...`)."""

    async def prepare(self, tasks: list[Task]) -> None:
        """Check the target can run these tasks (capabilities, input schema); raise `TargetError` if not."""
        ...

    async def attempt(self, task: Task, ctx: AttemptContext) -> Attempt:
        """Run the task once; raise `AttemptFailed` for an infrastructure failure. The runner enforces
        `ctx.timeout_s` too (a target that can stop its agent cleanly, e.g. `stop` over HTTP, should do it itself
        a little before)."""
        ...

    async def close(self) -> None: ...


class Session(Protocol):
    """One conversation of a target with a (simulated) user: `reply` answers the user's next message, adding the
    agent's steps to `attempt`."""

    attempt: Attempt

    async def reply(self, text: str) -> str: ...


class ConversationalTarget(AgentTarget, Protocol):
    """A target that can hold a multi-turn conversation (the built-in agent; a Python function taking `messages`)."""

    async def open_session(self, task: Task, ctx: AttemptContext) -> Session: ...


def conversational(target: AgentTarget) -> bool:
    """Whether the target can hold a conversation (after `prepare`)."""
    return callable(getattr(target, "open_session", None)) and bool(getattr(target, "holds_conversations", True))


def grace_s(target: AgentTarget) -> float | None:
    """Seconds a target may take past the attempt timeout to stop its agent itself (`stop_grace` over HTTP, or for a
    command's process group); None for a target the runner stops at the timeout."""
    grace = getattr(target, "grace_s", None)
    return None if grace is None else float(grace)


def concurrency_limit(target: AgentTarget) -> int | None:
    """The most attempts the target takes at once, when it says (after `prepare`)."""
    limit = getattr(target, "max_concurrent_runs", None)
    return limit if isinstance(limit, int) and limit > 0 else None
