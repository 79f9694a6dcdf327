"""Shared fixtures: a running collector per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from running_collector import Collector, serve_config, start_collector


@pytest.fixture
def collector(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Collector]:
    """A collector with the test defaults; parametrize it indirectly with N to run its pipelines in N workers."""
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = getattr(request, "param", 1)
    c = start_collector(tmp_path, cfg)
    yield c
    if c.proc.poll() is None:
        c.stop()
