"""The redact processor on real PII captures and hand-built edge cases: rules, key rules, hashing, failures, logs."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import hmac
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from evalsi.collector.config import ConfigError, parse_config
from evalsi.component import Next, Settings
from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.span import Span, SpanBatch, SpanEvent
from evalsi.processors.normalize import normalize_span
from evalsi.processors.redact import Redact, RedactConfig
from evalsi.processors.redact.rules import RuleSet, content_rules, hasher_of
from evalsi.receivers.otlp.decode import decode_logs_json, decode_traces_json
from evalsi.runtime.telemetry import SelfMetrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PII_FOLDERS = sorted(p.parent.name for p in FIXTURES.glob("*/chat_pii.json"))
EMAIL = "jane.doe@example.com"
PHONE = "+1 415 555 0134"
CARD = "4111 1111 1111 1111"


class Recorder:
    def __init__(self) -> None:
        self.batches: list[SpanBatch] = []
        self.log_batches: list[LogBatch] = []

    async def consume(self, batch: SpanBatch) -> None:
        self.batches.append(batch)

    async def consume_logs(self, batch: LogBatch) -> None:
        self.log_batches.append(batch)

    @property
    def spans(self) -> list[Span]:
        return [s for b in self.batches for s in b.spans]

    @property
    def records(self) -> list[LogRecord]:
        return [r for b in self.log_batches for r in b.records]


def make(**config: Any) -> tuple[Redact, Recorder, SelfMetrics]:
    recorder = Recorder()
    nxt = Next()
    nxt.traces = recorder
    nxt.logs = recorder
    metrics = SelfMetrics()
    redact = Redact(RedactConfig(**config), Settings("redact", metrics, logging.getLogger("test.redact")), nxt)
    return redact, recorder, metrics


def run(redact: Redact, *spans: Span, revision: bool = False) -> None:
    asyncio.run(redact.consume(SpanBatch(list(spans), revision)))


def span(span_id: str = "00000000000000a1", **attributes: Any) -> Span:
    return Span("0" * 31 + "1", span_id, "", "chat", "CLIENT", 1, 2, attributes=dict(attributes))


def chat(text: str, answer: str = "ok", **attributes: Any) -> Span:
    s = span(**attributes)
    s.input = [{"role": "user", "parts": [{"type": "text", "content": text}]}]
    s.output = [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
    s.content_captured = True
    return s


def masked_total(metrics: SelfMetrics, rule: str) -> float:
    value = metrics.registry.get_sample_value("evalsi_redaction_masked_total", {"processor": "redact", "rule": rule})
    return value or 0.0


def redacted_text(text: str, **config: Any) -> str:
    cfg = RedactConfig(**config)
    changes = RuleSet(content_rules(cfg, hasher_of(cfg))).apply([text])
    return changes[0].text if changes else text


def fixture_spans(folder: str, scenario: str = "chat_pii") -> list[Span]:
    decoded = decode_traces_json((FIXTURES / folder / f"{scenario}.json").read_bytes())
    for s in decoded.batch:
        normalize_span(s)
    return decoded.batch.spans


def everything(spans: list[Span]) -> str:
    """All a span holds, as the store would see it: canonical fields, attributes, events."""
    docs = [
        {**s.canonical(), "events": [(e.name, e.attributes) for e in s.events], "status": s.status_message}
        for s in spans
    ]
    return json.dumps(docs, default=str, ensure_ascii=False)


# --- the built-in rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", PII_FOLDERS)
def test_pii_captures_are_fully_redacted_with_no_config(folder: str) -> None:
    spans = fixture_spans(folder)
    assert any(EMAIL in everything([s]) for s in spans) or folder == "otel-openai-v2"  # content is in its logs
    redact, out, metrics = make()
    run(redact, *spans)
    text = everything(out.spans)
    for pii in (EMAIL, PHONE, CARD, "4155550134", "555 0134"):
        assert pii not in text, f"{pii!r} survived in {folder}"
    if folder != "otel-openai-v2":
        assert "<EMAIL_ADDRESS>" in text and "<PHONE_NUMBER>" in text and "<CREDIT_CARD>" in text
        assert masked_total(metrics, "email") >= 2 and masked_total(metrics, "card") >= 1
        chat_span = next(s for s in out.spans if s.content_captured)
        # the redacted text still reads as the prompt
        prompt = json.dumps(chat_span.input)
        assert "Please email the confirmation to <EMAIL_ADDRESS>, call me on <PHONE_NUMBER>" in prompt


@pytest.mark.parametrize(
    "text",
    [
        "jane.doe@example.com",
        "J.Doe+tag@mail.example.co.uk",
        "first_last-99@sub-domain.example.org",
    ],
)
def test_email(text: str) -> None:
    assert redacted_text(f"write to {text}, please") == "write to <EMAIL_ADDRESS>, please"


@pytest.mark.parametrize(
    "text",
    [
        "+1 415 555 0134",
        "+1 (415) 555-0134",
        "+14155550134",
        "+44 20 7946 0958",
        "+49 30 1234567",
        "+33 1 23 45 67 89",
        "(415) 555-0134",
        "415-555-0134",
        "415.555.0134",
        "020 7946 0958",
        "07700 900123",
        "030 1234567",
        "01 23 45 67 89",
    ],
)
def test_phone_numbers_international_and_national(text: str) -> None:
    assert redacted_text(f"call {text} today") == "call <PHONE_NUMBER> today"


@pytest.mark.parametrize(
    "text",
    [
        "4111 1111 1111 1111",
        "4111-1111-1111-1111",
        "4111111111111111",
        "5555 5555 5555 4444",
        "3782 822463 10005",  # Amex, 15 digits
        "6011 0009 9013 9424",
        "4222222222222",  # 13 digits
    ],
)
def test_card_numbers_that_pass_the_luhn_check(text: str) -> None:
    assert redacted_text(f"card {text}.") == "card <CREDIT_CARD>."


@pytest.mark.parametrize(
    "text",
    [
        "order 1234 5678 9012 3456 shipped",  # 16 digits, fails Luhn
        "ids 1234567890123 and 98765432109876",
        "on 01.02.2024 12:30, 2024-01-15T10:00:00Z",
        "version 1.2.3 build 20240115",
        "unix time 1732900000, 1732900000123",
        "score +1 2 3",
    ],
)
def test_numbers_that_are_not_pii_stay(text: str) -> None:
    assert redacted_text(text) == text


def test_a_card_among_other_numbers_is_found_by_its_digit_groups() -> None:
    assert redacted_text("ref 12 4111 1111 1111 1111 123 ok") == "ref 12 <CREDIT_CARD> 123 ok"


def test_ipv4() -> None:
    assert redacted_text("from 10.0.0.12 and 192.168.1.254") == "from <IP_ADDRESS> and <IP_ADDRESS>"
    assert redacted_text("not 256.1.1.1 nor 1.2.3") == "not 256.1.1.1 nor 1.2.3"


def test_pii_right_after_a_json_escape_in_raw_json_is_found_and_the_json_stays_valid() -> None:
    raw = json.dumps([{"role": "user", "content": f"Card:\n{CARD}\nMail:\n{EMAIL}\u00a0IP:\t10.0.0.1\n{PHONE}"}])
    assert "\\n4111" in raw and "\\u00a0" in raw  # json.dumps escapes them: the letters touch the number
    out = redacted_text(raw)
    assert json.loads(out) == [
        {
            "role": "user",
            "content": "Card:\n<CREDIT_CARD>\nMail:\n<EMAIL_ADDRESS>\u00a0IP:\t<IP_ADDRESS>\n<PHONE_NUMBER>",
        }
    ]


def test_default_rules_can_be_chosen_and_turned_off() -> None:
    text = f"{EMAIL} {PHONE}"
    assert redacted_text(text, default_rules=["phone"]) == f"{EMAIL} <PHONE_NUMBER>"
    assert redacted_text(text, default_rules=[]) == text


# --- your rules ------------------------------------------------------------------------------------


def test_a_rule_replaces_its_matches_and_counts_them() -> None:
    redact, out, metrics = make(rules=[{"name": "ticket", "pattern": r"TCK-\d{6}", "replace": "<TICKET>"}])
    run(redact, chat("see TCK-123456 and TCK-654321", answer="TCK-123456 closed"))
    s = out.spans[0]
    assert s.input[0]["parts"][0]["content"] == "see <TICKET> and <TICKET>"
    assert s.output[0]["parts"][0]["content"] == "<TICKET> closed"
    assert s.attributes["redaction.rule.ticket.count"] == 3
    assert s.attributes["redaction.masked.count"] == 3
    assert s.attributes["redaction.masked.keys"] == "canonical.input,canonical.output"
    assert masked_total(metrics, "ticket") == 3


def test_a_rule_without_replace_gets_its_name() -> None:
    assert redacted_text("id AB-12", rules=[{"name": "code", "pattern": r"AB-\d+"}]) == "id <CODE>"


def test_hash_rule_gives_the_same_token_for_the_same_value() -> None:
    digest = hashlib.sha256(EMAIL.encode()).hexdigest()
    out = redacted_text(f"{EMAIL} and {EMAIL}", rules=[{"name": "email", "hash": True}])
    assert out == f"{digest} and {digest}"


def test_hmac_hash_uses_the_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALSI_TEST_REDACT_KEY", "s3cret")
    cfg = parse_config(
        {
            "receivers": {"otlp": {}},
            "processors": {
                "redact": {
                    "hash_function": "hmac-sha256",
                    "hmac_key": "env:EVALSI_TEST_REDACT_KEY",
                    "rules": [{"name": "email", "hash": True}],
                    "blocked_key_patterns": ["password"],
                }
            },
            "exporters": {"clickhouse": {}},
            "service": {
                "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["redact"], "exporters": ["clickhouse"]}}
            },
        }
    )
    config = cfg.component("processor", "redact")
    assert "s3cret" not in repr(config)  # the key is a secret, never printed
    recorder = Recorder()
    nxt = Next()
    nxt.traces = recorder
    redact = Redact(config, Settings("redact", SelfMetrics(), logging.getLogger("t")), nxt)  # type: ignore[arg-type]
    run(redact, chat(f"mail {EMAIL}", **{"db.password": "hunter2"}))
    s = recorder.spans[0]
    keyed = hmac.new(b"s3cret", EMAIL.encode(), hashlib.sha256).hexdigest()
    assert s.input[0]["parts"][0]["content"] == f"mail {keyed}"
    assert s.attributes["db.password"] == hmac.new(b"s3cret", b"hunter2", hashlib.sha256).hexdigest()


def _config_errors(redact: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        parse_config(
            {
                "receivers": {"otlp": {}},
                "processors": {"redact": redact},
                "exporters": {"clickhouse": {}},
                "service": {
                    "pipelines": {
                        "traces": {"receivers": ["otlp"], "processors": ["redact"], "exporters": ["clickhouse"]}
                    }
                },
            }
        )
    return str(e.value)


def test_hmac_without_a_key_is_a_config_error_naming_the_key() -> None:
    assert "processors.redact.hmac_key: hash_function hmac-sha256 needs a key" in _config_errors(
        {"hash_function": "hmac-sha256"}
    )


def test_hmac_key_from_an_unset_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVALSI_TEST_UNSET_KEY", raising=False)
    errors = _config_errors({"hash_function": "hmac-sha256", "hmac_key": "env:EVALSI_TEST_UNSET_KEY"})
    want = "processors.redact.hmac_key: environment variable EVALSI_TEST_UNSET_KEY is not set"
    assert want in errors, errors


@pytest.mark.parametrize(
    ("redact", "expected"),
    [
        ({"rules": [{"name": "x", "pattern": "(?<=a)b"}]}, "processors.redact.rules.0.pattern: invalid pattern"),
        ({"rules": [{"name": "x", "pattern": "a*"}]}, "matches the empty string"),
        ({"rules": [{"name": "x"}]}, "processors.redact.rules.0: rule 'x' needs a pattern"),
        ({"rules": [{"name": "email", "hash": True, "replace": "x"}]}, "set either replace or hash"),
        ({"rules": [{"name": "a b", "pattern": "x"}]}, "processors.redact.rules.0.name"),
        ({"default_rules": ["ssn"]}, "processors.redact.default_rules: unknown built-in rule(s) 'ssn'"),
        ({"blocked_values": ["(a"]}, "processors.redact.blocked_values.0: invalid pattern"),
        ({"blocked_key_patterns": ["(a"]}, "processors.redact.blocked_key_patterns.0: invalid regular expression"),
        # keys are the sender's: their patterns run on RE2 (linear time), which takes no backreference
        ({"blocked_key_patterns": [r"(\w)\1"]}, "invalid escape sequence: \\1 (RE2 syntax"),
        ({"on_error": "keep"}, "processors.redact.on_error"),
        ({"presidio": {"operator": "encrypt"}}, "processors.redact.presidio.operator"),
    ],
)
def test_config_errors_name_the_key(redact: dict[str, Any], expected: str) -> None:
    assert expected in _config_errors(redact)


# --- which attributes are scanned --------------------------------------------------------------------


def test_content_attributes_are_scanned_other_attributes_are_not_by_default() -> None:
    redact, out, _ = make()
    run(
        redact,
        span(
            **{
                "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": EMAIL}]}]),
                "gen_ai.prompt.0.content": f"call {PHONE}",
                "llm.input_messages.3.message.content": EMAIL,
                "gen_ai.tool.call.arguments": json.dumps({"to": EMAIL}),
                "enduser.email": EMAIL,  # not content: keep it out with attribute_keys or blocked_values
            }
        ),
    )
    a = out.spans[0].attributes
    assert EMAIL not in a["gen_ai.input.messages"] and "<EMAIL_ADDRESS>" in a["gen_ai.input.messages"]
    assert a["gen_ai.prompt.0.content"] == "call <PHONE_NUMBER>"
    assert a["llm.input_messages.3.message.content"] == "<EMAIL_ADDRESS>"
    assert json.loads(a["gen_ai.tool.call.arguments"]) == {"to": "<EMAIL_ADDRESS>"}
    assert a["enduser.email"] == EMAIL
    assert a["redaction.masked.keys"] == (
        "gen_ai.input.messages,gen_ai.prompt.0.content,gen_ai.tool.call.arguments,llm.input_messages.3.message.content"
    )


def test_attribute_keys_add_keys_exact_and_glob() -> None:
    redact, out, _ = make(attribute_keys=["enduser.email", "app.note.*"])
    run(redact, span(**{"enduser.email": EMAIL, "app.note.1": "ip 10.1.2.3", "app.other": EMAIL}))
    a = out.spans[0].attributes
    assert a["enduser.email"] == "<EMAIL_ADDRESS>"
    assert a["app.note.1"] == "ip <IP_ADDRESS>"
    assert a["app.other"] == EMAIL


def test_structured_values_tool_calls_results_documents_and_events_are_scanned() -> None:
    s = span(**{"gen_ai.output.messages": [{"role": "assistant", "parts": [{"type": "text", "content": EMAIL}]}]})
    s.input = [
        {"role": "user", "parts": [{"type": "text", "content": "weather?"}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c1", "name": "notify", "arguments": {"type": EMAIL, "n": 1}}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": {"sent_to": [EMAIL]}}]},
    ]
    s.details = {"documents": [{"id": "d1", "content": f"phone {PHONE}"}], "total_tokens": 12}
    s.events = [SpanEvent(5, "gen_ai.content.prompt", {"gen_ai.prompt": f"card {CARD}"})]
    s.status_message = f"invalid recipient {EMAIL}"
    redact, out, _ = make()
    run(redact, s)
    r = out.spans[0]
    assert r.input[1]["parts"][0]["arguments"] == {"type": "<EMAIL_ADDRESS>", "n": 1}
    assert r.input[2]["parts"][0]["response"] == {"sent_to": ["<EMAIL_ADDRESS>"]}
    assert r.details == {"documents": [{"id": "d1", "content": "phone <PHONE_NUMBER>"}], "total_tokens": 12}
    assert r.events[0].attributes == {"gen_ai.prompt": "card <CREDIT_CARD>"}
    assert r.attributes["gen_ai.output.messages"][0]["parts"][0]["content"] == "<EMAIL_ADDRESS>"
    assert r.status_message == "invalid recipient <EMAIL_ADDRESS>"
    assert r.attributes["redaction.rule.email.count"] == 4


# --- key rules ---------------------------------------------------------------------------------------


def test_allowed_keys_remove_the_rest_and_say_which() -> None:
    redact, out, metrics = make(allow_all_keys=False, allowed_keys=["gen_ai.request.model"], ignored_keys=["safe"])
    run(redact, span(**{"gen_ai.request.model": "m", "safe": EMAIL, "http.url": "x", "user.id": "u1"}))
    a = out.spans[0].attributes
    assert a == {
        "gen_ai.request.model": "m",
        "safe": EMAIL,  # ignored: never changed
        "redaction.redacted.count": 2,
        "redaction.redacted.keys": "http.url,user.id",
    }
    assert metrics.registry.get_sample_value("evalsi_redaction_removed_total", {"processor": "redact"}) == 2


def test_an_empty_allow_list_fails_closed_and_takes_the_content_made_from_removed_attributes() -> None:
    redact, out, _ = make(allow_all_keys=False)
    s = chat("hello", **{"gen_ai.input.messages": "[]", "gen_ai.request.model": "m"})
    run(redact, s)
    r = out.spans[0]
    assert set(r.attributes) == {"redaction.redacted.count", "redaction.redacted.keys"}
    assert r.input is None and r.output is None and r.content_captured is False


def test_blocked_key_patterns_mask_whole_values() -> None:
    redact, out, metrics = make(blocked_key_patterns=[r".*token.*", "api_key"])
    run(redact, span(**{"auth.token": "abc", "x.api_key.v": 42, "model": "m"}))
    a = out.spans[0].attributes
    assert a["auth.token"] == "****" and a["x.api_key.v"] == "****" and a["model"] == "m"
    assert a["redaction.masked.keys"] == "auth.token,x.api_key.v"
    assert a["redaction.rule.blocked_key_patterns.count"] == 2
    assert masked_total(metrics, "blocked_key_patterns") == 2


def test_blocked_key_patterns_hash_with_sha256() -> None:
    redact, out, _ = make(blocked_key_patterns=["secret"], hash_function="sha256")
    run(redact, span(**{"app.secret": "hunter2"}))
    assert out.spans[0].attributes["app.secret"] == hashlib.sha256(b"hunter2").hexdigest()


def test_blocked_values_mask_matches_in_every_attribute_and_the_content() -> None:
    redact, out, metrics = make(blocked_values=[r"ACCT-\d{4}"], default_rules=[])
    run(redact, chat("my ACCT-1234", **{"app.account": "ACCT-9999 ok", "n": 3}))
    r = out.spans[0]
    assert r.attributes["app.account"] == "**** ok"
    assert r.input[0]["parts"][0]["content"] == "my ****"
    assert r.attributes["redaction.rule.blocked_values.count"] == 2
    assert masked_total(metrics, "blocked_values") == 2


def test_ignored_keys_are_never_changed_even_when_content() -> None:
    redact, out, _ = make(ignored_keys=["input.value"])
    run(redact, span(**{"input.value": EMAIL, "output.value": EMAIL}))
    a = out.spans[0].attributes
    assert a["input.value"] == EMAIL and a["output.value"] == "<EMAIL_ADDRESS>"


def test_summaries_add_up_over_a_revision_and_leave_the_span_handed_on_before_alone() -> None:
    redact, out, _ = make()
    first = span(**{"gen_ai.prompt.0.content": EMAIL})
    run(redact, first)
    # normalize revises a span handed on before with a shallow copy: its dicts are shared
    revision = copy.copy(first)
    revision.output = [{"role": "assistant", "parts": [{"type": "text", "content": f"to {EMAIL}"}]}]
    run(redact, revision, revision=True)
    r = out.spans[1]
    assert r.output[0]["parts"][0]["content"] == "to <EMAIL_ADDRESS>"
    assert r.attributes["redaction.masked.count"] == 2
    assert r.attributes["redaction.masked.keys"] == "canonical.output,gen_ai.prompt.0.content"
    assert first.attributes["redaction.masked.count"] == 1  # the stored span's attributes are not changed again


# --- failures ----------------------------------------------------------------------------------------


def _fail_on(redact: Redact, marker: str) -> None:
    """Make the first rule (email) fail on matches containing `marker`."""
    rule = redact.content_rules.rules[0]
    original = rule.replacement

    def replacement(text: str) -> str:
        if marker in text:
            raise RuntimeError("injected failure")
        return original(text)

    object.__setattr__(rule, "replacement", replacement)


def _two_spans() -> tuple[Span, Span]:
    bad = chat(f"mail {EMAIL}", **{"gen_ai.input.messages": f"bad {EMAIL}", "gen_ai.request.model": "m"})
    bad.events = [SpanEvent(1, "gen_ai.content.prompt", {"gen_ai.prompt": EMAIL})]
    bad.status_message = f"failed for {EMAIL}"
    good = chat(f"mail {EMAIL.replace('jane', 'john')}", **{"gen_ai.request.model": "m"})
    good.span_id = "00000000000000b2"
    return bad, good


def test_on_error_drop_content_removes_what_it_would_have_scanned_and_keeps_the_span() -> None:
    redact, out, metrics = make()
    _fail_on(redact, "jane")
    bad, good = _two_spans()
    run(redact, bad, good)
    assert [s.span_id for s in out.spans] == [bad.span_id, good.span_id]
    b, g = out.spans
    assert b.input is None and b.output is None and b.content_captured is False
    assert b.attributes == {"gen_ai.request.model": "m", "redaction.failed": True}
    assert b.events[0].attributes == {} and b.status_message == ""
    assert "jane" not in everything([b])
    # the other span of the batch is redacted as usual
    assert g.input[0]["parts"][0]["content"] == "mail <EMAIL_ADDRESS>"
    value = metrics.registry.get_sample_value(
        "evalsi_redaction_failures_total", {"processor": "redact", "signal": "traces", "action": "drop_content"}
    )
    assert value == 1


def test_on_error_drop_span_drops_it_and_counts() -> None:
    redact, out, metrics = make(on_error="drop_span")
    _fail_on(redact, "jane")
    bad, good = _two_spans()
    run(redact, bad, good)
    assert [s.span_id for s in out.spans] == [good.span_id]
    value = metrics.registry.get_sample_value(
        "evalsi_redaction_failures_total", {"processor": "redact", "signal": "traces", "action": "drop_span"}
    )
    assert value == 1


def test_a_string_the_regex_engine_cannot_take_fails_closed() -> None:
    redact, out, _ = make()
    s = chat(f"lone surrogate \ud800 and {EMAIL}")  # JSON can carry one; UTF-8 cannot
    run(redact, s)
    assert out.spans[0].input is None and "redaction.failed" in out.spans[0].attributes


# --- logs --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", ["otel-openai-v2", "openlit"])
def test_log_bodies_and_attributes_are_redacted(folder: str) -> None:
    decoded = decode_logs_json((FIXTURES / folder / "chat_pii.logs.json").read_bytes())
    before = json.dumps([(r.body, r.attributes) for r in decoded.batch], default=str)
    assert EMAIL in before and CARD in before
    redact, out, metrics = make()
    asyncio.run(redact.consume_logs(decoded.batch))
    after = json.dumps([(r.body, r.attributes) for r in out.records], default=str)
    for pii in (EMAIL, PHONE, CARD):
        assert pii not in after
    assert len(out.records) == len(decoded.batch.records)
    touched = [r for r in out.records if "redaction.masked.count" in r.attributes]
    assert touched and all(r.attributes["redaction.rule.email.count"] >= 1 for r in touched)
    assert masked_total(metrics, "email") >= 2


def test_log_records_failing_redaction_lose_body_or_are_dropped() -> None:
    for on_error, kept in (("drop_content", 2), ("drop_span", 1)):
        redact, out, _ = make(on_error=on_error)
        _fail_on(redact, "jane")
        bad = LogRecord(1, 1, body={"content": EMAIL}, attributes={"event.name": "x", "gen_ai.input.messages": EMAIL})
        good = LogRecord(2, 2, body="fine", attributes={})
        asyncio.run(redact.consume_logs(LogBatch([bad, good])))
        assert len(out.records) == kept
        if on_error == "drop_content":
            assert out.records[0].body is None
            assert out.records[0].attributes == {"event.name": "x", "redaction.failed": True}


# --- Presidio ----------------------------------------------------------------------------------------


def _presidio() -> None:
    pytest.importorskip("presidio_analyzer", reason="needs presidio: pip install -e '.[presidio]'")
    pytest.importorskip("presidio_anonymizer", reason="needs presidio: pip install -e '.[presidio]'")


def test_presidio_alone_redacts_the_pii_captures_offline() -> None:
    _presidio()
    redact, out, metrics = make(default_rules=[], presidio={"enabled": True})
    asyncio.run(redact.start())
    import tldextract.tldextract

    assert tldextract.tldextract.TLD_EXTRACTOR.suffix_list_urls == ()  # no public-suffix download at run time
    for folder in ("openinference", "openllmetry-0.54"):
        asyncio.run(redact.consume(SpanBatch(fixture_spans(folder))))
    text = everything(out.spans)
    for pii in (EMAIL, PHONE, CARD):
        assert pii not in text
    assert "<EMAIL_ADDRESS>" in text and "<CREDIT_CARD>" in text and "<PHONE_NUMBER>" in text
    chat_span = next(s for s in out.spans if s.content_captured)
    assert chat_span.attributes["redaction.rule.presidio.EMAIL_ADDRESS.count"] >= 2
    assert masked_total(metrics, "presidio.CREDIT_CARD") >= 2


@pytest.mark.parametrize(
    ("operator", "expected"), [("mask", "*" * len(EMAIL)), ("hash", "HASH"), ("replace", "<EMAIL_ADDRESS>")]
)
def test_presidio_operators(operator: str, expected: str) -> None:
    _presidio()
    redact, out, _ = make(
        default_rules=[], presidio={"enabled": True, "operator": operator, "entities": ["EMAIL_ADDRESS"]}
    )
    asyncio.run(redact.start())
    run(redact, chat(f"mail {EMAIL} now"))
    if expected == "HASH":
        expected = hashlib.sha256(EMAIL.encode()).hexdigest()
    assert out.spans[0].input[0]["parts"][0]["content"] == f"mail {expected} now"


def test_presidio_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    _presidio()
    redact, out, _ = make(default_rules=[], presidio={"enabled": True, "batch_size": 2})
    asyncio.run(redact.start())
    calls: list[int] = []
    real = asyncio.to_thread

    async def counting(fn: Any, *args: Any) -> Any:
        calls.append(len(args[0]))
        return await real(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    run(redact, chat(f"a {EMAIL}", answer=f"b {PHONE}"), chat("c", answer="d"))
    assert calls == [2, 2]  # 4 content strings, 2 per worker call
    assert "<EMAIL_ADDRESS>" in json.dumps(out.spans[0].input)


def test_presidio_unknown_entity_or_missing_model_fails_at_start() -> None:
    _presidio()
    redact, _, _ = make(presidio={"enabled": True, "entities": ["PERSON"]})
    with pytest.raises(Exception, match=r"presidio.entities: no recognizer for PERSON"):
        asyncio.run(redact.start())
    redact, _, _ = make(presidio={"enabled": True, "spacy_model": "xx_no_such_model"})
    with pytest.raises(Exception, match=r"presidio.spacy_model: spaCy model 'xx_no_such_model' is not installed"):
        asyncio.run(redact.start())


def test_no_pii_in_any_form_after_default_rules_over_every_capture() -> None:
    """Every capture of every folder (not only chat_pii): what a rule finds in one must be masked in all."""
    redact, out, _ = make()
    for path in sorted(FIXTURES.glob("*/*.json")):
        if path.name == "meta.json" or ".logs." in path.name:
            continue
        asyncio.run(redact.consume(SpanBatch(fixture_spans(path.parent.name, path.stem))))
    text = everything(out.spans)
    assert not re.search(r"[\w.]+@example\.com", text)
