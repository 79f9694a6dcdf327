"""The layer contract: imports go down the layers only, and no module imports itself through others.

Layers, bottom up: the data model (`evalsi.model`: spans, scores, trajectories, ...), the runtime (`evalsi.runtime`:
retries, supervised tasks, serving, self-metrics, ports), the rest of the core (the component model, the store port,
auth, CEL, ...), the evaluators, the policies, the components (receivers, processors, exporters), the collector and
the harness, the CLI. A function-level import counts like any other: it must not dodge a cycle. Imports under
`if TYPE_CHECKING:` are left out of the layers (they never run) but not out of the cycles: a circle through types
still ties two modules so that neither can be read or moved without the other. A package's `__init__` importing
its own submodules is an import like any other too: a submodule that imports its package (or, through others,
itself) closes a circle.
"""

from __future__ import annotations

import copy

import grimp
import pytest

LAYERS: tuple[tuple[str, ...], ...] = (
    ("model",),
    ("runtime",),
    (),  # the rest of the core: every top-level module and package not named here
    ("evaluators",),
    ("policies",),
    ("receivers", "processors", "exporters"),
    ("collector", "run_harness"),
    ("cli", "__main__"),
)
COMPONENT_PACKAGES = ("evalsi.receivers", "evalsi.processors", "evalsi.exporters")
REGISTRY_OF_BUILTINS = "evalsi.collector.builtin"


CORE = LAYERS.index(())


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return next((i for i, names in enumerate(LAYERS) if top in names), CORE)


def upward_imports(graph: grimp.ImportGraph) -> list[str]:
    """Each import from a lower layer into a higher one, as `importer -> imported (line N)`."""
    found = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if layer_of(imported) > layer_of(importer):
                lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
                found.append(f"{importer} -> {imported} (line {', '.join(map(str, lines))})")
    return found


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected sets of modules (Tarjan): each set of two or more imports itself through the others.

    Every edge of the graph counts, function-level imports and a package's imports of its own submodules alike."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def edges(m: str) -> list[str]:
        return sorted(graph.find_modules_directly_imported_by(m))

    def visit(root: str) -> None:
        # iterative Tarjan: the import graph is deep enough to hit the recursion limit
        work = [(root, iter(edges(root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges(child))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    group.append(m)
                    if m == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return cycles


def component_imports_in_collector(graph: grimp.ImportGraph) -> list[str]:
    """The collector names no component: only the list of built-ins imports their modules (to register them)."""
    found = []
    collector = layer_of(REGISTRY_OF_BUILTINS)
    for importer in sorted(m for m in graph.modules if layer_of(m) == collector and m != REGISTRY_OF_BUILTINS):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            if imported.startswith(tuple(p + "." for p in COMPONENT_PACKAGES)):
                found.append(f"{importer} -> {imported}")
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("evalsi", exclude_type_checking_imports=True, cache_dir=None)


@pytest.fixture(scope="module")
def graph_with_types() -> grimp.ImportGraph:
    """Every import, those under `if TYPE_CHECKING:` included."""
    return grimp.build_graph("evalsi", exclude_type_checking_imports=False, cache_dir=None)


def test_imports_go_down_the_layers_only(graph: grimp.ImportGraph) -> None:
    assert upward_imports(graph) == []


def test_no_module_imports_itself_through_others(graph_with_types: grimp.ImportGraph) -> None:
    assert import_cycles(graph_with_types) == []


def test_the_collector_names_no_component(graph: grimp.ImportGraph) -> None:
    assert component_imports_in_collector(graph) == []


def test_the_contract_fails_on_an_upward_import_and_on_a_cycle(graph: grimp.ImportGraph) -> None:
    """The checks above can fail: add an upward import and a cycle to a copy of the real graph."""
    g = copy.deepcopy(graph)
    g.add_import(importer="evalsi.model.span", imported="evalsi.processors.normalize", line_number=7, line_contents="x")
    assert "evalsi.model.span -> evalsi.processors.normalize (line 7)" in upward_imports(g)
    g.add_import(importer="evalsi.model.score", imported="evalsi.model.trajectory", line_number=3, line_contents="x")
    g.add_import(importer="evalsi.model.trajectory", imported="evalsi.model.score", line_number=3, line_contents="x")
    assert any({"evalsi.model.score", "evalsi.model.trajectory"} <= set(c) for c in import_cycles(g))
    g.add_import(importer="evalsi.collector.service", imported="evalsi.exporters.clickhouse")
    assert "evalsi.collector.service -> evalsi.exporters.clickhouse" in component_imports_in_collector(g)


def test_the_core_is_layered_too(graph: grimp.ImportGraph) -> None:
    """The data model sits below the runtime, and both below the rest of the core: an import of the runtime from the
    model, or of the component model from the runtime, is upward."""
    g = copy.deepcopy(graph)
    g.add_import(importer="evalsi.model.span", imported="evalsi.runtime.telemetry", line_number=5, line_contents="x")
    g.add_import(importer="evalsi.runtime.held", imported="evalsi.component", line_number=6, line_contents="x")
    found = upward_imports(g)
    assert "evalsi.model.span -> evalsi.runtime.telemetry (line 5)" in found
    assert "evalsi.runtime.held -> evalsi.component (line 6)" in found


def test_a_cycle_through_a_package_init_or_a_function_level_import_is_found() -> None:
    """A small synthetic package: its `__init__` imports a submodule that imports, in a function, a module that
    imports the package. Every edge is needed for the circle, and the check names all three modules."""
    g = grimp.ImportGraph()
    for m in ("pkg", "pkg.base", "pkg.packs", "pkg.other"):
        g.add_module(m)
    g.add_import(importer="pkg", imported="pkg.base")  # the package's own submodule
    g.add_import(importer="pkg.base", imported="pkg.packs")  # say, inside a function
    g.add_import(importer="pkg.other", imported="pkg.base")
    assert import_cycles(g) == []
    g.add_import(importer="pkg.packs", imported="pkg")
    assert import_cycles(g) == [["pkg", "pkg.base", "pkg.packs"]]


def test_the_real_circles_that_were_broken_would_be_found(graph_with_types: grimp.ImportGraph) -> None:
    """Put back, on a copy of the real graph, the imports that once closed circles: the interface loading its own
    packs (a function-level import into a package whose `__init__` imports the packs), the judge client taking
    `Params` from the interface, the cassette taking `AttemptFailed` from the target interface."""
    g = copy.deepcopy(graph_with_types)
    g.add_import(importer="evalsi.evaluators.base", imported="evalsi.evaluators.packs")
    g.add_import(importer="evalsi.evaluators.judge_client", imported="evalsi.evaluators.base")
    g.add_import(importer="evalsi.run_harness.cassette", imported="evalsi.run_harness.targets.base")
    found = [set(c) for c in import_cycles(g)]
    packs = {"evalsi.evaluators.base", "evalsi.evaluators.packs", "evalsi.evaluators.packs.core"}
    assert any(packs <= c for c in found)
    assert any({"evalsi.evaluators.base", "evalsi.evaluators.judge_client"} <= c for c in found)
    assert {"evalsi.run_harness.cassette", "evalsi.run_harness.targets.base"} in found
