"""The redact processor's config: regex rules, key rules in the OTel redaction processor's vocabulary, Presidio."""

from __future__ import annotations

import importlib.util
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr, ValidationInfo, field_validator, model_validator

from evalsi.component import ComponentConfig
from evalsi.pattern import compile_pattern

# the built-in rules, in the order they run (see rules.BUILTIN_RULES)
BUILTIN_RULE_NAMES = ("email", "card", "phone", "ipv4")

_RULE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def check_pattern(pattern: str) -> str:
    """A value regex must compile in the Rust regex engine the rules run on (like the OTel Collector's RE2: no
    look-around, no back-references) and must not match the empty string."""
    import polars as pl  # here, not at the top: every command that reads a config loads this module

    try:
        matches_empty = pl.Series([""], dtype=pl.String).str.contains(pattern).item()
    except pl.exceptions.PolarsError as e:
        lines = str(e).split("\n\nThis error occurred", 1)[0].strip().splitlines()
        detail = next((ln.removeprefix("error: ") for ln in reversed(lines) if ln.startswith("error: ")), lines[-1])
        raise ValueError(f"invalid pattern {pattern!r}: {detail.strip()}") from None
    if matches_empty:
        raise ValueError(f"pattern {pattern!r} matches the empty string")
    return pattern


def _check_key_pattern(pattern: str) -> str:
    compile_pattern(pattern)  # RE2, as it runs over sender-chosen keys: a PatternError names it and RE2's reason
    return pattern


class RedactionRule(ComponentConfig):
    """One regex rule over content: each match is replaced by `replace`, or by its hash when `hash` is true."""

    name: str
    """Names the rule in `redaction.rule.<name>.count` and in the metrics; a built-in name overrides that rule."""
    pattern: str | None = None
    """Rust-regex syntax; may be left out when `name` is a built-in rule (email, card, phone, ipv4)."""
    replace: str | None = None
    """Replacement text; default `<NAME>` (the built-in rules: <EMAIL_ADDRESS>, <CREDIT_CARD>, ...)."""
    hash: bool = False
    """Replace each match by its hash (`hash_function`, sha256 when that is `none`) instead of a text."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _RULE_NAME.fullmatch(v):
            raise ValueError(f"rule name {v!r} must be a letter followed by letters, digits or _")
        return v

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str | None) -> str | None:
        return None if v is None else check_pattern(v)

    @model_validator(mode="after")
    def _complete(self) -> RedactionRule:
        if self.pattern is None and self.name not in BUILTIN_RULE_NAMES:
            raise ValueError(
                f"rule {self.name!r} needs a pattern (only the built-in rules {', '.join(BUILTIN_RULE_NAMES)} "
                "may leave it out)"
            )
        if self.hash and self.replace is not None:
            raise ValueError(f"rule {self.name!r}: set either replace or hash, not both")
        return self


class PresidioConfig(ComponentConfig):
    """Microsoft Presidio over the content fields, after the regex rules (`pip install 'evalsi[presidio]'`)."""

    enabled: bool = False
    entities: list[str] = Field(default_factory=lambda: ["EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IP_ADDRESS"])
    """Presidio entity types to find; checked against the analyzer's recognizers at start."""
    score_threshold: float = Field(0.3, ge=0.0, le=1.0)
    operator: Literal["replace", "mask", "hash"] = "replace"
    """replace: `<ENTITY_TYPE>`; mask: `*` for every character; hash: the processor's `hash_function`."""
    language: str = "en"
    spacy_model: str | None = None
    """An installed spaCy model (e.g. en_core_web_sm) for PERSON, LOCATION, ...; default: pattern recognizers only
    (the `no_op` NLP engine, nothing downloaded)."""
    batch_size: int = Field(256, ge=1)
    """Texts per call of the worker thread Presidio runs in."""

    @field_validator("enabled")
    @classmethod
    def _installed(cls, v: bool) -> bool:
        if v:
            missing = [m for m in ("presidio_analyzer", "presidio_anonymizer") if importlib.util.find_spec(m) is None]
            if missing:
                raise ValueError(
                    f"{' and '.join(m.replace('_', '-') for m in missing)} not installed: "
                    "pip install 'evalsi[presidio]'"
                )
        return v

    @field_validator("entities")
    @classmethod
    def _entities(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one entity type is required")
        return v


class RedactConfig(ComponentConfig):
    """What is redacted, how, and what happens when redaction fails."""

    default_rules: list[str] = Field(default_factory=lambda: list(BUILTIN_RULE_NAMES))
    """Built-in rules to run, by name (email, card, phone, ipv4); [] turns them off."""
    rules: list[RedactionRule] = Field(default_factory=list)
    """Your rules, run after the built-in ones; one named like a built-in rule replaces it."""
    attribute_keys: list[str] = Field(default_factory=list)
    """Attribute keys whose values the rules scan, besides the known GenAI content keys; exact or glob (`*`, `?`)."""
    # key rules, as in the OpenTelemetry Collector's redaction processor
    allow_all_keys: bool = True
    """Keep every attribute key; false: only `allowed_keys` (and `ignored_keys`) are kept, the rest removed."""
    allowed_keys: list[str] = Field(default_factory=list)
    ignored_keys: list[str] = Field(default_factory=list)
    """Attribute keys never changed or removed."""
    blocked_key_patterns: list[Annotated[str, AfterValidator(_check_key_pattern)]] = Field(default_factory=list)
    """Regexes over attribute keys: the whole value of a matching key is masked."""
    blocked_values: list[Annotated[str, AfterValidator(check_pattern)]] = Field(default_factory=list)
    """Regexes over every attribute value (and the content): matches are masked."""
    hash_function: Literal["none", "sha256", "hmac-sha256"] = "none"
    """How masks are made: none: `****`; sha256 / hmac-sha256: the hex digest of the masked text."""
    hmac_key: SecretStr | None = Field(None, validate_default=True)
    """The key for hmac-sha256; write it as `env:VAR`, never in the file."""
    presidio: PresidioConfig = Field(default_factory=PresidioConfig)
    on_error: Literal["drop_content", "drop_span"] = "drop_content"
    """When redaction fails: drop every value it would have scanned, or the whole span (log record); counted."""

    @field_validator("default_rules")
    @classmethod
    def _known_rules(cls, v: list[str]) -> list[str]:
        unknown = [n for n in v if n not in BUILTIN_RULE_NAMES]
        if unknown:
            raise ValueError(
                f"unknown built-in rule(s) {', '.join(map(repr, unknown))}; built-in rules: "
                f"{', '.join(BUILTIN_RULE_NAMES)}"
            )
        return v

    @field_validator("rules")
    @classmethod
    def _unique(cls, v: list[RedactionRule]) -> list[RedactionRule]:
        names = [r.name for r in v]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"rule name(s) {', '.join(map(repr, twice))} used more than once")
        return v

    @field_validator("hmac_key", mode="after")
    @classmethod
    def _hmac_key(cls, v: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if v is not None and not v.get_secret_value():
            raise ValueError("is empty")
        if v is None and info.data.get("hash_function") == "hmac-sha256":
            raise ValueError("hash_function hmac-sha256 needs a key: set hmac_key: env:YOUR_KEY_VARIABLE")
        return v
