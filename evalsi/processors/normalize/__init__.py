"""The normalize processor: maps each span's semantic convention onto the canonical GenAI fields."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from pydantic import field_validator

from evalsi.backlog import SHUTDOWN_WAIT_S, Backlog, unhanded
from evalsi.component import ComponentConfig, Next, Settings, processor
from evalsi.duration import Duration
from evalsi.model.log_record import LogBatch
from evalsi.model.span import Span, SpanBatch

# each mapper registers itself with its precedence (lower is tried first): agentgateway 10, mlflow 20,
# openinference 30, vercel_ai 35, openllmetry 40, openlit 50, then the generic otel_genai 100
from evalsi.processors.normalize import (  # noqa: F401
    agentgateway,
    mlflow,
    openinference,
    openlit,
    openllmetry,
    otel_genai,
    vercel_ai,
)
from evalsi.processors.normalize.cost import CostConfig, Pricer
from evalsi.processors.normalize.events import JOINED_STEPS, EventJoin
from evalsi.processors.normalize.mapper import MAPPERS, Detection, Mapper, detection, register_mapper
from evalsi.processors.normalize.values import MAX_TOKENS
from evalsi.runtime.held import earliest
from evalsi.runtime.supervise import supervise

__all__ = ["MAPPERS", "Mapper", "Normalize", "NormalizeConfig", "normalize_span", "register_mapper"]


class NormalizeConfig(ComponentConfig):
    """Which mappers run, and in what order."""

    mappers: list[str] | None = None
    """Mappers to enable, in the order they are tried; None: every registered one, by precedence."""
    event_wait: Duration = 2.0
    """How long a GenAI span with no content waits for its content events (log records) before going on."""
    event_ttl: Duration = 60.0
    """How long content events wait for a span that has not arrived."""
    max_waiting_spans: int = 50_000
    cost: CostConfig = CostConfig()
    """`cost_usd` from a price table for spans that carry none (`cost.py`)."""

    @field_validator("mappers")
    @classmethod
    def _known_mappers(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        unknown = [n for n in names if n not in MAPPERS]
        if unknown:
            raise ValueError(f"unknown mapper(s) {', '.join(map(repr, unknown))}; known mappers: {', '.join(MAPPERS)}")
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"mapper(s) {', '.join(map(repr, duplicated))} listed more than once")
        return names


def _reset(span: Span) -> None:
    span.step_type = "other"
    span.model = None
    span.provider = None
    span.input_tokens = None
    span.output_tokens = None
    span.tool_name = None
    span.session_id = None
    span.agent_name = None
    span.user_id = None
    span.cost_usd = None
    span.error_type = None
    span.details = {}
    span.input = None
    span.output = None
    span.content_captured = False
    span.convention = ""
    span.unparsed = []


def _flag_unparsed(span: Span) -> None:
    messages = span.input
    if messages:
        for m in messages:
            if m.get("unparsed"):
                span.unparsed.append("input")
                break
    messages = span.output
    if messages:
        for m in messages:
            if m.get("unparsed"):
                span.unparsed.append("output")
                break
    # a count no model reports, from a mapper that does not read counts with `token_count`: none, and said so
    tokens = span.input_tokens
    if tokens is not None and not 0 <= tokens <= MAX_TOKENS:
        span.input_tokens = None
        span.unparsed.append("input_tokens")
    tokens = span.output_tokens
    if tokens is not None and not 0 <= tokens <= MAX_TOKENS:
        span.output_tokens = None
        span.unparsed.append("output_tokens")


def normalize_span(span: Span, mappers: Sequence[Mapper] | None = None) -> None:
    """Fill the canonical fields of `span` with the first of `mappers` (default: all registered) that matches.

    Raw attributes are never changed. A span mapped before (stored data) is reset first, so re-running
    with other mappers leaves no fields from the old mapping; a span no mapper matches stays "other".
    """
    _normalize(span, detection(MAPPERS.values() if mappers is None else mappers))


def _normalize(span: Span, steps: Detection) -> None:
    """`normalize_span` with the mappers as a `Detection`."""
    if span.convention:
        _reset(span)
    keys = span.attributes.keys()
    for markers, scopes, run in steps:
        if markers is not None and keys.isdisjoint(markers) and span.scope_name not in scopes:
            continue  # none of these mappers matches: the span holds none of their markers, is of none of their scopes
        for mapper in run:
            if mapper.matches(span):
                span.convention = mapper.name
                mapper.apply(span)
                _flag_unparsed(span)
                return


@processor("normalize", config=NormalizeConfig, signals=("traces", "logs"))
class Normalize:
    """Fills the canonical fields of every span, joins GenAI content log records to their spans, hands both on."""

    def __init__(self, config: NormalizeConfig, settings: Settings, next: Next) -> None:
        self.config = config
        self.settings = settings
        self.next = next
        names = list(MAPPERS) if config.mappers is None else config.mappers
        self.mappers: tuple[Mapper, ...] = tuple(MAPPERS[n] for n in names)
        self._detection = detection(self.mappers)
        self._failed_mappers: set[str] = set()
        m = settings.metrics
        self._unparsed = m.counter(
            "evalsi_normalize_unparsed",
            "Canonical fields kept as raw text because the span's content would not parse.",
            ["convention", "field"],
        )
        self._revised = m.counter(
            "evalsi_normalize_spans_revised",
            "Spans handed on again because their GenAI content events arrived after them.",
            ["processor"],
        ).labels(settings.id)
        self._pricer = (
            Pricer(
                config.cost,
                m.counter(
                    "evalsi_normalize_cost_unknown_models",
                    "GenAI spans left without cost_usd because no price is known for their model.",
                    ["provider", "model"],
                ),
            )
            if config.cost.enabled
            else None
        )
        self._join = EventJoin(config.event_wait, config.event_ttl, max_spans=config.max_waiting_spans)
        # what this processor took and the next consumer refused: handed on later, while new batches are refused
        self._owed = Backlog("the consumer after normalize", settings.logger)
        self._owed_logs = Backlog("the logs consumer after normalize", settings.logger)
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._ticker = supervise(
            f"{self.settings.id} release", self._release_loop, log=self.settings.logger, metrics=self.settings.metrics
        )

    async def _release_loop(self) -> None:
        period = min(0.1, max(0.01, self.config.event_wait / 4))
        while True:
            await asyncio.sleep(period)
            await self._hand_on(self._join.due())

    async def _hand_on(self, spans: list[Span], *, revision: bool = False) -> None:
        if spans:
            await self._hand_on_batch(SpanBatch(spans, revision))

    async def _hand_on_batch(self, batch: SpanBatch) -> None:
        """Hand a batch this processor took on, or owe it when the next consumer refuses."""
        await self._owed.hand_on(lambda: self.next.consume(batch), batch.spans)

    async def shutdown(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await self._hand_on(self._join.due(everything=True))
        # the exporters still run: give a full queue a few seconds to drain
        await asyncio.gather(self._owed.drain(SHUTDOWN_WAIT_S), self._owed_logs.drain(SHUTDOWN_WAIT_S))

    @property
    def unstored(self) -> dict[str, int]:
        """`LossCounter`: spans and log records taken and never handed on (refused until shutdown)."""
        return unhanded(self._owed, self._owed_logs)

    def held_since(self) -> float | None:
        """When the oldest span or content event held here reached a receiver (see `wal.py`)."""
        return earliest((self._join.held_since(), self._owed.held_since(), self._owed_logs.held_since()))

    async def consume(self, batch: SpanBatch) -> None:
        # once taken, a batch is counted and its spans may wait in the join: a retry must not bring it again
        self._owed.refuse_while_owed()
        steps = self._detection
        join = self._join
        pricer = self._pricer
        if pricer is not None:
            pricer.new_batch()
        revision = batch.revision
        ready = []
        try:
            for span in batch.spans:
                try:
                    _normalize(span, steps)
                except Exception:
                    # a mapper bug must not cost the batch: the span goes on unmapped, its attributes intact
                    self._mapper_failed(span)
                    ready.append(span)
                    continue
                if span.unparsed:
                    for name in span.unparsed:
                        self._unparsed.labels(span.convention, name).inc()
                if pricer is not None:
                    pricer.price_span(span)
                # a span with content, or of a step without content events, is not held: on_span's first test, here
                if revision or span.content_captured or span.step_type not in JOINED_STEPS or join.on_span(span):
                    ready.append(span)
        finally:
            if pricer is not None:
                pricer.end_batch()
        if len(ready) != len(batch.spans):
            batch = SpanBatch(ready, revision, batch.kind)
        if batch.spans:
            await self._hand_on_batch(batch)

    async def consume_logs(self, batch: LogBatch) -> None:
        # once joined, a record may have released or revised spans: a retry must not bring it again
        self._owed_logs.refuse_while_owed()
        released, revised = self._join.on_records(batch.records)
        if released:
            await self._hand_on(released)
        if revised:
            self._revised.inc(len(revised))
            await self._hand_on(revised, revision=True)
        if self.next.logs is not None:
            await self._owed_logs.hand_on(lambda: self.next.consume_logs(batch), batch.records)

    def _mapper_failed(self, span: Span) -> None:
        convention = span.convention
        _reset(span)
        if convention not in self._failed_mappers:
            self._failed_mappers.add(convention)
            self.settings.logger.exception(
                "normalize: mapper %r failed on span %s of trace %s; spans it fails on pass on unmapped "
                "(logged once per mapper)",
                convention,
                span.span_id,
                span.trace_id,
            )
