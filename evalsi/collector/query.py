"""Where the CLI reads traces: the running collector's API, or the store itself when no collector runs."""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from evalsi.auth import KEY_ENV, api_headers
from evalsi.collector.config import Config, is_store, type_of
from evalsi.component import REGISTRY
from evalsi.store import StoreBusy, TraceQueries


class QueryError(Exception):
    """The traces cannot be read; the message says what to do."""


class TraceReader(Protocol):
    where: str

    def list_traces(self, *, limit: int, service: str | None) -> list[dict[str, Any]]: ...

    def get_trace(self, trace_id: str) -> list[dict[str, Any]]: ...

    def list_scores(self, *, limit: int, trace_id: str | None, policy: str | None) -> list[dict[str, Any]]: ...

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

    def list_traces(self, *, limit: int, service: str | None) -> list[dict[str, Any]]:
        resp = self._get("/api/v1/traces", limit=limit, service=service)
        if resp.status_code != 200:
            raise QueryError(f"{self.where} answered {resp.status_code}: {_detail(resp)}")
        return resp.json()["traces"]

    def list_scores(self, *, limit: int, trace_id: str | None, policy: str | None) -> list[dict[str, Any]]:
        resp = self._get("/api/v1/scores", limit=limit, trace_id=trace_id, policy=policy)
        if resp.status_code != 200:
            raise QueryError(f"{self.where} answered {resp.status_code}: {_detail(resp)}")
        return resp.json()["scores"]

    def get_trace(self, trace_id: str) -> list[dict[str, Any]]:
        resp = self._get(f"/api/v1/traces/{trace_id}")
        if resp.status_code == 404:
            return []
        if resp.status_code != 200:
            raise QueryError(f"{self.where} answered {resp.status_code}: {_detail(resp)}")
        return resp.json()["spans"]

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


class StoreReader:
    def __init__(self, store: TraceQueries) -> None:
        self.store = store
        self.where = store.description

    def list_traces(self, *, limit: int, service: str | None) -> list[dict[str, Any]]:
        return self.store.list_traces(limit=limit, service=service)

    def get_trace(self, trace_id: str) -> list[dict[str, Any]]:
        return self.store.get_trace(trace_id)

    def list_scores(self, *, limit: int, trace_id: str | None, policy: str | None) -> list[dict[str, Any]]:
        return self.store.list_scores(limit=limit, trace_id=trace_id, policy=policy)

    def close(self) -> None:
        self.store.close()


def api_url(endpoint: str) -> str:
    host, _, port = endpoint.rpartition(":")
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def open_reader(config: Config, api: str | None) -> TraceReader:
    """`--api` if given; else the configured API if a collector answers there; else the store directly."""
    if api:
        return ApiReader(api)
    url = api_url(config.service.api.endpoint)
    try:
        if httpx.get(url + "/healthz", timeout=0.5).status_code == 200:
            return ApiReader(url)
    except httpx.HTTPError:
        pass
    stores = [(eid, c) for (kind, eid), c in config.components.items() if kind == "exporter" and is_store(eid)]
    if not stores:
        raise QueryError(f"no collector answers at {url} and the config has no store exporter (clickhouse) to read")
    eid, c = stores[0]
    store_type = REGISTRY[("exporter", type_of(eid))].store
    assert store_type is not None
    try:
        return StoreReader(store_type.open_queries(c))
    except StoreBusy as e:
        raise QueryError(f"{e}, or read through that collector's API with --api URL (none answers at {url})") from None
