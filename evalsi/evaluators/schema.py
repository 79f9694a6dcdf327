"""JSON Schema (draft 2020-12, through the `jsonschema` library) for the evaluator packs: a schema is checked and
compiled once, and each violation worded as a JSON path and what is wrong (`$.items[0].qty: required but missing`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:  # jsonschema loads with the first schema compiled: ~7 MB a process that checks none
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

InstancePath = tuple[str | int, ...]

# keywords whose value is a subschema, a list of subschemas, or an object of them
_SUBSCHEMA = frozenset(
    (
        "not", "if", "then", "else", "contains", "propertyNames", "items", "additionalProperties",
        "unevaluatedItems", "unevaluatedProperties", "contentSchema",
    )
)  # fmt: skip
_SUBSCHEMA_LIST = frozenset(("allOf", "anyOf", "oneOf", "prefixItems"))
_SUBSCHEMA_MAP = frozenset(("properties", "patternProperties", "dependentSchemas", "$defs", "definitions"))
# jsonschema reports a `false` subschema reached through these keywords without the property or item it guards
# (its descend() drops the path). {"not": {}} fails exactly the same values and keeps the path.
_PATH_LOST = frozenset(("properties", "patternProperties", "prefixItems"))
_NEVER: dict[str, Any] = {"not": {}}

_BOUNDS = {
    "minimum": "less than the minimum {}",
    "maximum": "greater than the maximum {}",
    "exclusiveMinimum": "not greater than {}",
    "exclusiveMaximum": "not less than {}",
    "multipleOf": "not a multiple of {}",
    "minLength": "shorter than {} characters",
    "maxLength": "longer than {} characters",
    "pattern": "does not match the pattern {!r}",
    "format": "not a valid {}",
    "minItems": "fewer than {} items",
    "maxItems": "more than {} items",
    "uniqueItems": "has duplicate items",
    "minContains": "fewer than {} items match contains",
    "maxContains": "more than {} items match contains",
    "minProperties": "fewer than {} properties",
    "maxProperties": "more than {} properties",
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def json_type(value: Any) -> str:
    """The JSON type name of a parsed value: a float is a number, an int an integer."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def json_path(path: InstancePath) -> str:
    """`$`, `$.items[0].sku`, `$['a key']`: the notation of jsonschema's `ValidationError.json_path`."""
    text = "$"
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _NAME.fullmatch(part):
            text += f".{part}"
        else:
            text += "['" + part.replace("\\", "\\\\").replace("'", "\\'") + "']"
    return text


def _short(value: Any, limit: int) -> str:
    """A value as compact, key-sorted JSON, cut at `limit` characters."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str).decode()
    except TypeError:  # orjson.JSONEncodeError: e.g. an integer beyond 64 bits
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _paths_kept(schema: Any) -> Any:
    """`schema` with `false` under properties, patternProperties and prefixItems written as {"not": {}}."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key, value in schema.items():
        never = key in _PATH_LOST
        if key in _SUBSCHEMA:
            out[key] = _paths_kept(value)
        elif key in _SUBSCHEMA_LIST and isinstance(value, list):
            out[key] = [_NEVER if never and sub is False else _paths_kept(sub) for sub in value]
        elif key in _SUBSCHEMA_MAP and isinstance(value, dict):
            out[key] = {name: _NEVER if never and sub is False else _paths_kept(sub) for name, sub in value.items()}
    return out


