"""The base of every evaluator's params, below both the evaluator interface (`base`) and the judge client, which
each build on it (the judge's own config is params too)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Params(BaseModel):
    """Base of every evaluator's params: unknown keys are errors (a typo must not silently change a verdict)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Params):
    pass
