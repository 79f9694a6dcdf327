"""Evaluators: the interface, the registry of refs, and the built-in packs."""

from evalsi.evaluators.base import REGISTRY, Evaluator, Target, evaluator, parse_params, register, run
from evalsi.evaluators.builtin import load_evaluators
from evalsi.evaluators.params import NoParams, Params

__all__ = [
    "REGISTRY", "Evaluator", "NoParams", "Params", "Target", "evaluator", "load_evaluators", "parse_params",
    "register", "run",
]  # fmt: skip
