"""What every pull receiver shares: the poll loop over a source's new traces, its watermark (kept in the store once
what it covers is no longer held), duplicates left out, rate limit and backoff. A source only lists and fetches."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import httpx
from pydantic import Field, field_validator

from evalsi.component import ComponentConfig, Next, Refused, Settings
from evalsi.duration import Duration
from evalsi.model.encoded import EncodedBatch
from evalsi.model.span import SpanBatch
from evalsi.receivers.otlp.config import Limits
from evalsi.receivers.otlp.decode import TRACES, DecodeFailed, ReceiverLimits, checking_codec
from evalsi.runtime.backoff import RETRYABLE_HTTP, Backoff, retry_after
from evalsi.runtime.held import stamp
from evalsi.runtime.supervise import supervise
from evalsi.wal import without_stored_spans

log = logging.getLogger("evalsi.receivers.pull")


class PullConfig(ComponentConfig):
    """What every pull receiver takes besides where its source is."""

    poll_interval: Duration = 30.0
    """Time between two polls of the source (a poll reads every page of new traces)."""
    page_size: int = Field(100, ge=1, le=500)
    """Traces a request lists (the sources cap it: MLflow 500, Phoenix 1000, Langfuse 100)."""
    lookback: Duration = 3600.0
    """At the first start (no watermark in the store yet), traces started this long ago or later are read."""
    max_trace_duration: Duration = 3600.0
    """A trace the source says is still running is read again at each poll until it completes, or until it started
    this long ago; then it is read as it is."""
    max_requests_per_second: float = Field(10.0, gt=0)
    """At most this many requests to the source a second."""
    retry_initial: Duration = 1.0
    retry_max: Duration = 60.0
    limits: Limits = Limits()
    """What one fetched trace may carry, as `receivers.otlp.limits`."""

    @field_validator("poll_interval", "lookback", "max_trace_duration", "retry_initial", "retry_max")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be more than 0 (a pull receiver that never waits or reads nothing does nothing)")
        return value


@dataclass(frozen=True)
class Watermark:
    """How far a source was read: every trace started before `time_ms` and those of `ids` (started at `time_ms`)."""

    time_ms: int
    ids: frozenset[str] = frozenset()

    def covers(self, time_ms: int, source_id: str) -> bool:
        return time_ms < self.time_ms or (time_ms == self.time_ms and source_id in self.ids)

    def after(self, time_ms: int, source_id: str) -> Watermark:
        """This watermark moved past one more trace (traces come in start order)."""
        if time_ms > self.time_ms:
            return Watermark(time_ms, frozenset((source_id,)))
        if time_ms == self.time_ms:
            return Watermark(time_ms, self.ids | {source_id})
        return self

    def to_json(self) -> dict[str, Any]:
        return {"time_ms": self.time_ms, "ids": sorted(self.ids)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Watermark:
        return cls(int(data["time_ms"]), frozenset(str(i) for i in data.get("ids", ())))


@dataclass(frozen=True)
class Listed:
    """A trace the source lists: its id there, when it started, and whether it is complete."""

    source_id: str
    time_ms: int
    complete: bool


@dataclass
class Page:
    traces: list[Listed]
    next_token: str | None = None


class SourceError(Exception):
    """The source answered, but not with what was asked (a permanent error for this request)."""


class Source(Protocol):
    """Where a pull receiver reads: lists traces started at or after a time, in start order, and fetches them as
    OTLP requests (with the source's own attributes kept, so the right mapper recognizes them)."""

    name: str
    """For logs and metrics, e.g. `mlflow http://mlflow:5000 experiment 1`."""

    async def list_since(self, time_ms: int, page_size: int, token: str | None) -> Page: ...

    async def fetch(self, listed: list[Listed]) -> bytes:
        """An `ExportTraceServiceRequest` (protobuf) holding every span of these traces."""
        ...


class WatermarkStore(Protocol):
    def read_watermark(self, source: str) -> dict[str, Any] | None: ...

    def write_watermark(self, source: str, watermark: dict[str, Any]) -> None: ...


class Pacer:
    """At most `per_second` calls a second, spaced evenly."""

    def __init__(self, per_second: float) -> None:
        self.interval = 1.0 / per_second
        self._next = 0.0

    async def wait(self) -> None:
        now = time.monotonic()
        if self._next > now:
            await asyncio.sleep(self._next - now)
        self._next = max(now, self._next) + self.interval


@dataclass
class _Pending:
    """A watermark to persist once everything handed on before `handed` is no longer held (stored, evaluated)."""

    handed: float
    watermark: Watermark


@dataclass
class PullCounters:
    traces: Any
    spans: Any
    duplicates: Any
    errors: Any = field(repr=False)
    lag: Any = field(repr=False)


class PullReceiver:
    """Polls `source` every `poll_interval`, hands each new complete trace to the traces pipeline (as the OTLP
    receiver does, so pipeline workers and limits apply alike), and keeps the watermark in the store once the
    traces it covers are no longer held by any component: a restart neither skips nor repeats a trace."""

    def __init__(self, config: PullConfig, settings: Settings, next: Next, source: Source) -> None:
        if next.traces is None and next.encoded is None:
            raise ValueError(f"receivers.{settings.id}: no traces pipeline lists this receiver")
        self._config, self._settings, self._next, self.source = config, settings, next, source
        self._limits = ReceiverLimits(config.limits, f"receivers.{settings.id}.limits", settings.id, settings.metrics)
        codec = TRACES if next.encoded is None else checking_codec(TRACES, next.encoded.shards)
        self._codec = self._limits.apply(codec)
        self._pacer = Pacer(config.max_requests_per_second)
        self._backoff = Backoff(config.retry_initial, config.retry_max)
        self._task: asyncio.Task[None] | None = None
        self._persister: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.watermark: Watermark | None = None
        self._persisted: Watermark | None = None
        self._pending: list[_Pending] = []
        self._read_ahead: dict[str, int] = {}  # complete traces read past a running one: source id -> start
        m, rid = settings.metrics, settings.id
        self.counters = PullCounters(
            traces=m.counter("evalsi_pull_traces", "Traces a pull receiver read from its source.", ["receiver"])
            .labels(rid),
            spans=m.counter("evalsi_pull_spans", "Spans a pull receiver handed to the pipeline.", ["receiver"])
            .labels(rid),
            duplicates=m.counter(
                "evalsi_pull_duplicate_spans", "Spans read again that the store held already (left out).", ["receiver"]
            ).labels(rid),
            errors=m.counter(
                "evalsi_pull_errors", "Failed requests to a pull receiver's source.", ["receiver", "reason"]
            ),
            lag=m.gauge("evalsi_pull_watermark_lag_seconds", "How far behind now the watermark is.", ["receiver"])
            .labels(rid),
        )  # fmt: skip

    # --- the store ---------------------------------------------------------------------------------------

    def _store(self) -> Any:
        host = self._settings.host
        return None if host is None else host.store

    def _key(self) -> str:
        return f"{self._settings.id}|{self.source.name}"

    async def _load_watermark(self) -> Watermark:
        store = self._store()
        saved = None
        if store is not None and hasattr(store, "read_watermark"):
            saved = await asyncio.to_thread(store.read_watermark, self._key())
        if saved is not None:
            wm = Watermark.from_json(saved)
            self._persisted = wm
            log.info("pull receiver resumes", extra={"receiver": self._settings.id, "watermark_ms": wm.time_ms})
            return wm
        start = int((time.time() - self._config.lookback) * 1000)
        return Watermark(start)

    async def _persist_loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 0.5)
            await self.persist()

    async def persist(self) -> None:
        """Write the newest watermark whose traces no component holds any more."""
        host = self._settings.host
        held = host.held_since() if host is not None else None
        ready = [p for p in self._pending if held is None or p.handed < held]
        if not ready:
            return
        self._pending = self._pending[len(ready) :]
        wm = ready[-1].watermark
        store = self._store()
        if store is None or not hasattr(store, "write_watermark") or wm == self._persisted:
            return
        try:
            await asyncio.to_thread(store.write_watermark, self._key(), wm.to_json())
            self._persisted = wm
        except asyncio.CancelledError:
            # a stop in the middle of the write: its thread may finish only after the store closed, so `settle`
            # writes it again (a later row, which the store keeps over this one)
            self._pending.insert(0, ready[-1])
            raise
        except Exception as e:  # the next poll's watermark is written instead; a restart reads a few traces again
            self._pending.insert(0, ready[-1])
            log.warning("cannot write the watermark of %s to the store: %s", self._settings.id, e)

    # --- polling -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.watermark = await self._load_watermark()
        self._task = supervise(f"pull {self._settings.id}", self._poll_loop, log=log, metrics=self._settings.metrics)
        self._persister = supervise(
            f"pull {self._settings.id} watermark", self._persist_loop, log=log, metrics=self._settings.metrics
        )

    async def shutdown(self) -> None:
        self._stopping.set()
        for task in (self._task, self._persister):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def settle(self, timeout: float) -> None:
        """On a clean stop, once the processors drained: keep the newest watermark whose traces the exporters have
        stored, waiting up to `timeout` for them (so a restart reads only what is new); what is still held then is
        read again on the next start and the spans the store holds are left out."""
        deadline = time.monotonic() + timeout
        while True:
            await self.persist()
            if not self._pending or time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.05)

    async def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            wait = self._config.poll_interval
            try:
                await self.poll()
                self._backoff.reset()
            except (httpx.HTTPError, Unavailable) as e:
                server_says = e.retry_after if isinstance(e, Unavailable) else None
                reason = "unavailable" if isinstance(e, Unavailable) else type(e).__name__
                self.counters.errors.labels(self._settings.id, reason).inc()
                wait = min(self._backoff.next_wait(server_says), self._config.retry_max)
                log.warning(
                    "%s: %s is not answering (%s); trying again in %.1fs", self._settings.id, self.source.name, e, wait
                )
            except SourceError as e:
                self.counters.errors.labels(self._settings.id, "refused").inc()
                log.error("%s: %s refused a request: %s", self._settings.id, self.source.name, e)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait)

    async def poll(self) -> int:
        """Read every page of traces past the watermark and hand the complete ones on; returns how many.

        Traces come in start order. The watermark moves past each trace handed on, but not past one the source says
        is still running (younger than `max_trace_duration`): that one is read again at the next poll. Complete
        traces after it are handed on now and remembered, so the next polls leave them out."""
        assert self.watermark is not None
        wm = self.watermark
        since = wm.time_ms  # every page of this poll lists from here (a page token belongs to its query)
        now_ms = int(time.time() * 1000)
        oldest_running = now_ms - int(self._config.max_trace_duration * 1000)
        token: str | None = None
        handed = 0
        held_back = False
        taken: list[Listed] = []
        while True:
            await self._pacer.wait()
            page = await self.source.list_since(since, self._config.page_size, token)
            for t in page.traces:
                if wm.covers(t.time_ms, t.source_id):
                    continue
                if t.source_id in self._read_ahead:  # handed on already: the watermark may pass it now
                    if not held_back:
                        wm = wm.after(t.time_ms, t.source_id)
                    continue
                if not t.complete and t.time_ms > oldest_running:
                    held_back = True
                    continue
                taken.append(t)
                if held_back:
                    self._read_ahead[t.source_id] = t.time_ms
                else:
                    wm = wm.after(t.time_ms, t.source_id)
            token = page.next_token
            if taken and (len(taken) >= self._config.page_size or not token):
                handed += await self._take(taken)
                taken = []
                self.watermark = wm
            if not token:
                break
        self.watermark = wm
        self._read_ahead = {k: v for k, v in self._read_ahead.items() if not wm.covers(v, k)}
        self._pending.append(_Pending(time.monotonic(), wm))
        self.counters.lag.set(max(0.0, (now_ms - wm.time_ms) / 1000))
        return handed

    async def _take(self, listed: list[Listed]) -> int:
        await self._pacer.wait()
        body = await self.source.fetch(listed)
        self.counters.traces.inc(len(listed))
        store = self._store()
        if store is not None and hasattr(store, "stored_span_keys"):
            left, skipped = await asyncio.to_thread(without_stored_spans, body, store.stored_span_keys)
            if skipped:
                self.counters.duplicates.inc(skipped)
            if left is None:
                return 0
            body = left
        try:
            decoded = self._codec.from_protobuf(body)
        except DecodeFailed as e:
            raise SourceError(f"its traces are not valid spans: {e}") from None
        if decoded.rejected:
            log.warning("%s: %d spans refused: %s", self._settings.id, decoded.rejected, decoded.message)
        n = len(decoded.batch)
        if not n:
            return 0
        await self._hand_on(decoded.batch)
        self.counters.spans.inc(n)
        return len(listed)

    async def _hand_on(self, batch: Any) -> None:
        """Into the pipeline, waiting while it refuses (the source keeps the traces; nothing is lost by waiting)."""
        delay = 0.05
        while True:
            arrived = time.monotonic()
            try:
                if isinstance(batch, EncodedBatch):
                    assert self._next.encoded is not None
                    batch = replace(batch, receiver=self._settings.id, arrived=arrived)
                    await self._next.encoded.consume_encoded(batch)
                else:
                    assert isinstance(batch, SpanBatch)
                    stamp(batch, arrived)
                    await self._next.consume(batch)
                return
            except Refused as r:
                if self._stopping.is_set():
                    raise
                await asyncio.sleep(min(max(delay, 0.0), r.retry_after))
                delay = min(delay * 2, 1.0)


