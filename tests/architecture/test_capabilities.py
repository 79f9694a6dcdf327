"""Optional component capabilities are declared, not probed: the collector finds them with `isinstance` against the
Protocols of `evalsi/capabilities.py`, and every built-in component that offers part of one offers all of it, with
the Protocol's signatures (an `isinstance` check on a runtime-checkable Protocol looks at names only)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest

from evalsi import capabilities
from evalsi.collector.builtin import load_builtin_components
from evalsi.collector.fanout import FanOut, LogFanOut, ScoreFanOut
from evalsi.collector.workers.link import StoreLink
from evalsi.collector.workers.pool import WorkerPool
from evalsi.component import REGISTRY
from evalsi.processors.tail_sampling.config import TailSamplingConfig

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = ROOT / "evalsi" / "collector"

ALLOWED: dict[tuple[str, str, str], str] = {
    # (file under evalsi/collector, the object probed, the name probed): why it is not a component capability
    ("service.py", "self.store", "'backend'"): "the store's backend (store port), not a component",
    (
        "service.py",
        "getattr(self.store, 'backend', None)",
        "'announce'",
    ): "an embedded store's lock file, not a component",
    ("query.py", "self.store", "'list_alerts'"): "a store port query, not a component",
    ("query.py", "store", "'search_traces'"): "a store port query, not a component",
    ("query.py", "found[1]", "'endpoint'"): "a component's config",
    ("api.py", "need_store()", "'list_alerts'"): "a store port query, not a component",
    ("api.py", "route", "'path'"): "a Starlette route",
    ("config.py", "config", "'listeners'"): "a component's config",
    ("config.py", "pipe", "section"): "a pipeline's config section by name",
    ("config.py", "config", "'policies'"): "a component's config",
    ("config.py", "config", "'presidio'"): "a component's config",
    ("config.py", "config", "'windows'"): "a component's config",
    ("config.py", "config", "'promote_to'"): "a component's config",
    ("fanout.py", "batch", "'spans'"): "a batch's items",
    ("fanout.py", "batch", "'records'"): "a batch's items",
    ("workers/pool.py", "self.ledger", "op"): "a worker's ledger call, by operation name",
}


def attribute_probes() -> set[tuple[str, str, str]]:
    """Each `hasattr(x, name)` / `getattr(x, name, ...)` in evalsi/collector, as (file, x, name)."""
    found = set()
    for path in sorted(COLLECTOR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr")
            ):
                obj, name = (ast.unparse(a) for a in node.args[:2])
                found.add((path.relative_to(COLLECTOR).as_posix(), obj, name))
    return found


def test_the_collector_probes_no_component_by_name() -> None:
    unexpected = sorted(attribute_probes() - ALLOWED.keys())
    assert not unexpected, (
        "hasattr/getattr in evalsi/collector: a component's optional capability is a Protocol in "
        f"evalsi/capabilities.py, checked with isinstance (else add it to ALLOWED with why): {unexpected}"
    )


def test_the_allow_list_names_only_probes_that_exist() -> None:
    assert sorted(ALLOWED.keys() - attribute_probes()) == []


def test_the_scan_finds_a_probe() -> None:
    tree = ast.parse("if hasattr(proc, 'admit'):\n    pass\n")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert [(c.func.id, ast.unparse(c.args[1])) for c in calls] == [("hasattr", "'admit'")]  # type: ignore[attr-defined]


PROTOCOLS = [
    p
    for _, p in inspect.getmembers(capabilities, inspect.isclass)
    if p.__module__ == capabilities.__name__ and getattr(p, "_is_protocol", False)
]


def members(protocol: type) -> set[str]:
    """The names a Protocol declares: its methods, properties and annotated attributes."""
    names = set(vars(protocol).get("__annotations__", {}))
    names |= {
        n for n, v in vars(protocol).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))
    }
    return names


def instance_attributes(cls: type) -> set[str]:
    """The names `self.<name> = ...` assigns in the class or its bases (attributes set in `__init__`)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__ in ("typing", "builtins"):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        for node in ast.walk(ast.parse(source)):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def offers(cls: type, name: str) -> bool:
    return hasattr(cls, name) or name in instance_attributes(cls)


