"""The evaluator interface: what an evaluator declares, what it is given (a Target), and the registry of refs.

Built-in evaluators are `builtin/<name>`; third-party ones register through the `evalsi.evaluators` entry point
(an object with the Evaluator attributes, or a module whose import registers them with `@evaluator`). Both are
loaded by `evaluators.builtin.load_evaluators()`, above this module and the packs that build on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import ValidationError

from evalsi.evaluators.params import NoParams, Params
from evalsi.model.content import last_text
from evalsi.model.score import Score
from evalsi.model.span import TRAJECTORY_STEP_TYPES, Span
from evalsi.model.trajectory import build_trajectory, counted_once, retrieved_documents, span_tree

if TYPE_CHECKING:
    from evalsi.evaluators.judge_client import Judges

Scope = Literal["span", "trace", "session"]
Requirement = Literal["input", "output", "context", "trajectory", "judge", "reference"]

log = logging.getLogger("evalsi.evaluators")


def _texts(messages: list[dict[str, Any]] | None) -> list[str]:
    return [
        p["content"]
        for m in messages or []
        for p in m.get("parts", [])
        if p.get("type") == "text" and isinstance(p.get("content"), str)
    ]


def _final_output(spans: list[Span]) -> str | None:
    """`build_trajectory(spans)["final_output"]` without building the trajectory: the same walk (roots, then each
    span's children, in (start, span id) order), reading only what the final output depends on."""
    roots, children = span_tree(spans)
    top_output: list[dict[str, Any]] | None = None  # the last top-level llm/agent step's output, if any
    last_llm: Span | None = None
    order = sorted(roots, key=lambda r: (r.start_time_unix_nano, r.span_id))
    stack: list[tuple[Span, bool]] = [(r, True) for r in reversed(order)]  # (span, no step above it)
    while stack:
        span, top = stack.pop()
        step_type = span.step_type
        include = step_type in TRAJECTORY_STEP_TYPES
        if include:
            if step_type == "llm":
                last_llm = span
            if top and step_type in ("llm", "agent") and span.output:
                top_output = span.output
        kids = children.get(span.span_id)
        if kids:
            below = top and not include
            for child in sorted(kids, key=lambda c: (c.start_time_unix_nano, c.span_id), reverse=True):
                stack.append((child, below))
    final = last_text(top_output) if top_output is not None else None
    if final is None and last_llm is not None:
        final = last_text(last_llm.output)
    return final


_LAZY: Any = object()


class _FromSpans:
    def __repr__(self) -> str:
        return "FROM_SPANS"


FROM_SPANS: Any = _FromSpans()
"""`Target(spans, trajectory=FROM_SPANS)`: the trajectory is `build_trajectory(spans)`, built when first read."""


class Target:
    """What one evaluation looks at.

    span scope: `span` is the span, `spans` is [span]. trace scope: `spans` is the whole trace, `span` its root
    (or first) span, `trajectory` its trajectory. session scope: `spans` is every span of the session.
    `reference` holds expected values from the policy or a dataset record (expected output, tools, trajectory).
    `context` is the retrieved documents' texts: given (a Score API record's, or a function of no arguments called
    when first read), or else read from the spans' retrieval steps when first read.
    `trajectory` may be given lazily, built the first time it is read (an evaluator that does not read it never
    pays for it): `FROM_SPANS` for `build_trajectory(spans)` (then `output_text` does not need it either), or
    any function of no arguments.
    `judges` is the service's judge runtime (`judge_client.Judges`) for judge-based evaluators; without it they
    are skipped.
    """

    def __init__(
        self,
        spans: list[Span],
        span: Span | None = None,
        trajectory: dict[str, Any] | Callable[[], dict[str, Any] | None] | None = None,
        reference: dict[str, Any] | None = None,
        context: list[str] | Callable[[], list[str]] | None = None,
        judges: Judges | None = None,
    ) -> None:
        self.spans = spans
        self.span = span
        self._from_spans = trajectory is FROM_SPANS
        if self._from_spans:
            self._build_trajectory: Callable[[], dict[str, Any] | None] | None = lambda: build_trajectory(spans)
            self._trajectory: dict[str, Any] | None = _LAZY
        elif callable(trajectory):
            self._build_trajectory = trajectory
            self._trajectory = _LAZY
        else:
            self._build_trajectory = None
            self._trajectory = trajectory
        self.reference: dict[str, Any] = {} if reference is None else reference
        self._context = context
        self.judges = judges
        self._counted_once: tuple[list[Span], dict[str, Span]] | None = None

    @property
    def trajectory(self) -> dict[str, Any] | None:
        if self._trajectory is _LAZY:
            assert self._build_trajectory is not None
            self._trajectory = self._build_trajectory()
            self._build_trajectory = None
        return self._trajectory

    @trajectory.setter
    def trajectory(self, value: dict[str, Any] | None) -> None:
        self._trajectory, self._build_trajectory, self._from_spans = value, None, False

    @property
    def context(self) -> list[str]:
        if self._context is None:
            self._context = [d["content"] for d in retrieved_documents(self.spans)]
        elif callable(self._context):
            self._context = self._context()
        return self._context

    @property
    def calls_once(self) -> tuple[list[Span], dict[str, Span]]:
        """The spans to sum a trace's usage over, a call recorded by a vendor SDK and an instrumentation counted once
        (on the instrumentation's span), and for such a span the SDK span whose usage counts
        (`trajectory.counted_once`); worked out once for every evaluator that sums (tokens, cost)."""
        if self._counted_once is None:
            folded, usage = counted_once(self.spans)
            spans = [s for s in self.spans if s.span_id not in folded] if folded else self.spans
            self._counted_once = spans, usage
        return self._counted_once

    @context.setter
    def context(self, value: list[str]) -> None:
        self._context = value

    def __repr__(self) -> str:
        trajectory = ("FROM_SPANS" if self._from_spans else "<lazy>") if self._trajectory is _LAZY else self._trajectory
        return (
            f"Target(spans={self.spans!r}, span={self.span!r}, trajectory={trajectory!r}, "
            f"reference={self.reference!r}, context={self._context!r})"
        )

    @cached_property
    def llm_spans(self) -> list[Span]:
        return [s for s in self.spans if s.step_type == "llm"]

    @cached_property
    def input_text(self) -> str | None:
        """The user's input: the span's last user message, or the trace's first LLM call's."""
        for candidate in ([self.span] if self.span is not None else []) + self.llm_spans:
            users = [m for m in candidate.input or [] if m.get("role") == "user"]
            texts = _texts(users[-1:])
            if texts:
                return "\n".join(texts)
        return None

    @cached_property
    def output_text(self) -> str | None:
        """The answer: the trajectory's final output, else the span's (or last LLM call's) output text."""
        if self._trajectory is _LAZY and self._from_spans:
            # build_trajectory(spans)["final_output"], without building the trajectory
            final = _final_output(self.spans)
            if final:
                return str(final)
        elif self.trajectory and self.trajectory.get("final_output"):
            return str(self.trajectory["final_output"])
        for candidate in ([self.span] if self.span is not None else []) + self.llm_spans[::-1]:
            texts = _texts(candidate.output)
            if texts:
                return "\n".join(texts)
        return None

    @property
    def has_content(self) -> bool:
        return any(s.content_captured for s in self.spans)


@runtime_checkable
class Evaluator(Protocol):
    name: str  # the ref, e.g. "builtin/contains"
    version: str
    scope: Scope
    requires: tuple[Requirement, ...]
    params: type[Params]
    description: str

    def evaluate(self, target: Target, params: Params) -> list[Score]: ...


REGISTRY: dict[str, Evaluator] = {}


def register(ev: Evaluator) -> Evaluator:
    if ev.name in REGISTRY and REGISTRY[ev.name] is not ev:
        raise ValueError(f"evaluator {ev.name!r} is registered twice")
    REGISTRY[ev.name] = ev
    return ev


@dataclass(frozen=True)
class FunctionEvaluator:
    """A plain function made an evaluator by `@evaluator`; it may return one Score or a list."""

    name: str
    version: str
    scope: Scope
    requires: tuple[Requirement, ...]
    params: type[Params]
    description: str
    fn: Callable[[Target, Any], Score | list[Score]]

    def evaluate(self, target: Target, params: Params) -> list[Score]:
        result = self.fn(target, params)
        return [result] if isinstance(result, Score) else list(result)


def evaluator(
    name: str,
    *,
    scope: Scope = "trace",
    requires: tuple[Requirement, ...] = (),
    params: type[Params] = NoParams,
    version: str = "1",
) -> Callable[[Callable[[Target, Any], Score | list[Score]]], FunctionEvaluator]:
    """Make a function `(target, params) -> Score | list[Score]` an evaluator named `name` and register it."""

    def decorate(fn: Callable[[Target, Any], Score | list[Score]]) -> FunctionEvaluator:
        doc = (fn.__doc__ or "").strip().splitlines()
        ev = FunctionEvaluator(name, version, scope, requires, params, doc[0] if doc else "", fn)
        register(ev)
        return ev

    return decorate


def parse_params(ev: Evaluator, raw: dict[str, Any] | None) -> Params:
    """Validate params for `ev`; raises ValueError with every problem, each naming its key."""
    try:
        return ev.params.model_validate(raw or {})
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(params)'}: {err['msg'].removeprefix('Value error, ')}"
            for err in e.errors()
        )
        raise ValueError(problems) from None


