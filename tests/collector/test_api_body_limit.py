"""The API's request bodies (evalsi.collector.body_limit): a real `evalsi serve` on its default limits answers a body
past its route's limit with 413 naming the limit and the key that raises it, whether the body declares its length or
comes chunked (then read no further than the limit: the collector's memory does not grow with it), and still takes
bodies under the limit; every POST/PUT/PATCH route of the app's route table is limited, one added later too; a bad
limit is a config error naming its key; and while a memory_limiter refuses, the API's body routes refuse too, with 503
and Retry-After, and count what they read against its hard limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.collector.api import BULK_ROUTES, build_api
from evalsi.collector.config import ApiConfig, ConfigError, parse_config
from evalsi.component import Refused, Settings
from evalsi.processors.memory_limiter import MIB, Limiter, Limits, MemoryLimiter, MemoryLimiterConfig
from evalsi.runtime.telemetry import SelfMetrics

USUAL, BULK = 4 * MIB, 20 * MIB  # the defaults
USUAL_KEY, BULK_KEY = "service.api.max_request_body_size", "service.api.max_bulk_request_body_size"
TRACE_ID = "ab" * 16


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp("body-limit")
    c = start_collector(tmp, serve_config(tmp / "store"))  # the default limits: no api limit keys set
    yield c
    assert c.stop() == 0


def _refusal(resp: httpx.Response, limit: int, key: str) -> str:
    assert resp.status_code == 413, resp.text[:500]
    doc = resp.json()
    assert doc["status"] == 413 and doc["limit"] == limit and doc["key"] == key
    assert f"exceeds the limit of {limit} bytes" in doc["detail"] and f"raise {key}" in doc["detail"]
    return str(doc["detail"])


# a JSON document just past the size: what each route would parse whole
def _json_of(size: int) -> bytes:
    return b'{"pad": "' + b"x" * size + b'"}'


@pytest.mark.parametrize(
    ("path", "limit", "key"),
    [
        ("/v1/feedback", USUAL, USUAL_KEY),
        ("/api/v1/spans/stored", USUAL, USUAL_KEY),
        ("/v1/runs", USUAL, USUAL_KEY),
        ("/v1/traces/select", USUAL, USUAL_KEY),
        ("/v1/evaluate", BULK, BULK_KEY),
        ("/v1/runs/r.1/score", BULK, BULK_KEY),
        ("/v1/no-such-route", USUAL, USUAL_KEY),
    ],
)
def test_a_declared_body_past_the_limit_gets_413_naming_the_key(
    collector: Collector, path: str, limit: int, key: str
) -> None:
    body = _json_of(limit)
    resp = httpx.post(collector.api + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    detail = _refusal(resp, limit, key)
    assert f"request body of {len(body)} bytes" in detail and f"POST {path}" in detail


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize(
    ("path", "limit", "key"), [("/v1/feedback", USUAL, USUAL_KEY), ("/v1/evaluate", BULK, BULK_KEY)]
)
def test_a_chunked_body_past_the_limit_gets_413_and_is_never_held(
    collector: Collector, path: str, limit: int, key: str
) -> None:
    """200 MB with no Content-Length: refused once it passes the limit, and the collector's resident memory (read 20
    times a second while it streams) grows by nothing like the body's size."""
    total, chunk = 200 * MIB, b"x" * MIB
    pid = collector.proc.pid
    before = _rss(pid)
    peak = [before]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                peak[0] = max(peak[0], _rss(pid))
            time.sleep(0.05)

    def body() -> Iterator[bytes]:
        yield b'{"pad": "'
        for _ in range(total // len(chunk)):
            yield chunk

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        resp = httpx.post(collector.api + path, content=body(), headers={"content-type": "application/json"},
                          timeout=120)  # fmt: skip
    finally:
        done.set()
        watcher.join()
    assert "transfer-encoding" not in resp.request.headers or resp.request.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in resp.request.headers
    assert peak[0] - before < limit + 48 * MIB, f"RSS grew by {(peak[0] - before) // MIB} MiB for a refused body"
    detail = _refusal(resp, limit, key)
    assert detail.startswith(f"request body exceeds the limit of {limit} bytes for POST {path}")


def test_bodies_under_the_limit_are_taken_and_the_bulk_routes_take_more(collector: Collector) -> None:
    """Feedback as ever; 6 MiB, past the usual limit, refused on feedback and taken by evaluate."""
    api = collector.api
    resp = httpx.post(api + "/v1/feedback", json={"trace_id": TRACE_ID, "name": "thumbs", "value": True}, timeout=30)
    assert resp.status_code == 200, resp.text
    outputs = ["y" * (64 * 1024)] * 96  # 6 MiB: over max_request_body_size, under max_bulk_request_body_size
    body = {"records": [{"output": o} for o in outputs], "evaluators": [{"ref": "builtin/length"}]}
    resp = httpx.post(api + "/v1/feedback", json=body, timeout=60)
    _refusal(resp, USUAL, USUAL_KEY)
    resp = httpx.post(api + "/v1/evaluate", json=body, timeout=60)
    assert resp.status_code == 200, resp.text[:500]
    assert len(resp.json()["results"]) == len(outputs)
    assert httpx.get(api + "/healthz").status_code == 200


# --- every route of the app's table, in process ---------------------------------------------------------------

SMALL, LARGE = 1000, 3000
BODY_METHODS = {"POST", "PUT", "PATCH"}


def _url(route: APIRoute) -> str:
    return re.sub(r"\{[^}]+\}", "r.1", route.path)


async def _limited(app: Any, method: str, url: str, size: int) -> tuple[httpx.Response, httpx.Response, int]:
    """The answers to a body of `size` + 1 bytes, declared then chunked, and the status of one of `size` bytes."""

    async def chunked() -> Any:
        for _ in range(size + 1):
            yield b"x"

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://api") as client:
        declared = await client.request(method, url, content=b"x" * (size + 1))
        streamed = await client.request(method, url, content=chunked())
        under = await client.request(method, url, content=b"x" * size)
    return declared, streamed, under.status_code


def test_every_route_taking_a_body_in_the_route_table_is_limited() -> None:
    app = build_api(None, dict, config=ApiConfig(max_request_body_size=SMALL, max_bulk_request_body_size=LARGE))

    @app.put("/v1/added-later")  # a route added after build_api: covered all the same
    async def added_later(body: Any = None) -> dict[str, Any]:
        return {}

    checked = []
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        for method in sorted(route.methods & BODY_METHODS):
            limit, key = (LARGE, BULK_KEY) if route.path in BULK_ROUTES else (SMALL, USUAL_KEY)
            declared, streamed, under = asyncio.run(_limited(app, method, _url(route), limit))
            _refusal(declared, limit, key)
            _refusal(streamed, limit, key)
            assert under != 413, f"{method} {route.path}: {limit} bytes refused"
            checked.append(f"{method} {route.path}")
    assert {"POST /v1/evaluate", "POST /v1/feedback", "POST /v1/runs/{run_id}/score", "PUT /v1/added-later"} <= set(
        checked
    )
    assert BULK_ROUTES <= {c.split(" ", 1)[1] for c in checked}, "a bulk route is not in the route table"


# --- config --------------------------------------------------------------------------------------------------


def _service(api: dict[str, Any]) -> dict[str, Any]:
    return {
        "receivers": {"otlp": {}},
        "exporters": {"clickhouse": {}},
        "service": {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}}, "api": api},
    }


