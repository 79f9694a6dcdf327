"""ATIF trajectories (what `GET /runs/{id}/trajectory` serves) read into the run model's steps: model turns as LLM
calls, tool calls with their results, embedded subagent trajectories as subagents; anything unreadable is refused."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from evalsi.evaluators.schema import json_type
from evalsi.run_harness.model import LlmCall, Message, Step, SubAgent, ToolCall

FAKE_STEP_NS = 1_000_000
"""The gap between made-up times of steps that carry no timestamp (1 ms)."""

_SOURCES = ("user", "agent", "system")
_ROLES = {"user": "user", "agent": "assistant", "system": "system"}
_MAJOR = re.compile(r"ATIF-v(\d+)")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class AtifError(ValueError):
    """A trajectory that cannot be converted; the message says what and where, as a path into the document
    (`steps[3].observation.results[0].source_call_id: no tool call 'c9'`)."""


@dataclass
class Trajectory:
    """A converted ATIF document: its steps in order (a subagent right after the tool call that started it), the
    agent that wrote it, and the root `final_metrics` as given (totals over the whole run, subagents included)."""

    steps: list[Step]
    agent_name: str = ""
    agent_version: str = ""
    final_metrics: dict[str, Any] = field(default_factory=dict)


def convert(doc: Any, start_ns: int) -> Trajectory:
    """Convert an ATIF document; raises `AtifError` naming the first thing that cannot be read.

    Each agent step is one model turn (an `LlmCall`) unless it says `llm_call_count: 0` (a deterministic dispatch):
    its input is the conversation so far (system, user and assistant messages, tool results as `tool` messages), its
    output the step's message with its reasoning and tool calls. Each tool call is a `ToolCall` with the content of the
    observation result whose `source_call_id` names it (a call without a result keeps `result=None`); a result's
    `subagent_trajectory_ref` names an embedded trajectory (`subagent_trajectories[].trajectory_id`, looked up in the
    trajectory that holds the result, then in those around it), converted the same way into a `SubAgent`.

    Times: a model turn runs from the previous step's `timestamp` (or from a tool result's later `extra.timestamp`,
    or a subagent's end, in between) to its own; a tool call from its step's timestamp to its result's
    `extra.timestamp`, else to the next step's timestamp. A step without a timestamp gets a made-up one,
    `FAKE_STEP_NS` (1 ms) after the latest time seen so far, the first one 1 ms after `start_ns` (the attempt's
    start): spans stay in order, but their durations then mean nothing. A timestamp without a zone is read as UTC.
    """
    return _Reader(start_ns).root(doc)


class _Clock:
    """The times of steps: real ones as given, missing ones made up after the latest time seen."""

    def __init__(self, start_ns: int) -> None:
        self.last = start_ns

    def at(self, value: Any, where: str) -> int:
        if value is None:
            self.last += FAKE_STEP_NS
            return self.last
        ns = time_ns(value, where)
        self.last = max(self.last, ns)
        return ns


def time_ns(value: Any, where: str) -> int:
    """Nanoseconds since the epoch of an ISO 8601 time (UTC when it names no zone)."""
    if not isinstance(value, str):
        raise AtifError(f"{where}: expected an ISO 8601 time string, got {json_type(value)}")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise AtifError(f"{where}: not an ISO 8601 time: {value!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


@dataclass
class _Embedded:
    path: str
    doc: dict[str, Any]
    referenced_at: str | None = None


@dataclass
class _Call:
    tool: ToolCall
    where: str
    result_at: str | None = None
    subagents: list[SubAgent] = field(default_factory=list)


class _Reader:
    def __init__(self, start_ns: int) -> None:
        self.clock = _Clock(start_ns)
        self.converting: set[str] = set()

    def root(self, doc: Any) -> Trajectory:
        steps, name, version, _ = self.trajectory(doc, "", ())
        final = doc.get("final_metrics")
        if final is not None and not isinstance(final, dict):
            raise AtifError(f"final_metrics: expected an object, got {json_type(final)}")
        return Trajectory(steps, name, version, final or {})

    def trajectory(
        self, doc: Any, base: str, scopes: tuple[dict[str, _Embedded], ...]
    ) -> tuple[list[Step], str, str, str | None]:
        """(steps, agent name, agent version, final answer text) of one trajectory; `base` prefixes its paths."""
        here = base.removesuffix(".") or "(document)"
        if not isinstance(doc, dict):
            raise AtifError(f"{here}: expected an ATIF trajectory object, got {json_type(doc)}")
        version = doc.get("schema_version")
        if version is None:
            raise AtifError(f"{base}schema_version: required but missing")
        if not isinstance(version, str):
            raise AtifError(f"{base}schema_version: expected a string, got {json_type(version)}")
        major = _MAJOR.match(version)
        if major and major.group(1) != "1":
            raise AtifError(f"{base}schema_version: {version!r} is not ATIF v1, the version evalsi reads")
        if "steps" not in doc:
            raise AtifError(f"{base}steps: required but missing")
        steps = doc["steps"]
        if not isinstance(steps, list):
            raise AtifError(f"{base}steps: expected an array, got {json_type(steps)}")
        agent = _object(doc, "agent", base.removesuffix("."))
        name = _string(agent, "name", f"{base}agent") or ""
        agent_version = agent.get("version")
        if agent_version is not None and (isinstance(agent_version, bool) or not isinstance(agent_version, str | int)):
            raise AtifError(f"{base}agent.version: expected a string, got {json_type(agent_version)}")
        default_model = _string(agent, "model_name", f"{base}agent") or ""
        scope = self.embedded(doc, base)
        order, answer = self.steps(steps, base, default_model, (scope, *scopes))
        for tid, sub in scope.items():
            if sub.referenced_at is None:
                raise AtifError(
                    f"{sub.path}: subagent trajectory {tid!r} is referenced by no tool result "
                    "(observation.results[].subagent_trajectory_ref)"
                )
        return order, name, "" if agent_version is None else str(agent_version), answer

    def embedded(self, doc: dict[str, Any], base: str) -> dict[str, _Embedded]:
        """The trajectory's `subagent_trajectories`, by `trajectory_id`."""
        found: dict[str, _Embedded] = {}
        subs = doc.get("subagent_trajectories")
        if subs is None:
            return found
        if not isinstance(subs, list):
            raise AtifError(f"{base}subagent_trajectories: expected an array, got {json_type(subs)}")
        for j, sub in enumerate(subs):
            path = f"{base}subagent_trajectories[{j}]"
            if not isinstance(sub, dict):
                raise AtifError(f"{path}: expected an ATIF trajectory object, got {json_type(sub)}")
            tid = sub.get("trajectory_id")
            if tid is None:
                raise AtifError(f"{path}.trajectory_id: required but missing (an embedded trajectory needs one)")
            if not isinstance(tid, str):
                raise AtifError(f"{path}.trajectory_id: expected a string, got {json_type(tid)}")
            if tid in found:
                raise AtifError(f"{path}.trajectory_id: {tid!r} is already the id of {found[tid].path}")
            found[tid] = _Embedded(path, sub)
        return found

    def steps(
        self, steps: list[Any], base: str, default_model: str, scopes: tuple[dict[str, _Embedded], ...]
    ) -> tuple[list[Step], str | None]:
        history: list[Message] = []
        order: list[Step] = []
        calls: dict[str, _Call] = {}
        open_calls: list[_Call] = []
        answer: str | None = None
        latest: int | None = None  # the latest time seen in this trajectory: steps, tool results, subagents
        for i, step in enumerate(steps):
            p = f"{base}steps[{i}]"
            if not isinstance(step, dict):
                raise AtifError(f"{p}: expected a step object, got {json_type(step)}")
            step_id = step.get("step_id")
            if step_id is None:
                raise AtifError(f"{p}.step_id: required but missing")
            if isinstance(step_id, bool) or step_id != i + 1:
                raise AtifError(f"{p}.step_id: expected {i + 1} (step ids run 1..n in order), got {_shown(step_id)}")
            source = step.get("source")
            if source not in _SOURCES:
                got = "nothing" if source is None else _shown(source)
                raise AtifError(f"{p}.source: expected 'user', 'agent' or 'system', got {got}")
            if "message" not in step:
                raise AtifError(f"{p}.message: required but missing")
            parts = _parts(step["message"], f"{p}.message")
            extra = _object(step, "extra", p)
            now = self.clock.at(step.get("timestamp"), f"{p}.timestamp")
            for call in open_calls:
                call.tool.end_ns = max(call.tool.start_ns, now)
            if latest is None:
                start = now if step.get("timestamp") is not None else now - FAKE_STEP_NS
            else:
                start = min(latest, now)
            latest = now if latest is None else max(latest, now)

            tool_calls = step.get("tool_calls")
            if tool_calls is not None and source != "agent":
                raise AtifError(f"{p}.tool_calls: only agent steps make tool calls (this step's source is {source!r})")
            new_calls = self.tool_calls(tool_calls, p, now, calls)
            if source != "agent":
                history.append({"role": _ROLES[source], "parts": parts})
            else:
                reasoning = step.get("reasoning_content")
                if reasoning is not None and not isinstance(reasoning, str):
                    raise AtifError(f"{p}.reasoning_content: expected a string, got {json_type(reasoning)}")
                out_parts = [{"type": "reasoning", "content": reasoning}] if reasoning else []
                out_parts += parts
                out_parts += [
                    {"type": "tool_call", "id": c.tool.call_id, "name": c.tool.name, "arguments": c.tool.arguments}
                    for c in new_calls
                ]
                message: Message = {"role": "assistant", "parts": out_parts}
                llm_calls = step.get("llm_call_count")
                if llm_calls is not None and (isinstance(llm_calls, bool) or not isinstance(llm_calls, int)):
                    raise AtifError(f"{p}.llm_call_count: expected an integer, got {json_type(llm_calls)}")
                if llm_calls != 0:
                    order.append(self.llm_call(step, p, default_model, list(history), message, start, now, extra))
                history.append(message)
                text = "".join(part["content"] for part in parts if part["type"] == "text")
                answer = text or answer
            for call in new_calls:
                order.append(call.tool)
            open_calls, seen = self.observation(step, p, calls, new_calls, history, order, scopes)
            latest = max(latest, seen)
        for call in open_calls:
            call.tool.end_ns = max(call.tool.start_ns, latest or 0)
        out: list[Step] = []
        subagents_after = {id(c.tool): c.subagents for c in calls.values()}
        for item in order:
            out.append(item)
            out.extend(subagents_after.get(id(item), ()))
        return out, answer

    def llm_call(
        self,
        step: dict[str, Any],
        p: str,
        default_model: str,
        history: list[Message],
        message: Message,
        start: int,
        end: int,
        extra: dict[str, Any],
    ) -> LlmCall:
        metrics = _object(step, "metrics", p)
        model = _string(step, "model_name", p) or default_model
        error = None
        is_error = extra.get("is_error")
        if is_error is not None and not isinstance(is_error, bool):
            raise AtifError(f"{p}.extra.is_error: expected a boolean, got {json_type(is_error)}")
        if is_error:
            error = _string(extra, "error", f"{p}.extra") or "the turn failed (extra.is_error)"
        cost = metrics.get("cost_usd")
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float) or cost < 0):
            raise AtifError(f"{p}.metrics.cost_usd: expected a non-negative number, got {_shown(cost)}")
        return LlmCall(
            model=model,
            input_messages=history,
            output_messages=[message],
            start_ns=start,
            end_ns=end,
            input_tokens=_count(metrics, "prompt_tokens", f"{p}.metrics"),
            output_tokens=_count(metrics, "completion_tokens", f"{p}.metrics"),
            cost_usd=None if cost is None else float(cost),
            error=error,
        )

    def tool_calls(self, value: Any, p: str, now: int, calls: dict[str, _Call]) -> list[_Call]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise AtifError(f"{p}.tool_calls: expected an array, got {json_type(value)}")
        made: list[_Call] = []
        for k, raw in enumerate(value):
            w = f"{p}.tool_calls[{k}]"
            if not isinstance(raw, dict):
                raise AtifError(f"{w}: expected a tool call object, got {json_type(raw)}")
            call_id = _required_string(raw, "tool_call_id", w)
            name = _required_string(raw, "function_name", w)
            if "arguments" not in raw:
                raise AtifError(f"{w}.arguments: required but missing")
            if call_id in calls:
                raise AtifError(f"{w}.tool_call_id: {call_id!r} is already the id of {calls[call_id].where}")
            call = _Call(ToolCall(name, call_id, raw["arguments"], None, now, now), w)
            calls[call_id] = call
            made.append(call)
        return made

    def observation(
        self,
        step: dict[str, Any],
        p: str,
        calls: dict[str, _Call],
        new_calls: list[_Call],
        history: list[Message],
        order: list[Step],
        scopes: tuple[dict[str, _Embedded], ...],
    ) -> tuple[list[_Call], int]:
        """Match the step's results to their calls. Returns the step's calls that the next step's time ends (no
        result timestamp) and the latest time the results and their subagents reached."""
        observation = _object(step, "observation", p)
        results = observation.get("results", [])
        if not isinstance(results, list):
            raise AtifError(f"{p}.observation.results: expected an array, got {json_type(results)}")
        open_calls = list(new_calls)
        latest = 0
        for r, result in enumerate(results):
            w = f"{p}.observation.results[{r}]"
            if not isinstance(result, dict):
                raise AtifError(f"{w}: expected a result object, got {json_type(result)}")
            content = _content(result.get("content"), f"{w}.content")
            extra = _object(result, "extra", w)
            call_id = result.get("source_call_id")
            call: _Call | None = None
            if call_id is not None:
                if not isinstance(call_id, str):
                    raise AtifError(f"{w}.source_call_id: expected a string, got {json_type(call_id)}")
                call = calls.get(call_id)
                if call is None:
                    raise AtifError(f"{w}.source_call_id: no tool call {call_id!r}")
                if call.result_at is not None:
                    raise AtifError(
                        f"{w}.source_call_id: tool call {call_id!r} already has a result ({call.result_at})"
                    )
                call.result_at = w
                call.tool.result = content
                is_error = extra.get("is_error")
                if is_error is not None and not isinstance(is_error, bool):
                    raise AtifError(f"{w}.extra.is_error: expected a boolean, got {json_type(is_error)}")
                if is_error:
                    text = content if isinstance(content, str) else ("" if content is None else str(content))
                    kind = _string(extra, "error_type", f"{w}.extra")
                    call.tool.error = (f"{kind}: {text}" if kind and text else text or kind) or "the tool call failed"
                if extra.get("timestamp") is not None:
                    returned = self.clock.at(extra["timestamp"], f"{w}.extra.timestamp")
                    call.tool.end_ns = max(call.tool.start_ns, returned)
                    latest = max(latest, call.tool.end_ns)
                    if call in open_calls:
                        open_calls.remove(call)
            history.append(
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": content}]}
            )
            subagents = self.subagents(result, w, call, scopes)
            latest = max([latest] + [s.end_ns for s in subagents])
            if call is not None:
                call.subagents.extend(subagents)
            else:
                order.extend(subagents)
        return open_calls, latest

    def subagents(
        self, result: dict[str, Any], w: str, call: _Call | None, scopes: tuple[dict[str, _Embedded], ...]
    ) -> list[SubAgent]:
        refs = result.get("subagent_trajectory_ref")
        if refs is None:
            return []
        if not isinstance(refs, list):
            raise AtifError(f"{w}.subagent_trajectory_ref: expected an array, got {json_type(refs)}")
        made: list[SubAgent] = []
        for j, ref in enumerate(refs):
            rw = f"{w}.subagent_trajectory_ref[{j}]"
            if not isinstance(ref, dict):
                raise AtifError(f"{rw}: expected an object, got {json_type(ref)}")
            tid = ref.get("trajectory_id")
            if tid is None:
                raise AtifError(
                    f"{rw}.trajectory_id: required but missing (only subagent trajectories embedded in "
                    "subagent_trajectories can be read)"
                )
            if not isinstance(tid, str):
                raise AtifError(f"{rw}.trajectory_id: expected a string, got {json_type(tid)}")
            sub = next((scope[tid] for scope in scopes if tid in scope), None)
            if sub is None:
                known = sorted({k for scope in scopes for k in scope})
                listed = ", ".join(repr(k) for k in known) if known else "none"
                raise AtifError(f"{rw}.trajectory_id: no subagent trajectory {tid!r} (embedded: {listed})")
            if sub.path in self.converting:
                raise AtifError(f"{rw}.trajectory_id: {tid!r} is {sub.path}, which holds this reference (a cycle)")
            if sub.referenced_at is not None:
                raise AtifError(f"{rw}.trajectory_id: {tid!r} is already referenced at {sub.referenced_at}")
            sub.referenced_at = rw
            begin = call.tool.start_ns if call is not None else self.clock.last
            self.converting.add(sub.path)
            steps, name, _, answer = self.trajectory(sub.doc, sub.path + ".", scopes)
            self.converting.discard(sub.path)
            start = min([s.start_ns for s in steps] + [begin])
            end = max([s.end_ns for s in steps] + [start])
            made.append(SubAgent(name=name or tid, steps=steps, start_ns=start, end_ns=end, output=answer))
        return made


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else json_type(value)


