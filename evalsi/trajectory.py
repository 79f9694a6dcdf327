"""The trajectory of a trace: its GenAI steps in order (agents, LLM calls, tool calls, retrievals), parents kept.

Trajectory evaluators read this, not raw spans. Tool calls come from tool spans when the instrumentation records
them, and otherwise from the tool calls the LLM asked for (matched by call id, so none is counted twice).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from evalsi import content
from evalsi.span import TRAJECTORY_STEP_TYPES, Span


def _step(span: Span, parent: str | None, depth: int) -> dict[str, Any]:
    step: dict[str, Any] = {
        "type": span.step_type,
        "span_id": span.span_id,
        "parent_span_id": parent,
        "depth": depth,
        "name": span.name,
        "start_time_unix_nano": span.start_time_unix_nano,
        "duration_ns": span.duration_ns,
        "error": span.status_code == "ERROR" or span.error_type is not None,
        "error_type": span.error_type,
        "status_message": span.status_message or None,
    }
    if span.step_type == "llm":
        step.update(
            model=span.model,
            input_tokens=span.input_tokens,
            output_tokens=span.output_tokens,
            cost_usd=span.cost_usd,
            input=span.input,
            output=span.output,
            tool_calls=content.tool_calls(span.output),
        )
    elif span.step_type == "tool":
        call = next(iter(content.tool_calls(span.input)), {})
        step.update(
            tool_name=span.tool_name,
            call_id=call.get("id"),
            arguments=call.get("arguments"),
            result=content.tool_result(span),
        )
    elif span.step_type == "agent":
        step.update(agent_name=span.agent_name, input=span.input, output=span.output)
    elif span.step_type == "user":
        step.update(output=span.output, text=content.last_text(span.output))
    elif span.step_type == "retriever":
        step.update(documents=span.details.get("documents"), input=span.input)
    return step


def span_tree(spans: list[Span]) -> tuple[list[Span], dict[str, list[Span]]]:
    """(roots, children by parent span id): a span whose parent is not among `spans` is a root."""
    by_id = {s.span_id: s for s in spans}
    children: dict[str, list[Span]] = {}
    roots: list[Span] = []
    for s in spans:
        if s.parent_span_id and s.parent_span_id in by_id:
            children.setdefault(s.parent_span_id, []).append(s)
        else:
            roots.append(s)
    return roots, children


def retrieved_documents(spans: list[Span]) -> list[dict[str, Any]]:
    """The documents a trace's retrieval steps returned, in the order the steps ran, each text once.

    Every mapper puts a retriever span's documents in `details["documents"]` as {"id", "content", "score",
    "metadata"} (OpenInference `retrieval.documents.N.document.*` and a reranker's output documents, OTel GenAI
    `gen_ai.retrieval.documents`, MLflow RETRIEVER outputs). A reranker returns documents its retriever already
    returned, so a text seen before is not repeated. Documents without text content (not captured) are left out.
    """
    documents: list[dict[str, Any]] = []
    seen: set[str] = set()
    for span in sorted(spans, key=lambda s: (s.start_time_unix_nano, s.span_id)):
        if span.step_type != "retriever":
            continue
        for document in span.details.get("documents") or ():
            content = document.get("content") if isinstance(document, dict) else None
            if isinstance(content, str) and content.strip() and content not in seen:
                seen.add(content)
                documents.append(document)
    return documents


def build_trajectory(spans: list[Span]) -> dict[str, Any]:
    """One trace's trajectory. `spans` are the trace's normalized spans, in any order."""
    roots, children = span_tree(spans)
    steps: list[dict[str, Any]] = []

    def walk(span: Span, parent: str | None, depth: int) -> None:
        include = span.step_type in TRAJECTORY_STEP_TYPES
        if include:
            steps.append(_step(span, parent, depth))
        for child in sorted(children.get(span.span_id, []), key=lambda c: (c.start_time_unix_nano, c.span_id)):
            walk(child, span.span_id if include else parent, depth + 1 if include else depth)

    for root in sorted(roots, key=lambda r: (r.start_time_unix_nano, r.span_id)):
        walk(root, None, 0)

    # tool calls in the order they happened: tool spans, plus calls an LLM asked for that no tool span records
    # (matched by call id, or by name for tool spans that record no id)
    executed_ids = {s["call_id"] for s in steps if s["type"] == "tool" and s.get("call_id")}
    id_less = Counter(s["tool_name"] for s in steps if s["type"] == "tool" and not s.get("call_id"))
    tool_calls: list[dict[str, Any]] = []
    for s in steps:
        if s["type"] == "tool":
            tool_calls.append(
                {"name": s["tool_name"], "id": s.get("call_id"), "arguments": s.get("arguments"), "error": s["error"]}
            )
        elif s["type"] == "llm":
            for call in s["tool_calls"]:
                if call["id"] is not None and call["id"] in executed_ids:
                    continue
                if id_less[call["name"]] > 0:
                    id_less[call["name"]] -= 1
                    continue
                tool_calls.append({**call, "error": None})
    llm_steps = [s for s in steps if s["type"] == "llm"]
    roots_with_output = [s for s in steps if s["depth"] == 0 and s.get("output")]
    final = content.last_text(roots_with_output[-1]["output"]) if roots_with_output else None
    if final is None and llm_steps:
        final = content.last_text(llm_steps[-1]["output"])
    first = min(spans, key=lambda s: s.start_time_unix_nano) if spans else None
    return {
        "trace_id": spans[0].trace_id if spans else None,
        "session_id": next((s.session_id for s in spans if s.session_id), None),
        "start_time_unix_nano": first.start_time_unix_nano if first else None,
        "steps": steps,
        "tool_calls": tool_calls,
        "llm_calls": len(llm_steps),
        "input_tokens": sum(s["input_tokens"] or 0 for s in llm_steps),
        "output_tokens": sum(s["output_tokens"] or 0 for s in llm_steps),
        "errors": sum(1 for s in steps if s["error"]),
        "final_output": final,
    }


def build_trajectories(spans: list[Span]) -> list[dict[str, Any]]:
    """One trajectory per trace, in order of first appearance."""
    traces: dict[str, list[Span]] = {}
    for s in spans:
        traces.setdefault(s.trace_id, []).append(s)
    return [build_trajectory(group) for group in traces.values()]
