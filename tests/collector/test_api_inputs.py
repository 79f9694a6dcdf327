"""Hostile values through every query filter of a real `evalsi serve`, on the embedded store (chDB) and on a server
through clickhouse-connect (the ClickHouse HTTP stand-in): each answers 400 saying what is wrong, or matches its
value literally. Never a 500, never another value's rows.

Bound parameters are read by ClickHouse as escaped text (`\\x73` is `s`, a lone `\\` an error), so a service named
`\\x73ec-svc` must not find `sec-svc`, and `\\` must find the service named `\\`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from clickhouse_http import StandInProcess, start_stand_in
from running_collector import Collector, serve_config, start_collector

from evalsi.exporters.clickhouse.backend import open_backend
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.model.score import Score
from evalsi.model.span import Span

# services the collector stores, one trace each: look-alikes of one another once escapes are read
SERVICES = ["sec-svc", "\\x73ec-svc", "back\\slash", "\\", "\\\\", "tab\\tsvc", "ünï ✈ 🚀", "' OR 1=1 --"]
# values sent through the filters: injections, escapes, control characters, unicode, long values
HOSTILE = [
    "' OR 1=1 --", "') OR ('1'='1", "'; DROP TABLE otel_traces; --", "\\", "\\\\", "\\x73ec-svc", "\\x73", "\\N",
    "\\0", "\\'", "sec-svc\n", "sec-svc\x00", "\x00", "a\tb", "sec-svc\r", "%", "_", "sec%", "{service:String}",
    "{service_hex:String}", "535c", "ünï ✈ 🚀", "\u202e", "sec-svc\u200b", "x" * 1000,
]  # fmt: skip
TOO_LONG = "x" * 1001
ARABIC_ONE = "\u0661"  # a digit to str.isdigit, not to a trace id
BAD_TRACE_IDS = [
    "a" * 32 + "\n", "a" * 31 + "\n", "a" * 32 + "\x00", "' OR 1=1 --", "g" * 32, "a" * 33, "a" * 31, "",
    " " + "a" * 31, ARABIC_ONE * 32, "0x" + "a" * 30, "a" * 5000, "%", "\\x61" * 8,
]  # fmt: skip
BAD_SPAN_IDS = ["a" * 16 + "\n", "a" * 15, "g" * 16, "' OR 1=1 --", "a" * 32, "\\x61" * 4]
BAD_RUN_IDS = ["r.1\n", "r.1\x00", "' OR 1=1 --", "r\\.1", "x" * 201, "r 1", "ünï", "r.1;DROP"]
BAD_LIMITS = ["-1", "0", "1e3", "NaN", "inf", "", "1; DROP", str(10**20), str(2**32), "0x10", ARABIC_ONE]
BAD_WINDOWS = ["99999999h", "87601h", "-5m", "0s", "0", "1e400h", "NaN", "inf", "5", "9" * 400 + "h", "5m\x00", "5m'",
               "x" * 101, "' OR 1=1 --", "\\x35m"]  # fmt: skip
BAD_SINCE: list[Any] = [-1, 2**63, 2**70, 1e30, "x", "' OR 1=1 --", None]


def _otlp(service: str, trace_id: str, span_id: str, start: int) -> dict[str, Any]:
    return {
        "resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
            "scopeSpans": [{"spans": [{
                "traceId": trace_id, "spanId": span_id, "name": f"root of {service}", "kind": 2,
                "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 1_000_000),
            }]}],
        }]
    }  # fmt: skip


def _run_body(trace_id: str, *, trial: int = 0, name: str = "x", wait_s: float = 0) -> dict[str, Any]:
    """A run scoring request for one trace, with a checker's score (no evaluator to run)."""
    return {
        "name": name, "wait_s": wait_s,
        "traces": [{"trace_id": trace_id, "task_id": "t", "trial": trial, "scores": [{"name": "checked", "value": 1}]}],
    }  # fmt: skip


class Served:
    """The collector, what it stores, and where each service's trace is."""

    def __init__(self, collector: Collector, kind: str) -> None:
        self.c = collector
        self.kind = kind
        self.trace_of: dict[str, str] = {}
        self.run_policies = {"run:p\\x73": "r.1", "run:ps": "r.2", "run:\\": "r.3"}

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(self.c.api + path, params=params, timeout=30)

    def post(self, path: str, body: Any) -> httpx.Response:
        return httpx.post(self.c.api + path, json=body, timeout=60)


