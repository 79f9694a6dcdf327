"""The rag pack: `builtin/context-relevance` (are the retrieved documents relevant to the question) and
`builtin/faithfulness` (is the answer supported by them), both judged by the shared LLM judge.

The documents are the trace's retrieval steps' (`Target.context`), or a Score API record's `context`. A trace
without retrieved documents is `skipped: no retrieved documents`; one that captured no content, `skipped: no
content`. Judge outages are `error: judge unavailable`, never a zero.
"""

from __future__ import annotations

from pydantic import Field

from evalsi.evaluators.base import Target, evaluator
from evalsi.evaluators.judge_client import VERDICT_FORMAT, JudgeConfig, PromptTemplate
from evalsi.model.score import Score

# --- the prompts ---------------------------------------------------------------------------------------------

CONTEXT_RELEVANCE = PromptTemplate(
    version="1",
    system=(
        "You are an impartial evaluator of a retrieval system. You judge whether the documents retrieved for a "
        "user's question are relevant to answering it. " + VERDICT_FORMAT
    ),
    user=(
        "# Question\n{question}\n\n# Retrieved documents\n{documents}\n\n"
        "Judge each document: is it relevant to answering the question (it states facts the answer needs, or "
        "directly bears on the question)? Score the share of the documents that are relevant: 1 when every "
        "document is, 0 when none is. In the explanation, name the irrelevant documents by number. "
        "Reply with the JSON object only."
    ),
)
"""Bump the version when the prompt changes; every score's metadata carries the version and the template hash."""

FAITHFULNESS = PromptTemplate(
    version="1",
    system=(
        "You are an impartial evaluator. You judge whether an AI assistant's answer is supported by the documents "
        "that were retrieved for it. " + VERDICT_FORMAT
    ),
    user=(
        "# Question\n{question}\n\n# Retrieved documents\n{documents}\n\n# Answer to judge\n{answer}\n\n"
        "Check every claim the answer makes against the retrieved documents only, not against what you know. "
        "Score the share of the claims that the documents support: 1 when every claim is supported, 0 when none "
        "is; a claim the documents contradict or do not state is unsupported. In the explanation, quote the "
        "unsupported claims. Reply with the JSON object only."
    ),
)
"""Bump the version when the prompt changes; every score's metadata carries the version and the template hash."""


def format_documents(context: list[str], max_documents: int, max_document_chars: int) -> tuple[str, int]:
    """(the documents as numbered sections, how many were sent): each text once, the first `max_documents`, each
    cut at `max_document_chars`."""
    texts = list(dict.fromkeys(context))[:max_documents]
    sections = []
    for i, text in enumerate(texts, 1):
        cut = text if len(text) <= max_document_chars else text[:max_document_chars] + " […]"
        sections.append(f"[{i}]\n{cut}")
    return "\n\n".join(sections), len(texts)


# --- params --------------------------------------------------------------------------------------------------


class RagJudgeParams(JudgeConfig):
    max_documents: int = Field(20, gt=0)
    """Send at most this many documents (in retrieval order) to the judge."""
    max_document_chars: int = Field(4000, gt=0)
    """Cut each document at this many characters."""


class ContextRelevanceParams(RagJudgeParams):
    name: str = Field("context-relevance", min_length=1)


class FaithfulnessParams(RagJudgeParams):
    name: str = Field("faithfulness", min_length=1)


# --- the evaluators ------------------------------------------------------------------------------------------


def _judge(params: RagJudgeParams, template: PromptTemplate, target: Target, **fields: str) -> Score:
    if target.judges is None:
        return Score.skipped(params.name, "no judge runtime")
    documents, sent = format_documents(target.context, params.max_documents, params.max_document_chars)
    score = target.judges.judge(params, template, template.messages(documents=documents, **fields))
    score.metadata["documents"] = sent
    return score


@evaluator(
    "builtin/context-relevance",
    scope="trace",
    requires=("context", "input", "judge"),
    params=ContextRelevanceParams,
    version="1",
)
def context_relevance(target: Target, params: ContextRelevanceParams) -> Score:
    """Judge: are the retrieved documents relevant to the user's question; 0..1, the share that are."""
    return _judge(params, CONTEXT_RELEVANCE, target, question=target.input_text or "")


@evaluator(
    "builtin/faithfulness",
    scope="trace",
    requires=("context", "output", "judge"),
    params=FaithfulnessParams,
    version="1",
)
def faithfulness(target: Target, params: FaithfulnessParams) -> Score:
    """Judge: is the answer supported by the retrieved documents; 0..1, the share of its claims they support."""
    return _judge(
        params, FAITHFULNESS, target, question=target.input_text or "(not recorded)", answer=target.output_text or ""
    )