def _compile(schema: Any) -> Draft202012Validator | str:
    """The validator, or what makes `schema` invalid."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where, what = next(_described(e, show_values=True), (tuple(e.absolute_path), e.message))
        return f"not a valid JSON Schema (draft 2020-12): {json_path(where)}: {what}"
    return Draft202012Validator(_paths_kept(schema), format_checker=Draft202012Validator.FORMAT_CHECKER)


@lru_cache(maxsize=512)
def _compiled(canonical: str) -> Draft202012Validator | str:
    return _compile(orjson.loads(canonical))


def compiled(schema: Any) -> Draft202012Validator:
    """The validator of `schema`, compiled once per distinct schema (cached by its canonical JSON); formats with an
    installed checker (email, date, ipv4, uuid, ...) are asserted. Raises ValueError naming what is invalid."""
    try:
        canonical = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # not plain JSON (e.g. an integer beyond 64 bits): compiled uncached
        result = _compile(schema)
    else:
        result = _compiled(canonical)
    if isinstance(result, str):
        raise ValueError(result)
    return result


def violations(validator: Draft202012Validator, instance: Any, show_values: bool = False) -> list[tuple[str, str]]:
    """Every way `instance` breaks the schema, as (JSON path, what is wrong), ordered by path then message. Values
    from the instance are named only with `show_values` (the schema's own values always are). Raises ValueError
    when a `$ref` the instance reaches cannot be resolved (remote references are never fetched)."""
    from referencing.exceptions import Unresolvable

    try:
        found = {
            (tuple((0, p) if isinstance(p, int) else (1, p) for p in path), path, what)
            for error in validator.iter_errors(instance)
            for path, what in _described(error, show_values, validator)
        }
    except Unresolvable as e:
        raise ValueError(f"cannot resolve $ref {e.ref!r}") from None
    return [(json_path(path), what) for _, path, what in sorted(found)]


def _described(
    error: ValidationError, show_values: bool, validator: Draft202012Validator | None = None
) -> Iterator[tuple[InstancePath, str]]:
    """(path, what is wrong) of one error; a missing or unexpected property is named by its own path."""
    path: InstancePath = tuple(error.absolute_path)
    keyword, value, instance = error.validator, error.validator_value, error.instance
    if keyword == "required" and isinstance(instance, dict):
        for key in value:
            if key not in instance:
                yield (*path, key), "required but missing"
    elif keyword == "dependentRequired" and isinstance(instance, dict):
        for trigger, needed in value.items():
            for key in needed if trigger in instance else ():
                if key not in instance:
                    yield (*path, key), f"required when {trigger!r} is present"
    elif keyword == "additionalProperties" and value is False and isinstance(instance, dict):
        schema = error.schema if isinstance(error.schema, dict) else {}
        declared, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
        for key in instance:
            if key not in declared and not any(re.search(p, key) for p in patterns):
                yield (*path, key), "not an allowed property"
    elif "propertyNames" in error.relative_schema_path and isinstance(instance, str):
        yield path, f"property name {instance!r}: {_what(error, True, validator)}"  # a name is not a value
    else:
        yield path, _what(error, show_values, validator)


def _what(error: ValidationError, show_values: bool, validator: Draft202012Validator | None) -> str:
    keyword, value, instance = error.validator, error.validator_value, error.instance
    if keyword is None or (keyword == "not" and value in ({}, True)):  # a `false` schema
        return "not allowed"
    if keyword == "type":
        return f"expected {' or '.join(value if isinstance(value, list) else [value])}, got {json_type(instance)}"
    if keyword == "enum":
        return (f"{_short(instance, 40)} is " if show_values else "") + f"not one of {_short(value, 80)}"
    if keyword == "const":
        return f"must be {_short(value, 40)}"
    if keyword in _BOUNDS:
        return _BOUNDS[keyword].format(value)
    if keyword == "items" and value is False:
        return f"more than {len(error.schema.get('prefixItems', ()))} items"
    if keyword == "contains":
        return "has no item matching contains"
    if keyword == "not":
        return "matches the schema under not"
    if keyword in ("anyOf", "oneOf"):
        if not error.context:  # oneOf, more than one matched
            return f"matches {_matching(error, validator)} of oneOf, exactly 1 allowed"
        return f"matches none of {keyword}{_closest(error, show_values, validator)}"
    if keyword in ("unevaluatedProperties", "unevaluatedItems"):
        return f"has {keyword.removeprefix('unevaluated').lower()} the schema does not allow ({keyword})"
    return f"fails {keyword}"


def _matching(error: ValidationError, validator: Draft202012Validator | None) -> str:
    """How many oneOf branches the instance matches ("more than 1" when that cannot be told)."""
    if validator is None:
        return "more than 1"
    from referencing.exceptions import Unresolvable

    try:
        return str(sum(validator.evolve(schema=branch).is_valid(error.instance) for branch in error.validator_value))
    except Unresolvable:  # a $ref in a branch that only resolves from where the branch sits
        return "more than 1"


def _closest(error: ValidationError, show_values: bool, validator: Draft202012Validator | None) -> str:
    """` (closest: …)`: of the branch errors that reach deepest (a branch whose type matched), the one jsonschema's
    best_match finds most relevant."""
    from jsonschema.exceptions import best_match

    deepest = max((len(e.relative_path) for e in error.context), default=0)
    best = best_match(e for e in error.context if len(e.relative_path) == deepest)
    if best is None:
        return ""
    path, what = next(_described(best, show_values, validator), (tuple(best.absolute_path), best.message))
    inner = json_path(path[len(error.absolute_path) :]).removeprefix("$").removeprefix(".")
    return f" (closest: {inner + ': ' if inner else ''}{what})"
