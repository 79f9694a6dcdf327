"""Targets: what `evalsi run` drives over a dataset (a Python callable, a command, the built-in OpenAI-compatible
agent, an agent behind the harness HTTP contract). Each is an `AgentTarget`; `build_target` makes one from a spec."""

from __future__ import annotations

from evalsi.run_harness.collector import CollectorLink
from evalsi.run_harness.spec import RunSpec
from evalsi.run_harness.targets.base import AgentTarget


def build_target(spec: RunSpec, link: CollectorLink) -> AgentTarget:
    """The target the run file names (exactly one kind, checked when the file was loaded)."""
    t = spec.body.target
    if t.python is not None:
        from evalsi.run_harness.targets.python import PythonAgent

        return PythonAgent(t.python, spec.base_dir)
    if t.command is not None:
        from evalsi.run_harness.targets.command import CommandAgent

        return CommandAgent(t.command, spec.base_dir, link.otlp_url)
    if t.openai is not None:
        from evalsi.run_harness.targets.openai import OpenAIAgent

        return OpenAIAgent(t.openai, path=[spec.base_dir])
    assert t.http is not None
    from evalsi.run_harness.targets.http import HttpAgent

    return HttpAgent(t.http)
