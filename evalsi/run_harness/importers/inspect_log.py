"""Inspect AI eval logs (the `.eval` or `.json` files `inspect eval` writes) read into the run model: each sample a
task, each (sample, epoch) an attempt with its model and tool calls as steps and its scorers' verdicts as scores."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from evalsi.run_harness.model import (
    Attempt,
    GivenScore,
    InfraError,
    LlmCall,
    Message,
    Step,
    SubAgent,
    Task,
    ToolCall,
)

if TYPE_CHECKING:
    from inspect_ai.event import ModelEvent, ToolEvent
    from inspect_ai.log import EvalLog, EvalSample
    from inspect_ai.model import ChatCompletionChoice, ChatMessage, ModelUsage
    from inspect_ai.scorer import Score

INSTALL_HINT = "pip install 'evalsi[harness]'"
LOG_SUFFIXES = (".eval", ".json")
FAKE_STEP_NS = 1_000_000
"""The gap between made-up times of steps that carry no timestamp (1 ms)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LETTERS = {"C": (1.0, True), "I": (0.0, False), "P": (0.5, False), "N": (0.0, False)}
"""Inspect's CORRECT / INCORRECT / PARTIAL / NOANSWER values: (value, passed)."""
_FINISH = {
    "stop": "stop",
    "max_tokens": "length",
    "model_length": "length",
    "tool_calls": "tool_call",
    "content_filter": "content_filter",
}
"""Inspect's stop reasons as GenAI finish reasons (`unknown` is left out)."""
_SCORING = frozenset({"scorers", "scorer"})
_MEDIA = frozenset({"image", "audio", "video"})
_NOT_A_NAME = re.compile(r"[^a-z0-9._-]+")


class InspectImportError(ValueError):
    """An Inspect log that cannot be imported; the message names the file and the problem."""


@dataclass
class ImportedRun:
    """An Inspect eval log as a run: its tasks (one per sample id), its attempts (one per sample and epoch, in task
    then trial order) and `source`, what the run's manifest records about where they come from."""

    name: str
    tasks: list[Task]
    attempts: list[Attempt]
    source: dict[str, Any]


