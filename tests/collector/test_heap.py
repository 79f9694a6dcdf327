"""glibc's malloc is told to give large freed blocks back (`tune_malloc`), only where glibc runs and unless the
environment chose a threshold already."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

SCRIPT = """
from evalsi.collector.heap import tune_malloc
print(tune_malloc())
"""


def _tuned(env: dict[str, str]) -> str:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, env={**os.environ, **env}
    ).stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's numbers are glibc's")
def test_glibc_gets_the_mmap_threshold_unless_the_environment_set_one() -> None:
    assert _tuned({}) == "True"
    assert _tuned({"MALLOC_MMAP_THRESHOLD_": "65536"}) == "False"