@pytest.fixture(scope="module", params=["chdb", "clickhouse-connect"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp(f"api_inputs_{request.param}")
    cfg = serve_config(tmp / "store")
    stand_in: StandInProcess | None = None
    if request.param == "clickhouse-connect":
        stand_in = start_stand_in(tmp / "clickhouse", password="pw")
        cfg["exporters"]["clickhouse"] = {"endpoint": stand_in.url, "password": "pw", "flush_interval": "100ms"}
    c = start_collector(tmp, cfg)
    try:
        s = Served(c, request.param)
        now = time.time_ns()
        for i, service in enumerate(SERVICES):
            trace_id = os.urandom(16).hex()
            resp = httpx.post(c.http + "/v1/traces", json=_otlp(service, trace_id, os.urandom(8).hex(), now - i * 1000))
            assert resp.status_code == 200, resp.text
            s.trace_of[service] = trace_id
        assert c.wait_stored(len(SERVICES)) == len(SERVICES)
        # scores under policies that are look-alikes once escapes are read, each in its own run
        for policy, run_id in s.run_policies.items():
            trace = s.trace_of["sec-svc"]
            assert s.post("/v1/runs", {"run_id": run_id, "name": "inputs", "status": "running"}).status_code == 200
            resp = s.post(f"/v1/runs/{run_id}/score", _run_body(trace, name=policy.removeprefix("run:"), wait_s=10))
            assert resp.status_code == 200 and not resp.json()["missing"], resp.text
        yield s
    finally:
        if c.proc.poll() is None:
            assert c.stop() == 0
        if stand_in is not None:
            stand_in.stop()


def _refused_or_literal(resp: httpx.Response, what: str) -> None:
    """A 400 saying what is wrong, or a 200."""
    assert resp.status_code in (200, 400), f"{what}: {resp.status_code} {resp.text[:300]}"
    if resp.status_code == 400:
        detail = resp.json()["detail"]
        assert isinstance(detail, str) and detail, what


def test_a_service_filter_matches_only_the_service_of_that_exact_name(served: Served) -> None:
    for value in SERVICES + HOSTILE:
        resp = served.get("/api/v1/traces", service=value, limit=100)
        _refused_or_literal(resp, f"service={value!r}")
        assert resp.status_code == 200, f"service={value!r}: {resp.text[:300]}"
        found = resp.json()["traces"]
        assert all(t["service_name"] == value for t in found), f"service={value!r} found {found}"
        if value in SERVICES:
            assert [t["trace_id"] for t in found] == [served.trace_of[value]], f"service={value!r}"
    resp = served.get("/api/v1/traces", service=TOO_LONG)
    assert resp.status_code == 400 and "at most 1000 characters" in resp.json()["detail"]
    assert "service" in resp.json()["detail"]
    # a percent-encoded lone surrogate reaches the API as replacement characters: nothing matches
    resp = httpx.get(served.c.api + "/api/v1/traces?service=%ED%A0%80", timeout=30)
    assert resp.status_code == 200 and resp.json()["traces"] == []


def test_a_policy_filter_matches_only_the_policy_of_that_exact_name(served: Served) -> None:
    for value in [*served.run_policies, *HOSTILE, "run:p\\\\x73", "run:\\\\"]:
        scores = served.get("/api/v1/scores", policy=value)
        _refused_or_literal(scores, f"scores policy={value!r}")
        assert scores.status_code == 200
        found = {s["policy"] for s in scores.json()["scores"]}
        assert found == ({value} if value in served.run_policies else set()), f"policy={value!r}: {found}"

        stats = served.get("/api/v1/policies/stats", policy=value, window="1h")
        _refused_or_literal(stats, f"stats policy={value!r}")
        assert stats.status_code == 200
        found = {s["policy"] for s in stats.json()["stats"]}
        assert found == ({value} if value in served.run_policies else set()), f"stats policy={value!r}: {found}"
    for path in ("/api/v1/scores", "/api/v1/policies/stats"):
        resp = served.get(path, policy=TOO_LONG)
        assert resp.status_code == 400 and "policy" in resp.json()["detail"], resp.text


def test_run_ids_are_checked_and_match_literally(served: Served) -> None:
    for policy, run_id in served.run_policies.items():
        run = served.get(f"/api/v1/runs/{run_id}")
        assert run.status_code == 200 and run.json()["run_id"] == run_id
        scores = served.get(f"/api/v1/runs/{run_id}/scores").json()["scores"]
        assert {s["policy"] for s in scores} == {policy}
    assert served.get("/api/v1/runs/r..1").status_code == 404, "a well-formed id of no run"
    for bad in BAD_RUN_IDS:
        where = quote(bad, safe="")
        for resp in (
            served.get(f"/api/v1/runs/{where}"),
            served.get(f"/api/v1/runs/{where}/scores"),
            served.post(f"/v1/runs/{where}/score", _run_body(served.trace_of["sec-svc"])),
        ):
            assert resp.status_code == 400, f"run id {bad!r}: {resp.status_code} {resp.text[:200]}"
            assert resp.json()["detail"].startswith("run_id: invalid run id"), resp.text
        resp = served.post("/v1/runs", {"run_id": bad, "name": "x", "status": "running"})
        assert resp.status_code == 400 and "run_id" in resp.json()["detail"], f"{bad!r}: {resp.text[:200]}"
    resp = served.post("/v1/runs", {"run_id": "r.9", "name": "x", "status": "running\n"})
    assert resp.status_code == 400 and "status" in resp.json()["detail"]


def test_trace_and_span_ids_are_32_and_16_hex_digits_or_refused_naming_the_parameter(served: Served) -> None:
    known = served.trace_of["sec-svc"]
    assert served.get(f"/api/v1/traces/{known.upper()}").json()["trace_id"] == known, "either case is an id"
    assert served.get(f"/api/v1/traces/{'f' * 32}").status_code == 404
    assert served.get("/api/v1/scores", trace_id=known).status_code == 200
    for bad in BAD_TRACE_IDS:
        if bad:  # an empty path segment is another route
            resp = served.get(f"/api/v1/traces/{quote(bad, safe='')}")
            assert resp.status_code == 400, f"{bad!r}: {resp.status_code} {resp.text[:200]}"
            assert resp.json()["detail"].startswith("trace_id: invalid trace id"), resp.text
            assert len(resp.json()["detail"]) < 200, "a long value is not echoed whole"
        resp = served.get("/api/v1/scores", trace_id=bad)
        assert resp.status_code == 400 and resp.json()["detail"].startswith("trace_id: "), f"{bad!r}: {resp.text}"
        resp = served.post("/v1/feedback", {"trace_id": bad, "name": "thumbs", "value": True})
        assert resp.status_code == 400 and resp.json()["detail"].startswith("trace_id: "), f"{bad!r}: {resp.text}"
        resp = served.post("/v1/runs/r.1/score", _run_body(bad))
        assert resp.status_code == 400 and "traces.0.trace_id" in resp.json()["detail"], f"{bad!r}: {resp.text}"
    for bad in BAD_SPAN_IDS:
        resp = served.post("/v1/feedback", {"trace_id": known, "span_id": bad, "name": "thumbs", "value": True})
        assert resp.status_code == 400 and resp.json()["detail"].startswith("span_id: "), f"{bad!r}: {resp.text}"


def test_stored_spans_names_each_held_span_and_refuses_what_is_no_list_of_trace_ids(served: Served) -> None:
    """`POST /api/v1/spans/stored` (what `evalsi import` leaves out): the stored spans of the traces asked for."""
    known = [served.trace_of[s] for s in ("sec-svc", "\\x73ec-svc")]
    resp = served.post("/api/v1/spans/stored", {"trace_ids": [known[0].upper(), known[1], "f" * 32]})
    assert resp.status_code == 200, resp.text
    spans = resp.json()["spans"]
    assert sorted(t for t, _ in spans) == sorted(known)  # one span each; the unknown trace has none
    assert all(len(s) == 16 for _, s in spans)
    for bad in BAD_TRACE_IDS:
        resp = served.post("/api/v1/spans/stored", {"trace_ids": [known[0], bad]})
        assert resp.status_code == 400 and resp.json()["detail"].startswith("trace_ids.1: "), f"{bad!r}: {resp.text}"
    for body in ({}, {"trace_ids": "a" * 32}, {"trace_ids": [1]}, [known[0]], {"trace_ids": [], "x": 1}, None):
        resp = served.post("/api/v1/spans/stored", body)
        assert resp.status_code in (400, 422) and resp.json()["detail"], f"{body!r}: {resp.text}"
    resp = served.post("/api/v1/spans/stored", {"trace_ids": ["a" * 32] * 1001})
    assert resp.status_code == 413 and "at most 1000" in resp.json()["detail"], resp.text
    assert served.post("/api/v1/spans/stored", {"trace_ids": []}).json() == {"spans": []}


def test_numbers_out_of_range_are_refused_with_a_message(served: Served) -> None:
    for path in ("/api/v1/traces", "/api/v1/scores", "/api/v1/runs"):
        for bad in BAD_LIMITS:
            resp = served.get(path, limit=bad)
            assert resp.status_code == 400, f"{path} limit={bad!r}: {resp.status_code} {resp.text[:200]}"
            assert "limit" in resp.json()["detail"]
    for bad in BAD_WINDOWS:
        resp = served.get("/api/v1/policies/stats", window=bad)
        assert resp.status_code == 400, f"window={bad!r}: {resp.status_code} {resp.text[:200]}"
        assert "window" in resp.json()["detail"]
    # past what a duration can say (292 years), then past the longest window (ten years)
    assert "longer than" in served.get("/api/v1/policies/stats", window="99999999h").json()["detail"]
    assert "at most 87600h" in served.get("/api/v1/policies/stats", window="100000h").json()["detail"]
    ok = served.get("/api/v1/policies/stats", window="87600h").json()
    assert 0 < ok["since_unix_nano"] < time.time_ns(), "the longest window still starts after 1970"
    assert {s["policy"] for s in ok["stats"]} == set(served.run_policies)

    for bad in BAD_SINCE:
        for path, body in (
            ("/v1/traces/select", {"where": "true", "since_unix_nano": bad}),
            ("/v1/runs/r.1/score", {**_run_body(served.trace_of["sec-svc"]), "since_unix_nano": bad}),
        ):
            resp = served.post(path, body)
            assert resp.status_code == 400, f"{path} since={bad!r}: {resp.status_code} {resp.text[:200]}"
            assert "since_unix_nano" in resp.json()["detail"]
    for field, bad in (("limit", 0), ("limit", 10**6), ("scan", -1), ("scan", 10**9), ("where", "x" * 10_001)):
        resp = served.post("/v1/traces/select", {"where": "true", field: bad})
        assert resp.status_code == 400 and field in resp.json()["detail"], f"{field}={bad!r}: {resp.text[:200]}"
    for trial in (-1, 2**32, 10**30):
        resp = served.post("/v1/runs/r.1/score", _run_body(served.trace_of["sec-svc"], trial=trial))
        assert resp.status_code == 400 and "trial" in resp.json()["detail"], f"trial={trial}: {resp.text[:200]}"


def test_select_takes_a_cel_condition_and_refuses_anything_else(served: Served) -> None:
    resp = served.post("/v1/traces/select", {"where": 'trace.service_name == "sec-svc"'})
    assert resp.status_code == 200 and resp.json()["trace_ids"] == [served.trace_of["sec-svc"]]
    for where in ("' OR 1=1 --", "1=1; DROP TABLE otel_traces", "trace.service_name == '\\", "\x00"):
        resp = served.post("/v1/traces/select", {"where": where})
        assert resp.status_code == 400 and resp.json()["detail"].startswith("where"), f"{where!r}: {resp.text}"


def test_bodies_that_json_allows_and_python_cannot_hold_are_refused(served: Served) -> None:
    """JSON allows an integer past a double's range and a lone UTF-16 surrogate escape (which UTF-8 cannot encode);
    the API answers them 400 naming the problem, not 500. Inputs of this shape come from benchmarks/fuzz.py."""
    trace_id = served.trace_of["sec-svc"]
    head = '{"trace_id": "' + trace_id + '", '
    evaluators = '"evaluators": [{"ref": "builtin/contains", "params": {"any": ["a"]}}]'
    raw = [
        ("/v1/feedback", head + '"name": "n", "value": 1' + "0" * 400 + "}"),
        ("/v1/feedback", head + '"name": "n", "value": true, "comment": "\\ud800"}'),
        ("/v1/feedback", head + '"name": "\\udfff", "value": "x"}'),
        ("/v1/evaluate", '{"records": [{"output": "a", "metadata": {"k": "\\ud800"}}], ' + evaluators + "}"),
    ]
    for path, body in raw:
        resp = httpx.post(served.c.api + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert resp.status_code == 400, (path, body[:80], resp.status_code, resp.text[:200])
        detail = resp.json()["detail"]
        assert "finite" in detail or "surrogate" in detail, detail


def test_the_cli_filters_read_literally(served: Served) -> None:
    """Through the API on the embedded store (the collector holds its lock); straight from a server's store, as the
    CLI reads it when no collector answers, on the other."""
    through_api = served.kind == "chdb"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return served.c.cli(*args, api=through_api, check=False)

    listed = cli("traces", "list", "--json", "--service", "\\x73ec-svc")
    assert [t["trace_id"] for t in json.loads(listed.stdout)] == [served.trace_of["\\x73ec-svc"]], listed.stderr
    scores = cli("scores", "list", "--json", "--policy", "run:p\\x73")
    assert {s["policy"] for s in json.loads(scores.stdout)} == {"run:p\\x73"}, scores.stderr
    bad = cli("scores", "list", "--trace", "' OR 1=1 --")
    said = "trace_id: invalid trace id" if through_api else "not a trace id"
    assert bad.returncode == 1 and said in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    bad = cli("policies", "stats", "--window", "99999999h")
    said = "window: invalid duration '99999999h': longer than"
    assert bad.returncode == 1 and said in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_nothing_was_changed_by_the_attempts_and_the_collector_still_answers(served: Served) -> None:
    assert served.get("/healthz").status_code == 200
    listed = served.get("/api/v1/traces", limit=1000).json()["traces"]
    assert {t["trace_id"] for t in listed} == set(served.trace_of.values())
    assert not [e for e in served.c.logs() if e.get("level") == "error" or "Traceback" in json.dumps(e)]


# --- the store itself, as the CLI reads it with no collector running ----------------------------------------------


@pytest.fixture(params=["chdb", "clickhouse-connect"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TraceStore]:
    stand_in: StandInProcess | None = None
    if request.param == "chdb":
        backend = open_backend(f"chdb://{tmp_path / 'store'}")
    else:
        stand_in = start_stand_in(tmp_path / "clickhouse")
        backend = open_backend(stand_in.url, database="inputs")
    s = TraceStore(backend)
    try:
        s.create_schema()
        yield s
    finally:
        s.close()
        if stand_in is not None:
            stand_in.stop()


def test_the_store_binds_every_string_literally_and_refuses_what_its_types_cannot_hold(store: TraceStore) -> None:
    now = time.time_ns()
    spans = [
        Span(os.urandom(16).hex(), os.urandom(8).hex(), "", "root", "SERVER", now - i, now, service_name=name)
        for i, name in enumerate(SERVICES)
    ]
    store.write(spans)
    trace_of = {s.service_name: s.trace_id for s in spans}
    store.write_scores([
        Score("n", value=1.0, trace_id=trace_of["sec-svc"], policy=policy, evaluator="x", run_id=run_id)
        for policy, run_id in (("p\\x73", "r\\x73"), ("ps", "rs"), ("\\", "\\"))
    ])  # fmt: skip
    for run_id in ("r\\x73", "rs", "\\"):
        store.write_run(run_id, "inputs", "running", {}, {})
    for value in SERVICES + HOSTILE:
        found = store.list_traces(limit=100, service=value)
        assert [t["trace_id"] for t in found] == ([trace_of[value]] if value in SERVICES else []), repr(value)
        policies = {s["policy"] for s in store.list_scores(policy=value)}
        assert policies == ({value} if value in ("p\\x73", "ps", "\\") else set()), repr(value)
        stats = {s["policy"] for s in store.score_window_stats(since_ns=now - 10**12, policy=value)}
        assert stats == policies, repr(value)
        runs = {s["run_id"] for s in store.run_scores(value)}
        assert runs == ({value} if value in ("r\\x73", "rs", "\\") else set()), repr(value)
        assert {r["run_id"] for r in store.list_runs(run_id=value)} == runs, repr(value)
    for value in (TOO_LONG, "x" * 100_000):
        with pytest.raises(ValueError, match=r"service: .* at most 1000"):
            store.list_traces(service=value)
        with pytest.raises(ValueError, match=r"policy: .* at most 1000"):
            store.list_scores(policy=value)
        with pytest.raises(ValueError, match=r"run_id: .* at most 1000"):
            store.run_scores(value)
    for limit in (0, -1, 2**32):
        for query in (store.list_traces, store.list_scores, store.list_runs):
            with pytest.raises(ValueError, match="limit"):
                query(limit=limit)
    for since in (-1, 2**63):
        with pytest.raises(ValueError, match="since"):
            store.score_window_stats(since_ns=since)
        with pytest.raises(ValueError, match="since"):
            store.span_counts([trace_of["sec-svc"]], since_ns=since)
    for bad in BAD_TRACE_IDS:
        with pytest.raises(ValueError, match="not a trace id"):
            store.get_trace(bad)
        if bad:  # "" is no filter
            with pytest.raises(ValueError, match="not a trace id"):
                store.list_scores(trace_id=bad)
        with pytest.raises(ValueError, match="not a trace id"):
            store.get_traces([trace_of["sec-svc"], bad])
