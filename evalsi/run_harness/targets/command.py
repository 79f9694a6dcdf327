"""The `command` target: a process per attempt, the input on stdin, the output on stdout; `TRACEPARENT` set so an
instrumented program joins the attempt's trace. Each attempt runs in a process group of its own, and a timeout
ends the whole group (SIGTERM, then SIGKILL after `stop_grace`): nothing the agent started outlives its attempt."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

from evalsi.run_harness.model import Attempt, Task
from evalsi.run_harness.spec import CommandTarget
from evalsi.run_harness.targets.base import AttemptContext, AttemptFailed

STDERR_TAIL = 2000
POLL_S = 0.05
"""How often the group is looked at while it has its stop grace."""


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to every process of the group (none left is fine)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def group_running(pgid: int) -> bool:
    """Whether a process of the group still runs. A zombie (it ended, its parent has not reaped it yet) does not:
    `killpg(pgid, 0)` counts it, so /proc is read where there is one."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat")) as f:
                state, _ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # it ended while we looked
        if int(pgrp) == pgid and state != "Z":
            return True
    return False


async def end_group(proc: asyncio.subprocess.Process, grace_s: float) -> str:
    """End the process's group (its pid is the group's id): SIGTERM, then SIGKILL to whatever still runs `grace_s`
    later. Says how it ended, for the infrastructure error."""
    signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc.returncode is not None and not group_running(proc.pid):
            return "terminated (SIGTERM)"
        await asyncio.sleep(POLL_S)
    signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()
    return f"killed (SIGKILL: still running {grace_s:g}s after SIGTERM)"


class CommandAgent:
    def __init__(self, config: CommandTarget, base_dir: Path, otlp_endpoint: str | None = None) -> None:
        self.config = config
        self.base_dir = base_dir
        self.cwd = str(base_dir / config.cwd) if config.cwd else str(base_dir)
        self.identity = "command:" + " ".join(config.argv)
        self.otlp_endpoint = otlp_endpoint
        self.grace_s = config.stop_grace  # the runner waits this long past the timeout for the group to end

    async def prepare(self, tasks: list[Task]) -> None:
        return None

    async def attempt(self, task: Task, ctx: AttemptContext) -> Attempt:
        env = {**os.environ, **self.config.env, "TRACEPARENT": ctx.traceparent, "EVALSI_RUN_ID": ctx.run_id,
               "EVALSI_TASK_ID": task.id, "EVALSI_TRIAL": str(ctx.trial)}  # fmt: skip
        if self.otlp_endpoint:
            env.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", self.otlp_endpoint)
        data = task.input if isinstance(task.input, str) else json.dumps(task.input, ensure_ascii=False)
        attempt = Attempt(task, ctx.trial)
        argv, cwd = list(self.config.argv), self.cwd
        if ctx.workdir is not None:  # a task folder's attempt runs in its working directory
            env["EVALSI_WORKDIR"] = cwd = str(ctx.workdir)
            argv = [str(self.base_dir / a) if not os.path.isabs(a) and (self.base_dir / a).is_file() else a
                    for a in argv]  # fmt: skip
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd, env=env, start_new_session=True,  # its own process group, ended whole
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
        except OSError as e:
            raise AttemptFailed("crash", f"cannot start {self.config.argv[0]!r}: {e.strerror or e}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(data.encode()), ctx.timeout_s)
        except TimeoutError:
            how = await end_group(proc, self.config.stop_grace)
            raise AttemptFailed("timeout", f"timed out after {ctx.timeout_s:g}s; its process group was {how}") from None
        except BaseException:  # cancelled (the run was interrupted): nothing of the attempt outlives it
            signal_group(proc.pid, signal.SIGKILL)
            raise
        attempt.end_ns = time.time_ns()
        if proc.returncode != 0:
            tail = err.decode(errors="replace")[-STDERR_TAIL:].strip()
            raise AttemptFailed("crash", f"exit code {proc.returncode}" + (f": {tail}" if tail else ""))
        text = out.decode(errors="replace").strip()
        attempt.output = text
        if text[:1] == "{":
            with contextlib.suppress(ValueError):
                attempt.output_json, attempt.output = json.loads(text), None
        return attempt

    async def close(self) -> None:
        return None