def read_inspect_log(path: Path) -> ImportedRun:
    """Read an Inspect AI eval log (`.eval` or `.json`); raises `InspectImportError` naming the file and the problem
    when it cannot be read, is not an eval log, or holds no finished eval (status `started`, `cancelled` or `error`:
    its samples are incomplete).

    - Each sample id is one `Task`, in the dataset's order (from the first epoch's sample): its input as text (a
      message list's texts joined by a blank line), `reference={"expected_output": target}` when it has one (a list
      target stays a list; a multiple choice sample's `choices` go along), its metadata. Invalidated samples are
      left out.
    - Each (sample, epoch) is one `Attempt`, `trial=epoch - 1`: its output completion, its scores, and
      `InfraError("target_error", ...)` when the sample errored. The agent name is the outermost Inspect agent's
      (`react(name=...)`; an attempt that stopped before its agent ran takes the log's), else the eval's solver,
      else `inspect`.
    - Steps come from the sample's events, in order: a model event is an `LlmCall` (provider and model split from
      `provider/model`, messages in the GenAI shape, input tokens counting cache reads and writes), a tool event a
      `ToolCall`, an agent run inside another agent (`as_tool()`, `handoff()`) a `SubAgent` right after the call that
      started it. Model calls made while scoring (a model-graded scorer's) are not the target's and are left out.
      A sample without events gets its steps from its messages (assistant messages as model calls, tool messages as
      tool calls), at made-up times.
    - Times are the events' timestamps (start, `completed` end); where there are none, a made-up clock starting at
      the log's creation time keeps attempts and steps in order, 1 ms apart.
    """
    path = Path(path)
    if not path.exists():
        raise InspectImportError(f"{path}: no such file")
    if not path.is_file():
        raise InspectImportError(f"{path}: not a file (an Inspect eval log is one `.eval` or `.json` file)")
    if path.suffix not in LOG_SUFFIXES:
        raise InspectImportError(f"{path}: not an Inspect eval log (expected a `.eval` or `.json` file)")
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        raise InspectImportError(
            f"{path}: reading Inspect AI logs needs the inspect_ai package: {INSTALL_HINT}"
        ) from None
    digest = _sha256(path)
    try:
        log = read_eval_log(path, resolve_attachments="core")
    except Exception as e:
        raise InspectImportError(f"{path}: not a readable Inspect eval log: {_problem(e)}") from e
    samples = _finished_samples(log, path)

    spec = log.eval
    clock = _Clock(_iso_ns(spec.created) or 0)
    solver = spec.solver or None
    tasks: dict[str, Task] = {}
    attempts: list[Attempt] = []
    invalidated = 0
    for sample in samples:
        if sample.invalidation is not None:
            invalidated += 1
            continue
        task = tasks.get(str(sample.id))
        if task is None:
            task = tasks[str(sample.id)] = _task(sample)
        attempts.append(_attempt(sample, task, spec.model, clock))
    if not tasks:
        raise InspectImportError(f"{path}: every sample of the log is invalidated: nothing to import")
    # an attempt that stopped before its agent started is named like the others
    agent = next((a.agent_name for a in attempts if a.agent_name), None) or solver or "inspect"
    for attempt in attempts:
        attempt.agent_name = attempt.agent_name or agent
    # the dataset's order (the log holds samples by epoch, then by id)
    listed = {str(sample_id): i for i, sample_id in enumerate(spec.dataset.sample_ids or [])}
    ordered = sorted(tasks, key=lambda task_id: listed.get(task_id, len(listed)))
    order = {task_id: i for i, task_id in enumerate(ordered)}
    attempts.sort(key=lambda a: (order[a.task.id], a.trial))

    source: dict[str, Any] = {
        "format": "inspect_ai",
        "path": str(path),
        "sha256": digest,
        "task": spec.task,
        "task_version": spec.task_version,
        "task_id": spec.task_id,
        "eval_id": spec.eval_id,
        "run_id": spec.run_id,
        "model": spec.model,
        "created": spec.created,
        "epochs": spec.config.epochs or max(s.epoch for s in samples),
        "scorers": _scorer_names(log),
        "status": log.status,
        "samples": len(samples),
        "inspect_version": spec.packages.get("inspect_ai"),
    }
    if solver:
        source["solver"] = solver
    if spec.dataset.name or spec.dataset.location:
        source["dataset"] = spec.dataset.name or spec.dataset.location
    if invalidated:
        source["invalidated_samples"] = invalidated
    return ImportedRun(name=_run_name(spec.task), tasks=[tasks[t] for t in ordered], attempts=attempts, source=source)


def _finished_samples(log: EvalLog, path: Path) -> list[EvalSample]:
    if log.status == "started":
        raise InspectImportError(
            f"{path}: the eval has not finished (status 'started': still running, or stopped before writing its end)"
        )
    if log.status == "cancelled":
        raise InspectImportError(f"{path}: the eval was cancelled (status 'cancelled'): its samples are incomplete")
    if log.status == "error":
        why = _first_line(log.error.message) if log.error is not None else "no message"
        raise InspectImportError(
            f"{path}: the eval stopped with an error ({why}): its samples are incomplete; retry it "
            "(`inspect eval-retry`) or run it with fail_on_error=False to keep the samples that fail"
        )
    if log.status != "success":
        raise InspectImportError(f"{path}: unknown eval status {log.status!r}")
    if not log.samples:
        raise InspectImportError(f"{path}: the log holds no samples (was it written with log_samples=False?)")
    return list(log.samples)


def _scorer_names(log: EvalLog) -> list[str]:
    if log.eval.scorers:
        return [s.name for s in log.eval.scorers]
    if log.results is not None and log.results.scores:
        return list(dict.fromkeys(s.scorer for s in log.results.scores))
    return list(dict.fromkeys(name for s in log.samples or [] for name in s.scores or {}))


def _task(sample: EvalSample) -> Task:
    reference: dict[str, Any] = {}
    target = sample.target
    if isinstance(target, str) and target:
        reference["expected_output"] = target
    elif isinstance(target, list) and target:
        reference["expected_output"] = list(target)
    if sample.choices:
        reference["choices"] = list(sample.choices)
    if isinstance(sample.input, str):
        text = sample.input
    else:
        text = "\n\n".join(m.text for m in sample.input if m.text)
    return Task(id=str(sample.id), input=text, reference=reference, metadata=dict(sample.metadata or {}))


