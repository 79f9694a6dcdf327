"""The evaluators there are: the built-in packs and every `evalsi.evaluators` entry point, registered from here.

This module sits above the interface (`base`) and the packs that build on it, so the interface never imports its
own packs: whoever needs the full registry calls `load_evaluators()` (as `collector.builtin` loads components).
"""

from __future__ import annotations

import importlib.metadata
import logging

from evalsi.evaluators.base import REGISTRY, Evaluator, register

log = logging.getLogger("evalsi.evaluators")

_entry_points_loaded = False


def load_evaluators() -> dict[str, Evaluator]:
    """The built-in packs and every `evalsi.evaluators` entry point, loaded once."""
    global _entry_points_loaded
    import evalsi.evaluators.packs  # noqa: F401  (registers the built-in packs; not at import: keeps startup light)

    if not _entry_points_loaded:
        _entry_points_loaded = True
        for ep in importlib.metadata.entry_points(group="evalsi.evaluators"):
            try:
                loaded = ep.load()
            except Exception as e:  # a broken plugin must not stop the collector
                log.error("cannot load evaluator entry point %s: %s", ep.name, e)
                continue
            if isinstance(loaded, Evaluator) and loaded.name not in REGISTRY:
                register(loaded)
    return REGISTRY
