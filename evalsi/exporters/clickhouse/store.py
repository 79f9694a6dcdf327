"""The trace store: creates the schema, writes span batches, and answers the trace queries the API and CLI make."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from evalsi.exporters.clickhouse.backend import Backend, StoreError
from evalsi.exporters.clickhouse.rows import canonical_from_row, scores_to_arrow, to_arrow
from evalsi.exporters.clickhouse.schema import (
    JUDGE_LEDGER_COLUMNS,
    MIGRATIONS,
    SCHEMA_VERSION,
    Tables,
    dataset_rows_sql,
    delete_spans_sql,
    judge_ledger_sql,
    judge_pairs_sql,
    judge_totals_sql,
    list_alerts_sql,
    list_datasets_sql,
    list_runs_sql,
    list_scores_sql,
    list_sessions_sql,
    list_traces_sql,
    policy_window_sql,
    quiet_sessions_sql,
    record_migration_sql,
    run_scores_sql,
    schema_version_sql,
    schema_versions_ddl,
    score_window_stats_sql,
    search_traces_sql,
    session_scores_sql,
    session_spans_sql,
    settings_clause,
    settings_to_apply,
    span_counts_sql,
    span_keys_sql,
    table_definitions_sql,
    table_keys_sql,
    trace_page_sql,
    trace_span_count_sql,
    trace_spans_sql,
    traces_spans_sql,
    ttl_expression,
    ttl_targets,
    watermark_sql,
)
from evalsi.model.score import DEFAULT_PROJECT, Score
from evalsi.model.span import Span
from evalsi.store import LedgerRow, QuietSession

if TYPE_CHECKING:
    from evalsi.policies.notify import AlertEvent

_HEX = re.compile(r"[0-9a-f]+")  # with fullmatch: no trailing newline
_TTL = re.compile(r"\sTTL\s+(.*?)\s+(?:SETTINGS|$)", re.S)


def _finite(value: Any) -> Any:
    """`value` with NaN and infinities as None: JSON has no spelling for them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _ttl_of(create_table_query: str) -> str:
    found = _TTL.search(create_table_query)
    return found.group(1).strip() if found else ""


def _checked(trace_ids: list[str]) -> list[str]:
    ids = [t.lower() for t in trace_ids]
    bad = next((t for t in ids if not (len(t) == 32 and _HEX.fullmatch(t))), None)
    if bad is not None:
        raise ValueError(f"not a trace id: {bad[:80]!r} (32 hex digits)")
    return ids


MAX_FILTER = 1000
"""The longest name a query filters on (as the API): past 4 KiB of parameters clickhouse-connect sends a form body."""


def hex_param(name: str, text: str) -> str:
    """A string for a `unhex({name:String})` placeholder, so it matches as written. ClickHouse reads a bound value as
    escaped text (`\\x73` is `s`, a lone `\\` an error); chDB hands it over as given and clickhouse-connect escapes
    it first, so a backslash would mean one thing on one path and another on the other. Hex digits read the same."""
    if len(text) > MAX_FILTER:
        raise ValueError(f"{name}: {len(text)} characters; at most {MAX_FILTER}")
    return text.encode("utf-8", "surrogateescape").hex()


_UINT32_MAX = 2**32 - 1
_INT64_MAX = 2**63 - 1


PROJECT = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def _project(project: str | None) -> dict[str, str]:
    """The {project:String} parameter of a query filtered by project (none: every project)."""
    if project is None:
        return {}
    if not PROJECT.fullmatch(project):
        raise ValueError(f"not a project name: {project[:80]!r} (lowercase letters, digits, - and _; 63 at most)")
    return {"project": project}


_UINT64_MAX = 2**64 - 1


def _limit(limit: int) -> int:
    """A {limit:UInt32}: ClickHouse would wrap a larger one around (2**32 reads as 0)."""
    if not 1 <= limit <= _UINT32_MAX:
        raise ValueError(f"limit: {limit} is not from 1 to {_UINT32_MAX}")
    return limit