def _attempt(sample: EvalSample, task: Task, default_model: str, clock: _Clock) -> Attempt:
    """The sample's attempt; its agent name is its outermost agent's, or empty."""
    agent = ""
    if sample.events:
        reader = _EventSteps(sample.events)
        steps = reader.steps
        agent = reader.agents[0] if reader.agents else ""
        start, end = reader.start_ns, reader.end_ns
    else:
        start = _iso_ns(sample.started_at) or clock.last + FAKE_STEP_NS
        steps = _message_steps(sample, default_model, start)
        end = max([_iso_ns(sample.completed_at) or 0, start, *(s.end_ns for s in steps)])
    clock.last = max(clock.last, end)
    output = sample.output
    error = None
    if sample.error is not None:
        error = InfraError("target_error", sample.error.message.strip() or "the sample failed")
    scores = [given for name, score in (sample.scores or {}).items() for given in _given_scores(name, score)]
    return Attempt(
        task=task,
        trial=sample.epoch - 1,
        output=output.completion if output.choices or output.completion else None,
        steps=steps,
        agent_name=agent,
        start_ns=start,
        end_ns=end,
        error=error,
        scores=scores,
    )


class _Clock:
    """The latest time any attempt reached: attempts without timestamps are placed after it."""

    def __init__(self, start_ns: int) -> None:
        self.last = start_ns


@dataclass
class _Span:
    parent: str | None
    type: str | None
    name: str
    start_ns: int
    end_ns: int | None = None


class _EventSteps:
    """A sample's events as steps: model and tool events in the order logged, each in the steps of the agent whose
    span holds it (an agent inside another agent is a `SubAgent`; the outermost agents' steps are the attempt's)."""

    def __init__(self, events: Sequence[Any]) -> None:
        self.spans: dict[str, _Span] = {}
        self.steps: list[Step] = []
        self.agents: list[str] = []
        """The outermost agents' names, in order."""
        self.subagents: dict[str, SubAgent] = {}
        times: list[int] = []
        for event in events:
            times.append(_ns(event.timestamp))
            completed = getattr(event, "completed", None)
            if completed is not None:
                times.append(_ns(completed))
            if event.event == "span_begin":
                self.spans[event.id] = _Span(event.parent_id, event.type, event.name, _ns(event.timestamp))
            elif event.event == "span_end" and event.id in self.spans:
                self.spans[event.id].end_ns = _ns(event.timestamp)
        self.start_ns, self.end_ns = min(times), max(times)
        for event in events:
            if event.event == "span_begin":
                if event.type == "agent" and not self._scoring(event.id):
                    self._steps_of(event.id)  # a subagent takes its place when it starts, even without steps
            elif event.event in ("model", "tool") and not self._scoring(event.span_id):
                step = _llm_call(event) if event.event == "model" else _tool_call(event)
                self._steps_of(self._agent(event.span_id)).append(step)
        for sub in reversed(self.subagents.values()):  # inner subagents start later: their ends are known first
            sub.end_ns = max([sub.end_ns, *(s.end_ns for s in sub.steps)])
            calls = [s for s in sub.steps if isinstance(s, LlmCall) and s.output_messages]
            if calls:
                sub.output = _text(calls[-1].output_messages[0]) or None

    def _chain(self, span_id: str | None) -> list[_Span]:
        """The span and the spans around it, innermost first."""
        chain: list[_Span] = []
        seen: set[str] = set()
        while span_id is not None and span_id in self.spans and span_id not in seen:
            seen.add(span_id)
            chain.append(self.spans[span_id])
            span_id = self.spans[span_id].parent
        return chain

    def _scoring(self, span_id: str | None) -> bool:
        return any(span.type in _SCORING for span in self._chain(span_id))

    def _agent(self, span_id: str | None) -> str | None:
        """The id of the innermost agent span holding the span (itself included)."""
        seen: set[str] = set()
        while span_id is not None and span_id in self.spans and span_id not in seen:
            seen.add(span_id)
            if self.spans[span_id].type == "agent":
                return span_id
            span_id = self.spans[span_id].parent
        return None

    def _steps_of(self, agent_id: str | None) -> list[Step]:
        if agent_id is None:
            return self.steps
        span = self.spans[agent_id]
        outer = self._agent(span.parent)
        if outer is None:
            if span.name not in self.agents:
                self.agents.append(span.name)
            return self.steps
        sub = self.subagents.get(agent_id)
        if sub is None:
            sub = SubAgent(name=span.name, steps=[], start_ns=span.start_ns, end_ns=span.end_ns or span.start_ns)
            self.subagents[agent_id] = sub
            self._steps_of(outer).append(sub)
        return sub.steps