class SourcesReceiver:
    """A pull receiver component: one poll loop (`PullReceiver`, with its own watermark) per source (an experiment,
    a project), and the HTTP client they share."""

    def __init__(
        self, config: PullConfig, settings: Settings, next: Next, client: httpx.AsyncClient, sources: list[Source]
    ) -> None:
        self._client = client
        self.loops = [PullReceiver(config, settings, next, s) for s in sources]

    async def start(self) -> None:
        for loop in self.loops:
            await loop.start()

    async def shutdown(self) -> None:
        for loop in self.loops:
            await loop.shutdown()
        await self._client.aclose()

    async def settle(self, timeout: float) -> None:
        await asyncio.gather(*(loop.settle(timeout) for loop in self.loops))


class Unavailable(Exception):
    """The source answered 429 or 5xx: retried with backoff (its Retry-After honoured)."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def check_response(resp: httpx.Response, what: str) -> Any:
    """The JSON body of a 2xx answer; 429/5xx raise `Unavailable` (retried), other errors `SourceError`."""
    if resp.status_code in RETRYABLE_HTTP or resp.status_code >= 500:
        raise Unavailable(f"{what}: HTTP {resp.status_code}", retry_after(resp.headers.get("retry-after")))
    if resp.status_code >= 400:
        raise SourceError(f"{what}: HTTP {resp.status_code}: {resp.text[:300]}")
    try:
        return resp.json()
    except ValueError:
        raise SourceError(f"{what}: the answer is not JSON") from None
