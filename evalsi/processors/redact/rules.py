"""Redaction rules: built-in PII patterns, your regex rules and the OTel redaction processor's key rules. Value rules
run over a batch's distinct strings at once in the Rust regex engine (polars), then Python checks and replaces."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fnmatch import translate
from typing import Any

from evalsi.pattern import compile_pattern
from evalsi.pii import (
    CARD_PATTERN,
    CARD_SIEVE,
    EMAIL_PATTERN,
    IPV4_PATTERN,
    IPV4_SIEVE,
    PHONE_PATTERN,
    PHONE_SIEVE,
    as_is,
    card_parts,
    phone_parts,
    whole_match,
)
from evalsi.processors.redact.config import BUILTIN_RULE_NAMES, RedactConfig

MASK = "****"  # what the OTel redaction processor puts in place of a masked value

# --- content keys ----------------------------------------------------------------------------------

# Attributes that carry prompts, completions, tool arguments and results, retrieved documents, in the
# conventions normalize maps (docs/conventions.md). Values may be JSON text or structured (lists, maps).
CONTENT_KEYS = frozenset(
    (
        # OTel GenAI semconv
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "gen_ai.retrieval.documents",
        "gen_ai.retrieval.query.text",
        # older semconv span events, Semantic Kernel, OpenLIT's older attributes
        "gen_ai.prompt",
        "gen_ai.completion",
        "gen_ai.event.content",
        "gen_ai.content.prompt",
        "gen_ai.content.completion",
        "gen_ai.tool.input",
        "gen_ai.tool.output",
        # OpenInference
        "input.value",
        "output.value",
        "llm.prompts",
        "reranker.query",
        "tool_call.function.arguments",
        "message.content",
        "message.function_call_arguments_json",
        # MLflow
        "mlflow.spanInputs",
        "mlflow.spanOutputs",
        "mlflow.traceInputs",
        "mlflow.traceOutputs",
        # OpenLLMetry / Traceloop
        "traceloop.entity.input",
        "traceloop.entity.output",
    )
)
CONTENT_KEY_GLOBS = (
    "gen_ai.prompt.*",  # OpenLLMetry, agentgateway: gen_ai.prompt.N.content
    "gen_ai.completion.*",
    "llm.input_messages.*",  # OpenInference: llm.input_messages.N.message.content, ...
    "llm.output_messages.*",
    "llm.prompts.*",
    "llm.prompt_template.*",
    "embedding.embeddings.*",
    "retrieval.documents.*",
    "reranker.input_documents.*",
    "reranker.output_documents.*",
)


def key_matcher(keys: Sequence[str]) -> Callable[[str], bool]:
    """Exact keys and globs (`*`, `?`, `[...]`) as one test."""
    exact = frozenset(k for k in keys if not any(c in k for c in "*?["))
    globs = [k for k in keys if k not in exact]
    pattern = re.compile("|".join(translate(g) for g in globs)) if globs else None

    def matches(key: str) -> bool:
        return key in exact or (pattern is not None and pattern.match(key) is not None)

    return matches


# --- hashing ---------------------------------------------------------------------------------------


class Hasher:
    """The hex digest of a masked text: sha256, or hmac-sha256 with the configured key."""

    def __init__(self, function: str, key: bytes | None = None) -> None:
        if function == "hmac-sha256" and not key:
            raise ValueError("hmac-sha256 needs a key")
        self.key = key if function == "hmac-sha256" else None

    def __call__(self, text: str) -> str:
        data = text.encode("utf-8", "surrogatepass")
        if self.key is not None:
            return hmac.new(self.key, data, hashlib.sha256).hexdigest()
        return hashlib.sha256(data).hexdigest()


def hasher_of(config: RedactConfig) -> Hasher:
    key = config.hmac_key.get_secret_value().encode() if config.hmac_key is not None else None
    return Hasher(config.hash_function, key)


# --- value rules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A value rule: each text its `pattern` matches (the parts `parts` keeps of it) becomes `replacement(text)`.

    The built-in rules also say how to scan faster without finding anything else: `ascii_pattern` is `pattern` for
    texts that are all ASCII (where Unicode and ASCII classes agree), and a sieve matches every text `pattern` has a
    match in (`ascii_sieve` among ASCII texts), so a text the sieve does not match is not scanned further. With
    `stand_in`, `ascii_pattern` also finds `pattern`'s matches in the ASCII stand-in of a text whose digits are all
    0-9 (see `_FOREIGN_DIGIT`)."""

    name: str
    pattern: str
    replacement: Callable[[str], str]
    parts: Callable[[str], list[str]] = as_is
    ascii_pattern: str | None = None
    ascii_sieve: str | None = None
    sieve: str | None = None
    stand_in: bool = False


