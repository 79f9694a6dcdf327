"""A span's conversation as `evalsi traces show` prints it: the messages it was given and those it produced (text,
tool calls with their arguments, tool results), one line each cut to the terminal unless the whole is asked for,
with what the redact processor masked marked as redacted."""

from __future__ import annotations

import json
import re
from typing import Any

from rich.text import Text

INPUT_MESSAGES = 3
"""Without --full, the input messages shown of a span: its last ones (a model call's input repeats the history)."""
MASK = re.compile(r"<[A-Z][A-Z0-9_]*>|\*{4,}")
"""What the redact processor leaves in a masked value: `<EMAIL_ADDRESS>` (replace) or `****` (mask, or `hash_function:
none`); a `hash` digest reads as text and is marked by the span's `redaction.masked.keys` instead."""
REDACTED_STYLE = "reverse yellow"


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def part_text(part: Any) -> str:
    """One part of a message as text: the text itself, `name(arguments)` for a tool call, `=> result` for a tool's
    answer, `[type]` for anything else (an image, a blob)."""
    if not isinstance(part, dict):
        return _value(part)
    kind = part.get("type")
    if kind == "text" or (kind is None and "content" in part):
        return _value(part.get("content", ""))
    if kind == "tool_call":
        return f"{part.get('name') or 'tool'}({_value(part.get('arguments', ''))})"
    if kind == "tool_call_response":
        return "=> " + _value(part.get("response", ""))
    if kind == "reasoning":
        return "(reasoning) " + _value(part.get("content", ""))
    return f"[{kind}]"


def message_text(message: Any) -> tuple[str, str]:
    """(role, text) of a message in the OTel GenAI message format; parts joined by a space."""
    if not isinstance(message, dict):
        return "", _value(message)
    parts = message.get("parts")
    if not isinstance(parts, list):
        return str(message.get("role", "")), _value(message.get("content", ""))
    return str(message.get("role", "")), " ".join(part_text(p) for p in parts)


def _marked(text: str, style: str = "") -> Text:
    """`text` with the redaction masks in it styled as redacted."""
    out = Text(style=style)
    at = 0
    for m in MASK.finditer(text):
        out.append(text[at : m.start()])
        out.append(m.group(0), style=REDACTED_STYLE)
        at = m.end()
    out.append(text[at:])
    return out


def _masked_keys(span: dict[str, Any]) -> set[str]:
    keys = (span.get("attributes") or {}).get("redaction.masked.keys") or ""
    return {k.strip() for k in str(keys).split(",")}


def conversation(span: dict[str, Any], *, full: bool = False) -> list[Text]:
    """The lines of a span's conversation: `in` its input messages (the last INPUT_MESSAGES unless `full`), `out` its
    output; each one line cut with an ellipsis unless `full`. A side the redact processor masked is labelled
    `redacted`, its masks highlighted; content the redaction dropped says so."""
    lines: list[Text] = []
    attributes = span.get("attributes") or {}
    if str(attributes.get("redaction.failed", "")).lower() == "true":
        lines.append(Text("content dropped: its redaction failed (redact on_error: drop_content)", style="yellow"))
    masked = _masked_keys(span)
    for side, key in (("in", "input"), ("out", "output")):
        messages = span.get(key) or []
        if not isinstance(messages, list):
            messages = [messages]
        if not full and side == "in" and len(messages) > INPUT_MESSAGES:
            earlier = len(messages) - INPUT_MESSAGES
            lines.append(Text(f"in  ... {earlier} earlier message{'s' * (earlier > 1)} (--full shows them)", "dim"))
            messages = messages[-INPUT_MESSAGES:]
        label = f"{side:<3} " + ("(redacted) " if f"canonical.{key}" in masked else "")
        for message in messages:
            role, text = message_text(message)
            if not full:
                text = " ".join(text.split())  # one line: newlines and runs of spaces as one space
            line = Text(label, style="dim")
            line.append(f"{role}: " if role else "", style="bold")
            line.append_text(_marked(text))
            if not full:
                line.no_wrap, line.overflow = True, "ellipsis"
            lines.append(line)
    return lines
