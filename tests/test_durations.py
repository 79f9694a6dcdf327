"""One duration syntax everywhere: every config key, API parameter and CLI option that takes a duration (or a time
written as one) accepts the same set, read by `evalsi.duration`."""

from __future__ import annotations

import importlib
import pkgutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from evalsi_cli import evalsi_cli
from fastapi.testclient import TestClient
from local_server import free_port
from pydantic import BaseModel, TypeAdapter

import evalsi
from evalsi.collector.api import build_api
from evalsi.duration import MAX_SECONDS, parse_duration, parse_time

DURATIONS = {"500ms": 0.5, "5s": 5.0, "1m30s": 90.0, "2h": 7200.0, "7d": 604_800.0, "1d12h": 129_600.0}
TIMES = ["2026-05-01", "2026-05-01T12:00:00Z"]
NOT_DURATIONS = ["5x", "1 day", "", "d", "-5s"]


@pytest.mark.parametrize(("text", "seconds"), DURATIONS.items())
def test_the_syntax(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    now = time.time_ns()
    assert parse_time(text, now) == now - int(seconds * 1e9)


@pytest.mark.parametrize("text", [*NOT_DURATIONS, "9" * 400 + "h"])
def test_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_the_longest_duration() -> None:
    with pytest.raises(ValueError, match="longer than"):
        parse_duration(f"{int(MAX_SECONDS // 86_400) + 1}d")


def _models() -> Iterator[type[BaseModel]]:
    for info in pkgutil.walk_packages(evalsi.__path__, "evalsi."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    seen: set[type] = set()
    todo: list[type] = [BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                if sub.__module__.startswith("evalsi."):
                    yield sub


def _duration_keys() -> dict[str, Any]:
    """Every config field whose type is read by `parse_duration`, by `module.Model.field`."""
    found: dict[str, Any] = {}
    for model in _models():
        for name, field in model.model_fields.items():
            annotation = field.rebuild_annotation()
            if "parse_duration" in repr(annotation):
                found[f"{model.__module__}.{model.__qualname__}.{name}"] = annotation
    return found


def test_every_config_key_taking_a_duration_accepts_the_syntax() -> None:
    keys = _duration_keys()
    assert len(keys) >= 40, sorted(keys)  # the receivers', processors', exporters', policies' and auth's
    for key, annotation in keys.items():
        adapter = TypeAdapter(annotation)
        for text, seconds in DURATIONS.items():
            assert adapter.validate_python(text) == seconds, key
        for text in NOT_DURATIONS:
            with pytest.raises(ValueError, match="invalid duration"):
                adapter.validate_python(text)


class _EmptyStore:
    """A store holding nothing: the API's parameters are checked before it is asked."""

    description = "empty store"

    def search_traces(self, **kwargs: Any) -> list[dict[str, Any]]:
        return []

    def list_sessions(self, **kwargs: Any) -> list[dict[str, Any]]:
        return []

    def list_alerts(self, **kwargs: Any) -> list[dict[str, Any]]:
        return []

    def score_window_stats(self, **kwargs: Any) -> list[dict[str, Any]]:
        return []

    def judge_agreement(self, **kwargs: Any) -> dict[str, list[dict[str, Any]]]:
        return {"pairs": [], "totals": []}


API_PARAMS = {
    ("/api/v1/traces", "since"): True,
    ("/api/v1/traces", "until"): True,
    ("/api/v1/traces", "min_duration"): False,
    ("/api/v1/sessions", "since"): True,
    ("/api/v1/sessions", "until"): True,
    ("/api/v1/alerts", "since"): True,
    ("/api/v1/policies/stats", "window"): False,
    ("/api/v1/policies/stats", "baseline"): False,
}
"""Every API parameter taking a duration: True where it is a time (a duration back from now, or ISO-8601)."""


@pytest.mark.parametrize(("path", "param"), API_PARAMS)
def test_every_api_parameter_taking_a_duration_accepts_the_syntax(path: str, param: str) -> None:
    client = TestClient(build_api(_EmptyStore(), dict))  # type: ignore[arg-type]
    for text in [*DURATIONS, *(TIMES if API_PARAMS[path, param] else [])]:
        resp = client.get(path, params={param: text})
        assert resp.status_code == 200, (path, param, text, resp.text)
    for text in NOT_DURATIONS[:2]:
        resp = client.get(path, params={param: text})
        assert resp.status_code == 400, (path, param, text)
        assert text in resp.json()["detail"] and "7d" in resp.json()["detail"], resp.text


@pytest.fixture(scope="module")
def api_url() -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_api(_EmptyStore(), dict), port=port, log_level="warning"))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the API did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)


CLI_OPTIONS = {
    ("traces", "list", "--since"): True,
    ("traces", "list", "--until"): True,
    ("traces", "list", "--min-duration"): False,
    ("sessions", "list", "--since"): True,
    ("sessions", "list", "--until"): True,
    ("alerts", "list", "--since"): True,
    ("policies", "stats", "--window"): False,
    ("policies", "stats", "--baseline"): False,
}
"""Every CLI option taking a duration (that reads through the API): True where it is a time."""


@pytest.mark.parametrize("option", CLI_OPTIONS)
def test_every_cli_option_taking_a_duration_accepts_the_syntax(option: tuple[str, str, str], api_url: str) -> None:
    *command, flag = option
    for text in [*DURATIONS, *(TIMES if CLI_OPTIONS[option] else [])]:
        res = evalsi_cli(*command, flag, text, "--api", api_url)
        assert res.returncode == 0, (option, text, res.stdout, res.stderr)
    res = evalsi_cli(*command, flag, "5x", "--api", api_url)
    assert res.returncode != 0 and "'5x'" in res.stderr and "7d" in res.stderr, (option, res.stderr)
