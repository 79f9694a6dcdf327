"""Where the CLI reads traces: the running collector's API, or the store itself when no collector runs; and the
trace and session search both answer with (`search_traces`, `read_trace`, `list_sessions`, `show_session`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, cast
from urllib.parse import quote, urlsplit

import httpx

from evalsi import duration
from evalsi.auth.keys import KEY_ENV, api_headers
from evalsi.collector.config import Config, is_store, type_of
from evalsi.component import REGISTRY
from evalsi.duration import parse_duration
from evalsi.store import DatasetStore, StoreBusy, TraceQueries


class QueryError(Exception):
    """The traces cannot be read; the message says what to do."""


class TraceReader(Protocol):
    where: str

    def list_scores(self, *, limit: int, trace_id: str | None, policy: str | None) -> list[dict[str, Any]]: ...

    def list_alerts(self, *, limit: int, policy: str | None, since: str | None) -> list[dict[str, Any]]:
        """Policy alerts that fired or resolved in the last `since` (a duration: 1h, 30m; None: ever), newest
        first."""
        ...

    def search_traces(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """`GET /api/v1/traces` with these query parameters (`SEARCH_PARAMETERS`)."""
        ...

    def list_datasets(self) -> list[dict[str, Any]]:
        """The datasets promoted into the store, each with its row count and first and last promotion."""
        ...

    def dataset_rows(self, dataset: str, *, limit: int) -> list[dict[str, Any]] | None:
        """A promoted dataset's rows in promotion order; None when it has none."""
        ...

    def read_trace(self, trace_id: str, *, limit: int, offset: int) -> dict[str, Any] | None:
        """A page of the trace (`GET /api/v1/traces/{id}`) with its `scores`; None when unknown."""
        ...

    def list_sessions(self, params: Mapping[str, Any]) -> list[dict[str, Any]]: ...

    def show_session(self, session_id: str, *, limit: int) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


