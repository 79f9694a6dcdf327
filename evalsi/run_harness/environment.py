"""Task folders (`task.yaml`, `setup`, `check`, `teardown` scripts, `files/`): read as tasks, and run around each
attempt in a fresh working directory, the `check` script's JSON verdict becoming the `task-success` score.

Isolation is process-level only: the scripts and the agent run as local processes with a scrubbed environment in a
temporary directory, not in a container or a VM. Task scripts therefore run only when the run spec says
`environment.trust: local`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from evalsi.run_harness.model import Attempt, DatasetError, GivenScore, InfraError, Task
from evalsi.run_harness.spec import EnvironmentSpec
from evalsi.run_harness.targets.base import AttemptContext, AttemptFailed, TargetError

TASK_FILE = "task.yaml"
FILES_DIR = "files"
SCRIPTS = ("setup", "check", "teardown")
CHECK_SCORE = "task-success"
_TASK_KEYS = frozenset({"id", "instruction", "input", "reference", "context", "metadata", "tool_results", "user"})
_OUTPUT_LIMIT = 64_000
_current_workdir: contextvars.ContextVar[Path | None] = contextvars.ContextVar("evalsi_workdir", default=None)


def workdir() -> Path | None:
    """The working directory of the attempt this code runs in (for tools of the built-in agent), or None."""
    return _current_workdir.get()


def script(folder: Path, name: str) -> Path | None:
    """The folder's `name` script: `name`, `name.sh` or `name.py`."""
    for candidate in (folder / name, folder / f"{name}.sh", folder / f"{name}.py"):
        if candidate.is_file():
            return candidate
    return None


def has_scripts(task: Task) -> bool:
    return task.folder is not None and any(script(task.folder, n) for n in SCRIPTS)


def load_task_folder(folder: Path, line: int = 0, errors: list[str] | None = None) -> Task | None:
    """A task from its folder's `task.yaml` (`instruction` or `input`, `reference`, `context`, `metadata`,
    `tool_results`, `user`, `id`, default the folder's name). Problems are appended to `errors` (or raised)."""
    problems: list[str] = []
    where = folder / TASK_FILE
    try:
        doc = yaml.safe_load(where.read_text())
    except OSError as e:
        problems.append(f"{where}: cannot read: {e.strerror}")
        doc = None
    except yaml.YAMLError as e:
        problems.append(f"{where}: not YAML: {e}")
        doc = None
    if not problems and not isinstance(doc, dict):
        problems.append(f"{where}: expected a mapping (instruction, reference, ...)")
    if problems:
        if errors is None:
            raise DatasetError(problems)
        errors.extend(problems)
        return None
    assert isinstance(doc, dict)
    for key in sorted(set(doc) - _TASK_KEYS):
        problems.append(f"{where}: {key}: unknown key (keys: {', '.join(sorted(_TASK_KEYS))})")
    task_input = doc.get("input", doc.get("instruction"))
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        problems.append(f"{where}: metadata: must be a mapping")
        metadata = {}
    for key in ("tool_results", "user"):
        if key in doc:
            metadata = {**metadata, key: doc[key]}
    if task_input is None and not isinstance(metadata.get("user"), dict):
        problems.append(f"{where}: instruction: missing (what the agent is asked to do)")
    reference = doc.get("reference") or {}
    if not isinstance(reference, dict):
        reference = {"expected_output": reference}
    context = doc.get("context") or []
    if isinstance(context, str):
        context = [context]
    if not isinstance(context, list):
        problems.append(f"{where}: context: must be a string or a list of strings")
    if problems:
        if errors is None:
            raise DatasetError(problems)
        errors.extend(problems)
        return None
    task_id = str(doc.get("id") or folder.name)
    return Task(task_id, task_input, reference, [str(c) for c in context], metadata, line, folder.resolve())


def load_task_folders(directory: Path) -> list[Task]:
    """Every task folder (a subdirectory holding `task.yaml`) of `directory`, by name."""
    errors: list[str] = []
    folders = sorted(p for p in directory.iterdir() if (p / TASK_FILE).is_file())
    if not folders:
        raise DatasetError([f"{directory}: no task folders (subdirectories holding {TASK_FILE})"])
    tasks = [t for i, f in enumerate(folders, 1) if (t := load_task_folder(f, i, errors)) is not None]
    seen: dict[str, Path] = {}
    for t in tasks:
        if t.id in seen:
            errors.append(f"{t.folder}: id {t.id!r} is already the id of {seen[t.id]}")
        seen[t.id] = t.folder or directory
    if errors:
        raise DatasetError(errors)
    return tasks


def check_trust(tasks: list[Task], spec: EnvironmentSpec) -> None:
    """Refuse to run task scripts unless the run spec trusts them."""
    if spec.trust == "local":
        return
    with_scripts = [t for t in tasks if has_scripts(t)]
    if with_scripts:
        names = ", ".join(str(t.folder) for t in with_scripts[:3])
        raise TargetError(
            f"spec.environment.trust: {len(with_scripts)} task(s) have setup/check/teardown scripts ({names}); they "
            "run as local processes with no sandbox. Read them, then set `environment: {trust: local}` to run them"
        )


class ScriptFailed(Exception):
    pass


