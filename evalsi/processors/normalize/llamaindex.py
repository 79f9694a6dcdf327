"""LlamaIndex's own shapes inside OpenInference's spans: a tool's `{"kwargs": ...}` input and its ToolOutput, the
LLM-kind span of a tool-calling request being prepared (no model call), and a workflow agent's run (a CHAIN span)."""

from __future__ import annotations

from typing import Any

from evalsi.processors.normalize.values import is_malformed, loads

PREPARE_SUFFIX = "._prepare_chat_with_tools"
"""LlamaIndex's dispatcher names spans `<Class>.<method>`; this LLM-kind method builds the messages and tool specs of a
request and calls no model."""


def _parsed(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("{"):
        parsed = loads(value)
        return None if is_malformed(parsed) else parsed
    return value if isinstance(value, dict) else None


AGENT_CLASSES = frozenset(("FunctionAgent", "ReActAgent", "CodeActAgent", "AgentWorkflow"))
"""LlamaIndex's workflow agents (llama_index.core.agent.workflow), whose `<Class>.run` span is one agent run."""


def agent_run(name: str) -> str | None:
    """The agent class of a `<Class>.run` span of a LlamaIndex workflow agent, else None."""
    cls, _, method = name.rpartition(".")
    return cls if method == "run" and cls in AGENT_CLASSES else None


def is_preparation(name: str) -> bool:
    return name.endswith(PREPARE_SUFFIX)


def tool_arguments(value: Any) -> Any:
    """A FunctionTool call's `input.value` `{"kwargs": {...}}` (and an empty `args`) as the named arguments; None
    when `value` is not that shape."""
    parsed = _parsed(value)
    if not isinstance(parsed, dict) or not isinstance(parsed.get("kwargs"), dict):
        return None
    if set(parsed) - {"kwargs", "args"} or parsed.get("args"):
        return None
    return parsed["kwargs"]


def tool_result(value: Any) -> Any:
    """A ToolOutput's `output.value` (`{"blocks": [{"text"}], "tool_name", "raw_input", "raw_output", ...}`) as what the
    tool returned (`raw_output`, else the blocks' text); None when `value` is not that shape."""
    parsed = _parsed(value)
    if not isinstance(parsed, dict) or "tool_name" not in parsed or not ("raw_output" in parsed or "blocks" in parsed):
        return None
    if parsed.get("raw_output") is not None:
        return parsed["raw_output"]
    blocks = parsed.get("blocks")
    if isinstance(blocks, list):
        texts = [b.get("text") for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)]
        if texts:
            return "".join(texts)
    return None