def _llm_call(event: ModelEvent) -> LlmCall:
    provider, model = _split_model(event.model)
    start = _ns(event.timestamp)
    end = _ns(event.completed) if event.completed is not None else start + _seconds_ns(event.working_time)
    output = event.output
    usage = output.usage
    error = event.error or output.error
    if error is None and event.pending:
        error = "the model call did not finish"
    reason = output.choices[0].stop_reason if output.choices else None
    return LlmCall(
        model=model,
        input_messages=[_message(m) for m in event.input],
        output_messages=[_choice(c) for c in output.choices],
        start_ns=start,
        end_ns=max(start, end),
        provider=provider,
        input_tokens=_input_tokens(usage),
        output_tokens=usage.output_tokens if usage is not None else None,
        cost_usd=usage.total_cost if usage is not None else None,
        finish_reason=_FINISH.get(reason) if reason else None,
        error=error,
    )


def _tool_call(event: ToolEvent) -> ToolCall:
    start = _ns(event.timestamp)
    end = _ns(event.completed) if event.completed is not None else start + _seconds_ns(event.working_time)
    error = None
    if event.error is not None:
        kind, text = event.error.type, event.error.message
        error = text if kind == "unknown" else f"{kind}: {text}"
    elif event.failed:
        error = "the tool call failed"
    elif event.pending:
        error = "the tool call did not finish"
    result = _tool_result(event.result)
    return ToolCall(
        name=event.function,
        call_id=event.id,
        arguments=dict(event.arguments),
        result=None if error is not None and result == "" else result,
        start_ns=start,
        end_ns=max(start, end),
        error=error,
    )


def _message_steps(sample: EvalSample, default_model: str, start: int) -> list[Step]:
    """Steps from a sample's messages alone (a log without events): made-up times `FAKE_STEP_NS` apart from `start`;
    the sample's output usage goes to the assistant message that is its output."""
    steps: list[Step] = []
    history: list[Message] = []
    arguments: dict[str, Any] = {}
    output = sample.output
    final_id = output.choices[0].message.id if output.choices else None
    now = start
    for m in sample.messages:
        message = _message(m)
        if m.role == "assistant":
            provider, model = _split_model(m.model or output.model or default_model)
            usage = output.usage if m.id is not None and m.id == final_id else None
            steps.append(
                LlmCall(
                    model=model,
                    input_messages=list(history),
                    output_messages=[message],
                    start_ns=now,
                    end_ns=now + FAKE_STEP_NS,
                    provider=provider,
                    input_tokens=_input_tokens(usage),
                    output_tokens=usage.output_tokens if usage is not None else None,
                    cost_usd=usage.total_cost if usage is not None else None,
                )
            )
            now += FAKE_STEP_NS
            arguments.update((c.id, c.arguments) for c in m.tool_calls or [])
        elif m.role == "tool":
            error = m.error.message if m.error is not None else None
            result = _content_value(m.content)
            steps.append(
                ToolCall(
                    name=m.function or "",
                    call_id=m.tool_call_id or "",
                    arguments=arguments.get(m.tool_call_id or "", {}),
                    result=None if error is not None and result == "" else result,
                    start_ns=now,
                    end_ns=now + FAKE_STEP_NS,
                    error=error,
                )
            )
            now += FAKE_STEP_NS
        history.append(message)
    return steps


def _message(m: ChatMessage) -> Message:
    """An Inspect chat message in the GenAI shape: a tool message is one `tool_call_response` part (an error as the
    `Error: ...` text Inspect gives the model), an assistant message's tool calls follow its content parts."""
    if m.role == "tool":
        response = f"Error: {m.error.message}" if m.error is not None else _content_value(m.content)
        return {"role": "tool", "parts": [{"type": "tool_call_response", "id": m.tool_call_id, "response": response}]}
    parts = _parts(m.content)
    if m.role == "assistant":
        parts += [
            {"type": "tool_call", "id": c.id, "name": c.function, "arguments": c.arguments} for c in m.tool_calls or []
        ]
    return {"role": m.role, "parts": parts}


def _choice(choice: ChatCompletionChoice) -> Message:
    message = _message(choice.message)
    reason = _FINISH.get(choice.stop_reason)
    if reason is not None:
        message["finish_reason"] = reason
    return message


