"""`evalsi traces show` prints each step's conversation: the messages in and out, tool arguments and results, one
line each cut to the terminal, the whole with --full; what the redact processor masked marked as redacted."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.tree import Tree
from running_collector import FIXTURES, serve_config, start_collector

from evalsi.cli.transcript import INPUT_MESSAGES, conversation

CAPTURE = FIXTURES / "otel-openai-v2-latest" / "chat_tools.json"


def _render(span: dict[str, Any], *, full: bool = False, width: int = 64) -> str:
    """The lines as `traces show` prints them under their step (a tree node), without the tree's guides."""
    tree = Tree("step")
    for line in conversation(span, full=full):
        tree.add(line)
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(tree)
    return "\n".join(line[4:] for line in console.export_text().splitlines()[1:])


def _text(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": content}]}


def test_a_real_trace_shows_its_prompt_answer_tool_arguments_and_results(tmp_path: Path) -> None:
    trace_id = json.loads(CAPTURE.read_text())["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
    c = start_collector(tmp_path, serve_config(tmp_path / "store"))
    try:
        import httpx

        sent = httpx.post(c.http + "/v1/traces", content=CAPTURE.read_bytes(),
                          headers={"Content-Type": "application/json"})  # fmt: skip
        assert sent.status_code == 200 and c.wait_stored(4) == 4
        shown = c.cli("traces", "show", trace_id).stdout
        full = c.cli("traces", "show", trace_id, "--full").stdout
    finally:
        assert c.stop() == 0
    for text in (shown, full):
        assert "in  system: You are a concise assistant." in text, text
        assert "in  user: What is the weather like in Paris today?" in text  # the prompt
        assert 'out assistant: get_weather({"location": "Paris"})' in text  # the model's tool call
        assert 'out tool: => {"location": "Paris", "temperature_c": 18, "condition": "sunny"}' in text  # its result
        assert "out assistant: Based on the tool result" in text and "sunny in Paris." in text  # the answer
    # the second model call was given 4 messages: the last 3 shown, the whole history with --full
    assert "in  ... 1 earlier message (--full shows them)" in shown
    assert "earlier message" not in full


def test_each_message_is_one_line_cut_to_the_terminal_unless_full() -> None:
    long = "word " * 100 + "THE-END"
    span = {"input": [_text("user", f"first line\nsecond line {long}")], "output": [_text("assistant", "ok")]}
    cut = _render(span)
    assert cut.splitlines()[0].startswith("in  user: first line second line word") and cut.splitlines()[0].endswith(
        "…"
    ), cut
    assert "THE-END" not in cut and len(cut.splitlines()) == 2 and max(map(len, cut.splitlines())) <= 60
    whole = _render(span, full=True)
    assert "THE-END" in whole and "first line\nsecond line" in whole


def test_only_the_last_input_messages_unless_full() -> None:
    span = {"input": [_text("user", f"message {n}") for n in range(1, 7)], "output": []}
    shown = _render(span, width=200)
    assert f"... {6 - INPUT_MESSAGES} earlier messages (--full shows them)" in shown
    assert "message 1" not in shown and "message 6" in shown
    assert all(f"message {n}" in _render(span, full=True, width=200) for n in range(1, 7))


def test_redacted_values_are_shown_as_redacted() -> None:
    span = {
        "input": [_text("user", "mail me at <EMAIL_ADDRESS>, card ****************")],
        "output": [_text("assistant", "noted")],
        "attributes": {"redaction.masked.keys": "canonical.input,gen_ai.input.messages"},
    }
    lines = conversation(span)
    assert lines[0].plain == "in  (redacted) user: mail me at <EMAIL_ADDRESS>, card ****************"
    styled = {lines[0].plain[s.start : s.end] for s in lines[0].spans if s.style == "reverse yellow"}
    assert styled == {"<EMAIL_ADDRESS>", "****************"}
    assert lines[1].plain == "out assistant: noted"  # the output was not masked
    dropped = conversation({"attributes": {"redaction.failed": "true"}})
    assert dropped[0].plain.startswith("content dropped: its redaction failed")
