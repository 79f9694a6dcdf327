"""glibc's malloc is told to give large freed blocks back (`tune_malloc`), only where glibc runs and unless the
environment chose a threshold already; Arrow's buffers come from jemalloc's pool (`tune_arrow_pool`)."""

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


POOL_SCRIPT = """
import pyarrow as pa
from evalsi.collector.heap import tune_arrow_pool
print(tune_arrow_pool(), pa.default_memory_pool().backend_name, pa.allocate_buffer(1 << 20).size)
"""


def _pool(env: dict[str, str]) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    return subprocess.run(
        [sys.executable, "-c", POOL_SCRIPT], capture_output=True, text=True, check=True, env={**clean, **env}
    ).stdout.split()


def _has_jemalloc() -> bool:
    import pyarrow as pa

    return "jemalloc" in pa.supported_memory_backends()


@pytest.mark.skipif(not _has_jemalloc(), reason="this pyarrow has no jemalloc pool")
def test_arrow_buffers_come_from_jemalloc_unless_the_environment_chose_a_pool() -> None:
    """Every process of `evalsi serve` takes Arrow's buffers from jemalloc's pool (its workers peaked ~30 MB
    lower than with pyarrow's default mimalloc); a pool named in `ARROW_DEFAULT_MEMORY_POOL` is left as it is."""
    assert _pool({}) == ["jemalloc", "jemalloc", str(1 << 20)]
    assert _pool({"ARROW_DEFAULT_MEMORY_POOL": "system"}) == ["system", "system", str(1 << 20)]
