"""Fixtures of the harness tests: one real collector per test module, started on the embedded store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from running_collector import Collector, serve_config, start_collector


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp("collector")
    c = start_collector(tmp, serve_config(tmp / "store"))
    yield c
    c.stop()