def _parts(content: str | Sequence[Any]) -> list[dict[str, Any]]:
    """Inspect content as GenAI parts: text, reasoning (a redacted one's summary), media as `uri` parts; anything else
    as a part of its Inspect type with its fields."""
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[dict[str, Any]] = []
    for item in content:
        if item.type == "text":
            parts.append({"type": "text", "content": item.text})
        elif item.type == "reasoning":
            text = item.summary if item.redacted else item.reasoning
            if text:
                parts.append({"type": "reasoning", "content": text})
        elif item.type in _MEDIA:
            parts.append({"type": "uri", "modality": item.type, "uri": getattr(item, item.type)})
        else:
            parts.append({"type": item.type, **item.model_dump(exclude={"type", "internal"}, exclude_none=True)})
    return parts


def _content_value(content: str | Sequence[Any]) -> Any:
    """A tool's result or a tool message's content: a string as is, text-only content as one string, else parts."""
    if isinstance(content, str):
        return content
    parts = _parts(content)
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["content"] for part in parts)
    return parts


def _tool_result(result: Any) -> Any:
    if isinstance(result, str | int | float | bool) or result is None:
        return result
    if isinstance(result, list):
        return _content_value(result)
    return _content_value([result])


def _text(message: Message) -> str:
    return "".join(part["content"] for part in message.get("parts", ()) if part.get("type") == "text")


def _given_scores(name: str, score: Score) -> list[GivenScore]:
    """A scorer's score: a dict value is one score per key (`scorer/key`), a list one per index (`scorer/0`)."""
    explanation = score.explanation
    if score.reason:
        explanation = f"{explanation} (reason: {score.reason})" if explanation else f"reason: {score.reason}"
    value = score.value
    if isinstance(value, Mapping):
        return [_given(f"{name}/{key}", item, explanation) for key, item in value.items()]
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_given(f"{name}/{i}", item, explanation) for i, item in enumerate(value)]
    return [_given(name, value, explanation)]


def _given(name: str, value: Any, explanation: str | None) -> GivenScore:
    """One scalar: C/I/P/N as 1/0/0.5/0 (passed only for C) with the letter as label; a bool as 1/0 and passed; a
    number as is (NaN, Inspect's unscored value, as no value); another string as a label only."""
    if isinstance(value, bool):
        return GivenScore(name, 1.0 if value else 0.0, passed=value, explanation=explanation, source="imported")
    if isinstance(value, int | float):
        number = float(value)
        return GivenScore(name, number if math.isfinite(number) else None, explanation=explanation, source="imported")
    if isinstance(value, str):
        if value in _LETTERS:
            number, passed = _LETTERS[value]
            return GivenScore(name, number, passed=passed, label=value, explanation=explanation, source="imported")
        return GivenScore(name, label=value, explanation=explanation, source="imported")
    return GivenScore(name, explanation=explanation, source="imported")


def _split_model(name: str) -> tuple[str, str]:
    """(provider, model) of an Inspect model name: `openai/gpt-4o` is ("openai", "gpt-4o")."""
    provider, sep, model = name.partition("/")
    return (provider, model) if sep and model else ("", name)


def _input_tokens(usage: ModelUsage | None) -> int | None:
    """All input tokens: Inspect counts cache reads and writes apart from `input_tokens`."""
    if usage is None:
        return None
    return usage.input_tokens + (usage.input_tokens_cache_read or 0) + (usage.input_tokens_cache_write or 0)


def _ns(when: datetime) -> int:
    """Nanoseconds since the epoch (a time without a zone is read as UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _iso_ns(value: str | None) -> int | None:
    if not value:
        return None
    try:
        return _ns(datetime.fromisoformat(value))
    except ValueError:
        return None


def _seconds_ns(seconds: float | None) -> int:
    return round(seconds * 1e9) if seconds and math.isfinite(seconds) and seconds > 0 else 0


def _run_name(task: str) -> str:
    """The Inspect task name as a run name (lowercase letters, digits, `-`, `_`, `.`)."""
    name = _NOT_A_NAME.sub("-", task.lower()).strip("-._")[:64].rstrip("-._")
    return name or "inspect"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def _problem(e: Exception) -> str:
    if isinstance(e, ValidationError):
        errors = e.errors()
        where = ".".join(str(p) for p in errors[0]["loc"]) or "(document)"
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        return f"not an eval log: {where}: {errors[0]['msg']}{more}"
    return f"{type(e).__name__}: {_first_line(str(e)) or 'no message'}"