def missing_requirement(ev: Evaluator, target: Target) -> str | None:
    """The skip reason when the target lacks what `ev` requires, else None."""
    for need in ev.requires:
        if need in ("input", "output") and not target.has_content:
            return "no content"
        if need == "input" and target.input_text is None:
            return "no input"
        if need == "output" and target.output_text is None:
            return "no output"
        if need == "trajectory" and not (target.trajectory and target.trajectory.get("steps")):
            return "no trajectory"
        if need == "context" and not target.context:
            # documents retrieved without their text (content capture off) are "no content", not "no documents"
            uncaptured = any(s.step_type == "retriever" and s.details.get("documents") for s in target.spans)
            return "no content" if uncaptured or not target.has_content else "no retrieved documents"
    return None


def run(ev: Evaluator, target: Target, params: Params) -> list[Score]:
    """Run one evaluator: requirements checked first (skipped, never scored), exceptions become error scores."""
    short = ev.name.rsplit("/", 1)[-1]
    reason = missing_requirement(ev, target)
    if reason is not None:
        scores = [Score.skipped(short, reason)]
    else:
        try:
            scores = ev.evaluate(target, params)
        except Exception as e:
            log.debug("evaluator %s failed", ev.name, exc_info=True)
            scores = [Score.error(short, type(e).__name__, str(e))]
    for s in scores:
        s.evaluator = ev.name
        s.evaluator_version = ev.version
    return scores
