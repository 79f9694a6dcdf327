"""The mapper interface, the ordered registry of semantic-convention mappers that normalize runs, and the order in
which normalize tries them on a span (`detection`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from evalsi.model.span import Span


@runtime_checkable
class Mapper(Protocol):
    """Turns one convention's raw attributes into the canonical fields of a span.

    `matches` and `apply` run for every span on the ingest path: keep them to a few dict
    lookups, parse content only when it is present, and never raise on odd input.
    `apply` fills canonical fields only; it never changes `span.attributes`.

    A mapper that matches exactly the spans holding one of a set of attributes may say so with a `markers`
    frozenset (`matches` must then be `not span.attributes.keys().isdisjoint(markers)`): normalize tests a run of
    such mappers with one set operation on the union of their markers, and calls `matches` only on a hit.
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


Detection = tuple[tuple[frozenset[str] | None, tuple[Mapper, ...]], ...]
"""Mappers in the order they are tried, each run of consecutive ones with `markers` grouped under their union
(None: a mapper on its own, whose `matches` is called)."""


def detection(mappers: Iterable[Mapper]) -> Detection:
    """`mappers` as a `Detection`: tried in the same order, a run of mappers with `markers` skipped at once when the
    span holds none of them."""
    steps: list[tuple[frozenset[str] | None, tuple[Mapper, ...]]] = []
    for mapper in mappers:
        markers = getattr(mapper, "markers", None)
        if not isinstance(markers, frozenset):
            steps.append((None, (mapper,)))
        elif steps and steps[-1][0] is not None:
            union, run = steps[-1]
            steps[-1] = (union | markers, (*run, mapper))
        else:
            steps.append((markers, (mapper,)))
    return tuple(steps)
