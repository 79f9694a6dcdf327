"""The built-in component types, listed once: importing their modules runs their registry lines."""

from __future__ import annotations

import importlib

BUILTIN_MODULES = (
    "evalsi.receivers.otlp",
    "evalsi.receivers.pull.mlflow",
    "evalsi.receivers.pull.langfuse",
    "evalsi.receivers.pull.phoenix",
    "evalsi.processors.memory_limiter",
    "evalsi.processors.normalize",
    "evalsi.processors.redact",
    "evalsi.processors.probabilistic_sampler",
    "evalsi.processors.tail_sampling",
    "evalsi.processors.evaluate",
    "evalsi.exporters.clickhouse",
    "evalsi.exporters.otlp",
    "evalsi.exporters.prometheus",
    "evalsi.exporters.langfuse",
    "evalsi.exporters.mlflow",
    "evalsi.exporters.phoenix",
)


def load_builtin_components() -> None:
    """Register every built-in receiver, processor and exporter (a module registers once, however often called)."""
    for name in BUILTIN_MODULES:
        importlib.import_module(name)