class TaskEnvironment:
    """Runs attempts of task folders: a fresh working directory with the folder's `files/`, `setup` before the
    agent, `check` after it (its verdict a `task-success` score from the checker), `teardown` always."""

    def __init__(self, spec: EnvironmentSpec) -> None:
        self.spec = spec
        self.kept: list[Path] = []

    def applies(self, task: Task) -> bool:
        return task.folder is not None

    def _env(self, task: Task, ctx: AttemptContext, work: Path, answer: Path | None) -> dict[str, str]:
        env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "SYSTEMROOT") if k in os.environ}
        env.update({k: os.environ[k] for k in self.spec.pass_env if k in os.environ})
        env.update(
            HOME=str(work), TMPDIR=str(work), EVALSI_TASK_ID=task.id, EVALSI_TRIAL=str(ctx.trial),
            EVALSI_WORKDIR=str(work), EVALSI_TASK_DIR=str(task.folder), EVALSI_RUN_ID=ctx.run_id,
            PYTHONDONTWRITEBYTECODE="1",
        )  # fmt: skip
        if answer is not None:
            env["EVALSI_ANSWER_FILE"] = str(answer)
        return env

    async def _script(self, path: Path, env: dict[str, str], cwd: Path, timeout: float) -> str:
        """Run a script; its stdout. ScriptFailed on a non-zero exit or the timeout (the process group killed)."""
        if path.suffix == ".py":
            argv = [sys.executable, str(path)]
        elif path.suffix == ".sh" or not os.access(path, os.X_OK):
            argv = ["bash", str(path)]
        else:
            argv = [str(path)]
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise ScriptFailed(f"{path.name} did not finish in {timeout:g}s (killed)") from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-500:] or out.decode(errors="replace").strip()[-500:]
            raise ScriptFailed(f"{path.name} exited with {proc.returncode}" + (f": {tail}" if tail else ""))
        return out.decode(errors="replace")[:_OUTPUT_LIMIT]

    async def run(
        self, task: Task, ctx: AttemptContext, agent: Callable[[AttemptContext], Awaitable[Attempt]]
    ) -> Attempt:
        """The attempt inside the task's environment. A failing setup is an `environment` infrastructure error; a
        checker that crashes, times out or prints no verdict is a `checker` one (the agent's steps are kept)."""
        assert task.folder is not None
        work = Path(tempfile.mkdtemp(prefix=f"evalsi-{ctx.run_id[:40]}-"))
        answer_file = work.parent / f"{work.name}.answer"
        files = task.folder / FILES_DIR
        attempt: Attempt | None = None
        try:
            if files.is_dir():
                shutil.copytree(files, work, dirs_exist_ok=True)
            env = self._env(task, ctx, work, None)
            setup = script(task.folder, "setup")
            if setup is not None:
                try:
                    await self._script(setup, env, work, self.spec.setup_timeout)
                except ScriptFailed as e:
                    raise AttemptFailed("environment", f"setup: {e}") from None
            token = _current_workdir.set(work)
            try:
                attempt = await agent(replace(ctx, workdir=work))
            finally:
                _current_workdir.reset(token)
            check = script(task.folder, "check")
            if check is not None and attempt.error is None:
                answer_file.write_text(attempt.output_text or "")
                try:
                    verdict = await self._script(
                        check, self._env(task, ctx, work, answer_file), work, self.spec.check_timeout
                    )
                    attempt.scores.append(parse_verdict(verdict))
                except (ScriptFailed, ValueError) as e:
                    attempt.error = InfraError("checker", f"check: {e}")
            return attempt
        except AttemptFailed as e:
            if e.attempt is None and attempt is not None:
                e.attempt = attempt
            raise
        finally:
            teardown = script(task.folder, "teardown")
            if teardown is not None:
                with contextlib.suppress(ScriptFailed, OSError):
                    await self._script(teardown, self._env(task, ctx, work, None), work, self.spec.teardown_timeout)
            answer_file.unlink(missing_ok=True)
            if self.spec.keep_workdirs:
                self.kept.append(work)
            else:
                shutil.rmtree(work, ignore_errors=True)


def parse_verdict(stdout: str) -> GivenScore:
    """The checker's verdict: the last line of its output that is a JSON object `{"passed": bool, "score": 0..1,
    "details": ...}`; ValueError saying what is wrong otherwise."""
    doc: Any = None
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
                break
            except ValueError:
                continue
    if not isinstance(doc, dict):
        shown = stdout.strip()[-200:]
        raise ValueError(f'no JSON verdict {{"passed": ..., "score": ...}} on its output: {shown!r}')
    passed = doc.get("passed")
    score = doc.get("score")
    if not isinstance(passed, bool):
        raise ValueError(f"the verdict's `passed` is not true or false: {passed!r}")
    if score is None:
        score = 1.0 if passed else 0.0
    if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
        raise ValueError(f"the verdict's `score` is not a number from 0 to 1: {score!r}")
    details = doc.get("details")
    explanation = details if isinstance(details, str) or details is None else json.dumps(details, default=str)
    return GivenScore(CHECK_SCORE, value=float(score), passed=passed, explanation=explanation, source="checker",
                      label="passed" if passed else "failed")  # fmt: skip
