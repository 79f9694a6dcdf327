"""The redact rules' fast scan (distinct strings, ASCII patterns, sieves) changes exactly what the plain scan does:
every pattern over every string in the Rust regex engine, as the rules ran before it."""

# ruff: noqa: RUF001  (look-alike digits and letters are what these strings are for)

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from budget import examples
from hypothesis import HealthCheck, given, settings, strategies as st
from test_redact import FIXTURES, chat, everything, fixture_spans, make

from evalsi.model.span import SpanBatch
from evalsi.processors.redact import Redact, RedactConfig, rules as rules_module
from evalsi.processors.redact.rules import Change, Rule, RuleSet, content_rules, hasher_of, value_rules

SHARED_FIXTURES = Path("/work/shared/fixtures")


class PlainRuleSet(RuleSet):
    """The rules as they ran before the fast scan: one pass of every pattern over every string, then each rule's
    matches in the strings that pass."""

    def apply(self, texts: list[str]) -> list[Change]:
        return plain_apply(self.rules, texts)


def plain_apply(rules: list[Rule], texts: list[str]) -> list[Change]:
    if not texts or not rules:
        return []
    import polars as pl

    series = pl.Series(texts, dtype=pl.String)
    hits = series.str.contains("|".join(f"(?:{r.pattern})" for r in rules)).arg_true()
    if hits.len() == 0:
        return []
    candidates = series.gather(hits)
    changes = [Change(i, texts[i]) for i in hits.to_list()]
    for rule in rules:
        found = candidates.str.extract_all(rule.pattern).to_list()
        for change, matches in zip(changes, found, strict=True):
            if not matches:
                continue
            text = change.text
            n = 0
            for match in dict.fromkeys(matches):
                for part in rule.parts(match):
                    k = text.count(part)
                    if k:
                        text = text.replace(part, rule.replacement(part))
                        n += k
            if n:
                change.text = text
                change.counts[rule.name] = change.counts.get(rule.name, 0) + n
    return [c for c in changes if c.counts]


CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "hashed and own rules": {
        "rules": [
            {"name": "email", "hash": True},
            {"name": "phone", "replace": "<TEL>"},
            {"name": "ticket", "pattern": r"TCK-\d{6}", "replace": "<TICKET>"},
            {"name": "word", "pattern": r"(?i)\bsecret\w*\b"},
        ],
        "blocked_values": [r"ACCT-\d{8}", r"\b\d{4}\b"],
        "hash_function": "sha256",
    },
    "a built-in overridden by a pattern": {
        "default_rules": ["card", "ipv4"],
        "rules": [{"name": "ipv4", "pattern": r"\d+\.\d+"}, {"name": "card"}],
    },
    "one built-in": {"default_rules": ["phone"]},
}


def rule_sets(name: str) -> tuple[RuleSet, RuleSet]:
    config = RedactConfig(**CONFIGS[name])
    rules = content_rules(config, hasher_of(config))
    return RuleSet(rules), PlainRuleSet(rules)


# one fast rule set per config for the whole module: what it remembers of earlier batches is used as it would be
_LONG_LIVED: dict[str, RuleSet] = {}


def outcome(rules: RuleSet, texts: list[str]) -> Any:
    """What the rules change (index, text, counts in order), or the error they raise."""
    try:
        return [(c.index, c.text, list(c.counts.items())) for c in rules.apply(texts)]
    except Exception as e:  # a string the engine cannot take (a lone surrogate) fails the batch in both
        return type(e)


def assert_same(texts: list[str]) -> None:
    """A fresh rule set, one that saw earlier batches, and this batch again all change what the plain scan does."""
    for name in CONFIGS:
        fast, plain = rule_sets(name)
        expected = outcome(plain, texts)
        assert outcome(fast, texts) == expected, name
        assert outcome(fast, texts) == expected, f"{name}, the same batch again"
        long_lived = _LONG_LIVED.setdefault(name, rule_sets(name)[0])
        assert outcome(long_lived, texts) == expected, f"{name}, after earlier batches"


# --- strings -----------------------------------------------------------------------------------------