@dataclass(frozen=True)
class _Builtin:
    pattern: str
    label: str
    parts: Callable[[str], list[str]]
    ascii_sieve: str  # a text with no match of this cannot hold one of `pattern`, if it is all ASCII
    sieve: str  # ... whatever its characters
    stand_in: bool  # `pattern` is made of \d, \b and ASCII characters but x and # (see `_FOREIGN_DIGIT`)


BUILTIN_RULES: dict[str, _Builtin] = {
    # e-mail's classes are ASCII letters, which a stand-in's `x` would join: it runs on the text itself (it has no
    # `\b`, so the engine's fast automaton takes it on any text)
    "email": _Builtin(EMAIL_PATTERN, "<EMAIL_ADDRESS>", whole_match, "@", "@", stand_in=False),
    # every digit of an ASCII text is 0-9 (`\d` is Unicode's digits in the Rust engine, `[0-9]` is a fast search)
    "card": _Builtin(CARD_PATTERN, "<CREDIT_CARD>", card_parts, "[0-9]", CARD_SIEVE, stand_in=True),
    "phone": _Builtin(PHONE_PATTERN, "<PHONE_NUMBER>", phone_parts, "[0-9]", PHONE_SIEVE, stand_in=True),
    "ipv4": _Builtin(IPV4_PATTERN, "<IP_ADDRESS>", whole_match, "[0-9]", IPV4_SIEVE, stand_in=True),
}
assert tuple(BUILTIN_RULES) == BUILTIN_RULE_NAMES


def _fixed(text: str) -> Callable[[str], str]:
    return lambda _match: text


def content_rules(config: RedactConfig, hasher: Hasher) -> list[Rule]:
    """The rules over content, in order: the built-in ones, yours, then `blocked_values`."""
    own = {r.name: r for r in config.rules}
    rules: list[Rule] = []

    def make(name: str) -> Rule:
        builtin = BUILTIN_RULES.get(name)
        user = own.get(name)
        if user is None:
            assert builtin is not None
            return _builtin_rule(name, builtin, _fixed(builtin.label))
        if user.hash:
            replacement: Callable[[str], str] = hasher
        elif user.replace is not None:
            replacement = _fixed(user.replace)
        else:
            replacement = _fixed(builtin.label if builtin else f"<{name.upper()}>")
        if user.pattern is not None:
            return Rule(name, user.pattern, replacement)
        assert builtin is not None
        return _builtin_rule(name, builtin, replacement)

    for name in config.default_rules:
        rules.append(make(name))
    for r in config.rules:
        if r.name not in config.default_rules:
            rules.append(make(r.name))
    return rules + value_rules(config, hasher)


def _builtin_rule(name: str, builtin: _Builtin, replacement: Callable[[str], str]) -> Rule:
    # (?-u:...): ASCII classes and word boundaries, which agree with the Unicode ones on ASCII text and let the
    # engine search with its fast automaton and literal prefilters
    ascii_pattern = f"(?-u:{builtin.pattern})"
    b = builtin
    return Rule(name, b.pattern, replacement, b.parts, ascii_pattern, b.ascii_sieve, b.sieve, b.stand_in)


def value_rules(config: RedactConfig, hasher: Hasher) -> list[Rule]:
    """`blocked_values`: over every attribute value, as the OTel redaction processor does."""
    mask = _fixed(MASK) if config.hash_function == "none" else hasher
    return [Rule("blocked_values", p, mask) for p in config.blocked_values]


@dataclass
class Change:
    """One string the rules changed: its index in the input, its new text, matches masked per rule."""

    index: int
    text: str
    counts: dict[str, int] = field(default_factory=dict)


# A text's ASCII stand-in: each run of non-ASCII word characters becomes `x`, each other run of non-ASCII characters
# `#`. Where the text has no digit outside 0-9, a pattern made of `\d`, `\b` and ASCII characters other than `x` and
# `#` finds the same matches in the stand-in (ASCII classes, as `(?-u:...)`) as in the text (Unicode classes): each
# position is a digit, a word character or a given ASCII character in both, and no match holds a stand-in character.
# The classes are the regex engine's own, so its Unicode tables decide. The stand-in keeps the engine on its fast
# automaton, where a Unicode `\b` next to non-ASCII text sends it to a ~100x slower one.
_FOREIGN_DIGIT = r"[\d&&[^0-9]]"
_FOREIGN_WORD = r"[\w&&[^\x00-\x7F]]+"
_FOREIGN_OTHER = r"[^\x00-\x7F]+"

