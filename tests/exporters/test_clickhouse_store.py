"""The store, the same tests on each way to reach ClickHouse: the embedded engine (chDB), a server through the real
clickhouse-connect client, and a real ClickHouse server when `EVALSI_TEST_CLICKHOUSE_URL` is set.

In every run the server path talks to `tests/clickhouse_http.py`: a stand-in for the server's HTTP interface (the
subset clickhouse-connect uses) answered by the real ClickHouse engine (chDB), run as its own process. It checks the
client, the SQL, the types and the errors as they cross HTTP; it is not a claim of full server compatibility (TLS,
users and grants, the server's settings are not modelled). Set `EVALSI_TEST_CLICKHOUSE_URL`
(e.g. `http://default:@localhost:8123`) to run the same tests on a real server: each test makes its own database and
drops it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from clickhouse_http import StandInProcess, start_stand_in
from running_collector import EVALSI, serve_config

from evalsi.exporters.clickhouse import ClickHouseConfig
from evalsi.exporters.clickhouse.backend import ServerOptions, error_reason, is_data_error, open_backend
from evalsi.exporters.clickhouse.rows import logs_to_arrow, to_arrow
from evalsi.exporters.clickhouse.schema import SCHEMA_VERSION, runs_by_project, schema_versions_ddl, table_keys_sql
from evalsi.exporters.clickhouse.store import TraceStore
from evalsi.model.log_record import LogRecord
from evalsi.model.score import Score
from evalsi.model.span import Span, SpanEvent, SpanLink
from evalsi.store import StoreError

SERVER_URL = os.environ.get("EVALSI_TEST_CLICKHOUSE_URL", "")
T0 = time.time_ns() - 60 * 10**9
TRACE = f"{0xA1:032x}"
OTHER = f"{0xB2:032x}"


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInProcess]:
    server = start_stand_in(tmp_path_factory.mktemp("clickhouse-http") / "data", password="s3cret")
    yield server
    server.stop()


class Place:
    """Where a test's store lives: opens it (again) with a given TTL or options."""

    def __init__(self, kind: str, endpoint: str, database: str, username: str, password: str) -> None:
        self.kind, self.endpoint, self.database = kind, endpoint, database
        self.username, self.password = username, password
        self.opened: list[TraceStore] = []

    def open(self, *, ttl: float = 0.0, create: bool = True, async_insert: bool = False) -> TraceStore:
        backend = open_backend(
            self.endpoint, database=self.database, username=self.username, password=self.password, create=create,
            server=ServerOptions(async_insert=async_insert),
        )  # fmt: skip
        store = TraceStore(backend, ttl=ttl)
        self.opened.append(store)
        return store

    def close(self) -> None:
        for store in self.opened:
            store.close()
        self.opened.clear()


