"""Trace and session search through the API (`GET /api/v1/traces`, `/api/v1/sessions`) on a real embedded store:
each filter brings back the traces it names and no other, a hostile value is matched as data, a `where` condition
sees what policy selectors see, and one trace is read a page at a time however many spans it holds."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest
from clickhouse_http import start_stand_in
from fastapi.testclient import TestClient

from evalsi.collector import query
from evalsi.collector.api import build_api
from evalsi.exporters.clickhouse.backend import open_backend
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.model.score import Score
from evalsi.model.span import Span

NOW = time.time_ns()
HOUR = 3600 * 10**9
ERRORED = f"{0xE1:032x}"  # an hour ago: gpt-4o failing, session s-1, tenant acme, 5 s, tool_error failed
CLEAN = f"{0xC1:032x}"  # 50 min ago: claude, session s-1, tenant globex, 100 ms, tool_error passed, other failed
OLD = f"{0x01D:032x}"  # 3 days ago: gpt-4o, three tool calls, session s-2, a hostile attribute value, score errored
ELSEWHERE = f"{0xB0:032x}"  # team-b's: gpt-4o failing, session s-1, tenant acme, tool_error failed
BIG = f"{0xB16:032x}"  # 250 spans, 30 min ago
HOSTILE = "' OR 1=1 --"
TEAM_B = {"service.name": "travel", "evalsi.project": "team-b"}


def _trace(trace_id: str, start: int, *, resource: dict[str, str] | None = None, **root: Any) -> Span:
    return Span(
        trace_id, trace_id[-8:] + "00000001", "", "invoke_agent travel", "SERVER", start, start + 100_000_000,
        service_name="travel", resource_attributes=resource or {"service.name": "travel"}, step_type="agent", **root,
    )  # fmt: skip


def _llm(trace_id: str, start: int, model: str, *, error: bool = False, resource: dict[str, str] | None = None) -> Span:
    return Span(
        trace_id, trace_id[-8:] + "00000002", trace_id[-8:] + "00000001", f"chat {model}", "CLIENT", start + 1_000,
        start + 2_000_000, service_name="travel", status_code="ERROR" if error else "UNSET", step_type="llm",
        model=model, input_tokens=100, output_tokens=20, cost_usd=0.001, resource_attributes=resource or {},
    )  # fmt: skip


def _tool(trace_id: str, start: int, n: int) -> Span:
    return Span(
        trace_id, trace_id[-8:] + f"{n:08x}", trace_id[-8:] + "00000001", "execute_tool search", "INTERNAL",
        start + n * 1_000, start + n * 1_000 + 500, service_name="travel", step_type="tool", tool_name="search",
    )  # fmt: skip


def _wait(trace_id: str, start: int, duration_ns: int) -> Span:
    span_id, parent = trace_id[-8:] + "00000009", trace_id[-8:] + "00000001"
    return Span(trace_id, span_id, parent, "wait", "INTERNAL", start + 10, start + duration_ns, service_name="travel")


def _score(trace_id: str, evaluator: str, passed: bool | None, **kw: Any) -> Score:
    return Score("quality", passed=passed, trace_id=trace_id, policy="online", evaluator=evaluator, **kw)


def _spans() -> list[Span]:
    errored = elsewhere = NOW - HOUR
    clean, old, big = NOW - 50 * 60 * 10**9, NOW - 72 * HOUR, NOW - HOUR // 2
    spans = [
        _trace(ERRORED, errored, session_id="s-1", attributes={"tenant": "acme"}),
        _llm(ERRORED, errored, "gpt-4o", error=True),
        _wait(ERRORED, errored, 5 * 10**9),
        _trace(CLEAN, clean, session_id="s-1", attributes={"tenant": "globex"}),
        _llm(CLEAN, clean, "claude-sonnet"),
        _trace(OLD, old, session_id="s-2", attributes={"k": HOSTILE}),
        _llm(OLD, old, "gpt-4o"),
        *(_tool(OLD, old, n) for n in range(3, 6)),
        _trace(ELSEWHERE, elsewhere, resource=TEAM_B, session_id="s-1", attributes={"tenant": "acme"}),
        _llm(ELSEWHERE, elsewhere, "gpt-4o", error=True, resource=TEAM_B),
        _trace(BIG, big, resource={"service.name": "travel", "region": "eu"}),
    ]
    return spans + [_tool(BIG, big, n) for n in range(2, 251)]


@pytest.fixture(scope="module", params=["chdb", "clickhouse-connect+stand-in"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TraceStore]:
    """The embedded engine, and a server through the real clickhouse-connect client (the stand-in: see
    tests/exporters/test_clickhouse_store.py): one SQL text, two ways parameters are bound."""
    path = tmp_path_factory.mktemp("search") / "store"
    server = start_stand_in(path) if request.param != "chdb" else None
    endpoint = server.url if server is not None else f"chdb://{path}"
    found = TraceStore(open_backend(endpoint, database="default", create=True))
    request.addfinalizer(lambda: server.stop() if server is not None else None)
    found.create_schema()
    found.write(_spans())
    found.write_scores([
        _score(ERRORED, "builtin/tool_error", False),
        _score(CLEAN, "builtin/tool_error", True),
        _score(CLEAN, "builtin/other", False),
        _score(OLD, "builtin/tool_error", None, outcome="error", reason="judge_timeout"),
        _score(ELSEWHERE, "builtin/tool_error", False, project="team-b"),
        Score("resolved", passed=True, session_id="s-1", policy="sessions", evaluator="builtin/goal"),
    ])  # fmt: skip
    yield found
    found.close()


@pytest.fixture(scope="module")
def api(store: TraceStore) -> TestClient:
    return TestClient(build_api(store, status=dict))


def ids(api: TestClient, **params: Any) -> list[str]:
    resp = api.get("/api/v1/traces", params={"limit": 100, **params})
    assert resp.status_code == 200, resp.text
    return [t["trace_id"] for t in resp.json()["traces"]]


def refused(api: TestClient, path: str = "/api/v1/traces", **params: Any) -> str:
    resp = api.get(path, params=params)
    assert resp.status_code == 400, f"{params}: {resp.status_code} {resp.text[:300]}"
    return str(resp.json()["detail"])


def iso(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).isoformat()


def test_with_no_filter_every_trace_comes_back_newest_first(api: TestClient) -> None:
    assert ids(api) == [BIG, CLEAN, ELSEWHERE, ERRORED, OLD], "newest first; at one time, by trace id"
    assert ids(api, limit=2) == [BIG, CLEAN]


def test_since_and_until_take_a_duration_back_from_now_or_an_iso_time(api: TestClient) -> None:
    assert OLD not in ids(api, since="2d") and set(ids(api, since="2d")) == {BIG, CLEAN, ERRORED, ELSEWHERE}
    assert ids(api, until="2d") == [OLD]
    assert set(ids(api, since="55m")) == {BIG, CLEAN}
    assert set(ids(api, since="65m", until="55m")) == {ERRORED, ELSEWHERE}
    old = NOW - 72 * HOUR
    assert ids(api, since=iso(old - 10**9), until=iso(old + 10**9)) == [OLD]
    naive = dt.datetime.fromtimestamp((old - 10**9) / 1e9, tz=dt.UTC).replace(tzinfo=None).isoformat()
    assert ids(api, since=naive, until="70h") == [OLD], "a time without a zone is UTC"
    assert ids(api, since="1d12h", until="1h30m") == []
    for bad in ("yesterday", "5", "-5m", "2026-13-01", HOSTILE, "9999-12-31T00:00:00Z", "9" * 99 + "h", "1e3h"):
        assert refused(api, since=bad).startswith("since: ")
    assert refused(api, until="soon").startswith("until: ")


def test_error_model_session_and_min_duration_each_narrow_to_their_traces(api: TestClient) -> None:
    assert set(ids(api, error=True)) == {ERRORED, ELSEWHERE}
    assert set(ids(api, error=False)) == {CLEAN, OLD, BIG}
    assert set(ids(api, model="gpt-4o")) == {ERRORED, OLD, ELSEWHERE}
    assert ids(api, model="claude-sonnet") == [CLEAN]
    assert ids(api, model="gpt-4") == [], "a model matches whole, not as a prefix"
    assert set(ids(api, session="s-1")) == {CLEAN, ERRORED, ELSEWHERE}
    assert ids(api, session="s-2") == [OLD]
    assert ids(api, min_duration="1s") == [ERRORED], "the trace lasts from its first start to its last end"
    assert ids(api, min_duration="5s") == [ERRORED]
    assert ids(api, min_duration="6s") == []
    assert set(ids(api, model="gpt-4o", error=True, session="s-1")) == {ERRORED, ELSEWHERE}
    for bad in ("long", "99999999999d", "9" * 99 + "h", "-1s"):
        assert refused(api, min_duration=bad).startswith("min_duration: "), bad


def test_attr_matches_a_span_or_resource_attribute_and_several_must_all_hold(api: TestClient) -> None:
    assert set(ids(api, attr="tenant=acme")) == {ERRORED, ELSEWHERE}
    assert ids(api, attr="tenant=globex") == [CLEAN]
    assert ids(api, attr="region=eu") == [BIG], "a resource attribute"
    assert set(ids(api, attr=["tenant=acme", "service.name=travel"])) == {ERRORED, ELSEWHERE}
    assert ids(api, attr=["tenant=acme", "tenant=globex"]) == []
    assert ids(api, attr="tenant=") == [], "an empty value matches an empty value, not a missing key"
    assert refused(api, attr="tenant").startswith("attr: ")
    assert refused(api, attr="=acme").startswith("attr: ")


def test_a_hostile_value_in_any_filter_is_matched_as_data(api: TestClient, store: TraceStore) -> None:
    assert ids(api, attr=f"k={HOSTILE}") == [OLD], "the one trace holding that literal value"
    assert ids(api, attr=f"tenant={HOSTILE}") == []
    assert ids(api, attr=f"{HOSTILE}=x") == []
    for value in (HOSTILE, "') OR ('1'='1", "'; DROP TABLE otel_traces; --", "\\", "{limit:UInt32}", "\\x27"):
        for name in ("model", "session", "service", "failed"):
            assert ids(api, **{name: value}) == [], f"{name}={value!r}"
        assert ids(api, attr=f"tenant={value}") == []
    assert len(ids(api)) == 5 and store.span_count() == 262, "nothing was dropped"
    assert refused(api, model="x" * 1001).startswith("invalid request: query.model")


def test_failed_finds_traces_with_a_score_of_that_evaluator_that_did_not_pass(api: TestClient) -> None:
    assert ids(api, failed="builtin/tool_error") == [ELSEWHERE, ERRORED], "not CLEAN's (passed) nor OLD's (an error)"
    assert ids(api, failed="builtin/other") == [CLEAN]
    assert ids(api, failed="builtin/goal") == [], "a passed score is no failure"
    assert ids(api, failed="builtin/tool") == [], "an evaluator matches whole"


def test_where_is_a_cel_condition_over_what_policy_selectors_see(api: TestClient) -> None:
    assert ids(api, where="trace.tool_calls >= 3 && trace.tool_calls < 10") == [OLD]
    assert ids(api, where="trace.error && 'gpt-4o' in trace.models", since="2d") == [ELSEWHERE, ERRORED]
    assert ids(api, where="session.id == 's-2'") == [OLD]
    assert ids(api, where="resource['region'] == 'eu'") == [BIG]
    assert ids(api, where="span.name == 'invoke_agent travel' && trace.steps['llm'] == 1", model="claude-sonnet") == [
        CLEAN
    ]
    assert ids(api, where="trace.span_count > 1", limit=1) == [BIG], "the newest match"
    assert ids(api, where="trace.steps['retriever'] > 0") == [], "an evaluation error (a missing key) is no match"
    got = api.get("/api/v1/traces", params={"where": "trace.tool_calls in [3, 4]", "scan": 2}).json()
    assert got["traces"] == [] and got["scanned"] == 2, "only the newest `scan` candidates are evaluated"
    detail = refused(api, where="trace.tool_calls >")
    assert detail.startswith("where 'trace.tool_calls >': invalid CEL expression"), detail
    assert refused(api, where="nope.x == 1").startswith("where 'nope.x == 1': ")
    assert refused(api, where="1 + 1").startswith("where '1 + 1': ")


def test_a_field_the_variables_do_not_have_is_refused_with_the_closest_one(api: TestClient, store: TraceStore) -> None:
    detail = refused(api, where="trace.toolcalls > 0")
    assert detail == (
        "where 'trace.toolcalls > 0': trace.toolcalls: trace has no field 'toolcalls': did you mean 'tool_calls'?"
    )
    assert "did you mean 'model'?" in refused(api, where="trace.spans.exists(s, s.modle == 'gpt-4o')")
    assert "did you mean 'trace_count'?" in refused(api, where="session.trace_cnt > 1")
    with pytest.raises(query.SearchError, match="did you mean 'tool_calls'"):  # the store reader (the CLI without API)
        query.search_traces(store, {"where": "trace.toolcalls > 0"})
    open_maps = "span.attributes['tenant'] == 'acme' && resource['service.name'] == 'travel'"
    assert ids(api, where=open_maps) == [ELSEWHERE, ERRORED]


def test_a_trace_is_read_a_page_at_a_time_and_says_when_it_is_cut(api: TestClient) -> None:
    whole = api.get(f"/api/v1/traces/{BIG}").json()
    assert len(whole["spans"]) == whole["span_count"] == 250 and whole["truncated"] is False
    assert "next_offset" not in whole
    first = api.get(f"/api/v1/traces/{BIG}", params={"limit": 100}).json()
    assert len(first["spans"]) == 100 and first["span_count"] == 250
    assert first["truncated"] is True and first["next_offset"] == 100
    pages, offset = [first], 100
    while "next_offset" in pages[-1]:
        pages.append(api.get(f"/api/v1/traces/{BIG}", params={"limit": 100, "offset": offset}).json())
        offset = pages[-1].get("next_offset", offset)
    assert [len(p["spans"]) for p in pages] == [100, 100, 50] and pages[-1]["truncated"] is True
    read = [s["span_id"] for p in pages for s in p["spans"]]
    assert read == [s["span_id"] for s in whole["spans"]], "the pages are the trace, in start order, once each"
    past = api.get(f"/api/v1/traces/{BIG}", params={"offset": 1000}).json()
    assert past["spans"] == [] and past["span_count"] == 250
    assert refused(api, f"/api/v1/traces/{BIG}", limit=100_001).startswith("invalid request: query.limit")
    assert refused(api, f"/api/v1/traces/{BIG}", offset=-1).startswith("invalid request: query.offset")
    assert api.get(f"/api/v1/traces/{'f' * 32}", params={"limit": 1}).status_code == 404


def test_a_trace_read_is_bounded_by_default(store: TraceStore) -> None:
    doc = query.read_trace(store, BIG, limit=10)
    assert doc is not None and len(doc["spans"]) == 10 and doc["truncated"] and doc["next_offset"] == 10
    assert query.TRACE_PAGE == 10_000 and query.MAX_TRACE_PAGE == 100_000


def test_sessions_list_their_traces_and_show_them_in_order_with_their_scores(api: TestClient) -> None:
    sessions = {s["session_id"]: s for s in api.get("/api/v1/sessions").json()["sessions"]}
    assert set(sessions) == {"s-1", "s-2"}
    assert sessions["s-1"]["trace_count"] == 3 and sessions["s-2"]["trace_count"] == 1
    assert sessions["s-1"]["error_count"] == 2 and sessions["s-1"]["input_tokens"] == 300
    assert [s["session_id"] for s in api.get("/api/v1/sessions", params={"since": "2d"}).json()["sessions"]] == ["s-1"]
    shown = api.get("/api/v1/sessions/s-1").json()
    assert [t["trace_id"] for t in shown["traces"]] == [ELSEWHERE, ERRORED, CLEAN], "oldest first"
    scored = {(s["trace_id"], s["evaluator"]) for s in shown["scores"]}
    assert scored == {
        (ERRORED, "builtin/tool_error"), (CLEAN, "builtin/tool_error"), (CLEAN, "builtin/other"),
        (ELSEWHERE, "builtin/tool_error"), ("", "builtin/goal"),
    }  # fmt: skip
    assert api.get("/api/v1/sessions/s-9").status_code == 404
    assert api.get(f"/api/v1/sessions/{HOSTILE}").status_code == 404
    assert refused(api, "/api/v1/sessions", since="later").startswith("since: ")


def test_every_search_stays_in_its_project(store: TraceStore) -> None:
    found = query.search_traces(store, {"model": "gpt-4o", "limit": 100}, project="default")["traces"]
    assert {t["trace_id"] for t in found} == {ERRORED, OLD}
    team_b = query.search_traces(store, {"limit": 100, "where": "trace.error"}, project="team-b")["traces"]
    assert [t["trace_id"] for t in team_b] == [ELSEWHERE]
    assert query.search_traces(store, {"failed": "builtin/tool_error"}, project="team-b")["traces"][0]["trace_id"] == (
        ELSEWHERE
    )
    shown = query.show_session(store, "s-1", project="default")
    assert shown is not None and {t["trace_id"] for t in shown["traces"]} == {ERRORED, CLEAN}
    assert ELSEWHERE not in {s["trace_id"] for s in shown["scores"]}
    assert query.show_session(store, "s-1", project="team-c") is None
    sessions = query.list_sessions(store, {}, project="team-b")
    assert [(s["session_id"], s["trace_count"]) for s in sessions] == [("s-1", 1)]
    assert query.read_trace(store, ELSEWHERE, project="default") is None
    assert query.read_trace(store, ELSEWHERE, project="team-b") is not None


def test_the_store_reader_searches_as_the_api_does(store: TraceStore, api: TestClient) -> None:
    reader = query.StoreReader(store)
    params = {"model": "gpt-4o", "attr": ["tenant=acme"], "limit": 100}
    assert [t["trace_id"] for t in reader.search_traces(params)["traces"]] == ids(api, **params)
    doc = reader.read_trace(ERRORED, limit=2, offset=0)
    assert doc is not None and doc["truncated"] and [s["evaluator"] for s in doc["scores"]] == ["builtin/tool_error"]
    with pytest.raises(query.SearchError, match="unknown search parameter 'colour'"):
        reader.search_traces({"colour": "red"})


def test_through_the_api_each_key_searches_its_own_project(store: TraceStore) -> None:
    from evalsi.auth import ApiKeyConfig, AuthConfig, Authenticator, gate, new_key
    from evalsi.collector.api import OPEN_PATHS

    a_key, a_hash = new_key()
    b_key, b_hash = new_key()
    keys = [ApiKeyConfig(hash=a_hash, project="default"), ApiKeyConfig(hash=b_hash, project="team-b")]
    auth = Authenticator(AuthConfig(api_keys=keys))
    served = TestClient(gate(build_api(store, status=dict, auth=auth), auth, surface="api", open_paths=OPEN_PATHS))

    def get(key: str, path: str, **params: Any) -> Any:
        resp = served.get(path, params=params, headers={"Authorization": f"Bearer {key}"})
        return resp.json() if resp.status_code == 200 else resp.status_code

    assert {t["trace_id"] for t in get(a_key, "/api/v1/traces", model="gpt-4o")["traces"]} == {ERRORED, OLD}
    assert [t["trace_id"] for t in get(b_key, "/api/v1/traces", model="gpt-4o")["traces"]] == [ELSEWHERE]
    assert [t["trace_id"] for t in get(b_key, "/api/v1/traces", where="trace.error")["traces"]] == [ELSEWHERE]
    assert [t["trace_id"] for t in get(a_key, "/api/v1/traces", failed="builtin/tool_error")["traces"]] == [ERRORED]
    assert get(a_key, f"/api/v1/traces/{ELSEWHERE}") == 404
    assert get(b_key, f"/api/v1/traces/{ELSEWHERE}", limit=1)["span_count"] == 2
    assert {t["trace_id"] for t in get(a_key, "/api/v1/sessions/s-1")["traces"]} == {ERRORED, CLEAN}
    assert [(s["session_id"], s["trace_count"]) for s in get(b_key, "/api/v1/sessions")["sessions"]] == [("s-1", 1)]
    assert served.get("/api/v1/sessions").status_code == 401, "no key, no read"
