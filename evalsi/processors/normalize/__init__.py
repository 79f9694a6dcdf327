"""The normalize processor: maps each span's semantic convention onto the canonical GenAI fields."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import field_validator

from evalsi.component import ComponentConfig, Consumer, Settings, processor
from evalsi.processors.normalize import otel_genai  # noqa: F401  (registers the mapper)
from evalsi.processors.normalize.mapper import MAPPERS, Mapper, register_mapper
from evalsi.span import Span, SpanBatch

__all__ = ["MAPPERS", "Mapper", "Normalize", "NormalizeConfig", "normalize_span", "register_mapper"]


class NormalizeConfig(ComponentConfig):
    """Which mappers run, and in what order."""

    mappers: list[str] | None = None
    """Mappers to enable, in the order they are tried; None: every registered one, by precedence."""

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
    for name, messages in (("input", span.input), ("output", span.output)):
        if messages and any(m.get("unparsed") for m in messages):
            span.unparsed.append(name)


def normalize_span(span: Span, mappers: Sequence[Mapper] | None = None) -> None:
    """Fill the canonical fields of `span` with the first of `mappers` (default: all registered) that matches.

    Raw attributes are never changed. A span mapped before (stored data) is reset first, so re-running
    with other mappers leaves no fields from the old mapping; a span no mapper matches stays "other".
    """
    if span.convention:
        _reset(span)
    for mapper in MAPPERS.values() if mappers is None else mappers:
        if mapper.matches(span):
            span.convention = mapper.name
            mapper.apply(span)
            _flag_unparsed(span)
            return


@processor("normalize", config=NormalizeConfig)
class Normalize:
    """Fills the canonical fields of every span it is handed, then hands the batch on."""

    def __init__(self, config: NormalizeConfig, settings: Settings, next: Consumer) -> None:
        self.config = config
        self.settings = settings
        self.next = next
        names = list(MAPPERS) if config.mappers is None else config.mappers
        self.mappers: tuple[Mapper, ...] = tuple(MAPPERS[n] for n in names)
        self._failed_mappers: set[str] = set()
        self._unparsed = settings.metrics.normalize_unparsed

    async def start(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def consume(self, batch: SpanBatch) -> None:
        mappers = self.mappers
        for span in batch.spans:
            try:
                normalize_span(span, mappers)
            except Exception:
                # a mapper bug must not cost the batch: the span goes on unmapped, its attributes intact
                self._mapper_failed(span)
                continue
            for name in span.unparsed:
                self._unparsed.labels(span.convention, name).inc()
        await self.next.consume(batch)

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
