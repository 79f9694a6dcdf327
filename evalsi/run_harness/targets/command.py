"""The `command` target: a process per attempt, the input on stdin, the output on stdout; `TRACEPARENT` set so an
instrumented program joins the attempt's trace."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path

from evalsi.run_harness.model import Attempt, Task
from evalsi.run_harness.spec import CommandTarget
from evalsi.run_harness.targets.base import AttemptContext, AttemptFailed

STDERR_TAIL = 2000


class CommandAgent:
    def __init__(self, config: CommandTarget, base_dir: Path, otlp_endpoint: str | None = None) -> None:
        self.config = config
        self.base_dir = base_dir
        self.cwd = str(base_dir / config.cwd) if config.cwd else str(base_dir)
        self.identity = "command:" + " ".join(config.argv)
        self.otlp_endpoint = otlp_endpoint

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
                *argv, cwd=cwd, env=env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
        except OSError as e:
            raise AttemptFailed("crash", f"cannot start {self.config.argv[0]!r}: {e.strerror or e}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(data.encode()), ctx.timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise AttemptFailed("timeout", f"the command ran longer than {ctx.timeout_s:g}s; killed") from None
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