def _since(since_ns: int) -> int:
    """An {Int64} time in ns since 1970: ClickHouse would wrap a larger one around to a negative time."""
    if not 0 <= since_ns <= _INT64_MAX:
        raise ValueError(f"since: {since_ns} ns is not a time from 1970 to 2262")
    return since_ns


def _trace_row(r: dict[str, Any]) -> dict[str, Any]:
    """A trace's summary row (`schema._TRACE_ROW`) as the API shows it."""
    return {
        "trace_id": r["trace_id"],
        "root_name": r["root_name"] or r["first_name"],
        "service_name": r["root_service"] or r["first_service"],
        "session_id": r.get("session_id") or None,
        "start_time_unix_nano": int(r["start_time_unix_nano"]),
        "duration_ns": max(0, int(r["duration_ns"])),
        "span_count": int(r["span_count"]),
        "error_count": int(r["error_count"]),
        "llm_calls": int(r["llm_calls"]),
        "input_tokens": int(r["input_tokens"]),
        "output_tokens": int(r["output_tokens"]),
        "cost_usd": r["cost_usd"],
    }


def _score_row(r: dict[str, Any]) -> dict[str, Any]:
    """A score row (`schema._SCORE_COLUMNS`) as the API shows it."""
    r["timestamp_unix_nano"] = int(r["timestamp_unix_nano"])
    r["trial"] = int(r["trial"])
    r["passed"] = None if r["passed"] is None else bool(r["passed"])
    r["value"] = None if r["value"] is None else float(r["value"])
    for key in ("label", "explanation", "reason"):
        r[key] = r[key] or None
    return r


MAX_ATTRIBUTE_FILTERS = 20
"""The most `KEY=VALUE` attribute filters one search takes."""


