"""The issue's done-when for redaction: every PII capture through a real `evalsi serve` (normalize -> redact with the
default rules -> store), then no e-mail, phone or card number anywhere in the store or in what the CLI shows."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from running_collector import FIXTURES, Collector, serve_config, start_collector

from evalsi.exporters.clickhouse.backend import open_backend

PII_FILES = sorted(FIXTURES.glob("*/chat_pii.pb"))
LOG_FILES = sorted(FIXTURES.glob("*/chat_pii.logs.pb"))


def _markers() -> list[str]:
    """The PII of the captures, taken from meta.json's markers and the raw capture text (not from our rules), in
    the forms a leak could take: as written, without separators, and in parts."""
    found: set[str] = set()
    for meta_path in sorted(FIXTURES.glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        pii = meta["scenarios"].get("chat_pii")
        if pii is None:
            continue
        markers = " ".join(json.dumps(v) for v in pii["markers"].values())
        found.update(re.findall(r"[\w.+-]+@[\w-]+\.[\w.]+\w", markers))  # the e-mail the answer echoes
        found.update(re.findall(r"\d{4}(?: \d{4}){3}", markers))  # the card number of the prompt
        raw = (meta_path.parent / "chat_pii.json").read_text()
        found.update(re.findall(r"call me on (\+[\d ]+\d)", raw))  # the phone number, from the prompt itself
    assert {"jane.doe@example.com", "4111 1111 1111 1111", "+1 415 555 0134"} <= found, found
    forms = set(found)
    for m in found:
        digits = re.sub(r"\D", "", m)
        if digits:
            forms.update({digits, digits[1:] if m.startswith("+") else digits})
            forms.update(m.split(" ", 2)[-1:] if m.startswith("+") else [])  # "555 0134"
    forms.update(m.split("@")[0] + "@" for m in found if "@" in m)
    return sorted(forms)


MARKERS = _markers()


def _trace_ids(pb: Path) -> set[str]:
    doc = json.loads(pb.with_suffix(".json").read_text())
    return {s["traceId"] for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]}


def _span_count(pb: Path) -> int:
    doc = json.loads(pb.with_suffix(".json").read_text())
    return sum(len(ss["spans"]) for rs in doc["resourceSpans"] for ss in rs["scopeSpans"])


def _log_count(pb: Path) -> int:
    doc = json.loads(pb.with_suffix("").with_suffix(".logs.json").read_text())
    return sum(len(sl["logRecords"]) for rl in doc["resourceLogs"] for sl in rl["scopeLogs"])


def _post(c: Collector, path: str, file: Path) -> None:
    r = httpx.post(c.http + path, content=file.read_bytes(), headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 200, r.text


def _metric(c: Collector, name: str) -> float:
    total = 0.0
    for line in httpx.get(c.metrics).text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait(check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def _leaks(text: str) -> list[str]:
    return [m for m in MARKERS if m in text]


@pytest.fixture(scope="module")
def redacted_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("redaction")
    store = tmp / "store"
    cfg = serve_config(store)
    cfg["processors"] = {"normalize": {"event_wait": "500ms"}, "redact": {}}
    for pipeline in cfg["service"]["pipelines"].values():
        pipeline["processors"] = ["normalize", "redact"]
    c = start_collector(tmp, cfg)
    shown: dict[str, str] = {}
    printed: dict[str, str] = {}
    metrics = ""
    try:
        spans = 0
        for pb in [*PII_FILES, *(p.with_name("embeddings.pb") for p in PII_FILES)]:
            if pb.exists():
                _post(c, "/v1/traces", pb)
                spans += _span_count(pb)
        # logs after their spans: the content reaches the stored spans as revisions, through redact again
        logs = 0
        for pb in LOG_FILES:
            _post(c, "/v1/logs", pb)
            logs += _log_count(pb)
        assert c.wait_stored(spans) == spans
        assert _wait(lambda: _metric(c, "otelcol_exporter_sent_log_records_total") >= logs)
        assert _wait(lambda: _metric(c, "evalsi_normalize_spans_revised_total") >= 1)

        def captured() -> bool:
            chats = []
            for tid in _trace_ids(FIXTURES / "otel-openai-v2" / "chat_pii.pb"):
                doc = json.loads(c.cli("traces", "show", tid, "--json").stdout)
                chats += [s for s in doc["spans"] if s["step_type"] == "llm"]
            return bool(chats) and all(s["content_captured"] for s in chats)

        assert _wait(captured), "the otel-openai-v2 content events never reached their span"
        for pb in PII_FILES:
            for tid in _trace_ids(pb):
                shown[f"{pb.parent.name}/{tid}"] = c.cli("traces", "show", tid, "--json").stdout
                printed[f"{pb.parent.name}/{tid}"] = c.cli("traces", "show", tid, "--full").stdout
        metrics = httpx.get(c.metrics).text
    finally:
        assert c.stop() == 0
    backend = open_backend(f"chdb://{store}", create=False)
    try:
        tables = [r["name"] for r in backend.query("SHOW TABLES")]
        rows = {t: backend.query(f"SELECT * FROM {t}") for t in tables}
    finally:
        backend.close()
    return {"rows": rows, "shown": shown, "printed": printed, "metrics": metrics, "spans": spans, "logs": logs}


def test_no_pii_anywhere_in_the_store(redacted_store: dict[str, Any]) -> None:
    rows = redacted_store["rows"]
    assert {"otel_traces", "otel_logs"} <= set(rows)
    assert len(rows["otel_traces"]) == redacted_store["spans"]
    assert len(rows["otel_logs"]) == redacted_store["logs"]
    for table, table_rows in rows.items():
        for row in table_rows:
            text = json.dumps(row, ensure_ascii=False, default=str)
            assert not _leaks(text), f"{_leaks(text)} in {table}: {text[:300]}"


def test_redacted_content_is_still_there_and_says_what_was_masked(redacted_store: dict[str, Any]) -> None:
    traces = redacted_store["rows"]["otel_traces"]
    chats = [r for r in traces if r["ContentCaptured"] and r["StepType"] == "llm" and "<EMAIL_ADDRESS>" in r["Input"]]
    # one chat span per folder with chat_pii, content kept and readable
    assert len(chats) >= len(PII_FILES)
    for r in chats:
        assert "<PHONE_NUMBER>" in r["Input"] and "<CREDIT_CARD>" in r["Input"]
        assert "<EMAIL_ADDRESS>" in r["Output"]
        attrs = r["SpanAttributes"]
        assert int(attrs["redaction.rule.email.count"]) >= 2
        assert "canonical.input" in attrs["redaction.masked.keys"]
    logs = [
        r
        for r in redacted_store["rows"]["otel_logs"]
        if "<EMAIL_ADDRESS>" in r["Body"] + json.dumps(r["LogAttributes"])
    ]
    assert logs and all("redaction.masked.count" in r["LogAttributes"] for r in logs)


def test_no_pii_in_what_the_cli_shows(redacted_store: dict[str, Any]) -> None:
    shown = redacted_store["shown"]
    assert len(shown) >= len(PII_FILES)
    for where, text in shown.items():
        doc = json.loads(text)
        assert doc["spans"], where
        assert not _leaks(text), f"{_leaks(text)} in `evalsi traces show --json` of {where}"


def test_the_printed_conversation_shows_masked_values_as_redacted(redacted_store: dict[str, Any]) -> None:
    printed = redacted_store["printed"]
    assert len(printed) >= len(PII_FILES)
    for where, text in printed.items():
        assert not _leaks(text), f"{_leaks(text)} in `evalsi traces show --full` of {where}"
    chats = [t for t in printed.values() if "<EMAIL_ADDRESS>" in t]
    assert len(chats) >= len(PII_FILES), printed
    for text in chats:
        assert "(redacted) user:" in text and "<PHONE_NUMBER>" in text and "<CREDIT_CARD>" in text, text


def test_masked_values_are_counted_per_rule(redacted_store: dict[str, Any]) -> None:
    metrics = redacted_store["metrics"]
    for rule in ("email", "phone", "card"):
        line = next(
            (
                m
                for m in metrics.splitlines()
                if m.startswith(f'evalsi_redaction_masked_total{{processor="redact",rule="{rule}"}}')
            ),
            None,
        )
        assert line is not None, f"no counter for {rule}"
        assert float(line.rsplit(" ", 1)[1]) >= len(PII_FILES)
