"""The mapper interface and the ordered registry of semantic-convention mappers that normalize runs."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from evalsi.model.span import Span


@runtime_checkable
class Mapper(Protocol):
    """Turns one convention's raw attributes into the canonical fields of a span.

    `matches` and `apply` run for every span on the ingest path: keep them to a few dict
    lookups, parse content only when it is present, and never raise on odd input.
    `apply` fills canonical fields only; it never changes `span.attributes`.
    """

    name: str
    version: str

    def matches(self, span: Span) -> bool: ...

    def apply(self, span: Span) -> None: ...


# Precedence of the generic OTel GenAI mapper. Conventions that also write some gen_ai.*
# attributes (OpenInference, OpenLLMetry, OpenLIT, MLflow, agentgateway) register with a
# lower number so their more specific markers win over the generic fallback.
GENERIC_PRECEDENCE = 100

MAPPERS: dict[str, Mapper] = {}
"""Registered mappers by name, in precedence order (the first that matches a span maps it)."""

_precedence: dict[str, int] = {}


def register_mapper(mapper: Mapper, *, precedence: int = GENERIC_PRECEDENCE) -> Mapper:
    """Add `mapper` to the registry; lower `precedence` is tried first, ties keep registration order."""
    if mapper.name in MAPPERS and MAPPERS[mapper.name] is not mapper:
        raise ValueError(f"mapper {mapper.name!r} is registered twice")
    _precedence[mapper.name] = precedence
    MAPPERS[mapper.name] = mapper
    # sorted() is stable, so equal precedences keep the order they were registered in
    ordered = sorted(MAPPERS.values(), key=lambda m: _precedence[m.name])
    MAPPERS.clear()
    MAPPERS.update((m.name, m) for m in ordered)
    return mapper
