"""What the agent pack reads from a target (its trajectory's tool calls and steps) and how its explanations show
calls, arguments and lists of problems."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from evalsi.evaluators.base import Target
from evalsi.model.score import Score

SHOWN = 3  # problems an explanation lists before "and N more"


def tool_calls_of(target: Target) -> list[dict[str, Any]]:
    return (target.trajectory or {}).get("tool_calls") or []


def steps_of(target: Target) -> list[dict[str, Any]]:
    return (target.trajectory or {}).get("steps") or []


def skip(name: str, reason: str, explanation: str) -> Score:
    score = Score.skipped(name, reason)
    score.explanation = explanation
    return score


def listing(items: list[str]) -> str:
    shown = "; ".join(items[:SHOWN])
    return shown + (f"; and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def counted(names: Counter[str]) -> str:
    return ", ".join(n if c == 1 else f"{n} (x{c})" for n, c in names.items())


def json_text(value: Any, limit: int = 120) -> str:
    """A value as compact, key-sorted JSON, cut at `limit` characters."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str).decode()
    except TypeError:  # orjson.JSONEncodeError: e.g. an integer beyond 64 bits
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def arguments_text(arguments: Any, limit: int = 120) -> str:
    """Tool-call arguments as text: the identity used to compare calls, and how explanations show them. A string
    is kept as sent (it was not JSON, or never parsed)."""
    if isinstance(arguments, str):
        return arguments if len(arguments) <= limit else arguments[: limit - 1] + "…"
    return json_text(arguments, limit)
