"""Shared fixtures (a running collector per test) and how the suite runs in parallel (pytest-xdist).

The suite mostly waits: on `evalsi serve` processes, a real `mlflow server`, `phoenix serve` and Prometheus, on
outages and decision waits. So it runs in more workers than cores (`-n auto`: two a core), and a test that shares a
server with others runs in the same worker as they do: every test whose fixtures outlive it (module-, class- or
session-scoped) is put in an xdist group named after what it shares, so that fixture starts once, in one worker
(`--dist loadgroup`). Tests with only their own fixtures spread one by one.

Hypothesis runs the `ci` profile (a budget fit for every run); `HYPOTHESIS_PROFILE=deep` runs the deep one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import budget
import pytest
from hypothesis import settings
from running_collector import Collector, serve_config, start_collector

TESTS = Path(__file__).resolve().parent


def _one_default_ssl_context() -> None:
    """httpx's top-level calls (`httpx.get`, `httpx.post`, ...) build a Client, and with it a default SSL context
    (~30 ms of CPU loading certifi's bundle), on every call; the tests' polling loops make thousands of them. They
    get one context, the same default one; each call still has a client and a connection of its own."""
    import functools

    import httpx

    context = httpx.create_ssl_context()  # what each call would have built (SSL_CERT_FILE, certifi)
    for name in ("request", "stream", "get", "options", "head", "post", "put", "patch", "delete"):
        call = getattr(httpx, name)

        @functools.wraps(call)
        def with_shared_context(*args: Any, _call: Any = call, **kwargs: Any) -> Any:
            kwargs.setdefault("verify", context)
            return _call(*args, **kwargs)

        setattr(httpx, name, with_shared_context)


_one_default_ssl_context()

settings.register_profile("ci", deadline=None, print_blob=True)
settings.register_profile("deep", deadline=None, print_blob=True, max_examples=1_000)
settings.load_profile(budget.PROFILE)


@pytest.fixture
def collector(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Collector]:
    """A collector with the test defaults; parametrize it indirectly with N to run its pipelines in N workers."""
    cfg = serve_config(tmp_path / "store")
    cfg["service"]["workers"] = getattr(request, "param", 1)
    c = start_collector(tmp_path, cfg)
    yield c
    if c.proc.poll() is None:
        c.stop()


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real `mlflow server` for the whole run (20-90 s to start): the MLflow exporter's and pull receiver's
    tests share it, each in experiments of its own, and so run in one xdist worker."""
    from mlflow_server import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Two workers a core (at most 8): the tests wait on real processes far more than they compute."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(2, min(8, 2 * cores))


def _shared_fixture_group(item: pytest.Item) -> str | None:
    """The xdist group of a test whose suite-defined fixtures outlive it: the session fixture's name, else the module
    (with the parameters of its module-scoped fixtures, so each parameter's fixture may run in its own worker)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module_params: list[str] = []
    shared_module = False
    callspec = getattr(item, "callspec", None)
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if not defs:
            continue
        fixturedef = defs[-1]
        scope = fixturedef.scope
        if scope == "function":
            continue
        code = getattr(fixturedef.func, "__code__", None)
        if code is None or TESTS not in Path(code.co_filename).resolve().parents:
            continue  # pytest's own (tmp_path_factory, ...) or a plugin's
        if scope in ("session", "package"):
            return f"fixture:{name}"
        shared_module = True
        if callspec is not None and name in callspec.params:
            module_params.append(f"{name}={callspec.indices[name]}")
    if not shared_module:
        return None
    module = item.nodeid.split("::", 1)[0]
    return module + (f":{','.join(module_params)}" if module_params else "")  # never `@` or `]`: xdist splits on them


def _tag(item: pytest.Item, group: str) -> None:
    """Put `item` in xdist group `group` as `--dist loadgroup` reads it: `<node id>@<group>`. pytest-xdist 3.8 writes
    that id to `item._nodeid`, which pytest 9.2 no longer reads (it keeps ids structured, in `item._id`)."""
    tagged = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(tagged)
    else:
        item._nodeid = tagged


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):
        return  # not an xdist worker of a `--dist loadgroup` run
    grouped = set()
    for item in items:
        marked = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})  # fmt: skip
        group = "_".join(marked) if marked else _shared_fixture_group(item)
        if group is not None:
            _tag(item, group)
            grouped.add(item.nodeid)
    # the groups (long: a server and the tests that share it) are handed out first, single tests fill in the end
    items.sort(key=lambda item: item.nodeid not in grouped)