class ApiReader:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.where = f"API at {self.url}"
        self._client = httpx.Client(base_url=self.url, timeout=30, headers=api_headers())

    def _get(self, path: str, **params: Any) -> httpx.Response:
        try:
            resp = self._client.get(path, params={k: v for k, v in params.items() if v is not None})
        except httpx.HTTPError as e:
            raise QueryError(f"cannot reach the evalsi API at {self.url}: {e}; is `evalsi serve` running?") from None
        return resp

    def list_scores(self, *, limit: int, trace_id: str | None, policy: str | None) -> list[dict[str, Any]]:
        resp = self._get("/api/v1/scores", limit=limit, trace_id=trace_id, policy=policy)
        if resp.status_code != 200:
            raise QueryError(f"{self.where} answered {resp.status_code}: {_detail(resp)}")
        return resp.json()["scores"]

    def list_alerts(self, *, limit: int, policy: str | None, since: str | None) -> list[dict[str, Any]]:
        resp = self._get("/api/v1/alerts", limit=limit, policy=policy, since=since)
        if resp.status_code != 200:
            raise QueryError(f"{self.where} answered {resp.status_code}: {_detail(resp)}")
        return resp.json()["alerts"]

    def list_datasets(self) -> list[dict[str, Any]]:
        return cast(dict[str, Any], self._doc("/api/v1/datasets", {}))["datasets"]

    def dataset_rows(self, dataset: str, *, limit: int) -> list[dict[str, Any]] | None:
        doc = self._doc(f"/api/v1/datasets/{quote(dataset, safe='')}/rows", {"limit": limit}, missing=True)
        return None if doc is None else doc["rows"]

    def _doc(self, path: str, params: Mapping[str, Any], missing: bool = False) -> dict[str, Any] | None:
        resp = self._get(path, **params)
        if missing and resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise QueryError(f"{self.where} answered {resp.status_code}: {_detail(resp)}")
        return cast(dict[str, Any], resp.json())

    def search_traces(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return cast(dict[str, Any], self._doc("/api/v1/traces", params))

    def read_trace(self, trace_id: str, *, limit: int, offset: int) -> dict[str, Any] | None:
        doc = self._doc(f"/api/v1/traces/{trace_id}", {"limit": limit, "offset": offset}, missing=True)
        if doc is not None:
            doc["scores"] = self.list_scores(limit=MAX_SCORES, trace_id=trace_id, policy=None)
        return doc

    def list_sessions(self, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        return cast(dict[str, Any], self._doc("/api/v1/sessions", params))["sessions"]

    def show_session(self, session_id: str, *, limit: int) -> dict[str, Any] | None:
        return self._doc(f"/api/v1/sessions/{quote(session_id, safe='')}", {"limit": limit}, missing=True)

    def close(self) -> None:
        self._client.close()


def _detail(resp: httpx.Response) -> str:
    try:
        detail = str(resp.json().get("detail", resp.text))
    except ValueError:
        detail = resp.text
    if resp.status_code == 401:
        detail += f"; set {KEY_ENV} to an API key of this collector"
    return detail


def alerts_since_ns(since: str | None) -> int:
    """The time `since` (a duration back from now or an ISO-8601 time) in ns since 1970; 0 for None. Raises
    ValueError."""
    return duration.parse_time(since, time.time_ns()) if since else 0


class StoreReader:
    def __init__(self, store: TraceQueries) -> None:
        self.store = store
        self.where = store.description

    def list_scores(self, *, limit: int, trace_id: str | None, policy: str | None) -> list[dict[str, Any]]:
        return self.store.list_scores(limit=limit, trace_id=trace_id, policy=policy)

    def list_alerts(self, *, limit: int, policy: str | None, since: str | None) -> list[dict[str, Any]]:
        list_alerts = getattr(self.store, "list_alerts", None)
        if list_alerts is None:
            raise QueryError(f"the {self.where} keeps no alerts")
        return cast(list[dict[str, Any]], list_alerts(limit=limit, policy=policy, since_ns=alerts_since_ns(since)))

    def search_traces(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return search_traces(self.store, params)

    def _datasets(self) -> DatasetStore:
        if not isinstance(self.store, DatasetStore):
            raise QueryError(f"the {self.where} keeps no datasets")
        return self.store

    def list_datasets(self) -> list[dict[str, Any]]:
        return self._datasets().list_datasets()

    def dataset_rows(self, dataset: str, *, limit: int) -> list[dict[str, Any]] | None:
        return self._datasets().dataset_rows(dataset, limit=limit) or None

    def read_trace(self, trace_id: str, *, limit: int, offset: int) -> dict[str, Any] | None:
        doc = read_trace(self.store, trace_id, limit=limit, offset=offset)
        if doc is not None:
            doc["scores"] = self.store.list_scores(limit=MAX_SCORES, trace_id=trace_id)
        return doc

    def list_sessions(self, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        return list_sessions(self.store, params)

    def show_session(self, session_id: str, *, limit: int) -> dict[str, Any] | None:
        return show_session(self.store, session_id, limit=limit)

    def close(self) -> None:
        self.store.close()


# --- searching traces and sessions ------------------------------------------------------------------------------

MAX_SCORES = 1000
"""The most scores `traces show` lists for one trace."""
TRACE_PAGE = 10_000
"""Spans of one trace a read returns unless asked for another page size: a trace may hold 500,000 (a sender picks
its trace ids), and every span read is held in memory and in the JSON answer."""
MAX_TRACE_PAGE = 100_000
MAX_SCAN = 10_000
MAX_LIST = 100_000
"""Traces one list returns at most when the CLI reads the store itself (the API answers 10,000 at most)."""
"""The most candidate traces a `where` condition is evaluated over, newest first (`scan`)."""
WHERE_SPAN_BUDGET = 50_000
"""Spans read at once to evaluate a `where` condition; a trace holding more is not evaluated (`skipped`)."""
WHERE_TRACES = 500
"""Traces read at once to evaluate a `where` condition."""
SEARCH_PARAMETERS = (
    "limit", "service", "since", "until", "error", "model", "session", "min_duration", "attr", "failed", "where",
    "scan",
)  # fmt: skip
"""The query parameters of `GET /api/v1/traces`: what `evalsi traces list` sends, and `search_traces` reads."""


class SearchError(QueryError):
    """A search the asker got wrong (a bad time, filter or condition): the message names the parameter."""


class SearchableStore(Protocol):
    """The reads a search needs of the store (the ClickHouse exporter's `TraceStore` has them)."""

    def search_traces(self, **filters: Any) -> list[dict[str, Any]]: ...

    def get_traces(
        self, trace_ids: list[str], *, since_ns: int = 0, project: str | None = None
    ) -> dict[str, list[dict[str, Any]]]: ...

    def trace_page(
        self, trace_id: str, *, limit: int, offset: int = 0, project: str | None = None
    ) -> tuple[list[dict[str, Any]], int]: ...

    def list_sessions(self, **filters: Any) -> list[dict[str, Any]]: ...

    def session_scores(
        self, session_id: str, *, limit: int = 1000, project: str | None = None
    ) -> list[dict[str, Any]]: ...


def _searchable(store: TraceQueries) -> SearchableStore:
    if not hasattr(store, "search_traces"):
        raise QueryError(f"the {store.description} cannot search traces")
    return cast(SearchableStore, store)


def _duration_ns(name: str, text: str) -> int:
    try:
        return int(parse_duration(text) * 1e9)
    except ValueError as e:
        raise SearchError(f"{name}: {e}") from None


def parse_time(name: str, text: str, now_ns: int) -> int:
    """A time in ns since 1970 from a duration back from now (`15m`, `2h`, `7d`) or an ISO-8601 time (UTC unless it
    says otherwise), as `evalsi.duration.parse_time`; its errors name the parameter."""
    try:
        return duration.parse_time(text, now_ns)
    except ValueError as e:
        raise SearchError(f"{name}: {e}") from None


def _attribute(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise SearchError(f"attr: {text[:80]!r} is not KEY=VALUE")
    return key, value


def _flag(name: str, value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise SearchError(f"{name}: {str(value)[:80]!r} is not true or false")


def _int(name: str, value: Any, default: int, low: int, high: int) -> int:
    if value is None:
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise SearchError(f"{name}: {str(value)[:80]!r} is not a whole number") from None
    if not low <= n <= high:
        raise SearchError(f"{name}: {n} is not from {low} to {high:,}")
    return n


def _times(params: Mapping[str, Any]) -> dict[str, int]:
    now = time.time_ns()
    found: dict[str, int] = {}
    for name in ("since", "until"):
        if params.get(name):
            found[f"{name}_ns"] = parse_time(name, str(params[name]), now)
    return found


def _filters(params: Mapping[str, Any]) -> dict[str, Any]:
    """The store's `search_traces` arguments from the query parameters, checked."""
    attrs = params.get("attr") or []
    filters: dict[str, Any] = {
        "service": params.get("service") or None,
        "error": _flag("error", params.get("error")),
        "model": params.get("model") or None,
        "session": params.get("session") or None,
        "failed": params.get("failed") or None,
        "attributes": [_attribute(a) for a in ([attrs] if isinstance(attrs, str) else attrs)],
        **_times(params),
    }
    if params.get("min_duration"):
        filters["min_duration_ns"] = _duration_ns("min_duration", str(params["min_duration"]))
    return filters


def search_traces(store: TraceQueries, params: Mapping[str, Any], project: str | None = None) -> dict[str, Any]:
    """`{"traces": [trace rows]}`, newest first, matching the query parameters (`SEARCH_PARAMETERS`): the filters
    narrow in the store's SQL; a `where` CEL condition over the trace (what policy selectors see: `trace`, `span`,
    `resource`, `session`) is then evaluated over the newest `scan` candidates, and the answer says how many it
    `scanned` and which traces it `skipped` as too big to evaluate. Raises `SearchError` for a bad parameter."""
    unknown = sorted(set(params) - set(SEARCH_PARAMETERS))
    if unknown:
        raise SearchError(f"unknown search parameter {unknown[0]!r}; known: {', '.join(SEARCH_PARAMETERS)}")
    searchable = _searchable(store)
    limit = _int("limit", params.get("limit"), 20, 1, MAX_LIST)
    filters = _filters(params)
    where = params.get("where")
    if not where:
        return {"traces": _store_search(searchable.search_traces, limit=limit, project=project, **filters)}
    from evalsi.model.span import span_from_canonical
    from evalsi.policies.conditions import TRACE_VARIABLES, Condition
    from evalsi.policies.trace_view import TraceView

    try:
        condition = Condition(str(where), TRACE_VARIABLES)
    except ValueError as e:
        raise SearchError(f"where {str(where)[:200]!r}: {e}") from None
    scan = _int("scan", params.get("scan"), 1000, 1, MAX_SCAN)
    candidates = _store_search(searchable.search_traces, limit=scan, project=project, **filters)
    found: list[dict[str, Any]] = []
    skipped: list[str] = []
    batch: list[dict[str, Any]] = []

    def evaluate(rows: list[dict[str, Any]]) -> None:
        # a row's start is its first span's, unless `service` left the trace's other spans out of the row
        since = 0 if filters["service"] else min(r["start_time_unix_nano"] for r in rows)
        spans = searchable.get_traces([r["trace_id"] for r in rows], since_ns=since, project=project)
        for r in rows:
            trace = [span_from_canonical(c) for c in spans.get(r["trace_id"], [])]
            if trace and len(found) < limit and condition.matches(TraceView(trace)):
                found.append(r)

    for row in candidates:
        if row["span_count"] > WHERE_SPAN_BUDGET:
            skipped.append(row["trace_id"])
            continue
        full = len(batch) >= WHERE_TRACES or sum(r["span_count"] for r in batch) + row["span_count"] > WHERE_SPAN_BUDGET
        if batch and full:
            evaluate(batch)
            batch = []
        if len(found) >= limit:
            break
        batch.append(row)
    if batch and len(found) < limit:
        evaluate(batch)
    return {"traces": found, "scanned": len(candidates), "skipped": skipped}


def _store_search(search: Any, **kwargs: Any) -> list[dict[str, Any]]:
    try:
        return cast(list[dict[str, Any]], search(**kwargs))
    except ValueError as e:  # a filter the store refuses (too long, too many)
        raise SearchError(str(e)) from None


def read_trace(
    store: TraceQueries, trace_id: str, *, limit: int = TRACE_PAGE, offset: int = 0, project: str | None = None
) -> dict[str, Any] | None:
    """A page of a trace: `spans` (at most `limit`, from `offset`, in start order), `span_count` (all of it),
    `truncated` and, when more follow, `next_offset`; None when the trace is unknown."""
    limit = _int("limit", limit, TRACE_PAGE, 1, MAX_TRACE_PAGE)
    offset = _int("offset", offset, 0, 0, 2**63 - 1)
    spans, total = _searchable(store).trace_page(trace_id, limit=limit, offset=offset, project=project)
    if total == 0:
        return None
    doc: dict[str, Any] = {"trace_id": trace_id.lower(), "spans": spans, "span_count": total, "offset": offset}
    doc["truncated"] = offset > 0 or offset + len(spans) < total
    if offset + len(spans) < total:
        doc["next_offset"] = offset + len(spans)
    return doc


def list_sessions(store: TraceQueries, params: Mapping[str, Any], project: str | None = None) -> list[dict[str, Any]]:
    """Sessions, the most recently active first; `params`: limit, since, until (as `search_traces`)."""
    unknown = sorted(set(params) - {"limit", "since", "until"})
    if unknown:
        raise SearchError(f"unknown session search parameter {unknown[0]!r}; known: limit, since, until")
    limit = _int("limit", params.get("limit"), 20, 1, 10_000)
    return _searchable(store).list_sessions(limit=limit, project=project, **_times(params))


def show_session(
    store: TraceQueries, session_id: str, *, limit: int = 1000, project: str | None = None
) -> dict[str, Any] | None:
    """A session's traces, oldest first (at most `limit`), and its scores (of the session and of its traces);
    None when no trace has that session."""
    limit = _int("limit", limit, 1000, 1, 10_000)
    searchable = _searchable(store)
    traces = _store_search(searchable.search_traces, limit=limit, session=session_id, oldest_first=True,
                           project=project)  # fmt: skip
    if not traces:
        return None
    scores = searchable.session_scores(session_id, limit=MAX_SCORES, project=project)
    return {"session_id": session_id, "traces": traces, "scores": scores}


def api_url(endpoint: str) -> str:
    host, _, port = endpoint.rpartition(":")
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def store_of(config: Config) -> tuple[str, Any] | None:
    """The config's store exporter (config validation allows one): its id and its config, None without one."""
    return next(((eid, c) for (kind, eid), c in config.components.items() if kind == "exporter" and is_store(eid)),
                None)  # fmt: skip


def server_description(endpoint: str) -> str:
    """How a collector's status names a ClickHouse server store (`ServerBackend.description`)."""
    u = urlsplit(endpoint)
    return f"ClickHouse server at {u.scheme}://{u.hostname}:{u.port or 8123}"


def serving_api(config: Config, *, runs: bool = True) -> str | None:
    """The API of a running collector that serves the store the config names, None when none does. An embedded
    store: the collector holding it, which records its API in the store's directory (waiting a moment for a
    reading command to let go; `StoreBusy` when a process that serves nothing keeps holding it). A ClickHouse
    server: the collector at the config's API endpoint, only when its status names that server: any other
    collector answering on that port is someone else's. `runs`: the collector an `evalsi run` started in its own
    process counts too (it is there only while its run goes on: a reader may ask it, a run may not use it)."""
    from evalsi.embedded_store import wait_for_store

    found = store_of(config)
    endpoint = str(getattr(found[1], "endpoint", "")) if found else ""
    if endpoint.startswith("chdb://"):
        record = wait_for_store(Path(endpoint.removeprefix("chdb://")))
        return str(record["api"]) if record and (runs or record.get("role") != "run") else None
    if not endpoint:
        return None
    url = api_url(config.service.api.endpoint)
    try:
        resp = httpx.get(url + "/api/v1/status", timeout=0.5, headers=api_headers())
        store = resp.json().get("store") if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return url if store == server_description(endpoint) else None


def open_reader(config: Config, api: str | None) -> TraceReader:
    """`--api` if given; else the collector serving the config's store (`serving_api`); else the store itself."""
    if api:
        return ApiReader(api)
    try:
        served = serving_api(config)
    except StoreBusy as e:
        raise QueryError(f"{e}, or read through a collector's API with --api URL") from None
    if served:
        return ApiReader(served)
    found = store_of(config)
    if found is None:
        url = api_url(config.service.api.endpoint)
        raise QueryError(f"no collector answers at {url} and the config has no store exporter (clickhouse) to read")
    eid, c = found
    store_type = REGISTRY[("exporter", type_of(eid))].store
    assert store_type is not None
    try:
        return StoreReader(store_type.open_queries(c))
    except StoreBusy as e:
        raise QueryError(f"{e}, or read through a collector's API with --api URL") from None