def shape(function: Any) -> tuple[bool, list[tuple[str, Any, bool]]]:
    """Whether it is a coroutine function, and its parameters after `self`: name, kind, whether it has a default."""
    params = list(inspect.signature(function).parameters.values())[1:]
    return inspect.iscoroutinefunction(function), [(p.name, p.kind, p.default is not p.empty) for p in params]


COLLECTOR_SIDE: dict[type, set[type]] = {
    # the service's own parts that it asks as it asks components (the pool's other methods relay to the workers)
    FanOut: {capabilities.Holder, capabilities.MutatesData},
    LogFanOut: {capabilities.Holder},
    ScoreFanOut: {capabilities.Holder},
    StoreLink: {capabilities.Holder, capabilities.MutatesData},
    WorkerPool: {capabilities.Holder, capabilities.LossCounter},
}


def components() -> list[type]:
    load_builtin_components()
    return sorted({f.cls for f in REGISTRY.values() if isinstance(f.cls, type)}, key=lambda c: c.__qualname__)


def claims() -> list[tuple[type, type]]:
    """Each (built-in component, capability) where the component offers at least one of the capability's members,
    and each capability the service asks its own parts for."""
    found = [(cls, p) for cls in components() for p in PROTOCOLS if any(offers(cls, n) for n in members(p))]
    return found + [(cls, p) for cls, ps in COLLECTOR_SIDE.items() for p in sorted(ps, key=lambda p: p.__name__)]


def test_the_capabilities_are_runtime_checkable_protocols_with_docstrings() -> None:
    assert len(PROTOCOLS) >= 13
    for p in PROTOCOLS:
        assert getattr(p, "_is_runtime_protocol", False), p
        assert p.__doc__ and "\n" in p.__doc__.strip(), f"{p.__name__}: say who calls it, when and why"


@pytest.mark.parametrize(("cls", "protocol"), claims(), ids=lambda x: x.__name__)
def test_a_component_offering_part_of_a_capability_offers_all_of_it(cls: type, protocol: type) -> None:
    missing = sorted(n for n in members(protocol) if not offers(cls, n))
    assert not missing, f"{cls.__qualname__} offers part of {protocol.__name__} but not {missing}"
    for name in members(protocol):
        declared = vars(protocol)[name] if name in vars(protocol) else None
        if callable(declared) and not isinstance(declared, property):
            assert shape(getattr(cls, name)) == shape(declared), f"{cls.__qualname__}.{name} vs {protocol.__name__}"


def test_the_known_implementers_offer_their_capabilities() -> None:
    """So a rename on either side cannot make a capability silently unused."""
    offered = {(cls.__name__, p.__name__) for cls, p in claims()}
    expected = {
        ("OtlpReceiver", "EndpointServer"), ("OtlpReceiver", "Replayer"),
        ("TailSampling", "SessionAssembler"), ("TailSampling", "Holder"),
        ("Evaluate", "SessionEvaluator"), ("Evaluate", "EvaluationHub"), ("Evaluate", "PolicyReloader"),
        ("Evaluate", "JudgeUser"), ("Evaluate", "FeedbackTaker"), ("Evaluate", "DuplicateCallJoiner"),
        ("MemoryLimiter", "Admitter"), ("MemoryLimiter", "BodyAdmitter"), ("MemoryLimiter", "WorkerWatcher"),
        ("MemoryLimiter", "GarbageCollector"),
        ("Normalize", "Holder"), ("PhoenixReceiver", "Settler"), ("LangfuseReceiver", "Settler"),
        ("ClickHouseExporter", "Holder"), ("ClickHouseExporter", "ReadinessReporter"),
        ("ClickHouseExporter", "LossCounter"),
        ("WorkerPool", "Holder"), ("WorkerPool", "LossCounter"), ("StoreLink", "Holder"),
        ("ClickHouseExporter", "MutatesData"), ("OtlpExporter", "MutatesData"), ("LangfuseExporter", "MutatesData"),
        ("MlflowExporter", "MutatesData"), ("StoreLink", "MutatesData"), ("FanOut", "MutatesData"),
    }  # fmt: skip
    assert expected <= offered, sorted(expected - offered)
    assert isinstance(TailSamplingConfig(), capabilities.SessionSettings)


def test_architecture_md_lists_every_capability() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert [p.__name__ for p in PROTOCOLS if f"`{p.__name__}`" not in text] == []
