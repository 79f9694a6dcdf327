"""The `evalsi` command run in the test's own process (typer's CliRunner), answered as a finished subprocess would be.

A subprocess costs ~2 s of imports per call; in-process it costs the command's own work. Use it wherever the process
boundary is not what a test checks (`validate`, commands reading through `--api`); a test of start-up, signals or a
command that opens the embedded store (one chDB path per process) keeps a real `python -m evalsi`."""

from __future__ import annotations

import os
import subprocess
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from typer.testing import CliRunner


@contextmanager
def _working_directory(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def evalsi_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`evalsi ARGS` in this process: its exit code, stdout and stderr (an uncaught exception's traceback in stderr,
    exit code 1, as the interpreter would)."""
    from evalsi.cli import app

    with _working_directory(cwd):
        result = CliRunner().invoke(app, list(args), prog_name="evalsi")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["evalsi", *args], result.exit_code, result.stdout, stderr)
