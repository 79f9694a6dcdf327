"""The trajectory of a trace: its GenAI steps in order (agents, LLM calls, tool calls, retrievals), parents kept.

Trajectory evaluators read this, not raw spans. Tool calls come from tool spans when the instrumentation records
them, and otherwise from the tool calls the LLM asked for (matched by call id, so none is counted twice).

What normalize cannot decide span by span is decided here, where the whole trace is seen: a model call recorded
both by a vendor SDK's own span and by an instrumentation is one `llm` step (`duplicate_calls`); plumbing spans
(`details["plumbing"]`) are no steps; a tool step takes the named arguments and the result from the LLM's tool call
and the next LLM call's tool response it is linked to (by call id, else by name and order) when its own span lacks
them. Spans are never changed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from evalsi.model import content
from evalsi.model.span import PLUMBING, TRAJECTORY_STEP_TYPES, VENDOR_SDK, WORKFLOW, Span


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
        # the newer semconv parts, listed only where a call has them
        server_calls = content.server_tool_calls(span.output)
        if server_calls:
            step["server_tool_calls"] = server_calls
        thought = content.reasoning(span.output)
        if thought is not None:
            step["reasoning"] = thought
    elif span.step_type == "tool":
        call = next(iter(content.tool_calls(span.input)), {})
        step.update(
            tool_name=span.tool_name,
            call_id=call.get("id") or _tool_response_id(span.output) or span.details.get("tool_call_id"),
            arguments=call.get("arguments"),
            result=content.tool_result(span),
        )
    elif span.step_type == "agent":
        step.update(agent_name=span.agent_name, input=span.input, output=span.output)
    elif span.step_type == "user":
        step.update(output=span.output, text=content.last_text(span.output))
    elif span.step_type == "retriever":
        step.update(documents=span.details.get("documents"), input=span.input)
    elif span.step_type == "chain" and span.details.get(WORKFLOW):
        step.update(workflow_name=span.details.get("workflow_name"), input=span.input, output=span.output)
    return step


def _tool_response_id(messages: list[dict[str, Any]] | None) -> str | None:
    for m in messages or []:
        for p in m.get("parts", []):
            if p.get("type") == "tool_call_response" and isinstance(p.get("id"), str) and p["id"]:
                return str(p["id"])
    return None


def _merge_duplicates(step: dict[str, Any], duplicates: list[Span]) -> None:
    """One llm step for a call recorded twice: the instrumentation's span is the step (it sits where the app called
    and carries the content); the vendor SDK's usage counts win (the SDK copies the API's usage as is, while e.g.
    OpenLLMetry's Anthropic streaming adds message_start's output token), and what the step lacks is taken from it."""
    step["duplicate_span_ids"] = [d.span_id for d in duplicates]
    for d in duplicates:
        if d.input_tokens is not None:
            step["input_tokens"] = d.input_tokens
        if d.output_tokens is not None:
            step["output_tokens"] = d.output_tokens
        if step["cost_usd"] is None:
            step["cost_usd"] = d.cost_usd
        if step["model"] is None:
            step["model"] = d.model
        if not step["input"] and d.input:
            step["input"] = d.input
        if not step["output"] and d.output:
            step["output"] = d.output
            step["tool_calls"] = content.tool_calls(d.output)
        if d.status_code == "ERROR" or d.error_type is not None:
            step["error"] = True
            step["error_type"] = step["error_type"] or d.error_type
            step["status_message"] = step["status_message"] or d.status_message or None


def _overlap(a: Span, b: Span) -> bool:
    return a.start_time_unix_nano <= b.end_time_unix_nano and b.start_time_unix_nano <= a.end_time_unix_nano


def _same_call(sdk: Span, other: Span) -> bool:
    """Whether a vendor SDK's llm span and a sibling instrumentation llm span record one API call: the same response
    id when both have one, else (a failed call has none) overlapping in time with the same model."""
    a, b = sdk.details.get("response_id"), other.details.get("response_id")
    if a and b:
        return bool(a == b)
    if sdk.model and other.model and sdk.model != other.model:
        return False
    return _overlap(sdk, other)


def duplicate_calls(spans: list[Span]) -> dict[str, str]:
    """Vendor SDK llm spans (`details["vendor_sdk"]`) that record a call an instrumentation's llm span of the same trace
    records too -> that span's id.

    Nested (OpenInference makes its span current: the SDK's is its child): the nearest step above is an llm span.
    Siblings (OpenLLMetry does not: both under the app's or the tool runner's span): the same response id, else
    overlapping in time; each instrumentation span takes one SDK span, the one that started closest to it. An SDK span
    whose instrumentation span is in another trace (no span of the app around the call) is joined first (`join_twins`).
    """
    sdk_spans = [s for s in spans if s.step_type == "llm" and s.details.get(VENDOR_SDK)]
    if not sdk_spans:
        return {}
    by_id = {s.span_id: s for s in spans}
    folded: dict[str, str] = {}
    taken: set[str] = set()
    siblings: dict[str, list[Span]] = {}
    for s in spans:
        if s.step_type == "llm" and not s.details.get(VENDOR_SDK):
            siblings.setdefault(s.parent_span_id, []).append(s)
    for sdk in sorted(sdk_spans, key=lambda s: (s.start_time_unix_nano, s.span_id)):
        above = by_id.get(sdk.parent_span_id)
        seen: set[str] = set()
        while above is not None and above.span_id not in seen and not _is_step(above):
            seen.add(above.span_id)
            above = by_id.get(above.parent_span_id)
        if above is not None and above.step_type == "llm" and not above.details.get(VENDOR_SDK):
            folded[sdk.span_id] = above.span_id
            continue
        candidates = [o for o in siblings.get(sdk.parent_span_id, ()) if o.span_id not in taken and _same_call(sdk, o)]
        if candidates:
            match = min(candidates, key=lambda o: abs(o.start_time_unix_nano - sdk.start_time_unix_nano))
            taken.add(match.span_id)
            folded[sdk.span_id] = match.span_id
    return folded


CALL_TWIN_SLACK_NS = 1_000_000  # the SDK's span lies inside the instrumentation's, give or take a millisecond


def lone_sdk_call(spans: list[Span]) -> Span | None:
    """The span of a trace that is nothing but a vendor SDK's record of one call made outside any span of the app
    (so outside the instrumentation's span too, when that span is not made current): its twin is in another trace."""
    if len(spans) != 1:
        return None
    s = spans[0]
    return s if s.step_type == "llm" and s.details.get(VENDOR_SDK) and not s.parent_span_id else None


def twin_candidates(spans: list[Span], vendors: frozenset[str] | set[str] | None = None) -> list[Span]:
    """The root instrumentation llm spans of a trace holding no vendor SDK span (a call recorded outside any span
    of the app), of a provider in `vendors` (None: any): where a lone SDK call's twin may be."""
    if any(s.details.get(VENDOR_SDK) for s in spans):
        return []
    return [
        s for s in spans if s.step_type == "llm" and not s.parent_span_id and (vendors is None or s.provider in vendors)
    ]


def same_call_across_traces(sdk: Span, other: Span) -> bool:
    """Whether a lone SDK call and a root instrumentation llm span of another trace record one API call: the same
    response id when both have one; else (a failed call has none; OpenInference's stream records none) the same
    provider and model, the SDK's span inside the instrumentation's (it is sent from within it)."""
    if other.provider and other.provider != sdk.details.get(VENDOR_SDK):
        return False
    a, b = sdk.details.get("response_id"), other.details.get("response_id")
    if a and b:
        return bool(a == b)
    if not sdk.model or sdk.model != other.model:
        return False
    return (
        other.start_time_unix_nano - CALL_TWIN_SLACK_NS <= sdk.start_time_unix_nano
        and sdk.end_time_unix_nano <= other.end_time_unix_nano + CALL_TWIN_SLACK_NS
    )


def join_twins(traces: dict[str, list[Span]]) -> dict[str, list[Span]]:
    """Traces by id, with each lone SDK call (`lone_sdk_call`) joined to the trace of the instrumentation span that
    records the same call (each takes one, the one that started closest): the call is then one step of that trace
    (`duplicate_calls`, siblings at the root). The order of first appearance is kept; spans keep their trace ids."""
    lone = {tid: sdk for tid, spans in traces.items() if (sdk := lone_sdk_call(spans)) is not None}
    if not lone:
        return traces
    roots = [(tid, s) for tid, spans in traces.items() if tid not in lone for s in twin_candidates(spans)]
    into: dict[str, str] = {}
    taken: set[str] = set()
    for tid, sdk in sorted(lone.items(), key=lambda kv: (kv[1].start_time_unix_nano, kv[1].span_id)):
        found = [(rt, r) for rt, r in roots if r.span_id not in taken and same_call_across_traces(sdk, r)]
        if found:
            rt, r = min(found, key=lambda f: abs(f[1].start_time_unix_nano - sdk.start_time_unix_nano))
            taken.add(r.span_id)
            into[tid] = rt
    if not into:
        return traces
    joined: dict[str, list[Span]] = {tid: list(spans) for tid, spans in traces.items() if tid not in into}
    for tid, rt in into.items():
        joined[rt].extend(traces[tid])
    return joined


def call_usage(span: Span, twin: Span | None) -> tuple[int | None, int | None, float | None]:
    """Input tokens, output tokens and cost of a call, `twin` its vendor SDK span when an instrumentation span
    records it too (`counted_once`), by the trajectory step's rule: the SDK's token counts (the API's usage as is),
    the instrumentation's cost, each taken from the other span where it has none."""
    if twin is None:
        return span.input_tokens, span.output_tokens, span.cost_usd
    return (
        twin.input_tokens if twin.input_tokens is not None else span.input_tokens,
        twin.output_tokens if twin.output_tokens is not None else span.output_tokens,
        span.cost_usd if span.cost_usd is not None else twin.cost_usd,
    )


def llm_wrappers(spans: list[Span]) -> set[str]:
    """`llm` spans that only wrap the span of the same call below them: no token counts, and a child `llm` span (not a
    vendor SDK's) of the same model. LlamaIndex's dispatcher records `OpenAILike.chat` twice, nested, the inner span
    with the messages and usage: the call is the inner span's, the outer is no step and is not counted."""
    if not any(s.step_type == "llm" and s.input_tokens is None and s.output_tokens is None for s in spans):
        return set()  # every call has its usage: no wrapper (the common case, one pass)
    by_parent: dict[str, list[Span]] = {}
    for s in spans:
        if s.step_type == "llm" and s.parent_span_id and not s.details.get(VENDOR_SDK):
            by_parent.setdefault(s.parent_span_id, []).append(s)
    if not by_parent:
        return set()
    return {
        s.span_id
        for s in spans
        if s.step_type == "llm"
        and s.input_tokens is None
        and s.output_tokens is None
        and any(c.model == s.model or s.model is None for c in by_parent.get(s.span_id, ()))
    }


def counted_once(spans: list[Span]) -> tuple[set[str], dict[str, Span]]:
    """For sums over a trace's spans (`trace.llm_calls`, tokens, cost): the vendor SDK spans to leave out (their call
    is the instrumentation span's) and the spans that wrap a call's span (`llm_wrappers`), and for each such
    instrumentation span the SDK span whose usage counts (it copies the API's usage as is, as the trajectory's step
    does)."""
    folded = duplicate_calls(spans)
    wrappers = llm_wrappers(spans)
    if not folded:
        return wrappers, {}
    by_id = {s.span_id: s for s in spans}
    return set(folded) | wrappers, {inst: by_id[sdk] for sdk, inst in folded.items()}


MODEL_CALLS = frozenset(("llm", "embedding"))


def aggregate_usage(spans: list[Span], folded: set[str] | dict[str, str] = frozenset()) -> set[str]:
    """Spans whose token counts or cost sum those of spans below them (an `invoke_agent` span with the run's usage, as
    the Vercel AI SDK's GenAI spans and the semconv's agent spans carry): left out of a trace's sums, which count each
    model call once. A model call's span always counts (the Vercel AI SDK runs a call's tools, and the agents they
    run, below it), as does a span with usage and nothing below it that has any (a remote agent's only record)."""

    def has_usage(s: Span) -> bool:
        return s.input_tokens is not None or s.output_tokens is not None or s.cost_usd is not None

    # most traces carry usage on their model calls only: nothing to leave out, one pass
    if not any(s.step_type not in MODEL_CALLS and has_usage(s) for s in spans):
        return set()
    by_id = {s.span_id: s for s in spans}
    covered: set[str] = set()
    for s in spans:
        if s.span_id in folded or not has_usage(s):
            continue
        parent, seen = by_id.get(s.parent_span_id), set()
        while parent is not None and parent.span_id not in seen:
            seen.add(parent.span_id)
            if parent.step_type not in MODEL_CALLS:  # a model call's usage is its own, whatever runs below it
                covered.add(parent.span_id)
            parent = by_id.get(parent.parent_span_id)
    return covered


def _is_step(span: Span) -> bool:
    return span.step_type in TRAJECTORY_STEP_TYPES and not span.details.get(PLUMBING)


def _link_tool_steps(steps: list[dict[str, Any]]) -> None:
    """Fill a tool step's call id, named arguments and result from the LLM's tool call it executes, when its span
    lacks them: linked by call id, else (Gemini's function calls have no id; some tool spans record none) the next
    call of that name the LLM asked for and no tool step took yet. The result comes from the tool response with that
    id a later LLM call was sent."""
    calls_by_id: dict[str, dict[str, Any]] = {}
    responses: dict[str, Any] = {}
    for s in steps:
        if s["type"] == "llm":
            for m in s["input"] or []:
                for p in m.get("parts", []):
                    call_id = p.get("id")
                    if p.get("type") == "tool_call_response" and isinstance(call_id, str) and call_id:
                        responses.setdefault(call_id, p.get("response"))
    pending: list[dict[str, Any]] = []  # calls asked for, in order, not yet linked to a tool step
    for s in steps:
        if s["type"] == "llm":
            for call in s["tool_calls"]:
                pending.append(call)
                if isinstance(call.get("id"), str) and call["id"]:
                    calls_by_id.setdefault(call["id"], call)
            continue
        if s["type"] != "tool":
            continue
        call: dict[str, Any] | None = None
        call_id = s["call_id"]
        if call_id:
            call = calls_by_id.get(call_id) if isinstance(call_id, str) else None
        else:
            call = next((c for c in pending if c.get("name") == s["tool_name"]), None)
        if call is not None:
            pending = [c for c in pending if c is not call]
            if s["call_id"] is None:
                s["call_id"] = call.get("id")
            if not isinstance(s["arguments"], (dict, list)) and call.get("arguments") is not None:
                s["arguments"] = call["arguments"]
            if s["tool_name"] is None:
                s["tool_name"] = call.get("name")
        call_id = s["call_id"]
        if s["result"] is None and isinstance(call_id, str) and call_id in responses:
            s["result"] = responses[call_id]


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
    folded = duplicate_calls(spans)
    duplicates: dict[str, list[Span]] = {}
    if folded:
        by_id = {s.span_id: s for s in spans}
        for sdk_id, kept in folded.items():
            duplicates.setdefault(kept, []).append(by_id[sdk_id])

    wrappers = llm_wrappers(spans)

    def walk(span: Span, parent: str | None, depth: int) -> None:
        include = _is_step(span) and span.span_id not in folded and span.span_id not in wrappers
        if include:
            step = _step(span, parent, depth)
            if span.span_id in duplicates:
                _merge_duplicates(step, duplicates[span.span_id])
            steps.append(step)
        for child in sorted(children.get(span.span_id, []), key=lambda c: (c.start_time_unix_nano, c.span_id)):
            walk(child, span.span_id if include else parent, depth + 1 if include else depth)

    for root in sorted(roots, key=lambda r: (r.start_time_unix_nano, r.span_id)):
        walk(root, None, 0)
    _link_tool_steps(steps)

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
            # tools the provider ran: no tool span records them, the model's output does
            for call in s.get("server_tool_calls", ()):
                tool_calls.append({k: call[k] for k in ("name", "id", "arguments")} | {"error": None, "server": True})
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
    """One trajectory per trace, in order of first appearance; a trace of plumbing only (an agent being built,
    OpenLLMetry's `create_agent` span in a trace of its own) is none, and a vendor SDK's lone span of a call an
    instrumentation recorded in another trace is a step of that trace's trajectory (`join_twins`)."""
    traces: dict[str, list[Span]] = {}
    for s in spans:
        traces.setdefault(s.trace_id, []).append(s)
    trajectories = []
    for group in join_twins(traces).values():
        trajectory = build_trajectory(group)
        if not trajectory["steps"] and any(s.details.get(PLUMBING) for s in group):
            continue
        trajectories.append(trajectory)
    return trajectories
