"""Shared fixtures: a running collector per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from running_collector import Collector, serve_config, start_collector


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = start_collector(tmp_path, serve_config(tmp_path / "store"))
    yield c
    if c.proc.poll() is None:
        c.stop()