_UNSEEN = object()
_SEEN_CHARS = 4_000_000  # strings remembered, in characters: the cache is emptied when it would hold more
_SEEN_LONGEST = 65_536  # a longer string is not remembered


class RuleSet:
    """Rules applied in order over a list of strings."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self.names = [r.name for r in rules]
        # every pattern at once picks the strings any rule may change; the sieves first, which are cheaper
        self._any = _either(r.pattern for r in rules)
        self._sieve = _either(r.sieve or r.pattern for r in rules)
        self._ascii_any = _either(r.ascii_pattern or r.pattern for r in rules)
        self._ascii_sieve = _either(r.ascii_sieve or r.ascii_pattern or r.pattern for r in rules)
        self._patterns = [r.pattern for r in rules]
        self._ascii_patterns = [r.ascii_pattern or r.pattern for r in rules]
        self._stand_in = any(r.stand_in for r in rules)
        # what the rules made of strings seen before (None: nothing); the rules never change, so neither does that
        self._seen: dict[str, tuple[str, dict[str, int]] | None] = {}
        self._seen_chars = 0
        if rules:
            import polars as pl  # here: every command that reads a config imports this module, few run it

            for pattern in (self._any, self._sieve, self._ascii_any, self._ascii_sieve):
                pl.Series([""], dtype=pl.String).str.contains(pattern)  # fails here, not on the first batch

    def __bool__(self) -> bool:
        return bool(self.rules)

    def apply(self, texts: list[str]) -> list[Change]:
        """The strings that change. Every occurrence of a masked text in a string is masked. A string that recurs in
        the batch or came in a recent one (a system prompt, a document quoted again) is scanned and judged once."""
        if not texts or not self.rules:
            return []
        import polars as pl

        seen = self._seen
        outcome: dict[str, tuple[str, dict[str, int]]] = {}  # text -> its new text and masked count per rule
        ascii_texts: list[str] = []
        other_texts: list[str] = []
        for text in dict.fromkeys(texts):
            done = seen.get(text, _UNSEEN)
            if done is _UNSEEN:
                if text.isascii():
                    ascii_texts.append(text)
                else:
                    other_texts.append(text)
            elif done is not None:
                outcome[text] = done
        found: dict[str, list[list[str]]] = {}  # text -> the matches of each rule in it
        if ascii_texts:
            series = pl.Series(ascii_texts, dtype=pl.String)
            hits = series.str.contains(self._ascii_sieve).arg_true()
            if hits.len() and self._ascii_any != self._ascii_sieve:
                hits = hits.gather(series.gather(hits).str.contains(self._ascii_any).arg_true())
            if hits.len():
                candidates = series.gather(hits)
                self._extract(hits, ascii_texts, [(candidates, p) for p in self._ascii_patterns], found)
        if other_texts:  # every new string goes through the engine: one it cannot take fails the batch
            self._scan_non_ascii(pl.Series(other_texts, dtype=pl.String), other_texts, found)
        judged = self._judge(found) if found else {}
        outcome.update(judged)
        self._remember(ascii_texts, judged)
        self._remember(other_texts, judged)
        if not outcome:
            return []
        changes = []
        for i, text in enumerate(texts):
            done = outcome.get(text)
            if done is not None:
                changes.append(Change(i, done[0], dict(done[1])))
        return changes

    def _remember(self, texts: list[str], judged: dict[str, tuple[str, dict[str, int]]]) -> None:
        """Keep what the rules made of `texts` for later batches, up to `_SEEN_CHARS` characters of them."""
        for text in texts:
            size = len(text)
            if size > _SEEN_LONGEST:
                continue
            if self._seen_chars + size > _SEEN_CHARS:
                self._seen.clear()
                self._seen_chars = 0
            self._seen[text] = judged.get(text)
            self._seen_chars += size

    def _scan_non_ascii(self, series: Any, texts: list[str], found: dict[str, list[list[str]]]) -> None:
        hits = series.str.contains(self._sieve).arg_true()
        if hits.len() == 0:
            return
        plain = hits
        if self._stand_in:
            foreign = series.gather(hits).str.contains(_FOREIGN_DIGIT)
            plain, standing = hits.filter(foreign), hits.filter(~foreign)
            if standing.len():
                candidates = series.gather(standing)
                stand_in = candidates.str.replace_all(_FOREIGN_WORD, "x").str.replace_all(_FOREIGN_OTHER, "#")
                scans = [
                    (stand_in, r.ascii_pattern) if r.stand_in and r.ascii_pattern else (candidates, r.pattern)
                    for r in self.rules
                ]
                self._extract(standing, texts, scans, found)
        if plain.len() and self._any != self._sieve:
            plain = plain.gather(series.gather(plain).str.contains(self._any).arg_true())
        if plain.len():
            candidates = series.gather(plain)
            self._extract(plain, texts, [(candidates, p) for p in self._patterns], found)

    @staticmethod
    def _extract(hits: Any, texts: list[str], scans: list[tuple[Any, str]], found: dict[str, list[list[str]]]) -> None:
        """Add to `found` the texts at `hits` with each rule's matches in them (rule i: pattern i over series i)."""
        matches = [series.str.extract_all(pattern).to_list() for series, pattern in scans]
        for k, i in enumerate(hits.to_list()):
            found[texts[i]] = [m[k] for m in matches]

    def _judge(self, found: dict[str, list[list[str]]]) -> dict[str, tuple[str, dict[str, int]]]:
        """Each text's new text and masked count per rule, for the texts that change."""
        outcome: dict[str, tuple[str, dict[str, int]]] = {}
        # the same match recurs (a span's raw attribute and its canonical content): judge and hash it once
        masks: list[dict[str, list[tuple[str, str]]]] = [{} for _ in self.rules]
        for original, per_rule in found.items():
            text = original
            counts: dict[str, int] = {}
            for rule, matches, judged in zip(self.rules, per_rule, masks, strict=True):
                if not matches:
                    continue
                n = 0
                for match in dict.fromkeys(matches):
                    pairs = judged.get(match)
                    if pairs is None:
                        pairs = judged[match] = [(part, rule.replacement(part)) for part in rule.parts(match)]
                    for part, replacement in pairs:
                        k = text.count(part)
                        if k:
                            text = text.replace(part, replacement)
                            n += k
                if n:
                    counts[rule.name] = counts.get(rule.name, 0) + n
            if counts:
                outcome[original] = (text, counts)
        return outcome


