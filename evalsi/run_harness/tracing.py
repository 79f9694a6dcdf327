"""Each attempt as one OpenTelemetry trace, sent with the OpenTelemetry SDK's OTLP exporter to the collector: a root
`invoke_agent` span, `chat` and `execute_tool` children (subagents as nested `invoke_agent`, a simulated user's turns
as `user_turn` spans) following the GenAI semantic conventions, content included, injected faults as `evalsi.fault`
events on their tool spans, tagged `evalsi.run_id`, `evalsi.trial` and `evalsi.task_id`; the root carries the
attempt's run-added measures (`evalsi.attempt.duration_ms`, `.tokens`, `.cost_usd`: `run_metrics`)."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span as OtelSpan, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from evalsi import __version__
from evalsi.auth.keys import api_headers
from evalsi.run_harness.model import Attempt, LlmCall, Step, SubAgent, ToolCall, UserTurn, text_message
from evalsi.run_harness.run_metrics import attempt_measures, root_attributes

SERVICE_NAME = "evalsi-run"
FAULT_EVENT = "evalsi.fault"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))


def _content(value: Any) -> str:
    return value if isinstance(value, str) else _json(value)


class RunTracer:
    """Spans of one run, batched and exported over OTLP/HTTP to `endpoint` (the collector's OTLP HTTP base URL)."""

    def __init__(self, endpoint: str, run_id: str, run_name: str) -> None:
        self.run_id = run_id
        self.run_name = run_name
        resource = Resource.create(
            {"service.name": SERVICE_NAME, "service.version": __version__, "evalsi.run_id": run_id,
             "evalsi.run.name": run_name}
        )  # fmt: skip
        self.provider = TracerProvider(resource=resource)
        self.exporter = OTLPSpanExporter(
            endpoint=endpoint.rstrip("/") + "/v1/traces", timeout=30, headers=api_headers()
        )
        self.provider.add_span_processor(
            BatchSpanProcessor(self.exporter, max_queue_size=65_536, schedule_delay_millis=200,
                               max_export_batch_size=1024)
        )  # fmt: skip
        self.tracer = self.provider.get_tracer("evalsi.run_harness", __version__)

    def begin(self, task_id: str, trial: int, agent_name: str, start_ns: int | None = None) -> tuple[OtelSpan, str]:
        """Start an attempt's root span (now, or at `start_ns` for an imported one); returns it and its W3C
        traceparent (for the target to join)."""
        root = self.tracer.start_span(
            f"invoke_agent {agent_name}" if agent_name else "invoke_agent",
            start_time=start_ns,
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "evalsi.run_id": self.run_id,
                "evalsi.run.name": self.run_name,
                "evalsi.task_id": task_id,
                "evalsi.trial": trial,
            },
        )
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(root))
        return root, carrier.get("traceparent", "")

    def finish(self, root: OtelSpan, attempt: Attempt) -> int:
        """Add the attempt's steps under `root`, with its measures, close it at the attempt's end; returns the spans
        sent."""
        if attempt.agent_name:
            root.update_name(f"invoke_agent {attempt.agent_name}")
            root.set_attribute("gen_ai.agent.name", attempt.agent_name)
        first = next((s for s in attempt.steps if isinstance(s, UserTurn)), None)
        opening = attempt.task.input_text if attempt.task.input is not None or first is None else first.text
        root.set_attribute("gen_ai.input.messages", _json([text_message("user", opening)]))
        if attempt.output_text is not None:
            root.set_attribute("gen_ai.output.messages", _json([text_message("assistant", attempt.output_text)]))
        if attempt.error is not None:
            root.set_attribute("error.type", attempt.error.kind)
            root.set_status(Status(StatusCode.ERROR, str(attempt.error)))
        root.set_attributes(root_attributes(attempt_measures(attempt)))
        context = trace.set_span_in_context(root)
        sent = 1 + self._steps(attempt.steps, context)
        root.end(end_time=max(attempt.end_ns, _last_end(attempt.steps)))
        attempt.trace_id = format(root.get_span_context().trace_id, "032x")
        return sent

    def _steps(self, steps: list[Step], context: Any) -> int:
        sent = 0
        for step in steps:
            if isinstance(step, LlmCall):
                self._chat(step, context)
                sent += 1
            elif isinstance(step, ToolCall):
                self._tool(step, context)
                sent += 1
            elif isinstance(step, UserTurn):
                self._user(step, context)
                sent += 1
            elif isinstance(step, SubAgent):
                span = self.tracer.start_span(
                    f"invoke_agent {step.name}", context=context, kind=SpanKind.INTERNAL, start_time=step.start_ns,
                    attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": step.name},
                )  # fmt: skip
                if step.output is not None:
                    span.set_attribute("gen_ai.output.messages", _json([text_message("assistant", step.output)]))
                sent += 1 + self._steps(step.steps, trace.set_span_in_context(span))
                span.end(end_time=max(step.end_ns, step.start_ns))
        return sent

    def _chat(self, call: LlmCall, context: Any) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": call.model,
            "gen_ai.input.messages": _json(call.input_messages),
            "gen_ai.output.messages": _json(call.output_messages),
        }
        if call.provider:
            attributes["gen_ai.provider.name"] = call.provider
        if call.input_tokens is not None:
            attributes["gen_ai.usage.input_tokens"] = call.input_tokens
        if call.output_tokens is not None:
            attributes["gen_ai.usage.output_tokens"] = call.output_tokens
        if call.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [call.finish_reason]
        if call.cost_usd is not None:
            attributes["evalsi.cost_usd"] = call.cost_usd
        span = self.tracer.start_span(
            f"chat {call.model}".strip(), context=context, kind=SpanKind.CLIENT, start_time=call.start_ns,
            attributes=attributes,
        )  # fmt: skip
        if call.error:
            span.set_attribute("error.type", "llm_error")
            span.set_status(Status(StatusCode.ERROR, call.error))
        span.end(end_time=max(call.end_ns, call.start_ns))

    def _tool(self, call: ToolCall, context: Any) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.call_id,
            "gen_ai.tool.call.arguments": _content(call.arguments),
        }
        if call.result is not None:
            attributes["gen_ai.tool.call.result"] = _content(call.result)
        span = self.tracer.start_span(
            f"execute_tool {call.name}", context=context, kind=SpanKind.INTERNAL, start_time=call.start_ns,
            attributes=attributes,
        )  # fmt: skip
        for fault in call.faults:
            span.add_event(
                FAULT_EVENT, {"evalsi.fault.kind": fault.kind, "evalsi.fault.detail": fault.detail},
                timestamp=call.start_ns,
            )  # fmt: skip
        if call.error:
            span.set_attribute("error.type", "tool_error")
            span.set_status(Status(StatusCode.ERROR, call.error))
        span.end(end_time=max(call.end_ns, call.start_ns))

    def _user(self, turn: UserTurn, context: Any) -> None:
        """A user's turn: its message as the span's output (a user writes it), `evalsi.step.type: user`."""
        attributes: dict[str, Any] = {
            "evalsi.step.type": "user",
            "gen_ai.output.messages": _json([text_message("user", turn.text)]),
            "evalsi.user.stop": turn.stop,
        }
        if turn.model:
            attributes["evalsi.user.model"] = turn.model
        for key, count in (("input_tokens", turn.input_tokens), ("output_tokens", turn.output_tokens)):
            if count is not None:
                attributes[f"evalsi.user.{key}"] = count
        span = self.tracer.start_span(
            "user_turn", context=context, kind=SpanKind.INTERNAL, start_time=turn.start_ns, attributes=attributes
        )
        span.end(end_time=max(turn.end_ns, turn.start_ns))

    def flush(self, timeout_s: float = 30.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()


def _last_end(steps: list[Step]) -> int:
    return max((s.end_ns for s in steps), default=0)