@pytest.fixture(params=["chdb", "clickhouse-connect+stand-in", "clickhouse-server"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    yield from _place(request, tmp_path)


@pytest.fixture(params=["clickhouse-connect+stand-in", "clickhouse-server"])
def server_place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    """A ClickHouse server's place only: databases and users are a server's (the embedded store has neither)."""
    yield from _place(request, tmp_path)


def _place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    kind = request.param
    if kind == "chdb":
        where = Place(kind, f"chdb://{tmp_path / 'store'}", "default", "default", "")
    elif kind == "clickhouse-connect+stand-in":
        server: StandInProcess = request.getfixturevalue("stand_in")
        where = Place(kind, server.url, f"t_{uuid.uuid4().hex[:12]}", "default", "s3cret")
    else:
        if not SERVER_URL:
            pytest.skip("no ClickHouse server: set EVALSI_TEST_CLICKHOUSE_URL=http://user:password@host:8123 to run")
        where = Place(kind, SERVER_URL, f"evalsi_test_{uuid.uuid4().hex[:12]}", "default", "")
    yield where
    where.close()
    if kind == "clickhouse-server":
        admin = open_backend(SERVER_URL, database="default")
        admin.command(f"DROP DATABASE IF EXISTS `{where.database}`")
        admin.close()


def _spans() -> list[Span]:
    root = Span(
        TRACE, "00000000000000a1", "", "invoke_agent travel", "SERVER", T0, T0 + 5_000_000,
        service_name="travel-agent", attributes={"gen_ai.operation.name": "invoke_agent", "tenant": "acme"},
        resource_attributes={"service.name": "travel-agent"}, step_type="agent", session_id="sess-1",
        agent_name="travel",
    )  # fmt: skip
    llm = Span(
        TRACE, "00000000000000a2", "00000000000000a1", "chat gpt-4o", "CLIENT", T0 + 1_000, T0 + 3_000_000,
        service_name="travel-agent", status_code="ERROR", status_message="rate limited",
        attributes={"gen_ai.request.model": "gpt-4o"}, step_type="llm", model="gpt-4o", provider="openai",
        input_tokens=120, output_tokens=30, cost_usd=0.0021, error_type="429",
        input=[{"role": "user", "content": "Flights to Lisbon? ✈"}], output=[{"role": "assistant", "content": "Two."}],
        content_captured=True, convention="otel-genai",
        events=[SpanEvent(T0 + 2_000, "gen_ai.choice", {"index": "0"})],
        links=[SpanLink(OTHER, "00000000000000b1", "", {"why": "retry of"})],
    )  # fmt: skip
    other = Span(OTHER, "00000000000000b1", "", "chat", "CLIENT", T0 - 10**9, T0 - 10**9 + 1_000, service_name="other")
    return [root, llm, other]


def _score(name: str, value: float, *, trace: str = TRACE, passed: bool | None = None, ts: int = T0) -> Score:
    return Score(
        name, value=value, passed=passed, trace_id=trace, policy="quality", evaluator="builtin/x",
        timestamp_unix_nano=ts,
    )  # fmt: skip


def test_the_schema_is_created_at_its_version_and_creating_it_again_changes_nothing(place: Place) -> None:
    store = place.open()
    assert store.schema_version() == 0
    store.create_schema()
    assert store.schema_version() == SCHEMA_VERSION
    tables = {
        r["name"] for r in store.backend.query("SELECT name FROM system.tables WHERE database = currentDatabase()")
    }
    assert {"otel_traces", "otel_traces_trace_id_ts", "otel_traces_trace_id_ts_mv", "otel_logs", "evalsi_scores",
            "evalsi_runs", "evalsi_schema"} <= tables  # fmt: skip
    store.write(_spans())
    place.close()
    again = place.open()
    again.create_schema()  # a restart, or a second replica starting at once
    again.check_schema()
    assert again.schema_version() == SCHEMA_VERSION
    rows = again.backend.query("SELECT count() AS n FROM evalsi_schema FINAL")
    assert rows[0]["n"] == SCHEMA_VERSION
    assert again.span_count() == 3, "the data survives"


def test_a_store_without_the_schema_is_refused_when_evalsi_may_not_create_it(place: Place) -> None:
    store = place.open()
    with pytest.raises(StoreError, match=r"schema at version 0.*create_schema: true"):
        store.check_schema()


def test_a_store_whose_schema_is_newer_than_evalsi_is_refused(place: Place) -> None:
    store = place.open()
    store.create_schema()
    store.backend.command(
        "INSERT INTO evalsi_schema (TracesTable, Version, Description) "
        f"VALUES ('otel_traces', {SCHEMA_VERSION + 1}, 'x')"
    )
    with pytest.raises(StoreError, match=rf"version {SCHEMA_VERSION + 1}, newer than this evalsi knows.*upgrade"):
        store.create_schema()
    with pytest.raises(StoreError, match="upgrade evalsi"):
        store.check_schema()


def test_spans_are_read_back_as_they_were_written(place: Place) -> None:
    store = place.open()
    store.create_schema()
    store.write(_spans())
    listed = {t["trace_id"]: t for t in store.list_traces(limit=10)}
    assert set(listed) == {TRACE, OTHER}
    t = listed[TRACE]
    assert (t["root_name"], t["service_name"], t["span_count"], t["error_count"], t["llm_calls"]) == (
        "invoke_agent travel", "travel-agent", 2, 1, 1,
    )  # fmt: skip
    assert (t["input_tokens"], t["output_tokens"]) == (120, 30)
    assert t["cost_usd"] == pytest.approx(0.0021)
    assert t["duration_ns"] == 5_000_000
    assert [x["trace_id"] for x in store.list_traces(limit=10, service="other")] == [OTHER]

    spans = store.get_trace(TRACE)
    assert [s["span_id"] for s in spans] == ["00000000000000a1", "00000000000000a2"]
    llm = spans[1]
    assert llm["attributes"]["gen_ai.request.model"] == "gpt-4o"
    assert (llm["model"], llm["provider"], llm["input_tokens"], llm["status_code"]) == (
        "gpt-4o",
        "openai",
        120,
        "ERROR",
    )
    assert llm["input"] == [{"role": "user", "content": "Flights to Lisbon? ✈"}]
    assert llm["events"][0]["name"] == "gen_ai.choice" and llm["events"][0]["attributes"] == {"index": "0"}
    assert llm["links"][0]["trace_id"] == OTHER
    assert spans[0]["session_id"] == "sess-1" and spans[0]["resource_attributes"] == {"service.name": "travel-agent"}
    assert store.get_trace(f"{0xCC:032x}") == []

    assert store.span_counts([TRACE, OTHER]) == {TRACE: 2, OTHER: 1}
    assert store.span_counts([TRACE, OTHER], since_ns=T0 - 1) == {TRACE: 2}
    both = store.get_traces([TRACE, OTHER])
    assert {k: len(v) for k, v in both.items()} == {TRACE: 2, OTHER: 1}


def test_a_revised_span_replaces_the_stored_one(place: Place) -> None:
    store = place.open()
    store.create_schema()
    spans = _spans()
    store.write(spans)
    spans[1].output = [{"role": "assistant", "content": "Three, in fact."}]
    store.revise_spans(to_arrow([spans[1]]))
    got = store.get_trace(TRACE)
    assert len(got) == 2
    assert got[1]["output"] == [{"role": "assistant", "content": "Three, in fact."}]


def test_a_score_written_twice_counts_once_and_the_newest_wins(place: Place) -> None:
    store = place.open()
    store.create_schema()
    store.write_scores([_score("helpfulness", 0.2, passed=False), _score("tone", 1.0, passed=True)])
    store.write_scores([_score("helpfulness", 0.9, passed=True, ts=T0 + 1)])  # a replay, with a newer verdict
    store.write_scores([_score("helpfulness", 0.5, trace=OTHER, passed=True)])
    scores = store.list_scores(limit=10, trace_id=TRACE)
    assert sorted((s["name"], s["value"]) for s in scores) == [("helpfulness", 0.9), ("tone", 1.0)]
    assert len(store.list_scores(limit=10, policy="quality")) == 3
    stats = {s["name"]: s for s in store.score_window_stats(since_ns=T0 - 1)}
    assert stats["helpfulness"]["n"] == 2 and stats["helpfulness"]["passed"] == 2
    assert stats["helpfulness"]["value_mean"] == pytest.approx(0.7)


def test_runs_keep_their_newest_record(place: Place) -> None:
    store = place.open()
    store.create_schema()
    store.write_run("run-1", "nightly", "running", {"dataset": "d.jsonl"}, {})
    store.write_run("run-1", "nightly", "finished", {"dataset": "d.jsonl"}, {"passed": True, "aggregates": {"x": 1}})
    store.write_scores([Score("task-success", value=1.0, passed=True, trace_id=TRACE, run_id="run-1", task_id="t1")])
    runs = store.list_runs(limit=5)
    assert [(r["run_id"], r["status"]) for r in runs] == [("run-1", "finished")]
    assert [(r["task_id"], r["name"]) for r in store.run_scores("run-1")] == [("t1", "task-success")]


def test_two_projects_recording_one_run_id_keep_two_runs(place: Place) -> None:
    """A run is keyed by (project, run id): team b recording team a's run id neither replaces nor shows team a's."""
    store = place.open()
    store.create_schema()
    store.write_run("run-1", "nightly-a", "finished", {"team": "a"}, {"passed": True}, project="team-a")
    store.write_run("run-1", "nightly-b", "running", {"team": "b"}, {}, project="team-b")
    store.backend.command("OPTIMIZE TABLE evalsi_runs FINAL")  # a merge keeps one row per key
    for project, name, status in (("team-a", "nightly-a", "finished"), ("team-b", "nightly-b", "running")):
        (run,) = store.list_runs(run_id="run-1", project=project)
        assert (run["project"], run["name"], run["status"]) == (project, name, status)
        assert [r["name"] for r in store.list_runs(project=project)] == [name]
    assert sorted(r["project"] for r in store.list_runs()) == ["team-a", "team-b"]  # no project: every project's


# As the store was created before version 5: `evalsi_runs` keyed by its run id alone (migration 1), `Project` added
# by migration 2 with every earlier run in `default`.
OLD_RUNS_DDL = """CREATE TABLE evalsi_runs (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    RunId String CODEC(ZSTD(1)),
    Name LowCardinality(String) CODEC(ZSTD(1)),
    Status LowCardinality(String) CODEC(ZSTD(1)),
    Manifest String CODEC(ZSTD(3)),
    Summary String CODEC(ZSTD(3))
) ENGINE = ReplacingMergeTree(Timestamp)
ORDER BY RunId
SETTINGS index_granularity = 8192"""
OLD_RUNS_PROJECT = "ALTER TABLE evalsi_runs ADD COLUMN IF NOT EXISTS Project LowCardinality(String) DEFAULT 'default'"


def _old_store(place: Place) -> None:
    """A store as evalsi made it at schema version 4, holding two runs of the time: one recorded before projects
    (so `default`), one by team a."""
    store = place.open()
    store.backend.command(OLD_RUNS_DDL)
    store.backend.command(
        "INSERT INTO evalsi_runs (Timestamp, RunId, Name, Status, Manifest, Summary) VALUES "
        """(now64(9), 'run-early', 'early', 'finished', '{"seed": 1}', '{"passed": true}')"""
    )
    store.backend.command(OLD_RUNS_PROJECT)
    store.backend.command(
        "INSERT INTO evalsi_runs (Timestamp, RunId, Name, Status, Manifest, Summary, Project) VALUES "
        """(now64(9), 'run-a', 'nightly', 'finished', '{"seed": 2}', '{"passed": false}', 'team-a')"""
    )
    store.backend.command(schema_versions_ddl())
    for version, description in ((1, "tables"), (2, "runs project"), (3, "alerts"), (4, "watermarks")):
        store.backend.command(
            "INSERT INTO evalsi_schema (TracesTable, Version, Description) "
            f"VALUES ('otel_traces', {version}, '{description}')"
        )
    place.close()


@pytest.mark.parametrize("interrupted_after", [0, 1, 2, 3, 4], ids=lambda n: f"{n}-statements-done")
def test_a_store_made_before_runs_were_keyed_by_project_opens_with_its_runs(
    place: Place, interrupted_after: int
) -> None:
    """Migration 5 rebuilds `evalsi_runs` with the new key (a sorting key cannot be altered): whether a first start
    ran none of its statements or stopped after any of them, the next start finishes it with every run kept."""
    _old_store(place)
    store = place.open()
    keys = {r["name"]: r["sorting_key"] for r in store.backend.query(table_keys_sql())}
    assert keys["evalsi_runs"] == "RunId"
    steps = runs_by_project(store.tables, keys)
    assert len(steps) == 4  # rename, create, copy, drop
    for statement in steps[:interrupted_after]:
        store.backend.command(statement)
    place.close()
    store = place.open()
    store.create_schema()
    assert store.schema_version() == SCHEMA_VERSION
    (early,) = store.list_runs(run_id="run-early", project="default")
    assert (early["project"], early["name"], early["manifest"], early["summary"]) == (
        "default",
        "early",
        {"seed": 1},
        {"passed": True},
    )
    (a,) = store.list_runs(run_id="run-a", project="team-a")
    assert (a["project"], a["name"], a["manifest"], a["summary"]) == (
        "team-a",
        "nightly",
        {"seed": 2},
        {"passed": False},
    )
    assert store.list_runs(run_id="run-a", project="default") == []
    # the table is keyed by (project, run id) now: another project's run of the same id is a second run
    store.write_run("run-a", "theirs", "running", {}, {}, project="team-b")
    store.backend.command("OPTIMIZE TABLE evalsi_runs FINAL")
    assert [r["name"] for r in store.list_runs(run_id="run-a", project="team-a")] == ["nightly"]
    assert [r["name"] for r in store.list_runs(run_id="run-a", project="team-b")] == ["theirs"]
    tables = {
        r["name"] for r in store.backend.query("SELECT name FROM system.tables WHERE database = currentDatabase()")
    }
    assert not {t for t in tables if t.startswith("evalsi_runs_")}, "the old table is dropped once copied"
    place.close()
    again = place.open()
    again.create_schema()  # a restart changes nothing
    assert sorted(r["run_id"] for r in again.list_runs(limit=10)) == ["run-a", "run-a", "run-early"]


def test_a_runs_table_made_again_with_the_old_key_beside_the_renamed_one_is_merged_into_the_new(place: Place) -> None:
    """An old evalsi writing a run after a first attempt renamed the table (so the table is made again, keyed by
    run id): both tables' runs end up in the new one."""
    _old_store(place)
    store = place.open()
    store.backend.command("RENAME TABLE evalsi_runs TO evalsi_runs_by_run_id")
    store.backend.command(OLD_RUNS_DDL)
    store.backend.command(OLD_RUNS_PROJECT)
    store.backend.command(
        "INSERT INTO evalsi_runs (Timestamp, RunId, Name, Status, Manifest, Summary, Project) VALUES "
        "(now64(9), 'run-late', 'late', 'running', '{}', '{}', 'team-b')"
    )
    store.create_schema()
    assert sorted((r["project"], r["run_id"]) for r in store.list_runs(limit=10)) == [
        ("default", "run-early"), ("team-a", "run-a"), ("team-b", "run-late")
    ]  # fmt: skip
    keys = {r["name"]: r["sorting_key"] for r in store.backend.query(table_keys_sql())}
    assert keys["evalsi_runs"] == "Project, RunId" and "evalsi_runs_by_run_id" not in keys


def test_the_runs_commands_read_an_old_embedded_store_with_each_runs_project(tmp_path: Path) -> None:
    """`evalsi runs list|show` with no collector running start one on the embedded store: a store directory made
    before runs were keyed by project opens (migrated) with its runs, each under its recorded project."""
    _old_store(Place("chdb", f"chdb://{tmp_path / 'store'}", "default", "default", ""))
    (tmp_path / "evalsi.yaml").write_text(yaml.safe_dump(serve_config(tmp_path / "store")))

    def evalsi(*args: str) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([*EVALSI, "runs", *args, "-c", "evalsi.yaml"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stderr
        return res

    listed = json.loads(evalsi("list", "--json").stdout)
    assert sorted((r["project"], r["run_id"], r["name"]) for r in listed) == [
        ("default", "run-early", "early"), ("team-a", "run-a", "nightly")
    ]  # fmt: skip
    table = evalsi("list").stdout
    assert "project" in table and "team-a" in table  # two projects' runs: the table says whose
    shown = json.loads(evalsi("show", "run-a", "--json").stdout)
    assert (shown["name"], shown["manifest"], shown["passed"]) == ("nightly", {"seed": 2}, False)


def test_log_records_are_stored(place: Place) -> None:
    store = place.open()
    store.create_schema()
    record = LogRecord(
        T0, T0, TRACE, "00000000000000a2", severity_number=9, severity_text="INFO", body="the body",
        service_name="travel-agent", attributes={"event.name": "gen_ai.evaluation.result"},
        event_name="gen_ai.evaluation.result",
    )  # fmt: skip
    store.insert_logs(logs_to_arrow([record]))
    rows = store.backend.query("SELECT TraceId, Body, EventName, LogAttributes FROM otel_logs")
    assert rows == [
        {"TraceId": TRACE, "Body": "the body", "EventName": "gen_ai.evaluation.result",
         "LogAttributes": {"event.name": "gen_ai.evaluation.result"}}
    ]  # fmt: skip


def test_rows_a_single_insert_cannot_take_are_a_data_error_on_every_path(place: Place) -> None:
    """What the exporter halves and drops alone must be recognised the same way however the error arrives."""
    store = place.open()
    store.create_schema()
    day = 86_400 * 10**9
    spread = [
        Span(f"{i + 1:032x}", f"{i + 1:016x}", "", "s", "CLIENT", T0 - i * day, T0 - i * day + 1) for i in range(120)
    ]
    with pytest.raises(Exception) as refused:
        store.insert_spans(to_arrow(spread))
    assert error_reason(refused.value) == "TOO_MANY_PARTS"
    assert is_data_error(refused.value)
    assert store.span_count() == 0, "nothing of the refused insert was stored"


def test_ttl_expires_traces_logs_and_scores_and_follows_the_config(place: Place) -> None:
    store = place.open(ttl=720 * 3600)
    store.create_schema()
    ttls = store.ttls()
    assert set(ttls) == {
        "otel_traces", "otel_traces_trace_id_ts", "otel_logs", "evalsi_scores", "evalsi_alerts", "evalsi_judge_ledger",
        "evalsi_session_activity",
    }  # fmt: skip
    assert ttls["otel_traces"] == "toDateTime(Timestamp) + toIntervalSecond(2592000)"
    assert ttls["otel_traces_trace_id_ts"] == "toDateTime(Start) + toIntervalSecond(2592000)"
    assert ttls["evalsi_scores"] == ttls["otel_logs"] == ttls["evalsi_alerts"] == ttls["otel_traces"]
    assert ttls["evalsi_judge_ledger"] == ttls["evalsi_session_activity"] == ttls["otel_traces"]
    place.close()
    shorter = place.open(ttl=24 * 3600)
    shorter.create_schema()
    assert set(shorter.ttls().values()) == {
        "toDateTime(Timestamp) + toIntervalSecond(86400)", "toDateTime(Start) + toIntervalSecond(86400)"
    }  # fmt: skip
    place.close()
    forever = place.open(ttl=0)
    forever.create_schema()
    assert set(forever.ttls().values()) == {""}


def test_spans_older_than_the_ttl_are_dropped(place: Place) -> None:
    store = place.open(ttl=3600)
    store.create_schema()
    old = Span(OTHER, "00000000000000b1", "", "old", "CLIENT", T0 - 3 * 3600 * 10**9, T0 - 3 * 3600 * 10**9 + 1)
    store.write([old, *_spans()[:2]])
    store.backend.command("OPTIMIZE TABLE otel_traces FINAL")
    assert {t["trace_id"] for t in store.list_traces(limit=10)} == {TRACE}


def test_a_server_database_that_does_not_exist_is_created(server_place: Place) -> None:
    place = server_place
    store = place.open()
    store.create_schema()
    rows = store.backend.query("SELECT currentDatabase() AS db")
    assert rows == [{"db": place.database}]
    with pytest.raises(StoreError, match=f"no database '{place.database}_x'|UNKNOWN_DATABASE"):
        open_backend(
            place.endpoint, database=place.database + "_x", username=place.username, password=place.password,
            create=False,
        )  # fmt: skip


def test_async_inserts_wait_for_the_write(place: Place, request: pytest.FixtureRequest) -> None:
    if place.kind == "chdb":
        with pytest.raises(ValueError, match="async_insert: applies to a ClickHouse server"):
            ClickHouseConfig(endpoint=place.endpoint, async_insert=True)
        return
    store = place.open(async_insert=True)
    store.create_schema()
    store.write(_spans())
    assert store.span_count() == 3, "an insert returns once its rows are written, not while they sit in a buffer"
    if place.kind == "clickhouse-connect+stand-in":
        sent: list[dict[str, Any]] = request.getfixturevalue("stand_in").requests()
        inserts = [r for r in sent if r["database"] == place.database
                   and r["sql"].replace("`", "").upper().lstrip().startswith("INSERT INTO OTEL_TRACES")]  # fmt: skip
        assert inserts and all(
            r["settings"].get("async_insert") == "1" and r["settings"].get("wait_for_async_insert") == "1"
            for r in inserts
        ), inserts[-1:]


def test_wrong_credentials_are_an_error_that_says_so(server_place: Place) -> None:
    place = server_place
    with pytest.raises(
        StoreError, match=r"cannot reach the ClickHouse server at .*(AUTHENTICATION_FAILED|uthentication)"
    ):
        open_backend(place.endpoint, database=place.database, username="default", password="wrong")


# -- the server path's config ----------------------------------------------------------------------------------------


def test_the_old_ttl_days_key_is_refused_with_the_ttl_to_write() -> None:
    with pytest.raises(ValueError, match=r"ttl_days: renamed to `ttl`.*`ttl: 720h`"):
        ClickHouseConfig(ttl_days=30)


def test_tls_needs_an_https_endpoint_and_files_that_exist(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tls: the endpoint 'http://ch:8123' does not use TLS.*https://"):
        ClickHouseConfig(endpoint="http://ch:8123", tls={})
    with pytest.raises(ValueError, match=r"ca_file: no file at '/nonexistent/ca.pem'"):
        ClickHouseConfig(endpoint="https://ch:8443", tls={"ca_file": "/nonexistent/ca.pem"})
    cert = tmp_path / "client.pem"
    cert.write_text("x")
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        ClickHouseConfig(endpoint="https://ch:8443", tls={"cert_file": str(cert)})
    ok = ClickHouseConfig(endpoint="https://ch:8443", tls={"ca_file": str(cert), "server_name_override": "ch.internal"})
    assert ok.tls is not None and ok.tls.ca_file == str(cert)


def test_a_tls_config_reaches_the_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What clickhouse-connect is given for an https endpoint (no TLS server runs here to connect to)."""
    import clickhouse_connect

    from evalsi.exporters.clickhouse import _open

    seen: dict[str, Any] = {}

    class Client:
        database = ""

        def close(self) -> None:
            pass

    def get_client(**kwargs: Any) -> Client:
        seen.update(kwargs)
        return Client()

    monkeypatch.setattr(clickhouse_connect, "get_client", get_client)
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "c.pem", "k.pem"))
    for f in (ca, cert, key):
        f.write_text("x")
    config = ClickHouseConfig(
        endpoint="https://ch.internal:8443", database="evalsi", username="evalsi", password="pw",
        tls={"ca_file": str(ca), "cert_file": str(cert), "key_file": str(key), "server_name_override": "ch"},
    )  # fmt: skip
    _open(config, create=False).close()
    assert seen["secure"] is True and seen["verify"] is True
    assert (seen["host"], seen["port"], seen["database"]) == ("ch.internal", 8443, "evalsi")
    assert (seen["ca_cert"], seen["client_cert"], seen["client_cert_key"]) == (str(ca), str(cert), str(key))
    assert seen["server_host_name"] == "ch"
    insecure = ClickHouseConfig(endpoint="https://ch.internal", tls={"insecure_skip_verify": True})
    _open(insecure, create=False).close()
    assert seen["verify"] is False and seen["port"] == 8443


DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_clickhouse_page_configs_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    import yaml

    from evalsi.collector.config import parse_config

    text = (DOCS / "exporters" / "clickhouse.md").read_text()
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    for name in ("ca.pem", "client.pem", "client-key.pem"):
        (tls_dir / name).write_text("x")
    monkeypatch.setenv("CLICKHOUSE_PASSWORD", "pw")
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    for block in blocks:
        doc = yaml.safe_load(block.replace("/etc/evalsi/tls", str(tls_dir)))
        doc["service"] = {"pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["clickhouse"]}}}
        doc["receivers"] = {"otlp": {}}
        config = parse_config(doc, source="docs/exporters/clickhouse.md")
        assert config is not None


def test_judge_verdicts_meet_peoples_feedback_on_the_same_trace_and_the_baseline_period(place: Place) -> None:
    store = place.open()
    store.create_schema()
    judge = [
        Score("faithful", passed=i % 3 != 0, trace_id=f"{i:032x}", policy="chat", evaluator="builtin/llm-judge",
              source="llm_judge", timestamp_unix_nano=T0 + i)
        for i in range(12)
    ]  # fmt: skip
    people = [
        Score("thumbs", passed=i % 2 == 0, trace_id=f"{i:032x}", policy="feedback", evaluator="feedback",
              source="human", timestamp_unix_nano=T0 + 100 + i)
        for i in range(4)
    ]  # fmt: skip
    elsewhere = [Score("thumbs", passed=False, trace_id=f"{1:032x}", policy="feedback", evaluator="feedback",
                       source="human", project="other", timestamp_unix_nano=T0)]  # fmt: skip
    store.write_scores(judge + people + elsewhere)
    found = store.judge_agreement(since_ns=T0 - 1, project="default")
    assert found["totals"] == [{"policy": "chat", "evaluator": "builtin/llm-judge", "name": "faithful", "n": 12,
                                "passed": 8}]  # fmt: skip
    pairs = sorted((r["judge"], r["human_passed"], r["feedback"]) for r in found["pairs"])
    assert pairs == sorted((i % 3 != 0, i % 2 == 0, "thumbs") for i in range(4))  # not the other project's
    # a period before a time, and one run's scores
    assert [r["n"] for r in store.score_window_stats(since_ns=T0 - 1, until_ns=T0 + 6, policy="chat")] == [6]
    store.write_scores([Score("faithful", passed=True, trace_id=f"{i:032x}", run_id="r-1") for i in range(3)])
    assert [r["n"] for r in store.score_window_stats(since_ns=0, run_id="r-1")] == [3]