PII = [
    "jane.doe@example.com",
    "J.Doe+tag@mail.example.co.uk",
    "+1 415 555 0134",
    "+44 20 7946 0958",
    "+4930123456",
    "(415) 555-0134",
    "415.555.0134",
    "020 7946 0958",
    "01 23 45 67 89",
    "030 1234567",
    "4111 1111 1111 1111",
    "4111-1111-1111-1111",
    "4111111111111111",
    "ref 12 4111 1111 1111 1111",
    "378282246310005",
    "192.168.0.1",
    "10.0.0.255",
    "0.0.0.0",
    "000 000 0000",
    "(000) 000-0000",
    "bob@mail.io",
    "1.2.3.4.5",
    "01.02.2024 12",
    "1733318400000",
    "TCK-123456",
    "ACCT-12345678",
    "secretive",
]
# digits and word characters outside ASCII: `\d` and `\b` are Unicode's in the engine
NON_ASCII = [
    "４１１１ １１１１ １１１１ １１１１",  # fullwidth digits
    "4１１１ １１１１ １１１１ １１１１",
    "+４４ ２０ ７９４６ ０９５８",
    "١٩٢.١٦٨.٠.١",  # Arabic-Indic
    "+٤٤ ٢٠ ٧٩٤٦ ٠٩٥٨",
    "०२० ७९४६ ०९५८",  # Devanagari
    "é4111 1111 1111 1111",
    "4111 1111 1111 1111é",
    "订单4111111111111111",
    "4111111111111111订单",
    "电话 +1 415 555 0134。",
    "e\u03014111 1111 1111 1111",  # a combining mark is a word character
    "4111 1111 1111 1111\u0301",
    "x\u200d192.168.0.1",  # zero-width joiner
    "café jane.doe@example.com naïve",
    "jäne@exämple.com",
    "😀192.168.0.1😀",
    "\u00a0415.555.0134\u00a0",
    "Ｔel： 020 7946 0958",
    "𝟒𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏𝟏",  # mathematical bold digits (4 bytes in UTF-8)
    "ǅ415.555.0134",
    "ñ bob@mail.io",
    "ñ 0.0.0.0 ñ000 000 0000",
]
HOSTILE = [
    "",
    "\x00",
    "\x00192.168.0.1\x00",
    "١٢٣",
    "9" * 23,
    " 12 ",
    "1e30",
    "\\n4111 1111 1111 1111",
    "Card:\\n4111 1111 1111 1111",
    "\\u00a0+1 415 555 0134",
    "\\u00e94111 1111 1111 1111",
    '{"content": "call +1 415 555 0134\\nor mail jane.doe@example.com"}',
    "x" * 100_000,
    ("4111 1111 1111 1111 " * 2_000) + "é",
    "1 " * 50_000,
    "é" * 50_000 + "192.168.0.1",
    "lone surrogate \ud800 and jane.doe@example.com",
    "\udfff",
]


def fixture_strings() -> list[str]:
    """Every string in every capture: raw OTLP/JSON values (often JSON text) and what normalize makes of them."""

    def strings(value: Any) -> Iterator[str]:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)

    out: list[str] = []
    for root in (FIXTURES, SHARED_FIXTURES):
        for path in sorted(root.glob("*/*.json")):
            out.extend(strings(json.loads(path.read_bytes())))
    return out


def test_fixture_strings_are_changed_as_by_the_plain_scan() -> None:
    texts = fixture_strings()
    assert len(texts) > 1_000
    assert_same(texts)
    fast, _ = rule_sets("default")
    assert len(fast.apply(texts)) > 10  # the captures hold PII for the rules to find


@pytest.mark.parametrize("group", ["pii", "non-ascii", "hostile"])
def test_edge_cases_are_changed_as_by_the_plain_scan(group: str) -> None:
    texts = {"pii": PII, "non-ascii": NON_ASCII, "hostile": HOSTILE}[group]
    contexts = ["{}", "x{}y", "1{}2", "é{}é", "{} {}", '"{}"', "\\n{}", "订单{}", "{}\u0301"]
    assert_same([c.replace("{}", t) for t in texts for c in contexts] + texts)
    for t in texts:  # alone, so that one failing string does not hide the others
        assert_same([t])


def test_a_string_recurring_in_a_batch_is_changed_at_each_place() -> None:
    fast, _ = rule_sets("default")
    texts = ["mail jane.doe@example.com", "clean", "mail jane.doe@example.com", "é jane.doe@example.com"] * 3
    changes = fast.apply(texts)
    assert [c.index for c in changes] == [0, 2, 3, 4, 6, 7, 8, 10, 11]
    assert {c.text for c in changes} == {"mail <EMAIL_ADDRESS>", "é <EMAIL_ADDRESS>"}
    changes[0].counts["presidio.EMAIL_ADDRESS"] = 1  # each change is its own: Presidio adds to one only
    assert changes[1].counts == {"email": 1}


def test_strings_seen_before_are_changed_as_at_first_after_the_memory_empties(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules_module, "_SEEN_CHARS", 60)  # a few strings, then emptied
    fast, plain = rule_sets("hashed and own rules")
    batches = [[t, f"x {t} y", "clean text", "é " + t] for t in PII + NON_ASCII] * 2
    for texts in batches:
        assert outcome(fast, texts) == outcome(plain, texts)
    assert 0 < sum(map(len, fast._seen)) == fast._seen_chars <= 60  # what it holds stays bounded
    bad = ["ok", "\ud800 jane.doe@example.com"]
    for _ in range(2):  # a string the engine cannot take is never remembered: it fails every batch it is in
        failed = outcome(fast, bad)
        assert failed == outcome(plain, bad) and isinstance(failed, type) and issubclass(failed, Exception)


def test_blocked_values_alone_are_scanned_as_before() -> None:
    config = RedactConfig(blocked_values=[r"ACCT-\d{8}", r"(?i)é\w+"])
    rules = value_rules(config, hasher_of(config))
    texts = ["ACCT-12345678", "Éclair éCLAT", "ACCT-١٢٣٤٥٦٧٨", "clean"]
    assert outcome(RuleSet(rules), texts) == outcome(PlainRuleSet(rules), texts) != []


