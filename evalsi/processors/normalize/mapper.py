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

    A mapper that matches no span without one of a set of attributes may say so with a `markers` frozenset, and
    with a `scopes` frozenset if it also matches spans of those instrumentation scopes without them: `matches` must
    be False for every span that holds none of `markers` and whose `scope_name` is not in `scopes`. Normalize tests a
    run of such mappers with one set operation on the union of their markers, and calls their `matches` only on a hit.
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


Detection = tuple[tuple[frozenset[str] | None, frozenset[str], tuple[Mapper, ...]], ...]
"""Mappers in the order they are tried: (markers, scopes, mappers), each run of consecutive mappers with `markers`
grouped under the union of their markers and of their scopes (None: a mapper on its own, whose `matches` is called)."""


def detection(mappers: Iterable[Mapper]) -> Detection:
    """`mappers` as a `Detection`: tried in the same order, a run of mappers with `markers` skipped at once when the
    span holds none of their markers and is of none of their scopes."""
    steps: list[tuple[frozenset[str] | None, frozenset[str], tuple[Mapper, ...]]] = []
    for mapper in mappers:
        markers = getattr(mapper, "markers", None)
        scopes = getattr(mapper, "scopes", frozenset())
        if not isinstance(markers, frozenset) or not isinstance(scopes, frozenset):
            steps.append((None, frozenset(), (mapper,)))
        elif steps and steps[-1][0] is not None:
            union, scope_union, run = steps[-1]
            steps[-1] = (union | markers, scope_union | scopes, (*run, mapper))
        else:
            steps.append((markers, scopes, (mapper,)))
    return tuple(steps)
