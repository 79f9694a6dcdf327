"""A one-off import (`evalsi import mlflow --since ...`): the traces a source holds in a time range, read with the
pull receiver's source and sent to a collector's OTLP/HTTP receiver, so the same pipeline stores and scores them.
Spans the collector's store holds already are left out: importing twice stores and scores a trace once."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from evalsi.auth.keys import api_headers
from evalsi.receivers.pull.poll import Listed, Source, SourceError, Unavailable
from evalsi.runtime.backoff import RETRYABLE_HTTP, Backoff, retry_after
from evalsi.wal import drop_spans

FETCH_BATCH = 50
STORED_SPANS_BATCH = 1_000  # trace ids a POST /api/v1/spans/stored takes at most
RETRY_FOR_S = 300.0
T = TypeVar("T")


async def _retrying(call: Callable[[], Awaitable[T]]) -> T:
    """`call()`, again with backoff while the source is unreachable or answers 429/5xx, for up to 5 minutes."""
    backoff = Backoff(0.5, 30.0)
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        try:
            return await call()
        except (httpx.TransportError, Unavailable) as e:
            if time.monotonic() > deadline:
                raise
            server_says = e.retry_after if isinstance(e, Unavailable) else None
            await asyncio.sleep(backoff.next_wait(server_says))


@dataclass
class BackfillResult:
    traces: int = 0
    """Complete traces in the range."""
    spans: int = 0
    """Their spans, as the source holds them."""
    running: int = 0
    """Traces the source says are still running: left out (import them once they end)."""
    stored_already: int = 0
    """Spans the collector's store held already: left out."""
    sent: int = 0
    """Spans handed to the collector."""
    sources: list[str] = field(default_factory=list)


async def list_range(source: Source, since_ms: int, until_ms: int, page_size: int) -> tuple[list[Listed], int]:
    """The complete traces that started in [since, until), in start order, and how many are still running."""
    found: list[Listed] = []
    running = 0
    token: str | None = None
    while True:
        page = await _retrying(functools.partial(source.list_since, since_ms, page_size, token))
        for t in page.traces:
            if t.time_ms >= until_ms:
                return found, running
            if t.complete:
                found.append(t)
            else:
                running += 1
        token = page.next_token
        if not token:
            return found, running


def _span_count(body: bytes) -> int:
    request = ExportTraceServiceRequest.FromString(body)
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


class CollectorTarget:
    """A collector's OTLP/HTTP receiver and API: what its store holds of a trace, and a request handed to it."""

    def __init__(self, otlp_url: str, api_url: str) -> None:
        self.otlp_url, self.api_url = otlp_url.rstrip("/"), api_url.rstrip("/")
        self._client = httpx.Client(timeout=60, headers=api_headers())

    def stored_spans(self, trace_ids: list[str]) -> set[str]:
        """trace id + span id (hex) of each span the store holds of these traces (one request a batch)."""
        held: set[str] = set()
        for i in range(0, len(trace_ids), STORED_SPANS_BATCH):
            body = {"trace_ids": trace_ids[i : i + STORED_SPANS_BATCH]}
            resp = self._client.post(f"{self.api_url}/api/v1/spans/stored", json=body)
            if resp.status_code >= 400:
                raise SourceError(
                    f"the collector's API could not say which spans it holds: HTTP {resp.status_code} "
                    f"{resp.text[:300]} (is the collector at {self.api_url} older than this evalsi?)"
                )
            held.update(t + s for t, s in resp.json()["spans"])
        return held

    def send(self, body: bytes) -> None:
        """POST the request, retrying 429/5xx (as an OTLP exporter does) until it is taken."""
        backoff = Backoff(0.2, 10.0)
        deadline = time.monotonic() + 600
        while True:
            try:
                resp = self._client.post(
                    self.otlp_url + "/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}
                )
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(backoff.next_wait())
                continue
            if resp.status_code == 200:
                return
            if resp.status_code not in RETRYABLE_HTTP or time.monotonic() > deadline:
                raise SourceError(f"the collector refused the spans: HTTP {resp.status_code} {resp.text[:300]}")
            time.sleep(backoff.next_wait(retry_after(resp.headers.get("retry-after"))))

    def close(self) -> None:
        self._client.close()


def backfill(
    sources: list[Source],
    since_ms: int,
    until_ms: int,
    *,
    page_size: int = 100,
    target: CollectorTarget | None = None,
    progress: Callable[[int, int], None] | None = None,
    clients: Sequence[httpx.AsyncClient] = (),
) -> BackfillResult:
    """Read every complete trace of [since, until) from each source; hand it to `target` (None: a dry run, which
    only counts). `progress(done, total)` after each batch of traces; `clients` (the sources' HTTP clients) are
    closed at the end, on the event loop they ran on."""
    result = BackfillResult(sources=[s.name for s in sources])

    async def listed() -> list[tuple[Source, list[Listed]]]:
        out = []
        for s in sources:
            found, running = await list_range(s, since_ms, until_ms, page_size)
            result.running += running
            out.append((s, found))
        return out

    loop = asyncio.new_event_loop()
    try:
        todo = loop.run_until_complete(listed())
        total = sum(len(found) for _, found in todo)
        result.traces = total
        done = 0
        for source, found in todo:
            for i in range(0, len(found), FETCH_BATCH):
                batch = found[i : i + FETCH_BATCH]
                body = loop.run_until_complete(_retrying(functools.partial(source.fetch, batch)))
                n = _span_count(body)
                result.spans += n
                if target is not None:
                    trace_ids = sorted(
                        {
                            s.trace_id.hex()
                            for rs in ExportTraceServiceRequest.FromString(body).resource_spans
                            for ss in rs.scope_spans
                            for s in ss.spans
                        }
                    )
                    held = target.stored_spans(trace_ids)
                    body, skipped = drop_spans(body, held.__contains__) if held else (body, 0)
                    result.stored_already += skipped
                    if skipped < n:
                        target.send(body)
                        result.sent += n - skipped
                done += len(batch)
                if progress is not None:
                    progress(done, total)
    finally:
        for client in clients:  # on the loop they ran on
            loop.run_until_complete(client.aclose())
        loop.close()
    return result