# --- generated strings -------------------------------------------------------------------------------

_PIECES = st.sampled_from(
    [*PII, *NON_ASCII, "@", ".", "-", " ", "(", ")", "+", "\\n", "\\u00a0", "\\", "0", "4", "1", "٣", "４", "é", "_"]
)
_CHARS = st.characters(codec=None, categories=None)  # any code point, lone surrogates included
_TEXT = st.one_of(
    st.lists(st.one_of(_PIECES, st.text(alphabet="0123456789 -.@+()x", max_size=20)), max_size=12).map("".join),
    st.text(alphabet=st.one_of(st.sampled_from("0123456789 .-+()@\\nu_aé٣४４\u0301订"), _CHARS), max_size=60),
    st.text(max_size=60),
)


@settings(max_examples=examples(ci=300, deep=3_000), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_TEXT, max_size=8))
def test_generated_strings_are_changed_as_by_the_plain_scan(texts: list[str]) -> None:
    assert_same(texts)


# --- the processor -----------------------------------------------------------------------------------


def _redact_all(redact: Redact, batches: list[SpanBatch]) -> str:
    for batch in batches:
        asyncio.run(redact.consume(batch))
    spans = [s for b in redact.next.traces.batches for s in b.spans]  # type: ignore[union-attr]
    return everything(spans) + json.dumps([s.attributes for s in spans], default=str, sort_keys=False)


def _fixture_batches() -> list[SpanBatch]:
    batches = []
    for path in sorted(FIXTURES.glob("*/*.json")):
        if path.name == "meta.json" or ".logs." in path.name:
            continue
        batches.append(SpanBatch(fixture_spans(path.parent.name, path.stem)))
    return batches


async def plain_presidio(self: Redact, texts: list[str], changes: list[Change]) -> list[Change]:
    """Presidio as it ran before: every content string analyzed, a recurring one each time."""
    assert self.presidio is not None
    by_index = {c.index: c for c in changes}
    current = list(texts)
    for c in changes:
        current[c.index] = c.text
    size = self.config.presidio.batch_size
    for start in range(0, len(current), size):
        for offset, text, counts in self.presidio.redact(current[start : start + size]):
            change = by_index.setdefault(start + offset, Change(start + offset, text))
            change.text = text
            for rule, n in counts.items():
                change.counts[rule] = change.counts.get(rule, 0) + n
    return list(by_index.values())


@pytest.mark.parametrize("presidio", [False, True])
def test_every_capture_is_redacted_as_by_the_plain_scan(presidio: bool) -> None:
    """Stored spans (content, attributes, summaries) are the same with the plain scan, Presidio after the rules too."""
    config: dict[str, Any] = {}
    if presidio:
        pytest.importorskip("presidio_analyzer", reason="needs presidio: pip install -e '.[presidio]'")
        pytest.importorskip("presidio_anonymizer", reason="needs presidio: pip install -e '.[presidio]'")
        config = {"presidio": {"enabled": True}}
    batches = _fixture_batches()
    if presidio:  # strings that recur in a batch, for Presidio to analyze once
        spans = [s for b in batches for s in b.spans]
        batches = [SpanBatch([*spans, *copy.deepcopy(spans)])]
    results = []
    for plain in (False, True):
        redact, _, metrics = make(**config)
        if plain:
            redact.content_rules = PlainRuleSet(redact.content_rules.rules)
            redact._presidio = plain_presidio.__get__(redact)  # type: ignore[method-assign]
        if presidio:
            asyncio.run(redact.start())
        results.append(
            (
                _redact_all(redact, copy.deepcopy(batches)),
                sorted(
                    (s.name, tuple(sorted(s.labels.items())), s.value)
                    for m in metrics.registry.collect()
                    if m.name.startswith("evalsi_redaction")
                    for s in m.samples
                ),
            )
        )
    assert results[0] == results[1]
    assert "<EMAIL_ADDRESS>" in results[0][0]


def test_presidio_analyzes_a_recurring_string_once_and_changes_it_everywhere() -> None:
    pytest.importorskip("presidio_analyzer", reason="needs presidio: pip install -e '.[presidio]'")
    pytest.importorskip("presidio_anonymizer", reason="needs presidio: pip install -e '.[presidio]'")
    redact, out, _ = make(default_rules=[], presidio={"enabled": True, "batch_size": 3})
    asyncio.run(redact.start())
    assert redact.presidio is not None
    analyzed: list[str] = []
    real = redact.presidio.redact

    def counting(texts: list[str]) -> Any:
        analyzed.extend(texts)
        return real(texts)

    redact.presidio.redact = counting  # type: ignore[method-assign]
    spans = [chat("mail jane.doe@example.com", answer=f"ok {i}") for i in range(4)]
    asyncio.run(redact.consume(SpanBatch(spans)))
    assert sorted(analyzed) == ["mail jane.doe@example.com", "ok 0", "ok 1", "ok 2", "ok 3"]
    for s in out.spans:
        assert s.input[0]["parts"][0]["content"] == "mail <EMAIL_ADDRESS>"
        assert s.attributes["redaction.rule.presidio.EMAIL_ADDRESS.count"] == 1