class TraceStore:
    def __init__(
        self,
        backend: Backend,
        *,
        table: str = "otel_traces",
        logs_table: str = "otel_logs",
        scores_table: str = "evalsi_scores",
        runs_table: str = "evalsi_runs",
        ttl: float = 0.0,
    ) -> None:
        self.backend = backend
        self.table = table
        self.logs_table = logs_table
        self.scores_table = scores_table
        self.runs_table = runs_table
        self.ttl_s = int(ttl)
        self.tables = Tables(table, logs_table, scores_table, runs_table, settings_clause(backend.table_settings))
        self._ledger_ns = 0  # the version of the newest ledger row written here: each next one is newer
        self._ledger_lock = threading.Lock()

    @property
    def description(self) -> str:
        return self.backend.description

    def schema_version(self) -> int:
        """The newest migration this store has run (0: none, or a store from before migrations were recorded)."""
        self.backend.command(schema_versions_ddl())
        rows = self.backend.query(schema_version_sql(), {"traces": self.table})
        return int(rows[0]["version"] or 0) if rows and rows[0]["n"] else 0

    def create_schema(self) -> None:
        """Run the migrations this store has not run yet, then set the tables' TTL to `ttl`. Idempotent: safe at
        every start and from several replicas at once."""
        version = self._checked_version()
        for migration in MIGRATIONS:
            if migration.version > version:
                keys = {r["name"]: r["sorting_key"] for r in self.backend.query(table_keys_sql())}
                for statement in migration.statements(self.tables, keys):
                    self.backend.command(statement)
                self.backend.command(record_migration_sql(self.table, migration))
        self._apply_table_settings()
        self._apply_ttl()

    def check_schema(self) -> None:
        """With `create_schema: false`: the tables must be at this evalsi's version already."""
        version = self._checked_version()
        if version < SCHEMA_VERSION:
            raise StoreError(
                f"the {self.description} has the store schema at version {version}, and this evalsi needs "
                f"{SCHEMA_VERSION}: start it once with `create_schema: true` (it runs the missing migrations, "
                "idempotently), or run the statements of evalsi/exporters/clickhouse/schema.py MIGRATIONS yourself"
            )

    def _checked_version(self) -> int:
        version = self.schema_version()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the {self.description} has the store schema at version {version}, newer than this evalsi knows "
                f"({SCHEMA_VERSION}): upgrade evalsi, or point it at another database"
            )
        return version

    def _apply_table_settings(self) -> None:
        """Give the traces and logs tables the backend's MergeTree settings they lack (a store made by an earlier
        evalsi): they apply to the parts written and merged from then on."""
        settings = self.backend.table_settings
        if not settings:
            return
        tables = [self.tables.traces, self.tables.logs]
        for row in self.backend.query(table_definitions_sql(tables)):
            missing = settings_to_apply(row["create_table_query"], settings)
            if missing:
                self.backend.command(f"ALTER TABLE {row['name']} MODIFY SETTING {settings_clause(missing)[2:]}")

    def _apply_ttl(self) -> None:
        targets = ttl_targets(self.tables)
        defined = {
            r["name"]: r["create_table_query"]
            for r in self.backend.query(table_definitions_sql([name for name, _ in targets]))
        }
        for name, column in targets:
            ddl = defined.get(name, "")
            if self.ttl_s > 0 and f"TTL {ttl_expression(column, self.ttl_s)}" not in ddl:
                self.backend.command(f"ALTER TABLE {name} MODIFY TTL {ttl_expression(column, self.ttl_s)}")
            elif self.ttl_s == 0 and " TTL " in ddl:
                self.backend.command(f"ALTER TABLE {name} REMOVE TTL")

    def ttls(self) -> dict[str, str]:
        """Each expiring table's TTL expression as the store reports it ("" for none)."""
        targets = [name for name, _ in ttl_targets(self.tables)]
        defined = {r["name"]: r["create_table_query"] for r in self.backend.query(table_definitions_sql(targets))}
        return {name: _ttl_of(defined.get(name, "")) for name in targets}

    def write(self, spans: list[Span]) -> None:
        if spans:
            self.insert_spans(to_arrow(spans))

    def insert_spans(self, table: pa.Table) -> None:
        """Insert spans already in the table's columns (`rows.to_arrow`)."""
        self.backend.insert(self.table, table)

    def revise_spans(self, table: pa.Table) -> None:
        """Replace stored spans by these newer versions of them (same trace and span ids)."""
        self._delete(list(zip(table["TraceId"].to_pylist(), table["SpanId"].to_pylist(), strict=True)))
        self.insert_spans(table)

    def _delete(self, keys: list[tuple[str, str]]) -> None:
        keys = [(t, s) for t, s in keys if _HEX.fullmatch(t) and _HEX.fullmatch(s)]
        if keys:
            self.backend.command(delete_spans_sql(self.table, keys))

    def insert_logs(self, table: pa.Table) -> None:
        self.backend.insert(self.logs_table, table)

    def insert_scores(self, table: pa.Table) -> None:
        self.backend.insert(self.scores_table, table)

    def write_scores(self, scores: list[Score]) -> None:
        if scores:
            self.insert_scores(scores_to_arrow(scores))

    def list_scores(
        self, *, limit: int = 100, trace_id: str | None = None, policy: str | None = None, project: str | None = None
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": _limit(limit), **_project(project)}
        if trace_id:
            params["trace_id"] = _checked([trace_id])[0]
        if policy:
            params["policy_hex"] = hex_param("policy", policy)
        sql = list_scores_sql(
            self.scores_table, with_trace=bool(trace_id), with_policy=bool(policy), with_project=project is not None
        )
        return [_score_row(r) for r in self.backend.query(sql, params)]

    def score_window_stats(
        self,
        *,
        since_ns: int,
        policy: str | None = None,
        project: str | None = None,
        until_ns: int | None = None,
        run_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Per (policy, evaluator, name), the scored scores since `since_ns` (and before `until_ns`; of one offline
        run with `run_id`): n, value_n, value_mean, value_sd, p50, p95, value_min, value_max, value_binary (values
        that are 0 or 1), pass_n, passed (None where a series has no values)."""
        params: dict[str, Any] = {"since_ns": _since(since_ns), **_project(project)}
        if policy:
            params["policy_hex"] = hex_param("policy", policy)
        if until_ns is not None:
            params["until_ns"] = _since(until_ns)
        if run_id:
            params["run_id_hex"] = hex_param("run_id", run_id)
        sql = score_window_stats_sql(
            self.scores_table, with_policy=bool(policy), with_project=project is not None,
            with_until=until_ns is not None, with_run=bool(run_id),
        )  # fmt: skip
        rows = self.backend.query(sql, params)
        for r in rows:
            for key in ("n", "value_n", "pass_n", "passed", "value_binary"):
                r[key] = int(r[key])
            for key in ("value_mean", "value_sd", "p50", "p95", "value_min", "value_max"):
                v = r[key]
                r[key] = None if v is None or not r["value_n"] or v != v else float(v)
        return rows

    def judge_agreement(
        self, *, since_ns: int, policy: str | None = None, project: str | None = None, limit: int = 100_000
    ) -> dict[str, list[dict[str, Any]]]:
        """Judge calibration rows: `pairs`, a judge's verdict (policy, evaluator, name, since `since_ns`) beside a
        person's latest feedback of one name on the same trace (`judge`, `human_passed`, `human_value`,
        `human_label`); `totals`, per judge the traces it gave a verdict and how many passed."""
        params: dict[str, Any] = {"since_ns": _since(since_ns), "limit": _limit(limit), **_project(project)}
        if policy:
            params["policy_hex"] = hex_param("policy", policy)
        kw = {"with_policy": bool(policy), "with_project": project is not None}
        pairs = self.backend.query(judge_pairs_sql(self.scores_table, **kw), params)
        totals = self.backend.query(judge_totals_sql(self.scores_table, **kw), params)
        for r in pairs:
            r["judge"] = bool(r["judge"])
            r["human_passed"] = None if r["human_passed"] is None else bool(r["human_passed"])
            v = r["human_value"]
            r["human_value"] = None if v is None or v != v else float(v)
            r["human_label"] = r["human_label"] or None
        for r in totals:
            r["n"], r["passed"] = int(r["n"]), int(r["passed"])
        return {"pairs": pairs, "totals": totals}

    def list_traces(
        self, *, limit: int = 20, service: str | None = None, project: str | None = None
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": _limit(limit), **_project(project)}
        if service:
            params["service_hex"] = hex_param("service", service)
        rows = self.backend.query(list_traces_sql(self.table, bool(service), project is not None), params)
        return [_trace_row(r) for r in rows]

    def get_trace(self, trace_id: str, *, project: str | None = None) -> list[dict[str, Any]]:
        """The trace's spans in the canonical shape, in start order; empty when unknown (in `project`)."""
        params = {"trace_id": _checked([trace_id])[0], **_project(project)}
        rows = self.backend.query(trace_spans_sql(self.table, project is not None), params)
        return [canonical_from_row(r) for r in rows]

    def trace_page(
        self, trace_id: str, *, limit: int, offset: int = 0, project: str | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """At most `limit` spans of a trace from `offset` on, in start order, and how many spans it holds: memory
        stays bounded however many spans a sender put in one trace."""
        if not 0 <= offset <= _INT64_MAX:
            raise ValueError(f"offset: {offset} is not from 0 to {_INT64_MAX}")
        params: dict[str, Any] = {"trace_id": _checked([trace_id])[0], **_project(project)}
        counted = self.backend.query(trace_span_count_sql(self.table, project is not None), params)
        total = int(counted[0]["n"]) if counted else 0
        if total == 0 or offset >= total:
            return [], total
        sql = trace_page_sql(self.table, project is not None)
        rows = self.backend.query(sql, {**params, "limit": _limit(limit), "offset": offset})
        return [canonical_from_row(r) for r in rows], total

    def search_traces(
        self, *, limit: int = 20, service: str | None = None, since_ns: int | None = None,
        until_ns: int | None = None, error: bool | None = None, model: str | None = None, session: str | None = None,
        min_duration_ns: int | None = None, attributes: Sequence[tuple[str, str]] = (), failed: str | None = None,
        oldest_first: bool = False, project: str | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """Trace rows (as `list_traces`) matching every filter given: started from `since_ns` to `until_ns`, with
        (`error=True`) or without (`False`) an error span, a span of `model`, of `session`, a span or resource with
        each attribute (key, value), lasting at least `min_duration_ns`, a scored score of evaluator `failed` that
        did not pass. Newest first, or oldest first."""
        params: dict[str, Any] = {"limit": _limit(limit), **_project(project)}
        if service:
            params["service_hex"] = hex_param("service", service)
        if since_ns is not None:
            params["since_ns"] = _since(since_ns)
        if until_ns is not None:
            params["until_ns"] = _since(until_ns)
        if error is not None:
            params["error"] = int(error)
        if model:
            params["model_hex"] = hex_param("model", model)
        if session:
            params["session_hex"] = hex_param("session", session)
        if min_duration_ns is not None:
            params["min_duration_ns"] = _since(min_duration_ns)
        if len(attributes) > MAX_ATTRIBUTE_FILTERS:
            raise ValueError(f"attributes: {len(attributes)} filters; at most {MAX_ATTRIBUTE_FILTERS}")
        for n, (key, value) in enumerate(attributes):
            params[f"attr_key_hex_{n}"] = hex_param("attribute key", key)
            params[f"attr_value_hex_{n}"] = hex_param("attribute value", value)
        if failed:
            params["failed_hex"] = hex_param("failed", failed)
        sql = search_traces_sql(self.table, self.scores_table, params, oldest_first=oldest_first)
        return [_trace_row(r) for r in self.backend.query(sql, params)]

    def list_sessions(
        self, *, limit: int = 20, since_ns: int | None = None, until_ns: int | None = None, project: str | None = None
    ) -> list[dict[str, Any]]:
        """Sessions, the most recently active first: trace_count, first start, last end, sums over their spans."""
        params: dict[str, Any] = {"limit": _limit(limit), **_project(project)}
        if since_ns is not None:
            params["since_ns"] = _since(since_ns)
        if until_ns is not None:
            params["until_ns"] = _since(until_ns)
        out = []
        for r in self.backend.query(list_sessions_sql(self.table, params), params):
            for key in ("trace_count", "start_time_unix_nano", "end_time_unix_nano", "last_trace_start_unix_nano",
                        "span_count", "error_count", "llm_calls", "input_tokens", "output_tokens"):  # fmt: skip
                r[key] = int(r[key])
            r["user_id"] = r["user_id"] or None
            out.append(r)
        return out

    def session_scores(self, session_id: str, *, limit: int = 1000, project: str | None = None) -> list[dict[str, Any]]:
        """Scores of a session and of its traces, oldest first."""
        params = {"session_hex": hex_param("session", session_id), "limit": _limit(limit), **_project(project)}
        sql = session_scores_sql(self.scores_table, self.table, project is not None)
        return [_score_row(r) for r in self.backend.query(sql, params)]

    def span_counts(self, trace_ids: list[str], *, since_ns: int = 0, project: str | None = None) -> dict[str, int]:
        """Stored spans of each trace (started since `since_ns`); a trace with none is left out."""
        sql = span_counts_sql(self.table, _checked(trace_ids), project is not None)
        rows = self.backend.query(sql, {"since": _since(since_ns), **_project(project)})
        return {r["trace_id"]: int(r["spans"]) for r in rows}

    def stored_span_keys(self, trace_ids: list[str], *, project: str | None = None) -> set[tuple[str, str]]:
        """The (trace id, span id) of every stored span of these traces, of one project (None: of any): what a
        write-ahead log replay or a re-sender leaves out."""
        found: set[tuple[str, str]] = set()
        sql_project, params = project is not None, _project(project)
        for i in range(0, len(trace_ids), 500):
            rows = self.backend.query(span_keys_sql(self.table, _checked(trace_ids[i : i + 500]), sql_project), params)
            found.update((r["TraceId"], r["SpanId"]) for r in rows)
        return found

    def get_traces(
        self, trace_ids: list[str], *, since_ns: int = 0, project: str | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        """The spans of several traces in the canonical shape, by trace id, each in start order."""
        sql = traces_spans_sql(self.table, _checked(trace_ids), project is not None)
        rows = self.backend.query(sql, {"since": _since(since_ns), **_project(project)})
        out: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            out.setdefault(r["TraceId"], []).append(canonical_from_row(r))
        return out

    def run_scores(self, run_id: str, *, project: str | None = None) -> list[dict[str, Any]]:
        params = {"run_id_hex": hex_param("run_id", run_id), **_project(project)}
        return self.backend.query(run_scores_sql(self.scores_table, project is not None), params)

    def write_run(
        self, run_id: str, name: str, status: str, manifest: dict[str, Any], summary: dict[str, Any],
        *, project: str = DEFAULT_PROJECT,
    ) -> None:  # fmt: skip
        """Record a run of `project` (the newest record of its run id in that project wins)."""
        _project(project)
        table = pa.table(
            {
                "Timestamp": pa.array([time.time_ns()], pa.timestamp("ns")),
                "RunId": [run_id],
                "Name": [name],
                "Status": [status],
                "Manifest": [json.dumps(manifest, sort_keys=True, default=str)],
                "Summary": [json.dumps(summary, sort_keys=True, default=str)],
                "Project": [project],
            }
        )
        self.backend.insert(self.runs_table, table)

    def read_watermark(self, source: str) -> dict[str, Any] | None:
        """A pull receiver's watermark for `source` (see `evalsi.receivers.pull`), None before its first."""
        rows = self.backend.query(watermark_sql(self.tables.watermarks), {"source": source})
        return json.loads(rows[0]["watermark"]) if rows else None

    def write_watermark(self, source: str, watermark: dict[str, Any]) -> None:
        table = pa.table(
            {
                "Timestamp": pa.array([time.time_ns()], pa.timestamp("ns")),
                "Source": [source],
                "Watermark": [json.dumps(watermark, sort_keys=True)],
            }
        )
        self.backend.insert(self.tables.watermarks, table)

    def list_runs(
        self, *, limit: int = 20, run_id: str | None = None, project: str | None = None
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": _limit(limit), **_project(project)}
        if run_id:
            params["run_id_hex"] = hex_param("run_id", run_id)
        sql = list_runs_sql(self.runs_table, with_id=bool(run_id), with_project=project is not None)
        rows = self.backend.query(sql, params)
        for r in rows:
            r["manifest"] = json.loads(r["manifest"] or "{}")
            r["summary"] = json.loads(r["summary"] or "{}")
        return rows

    def write_alerts(self, alerts: Sequence[AlertEvent], *, project: str = DEFAULT_PROJECT) -> None:
        """Record alerts that fired or resolved (`AlertEvent.state`)."""
        if not alerts:
            return
        _project(project)
        table = pa.table(
            {
                "Timestamp": pa.array([int(a.fired_at * 1e9) for a in alerts], pa.timestamp("ns")),
                "Project": [project] * len(alerts),
                "Policy": [a.policy for a in alerts],
                "Alert": [a.alert for a in alerts],
                "State": [a.state for a in alerts],
                "Condition": [a.condition for a in alerts],
                "WindowStart": pa.array([int(a.window_start * 1e3) for a in alerts], pa.timestamp("ms")),
                "WindowEnd": pa.array([int(a.window_end * 1e3) for a in alerts], pa.timestamp("ms")),
                "TraceCount": pa.array([a.count for a in alerts], pa.uint64()),
                "ConditionValues": [json.dumps(_finite(a.values), sort_keys=True) for a in alerts],
                "Aggregates": [json.dumps(_finite(a.aggregates), sort_keys=True) for a in alerts],
                "ExampleTraceIds": pa.array([a.example_trace_ids for a in alerts], pa.list_(pa.string())),
                "Labels": pa.array([list(a.labels.items()) for a in alerts], pa.map_(pa.string(), pa.string())),
            }
        )
        self.backend.insert(self.tables.alerts, table)

    def list_alerts(
        self, *, limit: int = 100, policy: str | None = None, since_ns: int = 0, project: str | None = None
    ) -> list[dict[str, Any]]:
        """Alerts that fired or resolved since `since_ns`, newest first."""
        params: dict[str, Any] = {"limit": _limit(limit), "since_ns": _since(since_ns), **_project(project)}
        if policy:
            params["policy_hex"] = hex_param("policy", policy)
        sql = list_alerts_sql(self.tables.alerts, with_policy=bool(policy), with_project=project is not None)
        rows = self.backend.query(sql, params)
        for r in rows:
            for key in ("timestamp_unix_nano", "window_start_unix_ms", "window_end_unix_ms", "count"):
                r[key] = int(r[key])
            r["values"] = json.loads(r.pop("condition_values") or "{}")
            r["aggregates"] = json.loads(r["aggregates"] or "{}")
            r["labels"] = dict(r["labels"] or {})
        return rows

    def policy_window(self, policy: str, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        """`policy`'s scores in [start_ns, end_ns) from every replica, each key once: per (project, evaluator, name)
        the window's aggregates, and per project a row with `evaluator` '' and the traces it scored (`traces`)."""
        params = {"policy": policy, "start_ns": _since(start_ns), "end_ns": _since(end_ns)}
        rows = self.backend.query(policy_window_sql(self.scores_table), params)
        for r in rows:
            for key in ("n", "value_n", "pass_n", "passed", "value_binary", "skipped", "errors", "traces"):
                r[key] = int(r[key] or 0)
            for key in ("value_mean", "value_sd", "value_min", "value_max"):
                v = r[key]
                r[key] = None if v is None or not r["value_n"] or v != v else float(v)
            quantiles = r.pop("quantiles") or [] if r["value_n"] else []
            r["quantiles"] = {q: float(v) for q, v in zip((50.0, 90.0, 95.0, 99.0), quantiles, strict=False)}
            r["failures"] = list(r["failures"] or [])
            r["examples"] = list(r["examples"] or [])
        return rows

    def write_promoted(self, rows: Sequence[dict[str, Any]]) -> None:
        """Promoted dataset rows, each `{project, dataset, row_id, policy, promoted_at (s), record}`: a row id
        promoted again into one dataset of one project keeps its first promotion."""
        if not rows:
            return
        for r in rows:
            _project(r["project"])
        ns = [int(r["promoted_at"] * 1e9) for r in rows]
        table = pa.table(
            {
                "Project": [r["project"] for r in rows],
                "Dataset": [r["dataset"] for r in rows],
                "RowId": [r["row_id"] for r in rows],
                "PromotedAt": pa.array(ns, pa.timestamp("ns")),
                "Version": pa.array([_UINT64_MAX - n for n in ns], pa.uint64()),  # the first promotion wins
                "Policy": [r["policy"] for r in rows],
                "Record": [json.dumps(_finite(r["record"]), ensure_ascii=False, default=str) for r in rows],
            }
        )
        self.backend.insert(self.tables.datasets, table)

    def list_datasets(self, *, project: str | None = None) -> list[dict[str, Any]]:
        """Each promoted dataset with its row count and first and last promotion (of one project; None: of all)."""
        rows = self.backend.query(list_datasets_sql(self.tables.datasets, with_project=project is not None),
                                  _project(project))  # fmt: skip
        for r in rows:
            for key in ("rows", "first_unix_nano", "last_unix_nano"):
                r[key] = int(r[key])
        return rows

    def dataset_rows(self, dataset: str, *, limit: int = 100_000, project: str | None = None) -> list[dict[str, Any]]:
        """The rows of `dataset` as the harness reads them, in promotion order."""
        params: dict[str, Any] = {"dataset": dataset, "limit": _limit(limit), **_project(project)}
        found = self.backend.query(dataset_rows_sql(self.tables.datasets, with_project=project is not None), params)
        return [json.loads(r["record"]) for r in found]
    # --- what replicas share (`evalsi.store.ReplicaState`) -----------------------------------------------------

    def judge_ledger(self, project: str, budget: str, period: int) -> list[LedgerRow]:
        params = {**_project(project), "budget_hex": hex_param("budget", budget), "period": period}
        return [
            LedgerRow(
                project,
                budget,
                period,
                r["replica"],
                int(r["claimed_calls"]),
                int(r["claimed_tokens"]),
                float(r["claimed_usd"]),
                int(r["calls"]),
                int(r["tokens"]),
                float(r["usd"]),
            )
            for r in self.backend.query(judge_ledger_sql(self.tables.judge_ledger), params)
        ]

    def write_judge_ledger(self, rows: list[LedgerRow]) -> None:
        if not rows:
            return
        for r in rows:
            _project(r.project)
        with self._ledger_lock:
            now = self._ledger_ns = max(time.time_ns(), self._ledger_ns + 1)
            self._ledger_ns += len(rows)
        table = pa.table(
            {
                "Timestamp": pa.array([now + i for i in range(len(rows))], pa.timestamp("ns")),
                "Project": [r.project for r in rows],
                "Budget": [r.budget for r in rows],
                "Period": pa.array([r.period for r in rows], pa.int64()),
                "Replica": [r.replica for r in rows],
                "ClaimedCalls": pa.array([r.claimed_calls for r in rows], pa.uint64()),
                "ClaimedTokens": pa.array([r.claimed_tokens for r in rows], pa.uint64()),
                "ClaimedUsd": pa.array([r.claimed_usd for r in rows], pa.float64()),
                "Calls": pa.array([r.calls for r in rows], pa.uint64()),
                "Tokens": pa.array([r.tokens for r in rows], pa.uint64()),
                "Usd": pa.array([r.usd for r in rows], pa.float64()),
            }
        ).select(JUDGE_LEDGER_COLUMNS.split(", "))
        self.backend.insert(self.tables.judge_ledger, table)

    def note_sessions(self, replica: str, seen: dict[tuple[str, str], tuple[int, int]]) -> None:
        self._session_rows(replica, [(p, s, t, n) for (p, s), (t, n) in seen.items()])

    def mark_sessions_evaluated(self, sessions: list[QuietSession]) -> None:
        self._session_rows("", [(q.project, q.session_id, q.seen_ns, 0) for q in sessions])

    def _session_rows(self, replica: str, rows: list[tuple[str, str, int, int]]) -> None:
        if not rows:
            return
        for project, _, _, _ in rows:
            _project(project)
        now = time.time_ns()
        table = pa.table(
            {
                "Timestamp": pa.array([now] * len(rows), pa.timestamp("ns")),
                "Project": [r[0] for r in rows],
                "SessionId": [r[1] for r in rows],
                "Replica": [replica] * len(rows),
                "LastSeen": pa.array([r[2] for r in rows], pa.timestamp("ns")),
                "Traces": pa.array([r[3] for r in rows], pa.uint32()),
            }
        )
        self.backend.insert(self.tables.session_activity, table)

    def quiet_sessions(self, *, quiet_since_ns: int, active_since_ns: int) -> list[QuietSession]:
        params = {"quiet_since_ns": _since(quiet_since_ns), "active_since_ns": _since(active_since_ns)}
        rows = self.backend.query(quiet_sessions_sql(self.tables.session_activity), params)
        return [QuietSession(r["project"], r["session_id"], int(r["seen_ns"]), int(r["traces"])) for r in rows]

    def session_spans(self, project: str, session_id: str) -> list[dict[str, Any]]:
        params = {"session_hex": hex_param("session", session_id), **_project(project)}
        return [canonical_from_row(r) for r in self.backend.query(session_spans_sql(self.table), params)]

    def span_count(self) -> int:
        rows = self.backend.query(f"SELECT count() AS n FROM {self.table}")
        return int(rows[0]["n"]) if rows else 0

    def ping(self) -> bool:
        return self.backend.ping()

    def close(self) -> None:
        self.backend.close()
