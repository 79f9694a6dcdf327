"""The judge pack: `builtin/llm-judge`, a rubric judge over an OpenAI-compatible endpoint, with a versioned prompt,
a content-hash cache, a rate limit and call/token/USD budgets per policy stage and window.

No judge is configured by default: without an endpoint (params or `EVALSI_JUDGE_BASE_URL`) the evaluator is
`skipped: no judge configured`. Judges see only the canonical content, which redaction has already masked.
The call, cache, budgets and verdict parsing live in `evalsi.evaluators.judge_client`, shared with the rag pack; the
state is the service's `Judges`, on `target.judges` (without one: `skipped: no judge runtime`).
"""

from __future__ import annotations

from pydantic import Field

from evalsi.evaluators.base import Target, evaluator
from evalsi.evaluators.judge_client import VERDICT_FORMAT, JudgeConfig, PromptTemplate
from evalsi.model.score import Score

__all__ = ["RUBRICS", "TEMPLATE", "JudgeParams", "build_messages", "llm_judge"]

# --- the prompt ----------------------------------------------------------------------------------------------

RUBRICS = {
    "correctness": (
        "Is the answer correct? It must answer the user's question, and every claim in it must be true (and agree "
        "with the expected answer and the context when they are given). Score 1 for fully correct, 0 for wrong; "
        "partial credit for partly correct answers."
    ),
    "helpfulness": (
        "Is the answer helpful? It should address what the user asked, be complete and clear, and not refuse "
        "without reason. Score 1 for an answer that fully helps the user, 0 for one that does not help at all."
    ),
}

TEMPLATE = PromptTemplate(
    version="1",
    system="You are an impartial evaluator. You judge an AI assistant's answer against a rubric. " + VERDICT_FORMAT,
    user="# Rubric\n{rubric}\n\n{sections}\n\nJudge the answer by the rubric. Reply with the JSON object only.",
    extra=tuple(f"{k}={v}" for k, v in sorted(RUBRICS.items())),
)
"""Bump the version when the prompt changes: the template hash in every score's metadata says which prompt judged
it."""
TEMPLATE_VERSION = TEMPLATE.version
TEMPLATE_HASH = TEMPLATE.hash


def build_messages(rubric: str, target: Target) -> list[dict[str, str]]:
    """The chat messages sent to the judge: the rubric and the (redacted) input, context, expected and answer."""
    sections = []
    if target.input_text:
        sections.append(f"# User input\n{target.input_text}")
    if target.context:
        sections.append("# Context\n" + "\n---\n".join(target.context))
    expected = target.reference.get("expected_output")
    if expected is not None:
        sections.append(f"# Expected answer\n{expected}")
    sections.append(f"# Answer to judge\n{target.output_text or ''}")
    return TEMPLATE.messages(rubric=RUBRICS.get(rubric, rubric), sections="\n\n".join(sections))


# --- params --------------------------------------------------------------------------------------------------


class JudgeParams(JudgeConfig):
    rubric: str = Field("correctness", min_length=1)
    """`correctness`, `helpfulness`, or the rubric's own text."""


@evaluator("builtin/llm-judge", scope="trace", requires=("output", "judge"), params=JudgeParams, version="1")
def llm_judge(target: Target, params: JudgeParams) -> Score:
    """Rubric judge (correctness, helpfulness or custom) over an OpenAI-compatible endpoint; 0..1, higher is better."""
    if target.judges is None:
        return Score.skipped(params.name, "no judge runtime")
    return target.judges.judge(params, TEMPLATE, build_messages(params.rubric, target))
