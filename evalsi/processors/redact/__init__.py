"""The redact processor: masks PII in span and log content and attributes before anything is stored or judged."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from evalsi import json_codec
from evalsi.backlog import SHUTDOWN_WAIT_S, Backlog, unhanded
from evalsi.component import Next, Settings, processor
from evalsi.model.log_record import LogBatch, LogRecord
from evalsi.model.span import Span, SpanBatch, SpanEvent
from evalsi.processors.redact.config import PresidioConfig, RedactConfig, RedactionRule
from evalsi.processors.redact.presidio import PresidioEngine
from evalsi.processors.redact.rules import (
    BLOCK,
    CONTENT,
    IGNORE,
    MASK,
    PASS,
    REMOVE,
    VALUES,
    Change,
    KeyRules,
    RuleSet,
    content_rules,
    hasher_of,
    value_rules,
)
from evalsi.runtime.held import earliest

__all__ = ["PresidioConfig", "Redact", "RedactConfig", "RedactionRule"]

# keys of canonical messages that normalize writes and that never hold content
_STRUCTURAL = frozenset(("role", "type", "id", "finish_reason", "unparsed"))
# the canonical details that are content (retrieved documents); the rest are numbers, ids and parameters
_CONTENT_DETAILS = ("documents", "input_documents")


class _Texts:
    """Strings gathered from a batch, each with its slot: where it goes back (container, key), whose it is (owner:
    the span's or record's index) and the label its summary names (the attribute key, `canonical.input`, ...)."""

    __slots__ = ("slots", "texts")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.slots: list[tuple[Any, Any, int, str]] = []

    def add(self, value: Any, container: Any, key: Any, owner: int, label: str) -> None:
        """`value` if it is a string, else every string in it (lists and maps, as far down as they go)."""
        if type(value) is str:
            if value:
                self.texts.append(value)
                self.slots.append((container, key, owner, label))
        elif isinstance(value, dict):
            for k, v in value.items():
                self.add(v, value, k, owner, label)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self.add(v, value, i, owner, label)

    def add_messages(self, messages: list[Any], owner: int, label: str) -> None:
        """Canonical messages: every string but the structural ones normalize writes (role, part type, ids)."""
        add = self.add
        texts, slots = self.texts, self.slots
        for m, message in enumerate(messages):
            if type(message) is not dict:
                add(message, messages, m, owner, label)
                continue
            for k, v in message.items():
                if k == "parts" and type(v) is list:
                    for p, part in enumerate(v):
                        if type(part) is not dict:
                            add(part, v, p, owner, label)
                            continue
                        for pk, pv in part.items():
                            if pk in _STRUCTURAL:
                                continue
                            if type(pv) is str:  # the common case, inlined
                                if pv:
                                    texts.append(pv)
                                    slots.append((part, pk, owner, label))
                            else:
                                add(pv, part, pk, owner, label)
                elif k not in _STRUCTURAL:
                    add(v, message, k, owner, label)


@dataclass
class _Plan:
    """What redaction will do to a batch; nothing is changed until all of it is known."""

    content: _Texts = field(default_factory=_Texts)
    values: _Texts = field(default_factory=_Texts)
    # (owner, attributes, key, new value or None to remove, rule)
    key_ops: list[tuple[int, dict[str, Any], str, Any, str]] = field(default_factory=list)
    drop_canonical: set[int] = field(default_factory=set)


@dataclass
class _Summary:
    masked_keys: set[str] = field(default_factory=set)
    removed_keys: set[str] = field(default_factory=set)
    rules: dict[str, int] = field(default_factory=dict)

    def count(self, rule: str, n: int) -> None:
        self.rules[rule] = self.rules.get(rule, 0) + n


@processor("redact", config=RedactConfig, signals=("traces", "logs"))
class Redact:
    """Masks what the rules find in content and attributes of spans (and their events) and log records.

    Content is the canonical input/output messages (text, tool-call arguments, tool results), retrieved documents,
    the known GenAI content attributes plus `attribute_keys`, span event attributes and log record bodies.
    """

    def __init__(self, config: RedactConfig, settings: Settings, next: Next) -> None:
        self.config = config
        self.settings = settings
        self.next = next
        hasher = hasher_of(config)
        self.hasher = hasher
        self.keys = KeyRules(config)
        self.content_rules = RuleSet(content_rules(config, hasher))
        self.value_rules = RuleSet(value_rules(config, hasher))
        self.presidio = PresidioEngine(config.presidio, hasher) if config.presidio.enabled else None
        self._block = (lambda _v: MASK) if config.hash_function == "none" else (lambda v: hasher(_as_text(v)))
        m = settings.metrics
        self._masked = m.counter(
            "evalsi_redaction_masked", "Values masked by the redact processor, per rule.", ["processor", "rule"]
        )
        self._removed = m.counter(
            "evalsi_redaction_removed",
            "Attributes removed by the redact processor because they are not in allowed_keys.",
            ["processor"],
        )
        self._failed = m.counter(
            "evalsi_redaction_failures",
            "Spans and log records whose redaction failed, by what on_error did with them.",
            ["processor", "signal", "action"],
        )
        self._masked_by_rule: dict[str, Any] = {}
        self._key_sets: dict[tuple[str, ...], tuple[tuple[str, int], ...]] = {}
        self._logged_failure = False
        # what this processor redacted and the next consumer refused: handed on later, while new batches are refused
        self._owed = Backlog("the consumer after redact", settings.logger)
        self._owed_logs = Backlog("the logs consumer after redact", settings.logger)

    async def start(self) -> None:
        if self.presidio is not None:
            await asyncio.to_thread(self.presidio.load)

    async def shutdown(self) -> None:
        """Only what the next consumer refused is held: given a few seconds to be taken (the exporters still run)."""
        await asyncio.gather(self._owed.drain(SHUTDOWN_WAIT_S), self._owed_logs.drain(SHUTDOWN_WAIT_S))

    @property
    def unstored(self) -> dict[str, int]:
        """`LossCounter`: spans and log records redacted and never handed on (refused until shutdown)."""
        return unhanded(self._owed, self._owed_logs)

    def held_since(self) -> float | None:
        """When the oldest span or log record redacted but not yet taken reached a receiver (see `wal.py`)."""
        return earliest((self._owed.held_since(), self._owed_logs.held_since()))

    # --- spans -------------------------------------------------------------------------------------

    async def consume(self, batch: SpanBatch) -> None:
        # once redacted, a batch is counted: a retry must not bring it again (nor pay for the scan twice)
        self._owed.refuse_while_owed()
        spans = await self._isolate(batch.spans, batch.revision, self._redact_spans, self._spans_failed, "traces")
        if len(spans) != len(batch.spans):
            batch = SpanBatch(spans, batch.revision, batch.kind)
        if batch.spans:
            await self._owed.hand_on(lambda: self.next.consume(batch), batch.spans)

    async def _redact_spans(self, spans: list[Span], revision: bool) -> None:
        plan = _Plan()
        action = self.keys.action
        content = plan.content
        for i, span in enumerate(spans):
            if revision:
                _own(span)  # a revision shares its dicts with the span handed on before
            attrs = span.attributes
            dropped = self._plan_attributes(i, attrs, plan)
            if dropped:
                plan.drop_canonical.add(i)
            else:
                if span.input:
                    content.add_messages(span.input, i, "canonical.input")
                if span.output:
                    content.add_messages(span.output, i, "canonical.output")
                details = span.details
                if details:
                    for key in _CONTENT_DETAILS:
                        if key in details:
                            content.add(details[key], details, key, i, "canonical.details")
            if span.status_message:  # error messages quote the input now and then
                content.add(span.status_message, span, "status_message", i, "status_message")
            for event in span.events:
                for k, v in event.attributes.items():
                    a = action(k)
                    if a <= VALUES:  # event attributes are content, whatever their key (gen_ai.prompt, content, ...)
                        content.add(v, event.attributes, k, i, k)
                    elif a == REMOVE or a == BLOCK:
                        plan.key_ops.append((i, event.attributes, k, None if a == REMOVE else self._block(v), ""))
        summaries = await self._apply(plan)
        for i in plan.drop_canonical:
            _drop_canonical(spans[i])
        for i, summary in summaries.items():
            _write_summary(spans[i].attributes, summary)

    def _plan_attributes(self, owner: int, attrs: dict[str, Any], plan: _Plan) -> bool:
        """Plan the key rules and gather the values to scan; True when a content attribute is removed or masked
        (the canonical content made from it goes too)."""
        # spans of one instrumentation repeat the same keys: their actions are looked up once per key sequence
        keys = tuple(attrs)
        todo = self._key_sets.get(keys)
        if todo is None:
            action = self.keys.action
            if len(self._key_sets) >= 10_000:
                self._key_sets.clear()
            todo = self._key_sets[keys] = tuple((k, a) for k in keys if (a := action(k)) != PASS and a != IGNORE)
        if not todo:
            return False
        is_content = self.keys.is_content
        content = plan.content
        dropped = False
        for k, a in todo:
            v = attrs[k]
            if a == CONTENT:
                if type(v) is str:  # the common case, inlined
                    if v:
                        content.texts.append(v)
                        content.slots.append((attrs, k, owner, k))
                else:
                    content.add(v, attrs, k, owner, k)
            elif a == VALUES:
                plan.values.add(v, attrs, k, owner, k)
            elif a == REMOVE:
                plan.key_ops.append((owner, attrs, k, None, ""))
                dropped = dropped or is_content(k)
            else:  # BLOCK
                plan.key_ops.append((owner, attrs, k, self._block(v), "blocked_key_patterns"))
                dropped = dropped or is_content(k)
        return dropped

    async def _apply(self, plan: _Plan) -> dict[int, _Summary]:
        """Run the rules (and Presidio) over the gathered strings, then write every change back."""
        content_changes = self.content_rules.apply(plan.content.texts)
        value_changes = self.value_rules.apply(plan.values.texts)
        if self.presidio is not None and plan.content.texts:
            content_changes = await self._presidio(plan.content.texts, content_changes)
        summaries: dict[int, _Summary] = {}
        for texts, changes in ((plan.content, content_changes), (plan.values, value_changes)):
            for change in changes:
                container, key, owner, label = texts.slots[change.index]
                if type(container) is dict or type(container) is list:
                    container[key] = change.text
                else:
                    setattr(container, key, change.text)
                summary = summaries.get(owner)
                if summary is None:
                    summary = summaries[owner] = _Summary()
                summary.masked_keys.add(label)
                for rule, n in change.counts.items():
                    summary.count(rule, n)
        for owner, attrs, key, new, rule in plan.key_ops:
            summary = summaries.get(owner)
            if summary is None:
                summary = summaries[owner] = _Summary()
            if new is None:
                attrs.pop(key, None)
                summary.removed_keys.add(key)
            else:
                attrs[key] = new
                summary.masked_keys.add(key)
                summary.count(rule or "blocked_key_patterns", 1)
        totals: dict[str, int] = {}
        removed = 0
        for summary in summaries.values():
            for rule, n in summary.rules.items():
                totals[rule] = totals.get(rule, 0) + n
            removed += len(summary.removed_keys)
        for rule, n in totals.items():
            self._count(rule, n)
        if removed:
            self._removed.labels(self.settings.id).inc(removed)
        return summaries

    async def _presidio(self, texts: list[str], changes: list[Change]) -> list[Change]:
        """Presidio over the content strings as the rules left them, in a worker thread, `batch_size` at a time. A
        string that recurs in the batch (a system prompt) is analyzed once and changed at each place."""
        assert self.presidio is not None
        by_index = {c.index: c for c in changes}
        current = list(texts)
        for c in changes:
            current[c.index] = c.text
        distinct = list(dict.fromkeys(current))
        found: dict[str, tuple[str, dict[str, int]]] = {}
        size = self.config.presidio.batch_size
        for start in range(0, len(distinct), size):
            chunk = distinct[start : start + size]
            for offset, text, counts in await asyncio.to_thread(self.presidio.redact, chunk):
                found[chunk[offset]] = (text, counts)
        if found:
            for index, before in enumerate(current):
                done = found.get(before)
                if done is None:
                    continue
                text, counts = done
                change = by_index.get(index)
                if change is None:
                    change = by_index[index] = Change(index, text)
                change.text = text
                for rule, n in counts.items():
                    change.counts[rule] = change.counts.get(rule, 0) + n
        return list(by_index.values())

    def _spans_failed(self, span: Span) -> bool:
        """on_error for one span: False drops it; otherwise every value redaction would have scanned goes."""
        if self.config.on_error == "drop_span":
            self._failed.labels(self.settings.id, "traces", "drop_span").inc()
            return False
        action = self.keys.action
        span.attributes = {k: v for k, v in span.attributes.items() if action(k) in (PASS, IGNORE)}
        span.attributes["redaction.failed"] = True
        span.status_message = ""
        _drop_canonical(span)
        span.events = [
            SpanEvent(e.time_unix_nano, e.name, {k: v for k, v in e.attributes.items() if action(k) == IGNORE})
            for e in span.events
        ]
        self._failed.labels(self.settings.id, "traces", "drop_content").inc()
        return True

    # --- logs --------------------------------------------------------------------------------------

    async def consume_logs(self, batch: LogBatch) -> None:
        self._owed_logs.refuse_while_owed()
        records = await self._isolate(batch.records, False, self._redact_records, self._record_failed, "logs")
        if records:
            redacted = batch if len(records) == len(batch.records) else LogBatch(records)
            await self._owed_logs.hand_on(lambda: self.next.consume_logs(redacted), records)

    async def _redact_records(self, records: list[LogRecord], _revision: bool) -> None:
        plan = _Plan()
        for i, record in enumerate(records):
            self._plan_attributes(i, record.attributes, plan)
            if record.body is not None:
                plan.content.add(record.body, record, "body", i, "body")
        summaries = await self._apply(plan)
        for i, summary in summaries.items():
            _write_summary(records[i].attributes, summary)

    def _record_failed(self, record: LogRecord) -> bool:
        if self.config.on_error == "drop_span":
            self._failed.labels(self.settings.id, "logs", "drop_span").inc()
            return False
        action = self.keys.action
        record.attributes = {k: v for k, v in record.attributes.items() if action(k) in (PASS, IGNORE)}
        record.attributes["redaction.failed"] = True
        record.body = None
        self._failed.labels(self.settings.id, "logs", "drop_content").inc()
        return True

    # --- failures ----------------------------------------------------------------------------------

    async def _isolate(self, items: list[Any], revision: bool, redact: Any, failed: Any, signal: str) -> list[Any]:
        """Redact the whole batch; if that fails, each item alone, and apply on_error to the items that fail alone.
        Nothing is changed before a batch's redaction is complete, so a failed batch can be redone item by item."""
        try:
            await redact(items, revision)
            return items
        except Exception:
            if not self._logged_failure:
                self._logged_failure = True
                self.settings.logger.exception(
                    "redact: redaction of a %s batch failed; redacting it item by item, on_error=%s for the items "
                    "that fail (logged once)",
                    signal,
                    self.config.on_error,
                )
        kept = []
        for item in items:
            try:
                await redact([item], revision)
            except Exception:
                if not failed(item):
                    continue
            kept.append(item)
        return kept

    def _count(self, rule: str, n: int) -> None:
        child = self._masked_by_rule.get(rule)
        if child is None:
            child = self._masked_by_rule[rule] = self._masked.labels(self.settings.id, rule)
        child.inc(n)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.hex()
    return json_codec.dumps(value)


