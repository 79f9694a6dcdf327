"""Evaluators: the interface, the registry of refs, and the built-in packs."""

from evalsi.evaluators.base import (
    REGISTRY,
    Evaluator,
    NoParams,
    Params,
    Target,
    evaluator,
    load_evaluators,
    parse_params,
    register,
    run,
)

__all__ = [
    "REGISTRY", "Evaluator", "NoParams", "Params", "Target", "evaluator", "load_evaluators", "parse_params",
    "register", "run",
]  # fmt: skip
