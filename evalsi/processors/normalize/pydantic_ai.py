"""Pydantic AI's own attributes beside the GenAI semconv ones it writes: an agent run's input and answer
(`pydantic_ai.all_messages`, `final_result`) and a model call's cost (`operation.cost`)."""

from __future__ import annotations

from typing import Any

from evalsi.processors.normalize.messages import Message, semconv_messages
from evalsi.processors.normalize.values import as_text, number

ALL_MESSAGES = "pydantic_ai.all_messages"
"""On the `invoke_agent` span: the run's whole conversation, in the semconv message format (JSON)."""
FINAL_RESULT = "final_result"
"""On the `invoke_agent` span: the agent's output (its text, or the output object as JSON)."""
OPERATION_COST = "operation.cost"
"""On a model call's span: its cost in USD, from genai-prices (the table evalsi prices with)."""


def is_agent_run(attributes: dict[str, Any]) -> bool:
    return ALL_MESSAGES in attributes or FINAL_RESULT in attributes


def agent_messages(attributes: dict[str, Any]) -> tuple[list[Message] | None, list[Message] | None]:
    """(input, output) of a Pydantic AI agent run: the messages before the model's first answer (system prompt, any
    history, the user's prompt), and the final result as one assistant message."""
    inputs: list[Message] | None = None
    conversation = semconv_messages(attributes.get(ALL_MESSAGES), "user")
    if conversation:
        first_answer = next((i for i, m in enumerate(conversation) if m["role"] == "assistant"), len(conversation))
        inputs = conversation[:first_answer] or None
    output: list[Message] | None = None
    result = attributes.get(FINAL_RESULT)  # a structured output is its JSON text: kept as that text
    if result is not None and result != "":
        output = [{"role": "assistant", "parts": [{"type": "text", "content": as_text(result)}]}]
    return inputs, output


def operation_cost(attributes: dict[str, Any]) -> float | None:
    cost = number(attributes.get(OPERATION_COST))
    return cost if cost is not None and cost >= 0 else None