def _own(span: Span) -> None:
    """Give a revision its own attribute and content containers before anything in them changes."""
    span.attributes = dict(span.attributes)
    span.events = [SpanEvent(e.time_unix_nano, e.name, dict(e.attributes)) for e in span.events]
    span.input = copy.deepcopy(span.input)
    span.output = copy.deepcopy(span.output)
    span.details = copy.deepcopy(span.details)


def _drop_canonical(span: Span) -> None:
    span.input = None
    span.output = None
    span.content_captured = False
    if any(k in span.details for k in _CONTENT_DETAILS):
        span.details = {k: v for k, v in span.details.items() if k not in _CONTENT_DETAILS}


def _merge_keys(existing: Any, keys: Iterable[str]) -> str:
    merged = set(keys)
    if isinstance(existing, str) and existing:
        merged.update(existing.split(","))
    return ",".join(sorted(merged))


def _write_summary(attrs: dict[str, Any], summary: _Summary) -> None:
    """The OTel redaction processor's summary attributes (added to any a previous pass wrote), per-rule counts."""

    def add(key: str, n: int) -> None:
        before = attrs.get(key)
        attrs[key] = (before if type(before) is int else 0) + n

    if summary.rules:
        add("redaction.masked.count", sum(summary.rules.values()))
        attrs["redaction.masked.keys"] = _merge_keys(attrs.get("redaction.masked.keys"), summary.masked_keys)
        for rule, n in summary.rules.items():
            add(f"redaction.rule.{rule}.count", n)
    if summary.removed_keys:
        add("redaction.redacted.count", len(summary.removed_keys))
        attrs["redaction.redacted.keys"] = _merge_keys(attrs.get("redaction.redacted.keys"), summary.removed_keys)