def test_the_limits_are_config_keys_and_a_bad_value_names_its_path() -> None:
    cfg = parse_config(_service({"max_request_body_size": 65536, "max_bulk_request_body_size": 1 << 30}))
    assert (cfg.service.api.max_request_body_size, cfg.service.api.max_bulk_request_body_size) == (65536, 1 << 30)
    assert parse_config(_service({})).service.api.max_request_body_size == USUAL
    for value, says in [(0, "must be at least 1"), (-1, "must be at least 1"), (True, "not true/false"),
                        ("4MB", "valid integer")]:  # fmt: skip
        for key in ("max_request_body_size", "max_bulk_request_body_size"):
            with pytest.raises(ConfigError) as info:
                parse_config(_service({key: value}))
            assert [e for e in info.value.errors if e.startswith(f"service.api.{key}: ") and says in e], info.value


# --- the memory limiter ----------------------------------------------------------------------------------------


class _Guard:
    """A memory_limiter as the API sees it: what it admitted, what it released."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.admitted: list[int] = []
        self.released: list[int] = []

    def admit_body(self, size: int) -> None:
        if self.refuse:
            raise Refused("memory_limiter: over the limit; retry later", unavailable=True, retry_after=2.5)
        self.admitted.append(size)

    def release_body(self, size: int) -> None:
        self.released.append(size)


def test_the_api_asks_the_memory_limiter_before_reading_a_body_and_releases_after_the_answer() -> None:
    guard = _Guard()
    app = build_api(None, dict, config=ApiConfig(max_request_body_size=SMALL), memory=[guard])

    async def send() -> list[int]:
        async def chunked() -> Any:
            for _ in range(3):
                yield b"x" * 100

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://api") as client:
            statuses = [(await client.post("/v1/feedback", content=b"x" * 500)).status_code]
            statuses.append((await client.post("/v1/feedback", content=chunked())).status_code)
            statuses.append((await client.get("/healthz")).status_code)
        return statuses

    assert asyncio.run(send()) == [400, 400, 200]  # not JSON: the route still answers
    # the declared size at once; a chunked body as it comes; a GET is not asked
    assert guard.admitted == [500, 0, 100, 100, 100]
    assert guard.released == [500, 300]

    refusing = _Guard(refuse=True)
    app = build_api(None, dict, memory=[refusing])

    async def refused() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://api") as client:
            return await client.post("/v1/feedback", json={}), await client.get("/healthz")

    post, get = asyncio.run(refused())
    assert post.status_code == 503 and post.headers["retry-after"] == "3"
    assert post.json()["detail"] == "memory_limiter: over the limit; retry later"
    assert get.status_code == 200


def test_admitted_bodies_count_against_the_hard_limit_until_answered() -> None:
    metrics = SelfMetrics()
    settings = Settings(id="memory_limiter", metrics=metrics, logger=logging.getLogger("test.api_body"))
    proc = MemoryLimiter(MemoryLimiterConfig(limit_mib=1000), settings, None)  # type: ignore[arg-type]
    usage = [700 * MIB]
    proc.limiter = Limiter(
        Limits(hard=1000 * MIB, soft=800 * MIB, source="limit_mib"), lambda: usage[0], lambda why: None,
        gc_soft=10, gc_hard=0, log=settings.logger,
    )  # fmt: skip
    proc.limiter.check()
    proc.admit_body(60 * MIB)  # parsed, some 180 MiB: 880 of 1000
    with pytest.raises(Refused) as info:
        proc.admit_body(60 * MIB)  # another: 1060, past the hard limit, though memory is under the soft one
    assert info.value.unavailable and info.value.retry_after >= 1
    assert "would pass the hard limit of 1000 MiB" in str(info.value)
    proc.release_body(60 * MIB)  # the first one answered
    proc.admit_body(60 * MIB)
    usage[0] = 850 * MIB  # above the soft limit: even a request without a body is refused
    proc.limiter.check()
    with pytest.raises(Refused, match="above its soft limit of 800 MiB"):
        proc.admit_body(0)
    refused = metrics.registry.get_sample_value(
        "evalsi_memory_limiter_refused_api_requests_total", {"processor": "memory_limiter"}
    )
    assert refused == 2


def test_a_collector_over_its_memory_limit_refuses_api_bodies_with_503(tmp_path: Path) -> None:
    """A memory_limiter whose limit the collector is always above: OTLP is refused, and so is every API route that
    takes a body, with Retry-After; reads still answer."""
    cfg = serve_config(tmp_path / "store")
    cfg["processors"]["memory_limiter"] = {"check_interval": "100ms", "limit_mib": 1}
    cfg["service"]["pipelines"]["traces"]["processors"] = ["memory_limiter", "normalize"]
    c = start_collector(tmp_path, cfg)
    try:
        metrics = c.metrics
        assert wait_until(lambda: 'evalsi_memory_limiter_refusing{processor="memory_limiter"} 1.0' in httpx.get(
            metrics).text)  # fmt: skip
        for path, body in [
            ("/v1/feedback", {"trace_id": TRACE_ID, "name": "thumbs", "value": True}),
            ("/v1/evaluate", {"records": [{"output": "x"}], "evaluators": [{"ref": "builtin/length"}]}),
            ("/api/v1/spans/stored", {"trace_ids": [TRACE_ID]}),
        ]:
            resp = httpx.post(c.api + path, json=body, timeout=30)
            assert resp.status_code == 503, (path, resp.text)
            assert int(resp.headers["retry-after"]) >= 1
            assert resp.json()["detail"].startswith("memory_limiter: the collector uses ")
        assert httpx.get(c.api + "/api/v1/traces").status_code == 200
        assert httpx.get(c.api + "/healthz").status_code == 200
    finally:
        assert c.stop() == 0