def _object(parent: dict[str, Any], key: str, p: str) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise AtifError(f"{p + '.' if p else ''}{key}: expected an object, got {json_type(value)}")
    return value


def _string(parent: dict[str, Any], key: str, p: str) -> str | None:
    value = parent.get(key)
    if value is not None and not isinstance(value, str):
        raise AtifError(f"{p + '.' if p else ''}{key}: expected a string, got {json_type(value)}")
    return value


def _required_string(parent: dict[str, Any], key: str, p: str) -> str:
    if parent.get(key) is None:
        raise AtifError(f"{p}.{key}: required but missing")
    value = _string(parent, key, p)
    assert value is not None
    return value


def _count(metrics: dict[str, Any], key: str, p: str) -> int | None:
    value = metrics.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AtifError(f"{p}.{key}: expected a token count (an integer >= 0), got {_shown(value)}")
    return value


def _parts(value: Any, where: str) -> list[dict[str, Any]]:
    """A step message (a string or ATIF content parts) as GenAI message parts."""
    if isinstance(value, str):
        return [{"type": "text", "content": value}] if value else []
    if not isinstance(value, list):
        raise AtifError(f"{where}: expected a string or an array of content parts, got {json_type(value)}")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(value):
        w = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise AtifError(f"{w}: expected a content part object, got {json_type(part)}")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise AtifError(f"{w}.text: expected a string, got {json_type(part.get('text'))}")
            parts.append({"type": "text", "content": part["text"]})
        elif kind == "image":
            source = part.get("source")
            if not isinstance(source, dict):
                raise AtifError(f"{w}.source: expected an object, got {json_type(source)}")
            parts.append(
                {"type": "uri", "modality": "image", "mime_type": source.get("media_type"), "uri": source.get("path")}
            )
        else:
            raise AtifError(
                f"{w}.type: expected 'text' or 'image', got {_shown(kind) if kind is not None else 'nothing'}"
            )
    return parts


def _content(value: Any, where: str) -> Any:
    """A result's content: a string as is, text-only parts as one string, other parts as GenAI message parts."""
    if value is None or isinstance(value, str):
        return value
    parts = _parts(value, where)
    if all(part["type"] == "text" for part in parts):
        return "".join(part["content"] for part in parts)
    return parts
