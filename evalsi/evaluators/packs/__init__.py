"""The built-in evaluator packs; importing this package registers every `builtin/*` evaluator."""

from evalsi.evaluators.packs import (
    agent,  # noqa: F401
    core,  # noqa: F401
    judge,  # noqa: F401
    rag,  # noqa: F401
    safety,  # noqa: F401
)
