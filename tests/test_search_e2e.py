"""Searching traces and sessions with the `evalsi` CLI against a running `evalsi serve` (and against its store once it
has stopped): the filters of `traces list`, `sessions list` / `sessions show`, and `traces show` as a readable tree
that says when it shows only part of a trace."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from running_collector import EVALSI, Collector, serve_config, start_collector

ERRORED = f"{0xA11:032x}"  # gpt-4o failing, a tool call, conversation conv-1, tenant acme; feedback: not helpful
CLEAN = f"{0xB22:032x}"  # claude, conversation conv-1, tenant globex; feedback: helpful
ODD = f"{0xC33:032x}"  # conversation conv-2; an attribute whose value is an SQL injection
HOSTILE = "' OR 1=1 --"


def _attrs(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}
        for k, v in values.items()
    ]


OP, CONVERSATION = "gen_ai.operation.name", "gen_ai.conversation.id"
MODEL, TOOL = "gen_ai.request.model", "gen_ai.tool.name"


def _span(
    trace: str, n: int, start: int, duration_ms: int, attrs: dict[str, Any], error: bool = False
) -> dict[str, Any]:
    """Span n of a trace (1 is its root), named as the GenAI conventions name it: `chat gpt-4o`."""
    ids = f"{int(trace[-3:], 16):08x}"
    name = f"{attrs[OP]} {attrs.get(MODEL, attrs.get(TOOL, 'travel'))}"
    span: dict[str, Any] = {
        "traceId": trace, "spanId": f"{ids}{n:08x}", "name": name, "kind": 1 if n > 1 else 2,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + duration_ms * 1_000_000), "attributes": _attrs(attrs),
    }  # fmt: skip
    if n > 1:
        span["parentSpanId"] = f"{ids}{1:08x}"
    if error:
        span["status"] = {"code": 2, "message": "rate limited"}
    return span


def _otlp() -> dict[str, Any]:
    """The traces, timed from now (when they are sent, not when the module was collected: `--since 15m` must keep
    CLEAN however long the tests before this module took)."""
    now = time.time_ns()
    errored, clean, odd = now - 30 * 60 * 10**9, now - 5 * 60 * 10**9, now - 3 * 3600 * 10**9
    tokens = {"gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": 30}
    spans = [
        _span(ERRORED, 1, errored, 3000, {OP: "invoke_agent", CONVERSATION: "conv-1", "tenant": "acme"}),
        _span(ERRORED, 2, errored + 1000, 800, {OP: "chat", MODEL: "gpt-4o", **tokens}, error=True),
        _span(ERRORED, 3, errored + 2000, 100, {OP: "execute_tool", TOOL: "search_flights"}),
        _span(CLEAN, 1, clean, 200, {OP: "invoke_agent", CONVERSATION: "conv-1", "tenant": "globex"}),
        _span(CLEAN, 2, clean + 1000, 100, {OP: "chat", MODEL: "claude-sonnet", "gen_ai.usage.input_tokens": 50}),
        _span(ODD, 1, odd, 100, {OP: "invoke_agent", CONVERSATION: "conv-2", "k": HOSTILE}),
    ]
    resource = {"attributes": _attrs({"service.name": "travel-agent"})}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}


def _send(c: Collector) -> None:
    r = httpx.post(c.http + "/v1/traces", json=_otlp())
    assert r.status_code == 200, r.text
    assert c.wait_stored(6, timeout=120) >= 6  # generous: the machine may be busy


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp("search-e2e")
    c = start_collector(tmp, serve_config(tmp / "store"))
    try:
        _send(c)
        for trace, helpful in ((ERRORED, False), (CLEAN, True)):
            r = httpx.post(c.api + "/v1/feedback", json={"trace_id": trace, "name": "helpful", "value": helpful})
            assert r.status_code == 200, r.text
        yield c
    finally:
        c.stop()


def found(c: Collector, *args: str) -> list[str]:
    return [t["trace_id"] for t in json.loads(c.cli("traces", "list", "--json", *args).stdout)]


def test_traces_list_narrows_by_each_filter(served: Collector) -> None:
    assert found(served) == [CLEAN, ERRORED, ODD]
    assert found(served, "--model", "gpt-4o") == [ERRORED]
    assert found(served, "--session", "conv-1") == [CLEAN, ERRORED]
    assert found(served, "--error") == [ERRORED]
    assert found(served, "--min-duration", "2s") == [ERRORED]
    assert found(served, "--since", "1h") == [CLEAN, ERRORED]
    assert found(served, "--since", "15m") == [CLEAN]
    assert found(served, "--until", "1h") == [ODD]
    assert found(served, "--attr", "tenant=globex") == [CLEAN]
    assert found(served, "--attr", "tenant=acme", "--attr", "service.name=travel-agent") == [ERRORED]
    assert found(served, "--failed", "feedback") == [ERRORED], "not helpful: a failed feedback score"
    assert found(served, "--session", "conv-1", "--model", "claude-sonnet", "--since", "1h") == [CLEAN]


def test_a_hostile_attribute_value_is_matched_as_data(served: Collector) -> None:
    assert found(served, "--attr", f"tenant={HOSTILE}") == []
    assert found(served, "--attr", f"k={HOSTILE}") == [ODD], "the trace holding that literal value, alone"
    assert found(served, "--model", HOSTILE) == []
    assert found(served, "--session", "conv-1' OR '1'='1") == []
    assert len(found(served)) == 3


def test_where_is_a_cel_condition_and_a_bad_one_is_an_error_naming_it(served: Collector) -> None:
    assert found(served, "--where", "trace.tool_calls > 0") == [ERRORED]
    assert found(served, "--where", "'claude-sonnet' in trace.models || session.id == 'conv-2'") == [CLEAN, ODD]
    assert found(served, "--where", "trace.input_tokens >= 50", "--session", "conv-1", "--since", "15m") == [CLEAN]
    bad = served.cli("traces", "list", "--where", "trace.tool_calls >", check=False)
    assert bad.returncode == 1 and "trace.tool_calls >" in bad.stderr and "invalid CEL expression" in bad.stderr
    assert "Traceback" not in bad.stderr
    typo = served.cli("traces", "list", "--where", "trace.toolcalls > 0", check=False)
    assert typo.returncode == 1, typo.stdout + typo.stderr
    assert "trace.toolcalls: trace has no field 'toolcalls': did you mean 'tool_calls'?" in typo.stderr
    assert "no traces" not in typo.stdout and "Traceback" not in typo.stderr
    when = served.cli("traces", "list", "--since", "last tuesday", check=False)
    assert when.returncode == 1 and "since: 'last tuesday'" in when.stderr


def test_the_filters_read_through_a_config_as_through_api(served: Collector, tmp_path: Path) -> None:
    """`-c` naming the collector's API: the CLI reads through it (the query module's reader, not `--api`'s)."""
    cfg = yaml.safe_load(served.config_path.read_text())
    cfg["service"]["api"]["endpoint"] = served.ready["api"]  # where it listens: port 0 was bound
    client = tmp_path / "evalsi.yaml"
    client.write_text(yaml.safe_dump(cfg))

    def run(*args: str) -> Any:
        res = subprocess.run([*EVALSI, *args, "--json", "-c", str(client)], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    assert [t["trace_id"] for t in run("traces", "list", "--model", "gpt-4o", "--attr", "tenant=acme")] == [ERRORED]
    assert [t["trace_id"] for t in run("traces", "list", "--where", "trace.tool_calls > 0")] == [ERRORED]
    assert [t["trace_id"] for t in run("sessions", "show", "conv-1")["traces"]] == [ERRORED, CLEAN]
    assert [r["session_id"] for r in run("sessions", "list")] == ["conv-1", "conv-2"]
    doc = run("traces", "show", ERRORED, "-n", "2")
    assert doc["truncated"] is True and doc["next_offset"] == 2 and doc["scores"][0]["name"] == "helpful"


def test_traces_show_prints_a_readable_tree_with_tokens_tools_cost_and_scores(served: Collector) -> None:
    text = served.cli("traces", "show", ERRORED).stdout
    assert "invoke_agent travel" in text and "chat gpt-4o" in text and "execute_tool search_flights" in text
    assert "tokens 120/30" in text and "tools search_flights" in text and "cost $" in text
    assert "steps agent 1, llm 1, tool 1" in text and "errors 1" in text
    assert "scores: 1" in text and "feedback/feedback helpful failed" in text
    assert "3 spans" in text and "of the spans shown" not in text
    doc = json.loads(served.cli("traces", "show", ERRORED, "--json").stdout)
    assert len(doc["spans"]) == 3 and doc["truncated"] is False and doc["scores"][0]["passed"] is False


def test_traces_show_says_when_it_shows_only_part_of_a_trace(served: Collector) -> None:
    part = served.cli("traces", "show", ERRORED, "--limit", "2")
    assert "spans 1-2 of 3" in part.stdout and "execute_tool" not in part.stdout
    assert "holds 3 spans; this shows 2 of them" in part.stderr and "--offset 2" in part.stderr
    rest = served.cli("traces", "show", ERRORED, "--limit", "2", "--offset", "2")
    assert "execute_tool search_flights" in rest.stdout and "spans 3-3 of 3" in rest.stdout
    doc = json.loads(served.cli("traces", "show", ERRORED, "--json", "-n", "1").stdout)
    assert len(doc["spans"]) == 1 and doc["truncated"] is True and doc["span_count"] == 3 and doc["next_offset"] == 1


def test_sessions_list_and_show(served: Collector) -> None:
    rows = json.loads(served.cli("sessions", "list", "--json").stdout)
    assert [(r["session_id"], r["trace_count"]) for r in rows] == [("conv-1", 2), ("conv-2", 1)]
    assert [r["session_id"] for r in json.loads(served.cli("sessions", "list", "--json", "--since", "1h").stdout)] == [
        "conv-1"
    ]
    text = served.cli("sessions", "show", "conv-1").stdout
    assert text.index(ERRORED) < text.index(CLEAN), "its traces in the order they started"
    assert ODD not in text and "scores: 2" in text and "helpful failed" in text and "helpful passed" in text
    missing = served.cli("sessions", "show", "conv-9", check=False)
    assert missing.returncode == 1 and "session 'conv-9' not found" in missing.stderr


def test_with_no_collector_running_the_cli_searches_the_store(collector: Collector) -> None:
    _send(collector)
    collector.stop()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([*EVALSI, *args, "-c", str(collector.config_path)], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stderr
        return res

    listed = json.loads(run("traces", "list", "--json", "--attr", "tenant=acme", "--where", "trace.error").stdout)
    assert [t["trace_id"] for t in listed] == [ERRORED]
    assert json.loads(run("traces", "list", "--json", "--attr", f"tenant={HOSTILE}").stdout) == []
    part = run("traces", "show", ERRORED, "-n", "1")
    assert "spans 1-1 of 3" in part.stdout and "this shows 1 of them" in part.stderr
    assert [t["trace_id"] for t in json.loads(run("sessions", "show", "conv-1", "--json").stdout)["traces"]] == [
        ERRORED, CLEAN
    ]  # fmt: skip