def _either(patterns: Iterable[str]) -> str:
    """One regex matching where any of `patterns` does (each once)."""
    return "|".join(dict.fromkeys(f"(?:{p})" for p in patterns))


# --- key rules -------------------------------------------------------------------------------------

# What a key's value gets (decided once per key, then cached)
PASS = 0  # nothing
CONTENT = 1  # the content rules (and blocked_values)
VALUES = 2  # blocked_values only
IGNORE = 3  # ignored_keys, and our own summary attributes: never touched
REMOVE = 4  # not in allowed_keys (allow_all_keys false)
BLOCK = 5  # blocked_key_patterns: the whole value masked

SUMMARY_PREFIX = "redaction."
_CACHE_LIMIT = 100_000


class KeyRules:
    """The OTel redaction processor's key vocabulary, plus which keys carry content."""

    def __init__(self, config: RedactConfig) -> None:
        self.ignored = frozenset(config.ignored_keys)
        self.allowed = None if config.allow_all_keys else frozenset(config.allowed_keys)
        self.blocked = [compile_pattern(p) for p in config.blocked_key_patterns]
        self.scan_values = bool(config.blocked_values)
        self.is_content = key_matcher([*CONTENT_KEYS, *CONTENT_KEY_GLOBS, *config.attribute_keys])
        self.cache: dict[str, int] = {}  # key -> action; read directly on the hot path

    def action(self, key: str) -> int:
        a = self.cache.get(key)
        if a is None:
            if len(self.cache) >= _CACHE_LIMIT:  # keys with ids in them must not grow it without bound
                self.cache.clear()
            a = self.cache[key] = self._decide(key)
        return a

    def _decide(self, key: str) -> int:
        if key in self.ignored or key.startswith(SUMMARY_PREFIX):
            return IGNORE
        if self.allowed is not None and key not in self.allowed:
            return REMOVE
        if any(p.search(key) for p in self.blocked):
            return BLOCK
        if self.is_content(key):
            return CONTENT
        return VALUES if self.scan_values else PASS
