"""Evaluators under `test/` whose verdicts the policy tests control, plus small builders of spans and policy files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from running_collector import FIXTURES

from evalsi.evaluators import REGISTRY, NoParams, Params, Target, evaluator
from evalsi.model.score import Score
from evalsi.model.span import Span
from evalsi.processors.normalize.files import normalize_files


class KeywordParams(Params):
    keyword: str


class AttributeParams(Params):
    key: str = "test.value"


def _register() -> None:
    if "test/keyword" in REGISTRY:
        return

    @evaluator("test/keyword", requires=("output",), params=KeywordParams, version="3")
    def keyword(target: Target, params: KeywordParams) -> Score:
        """Passes when the output contains the keyword."""
        assert target.output_text is not None
        return Score("keyword", passed=params.keyword in target.output_text)

    @evaluator("test/attribute", params=AttributeParams)
    def attribute(target: Target, params: AttributeParams) -> Score:
        """The root span's attribute as the value; `test.passed` as the verdict."""
        a = target.span.attributes if target.span is not None else {}
        if params.key not in a and "test.passed" not in a:
            return Score.skipped("attribute", "no attribute")
        return Score("attribute", value=a.get(params.key), passed=a.get("test.passed"))

    @evaluator("test/echo", params=NoParams)
    def echo(target: Target, params: NoParams) -> Score:
        """Always passes: shows that a stage ran."""
        return Score("echo", passed=True)

    @evaluator("test/span-tokens", scope="span", params=NoParams)
    def span_tokens(target: Target, params: NoParams) -> Score:
        """The span's output tokens."""
        assert target.span is not None
        return Score("span-tokens", value=target.span.output_tokens)

    @evaluator("test/session-traces", scope="session", params=NoParams)
    def session_traces(target: Target, params: NoParams) -> Score:
        """How many traces the session holds."""
        return Score("session-traces", value=len({s.trace_id for s in target.spans}))

    @evaluator("test/boom", params=NoParams)
    def boom(target: Target, params: NoParams) -> Score:
        """Raises: an error outcome."""
        raise RuntimeError("kaput")


_register()


def fixture_spans(folder: str, scenario: str) -> list[Span]:
    d = FIXTURES / folder
    paths = [p for p in (d / f"{scenario}.pb", d / f"{scenario}.logs.pb") if p.exists()]
    out = normalize_files(paths)
    assert out.spans and not out.problems, out.problems
    return out.spans


def span(
    trace_id: str,
    span_id: str = "a1",
    *,
    parent: str = "",
    duration_ms: float = 10,
    start: int = 1_700_000_000_000_000_000,
    step_type: str = "llm",
    status: str = "UNSET",
    attributes: dict[str, Any] | None = None,
    session_id: str | None = None,
    output_tokens: int | None = None,
    service_name: str = "svc",
) -> Span:
    return Span(
        trace_id, span_id, parent, "chat", "CLIENT", start, start + int(duration_ms * 1e6), status_code=status,
        service_name=service_name, attributes=attributes or {}, step_type=step_type, session_id=session_id,
        output_tokens=output_tokens,
    )  # fmt: skip


def policy_doc(name: str = "p", **spec: Any) -> dict[str, Any]:
    spec.setdefault("cascade", [{"ref": "test/echo"}])
    return {"apiVersion": "evals.si/v1alpha1", "kind": "OnlineEvalPolicy", "metadata": {"name": name}, "spec": spec}


def write(path: Path, *docs: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path
