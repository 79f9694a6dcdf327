"""`evalsi normalize`: the canonical view of OTLP files, read without a collector."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from evalsi.cli.config import JsonOpt
from evalsi.cli.render import err, fail, label, out

if TYPE_CHECKING:
    from rich.tree import Tree


def normalize_command(
    files: Annotated[list[Path], typer.Argument(help="OTLP files: traces and logs, protobuf (.pb) or JSON.")],
    as_json: JsonOpt = False,
) -> None:
    """Show the canonical view of OTLP files, without a collector: how evalsi reads your instrumentation."""
    from rich.tree import Tree

    from evalsi.model.trajectory import build_trajectories
    from evalsi.processors.normalize.files import normalize_files

    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise fail(
            f"no such file: {', '.join(missing)}; give the paths of OTLP files to read (traces and logs, protobuf "
            ".pb or JSON)",
            code=2,
        )
    result = normalize_files(files)
    for problem in result.problems:
        err.print(f"[yellow]warning:[/] {escape(problem)}", highlight=False, soft_wrap=True)
    if not result.spans and result.problems:
        raise typer.Exit(1)
    trajectories = build_trajectories(result.spans)
    if as_json:
        doc = {"spans": [s.canonical() for s in result.spans], "trajectories": trajectories}
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n")
        return
    for trajectory in trajectories:
        tree = Tree(f"trace [bold]{trajectory['trace_id']}[/]")
        spans = [s.canonical() for s in result.spans if s.trace_id == trajectory["trace_id"]]
        ids = {s["span_id"] for s in spans}
        children: dict[str, list[dict[str, Any]]] = {}
        for s in spans:
            children.setdefault(s["parent_span_id"] if s["parent_span_id"] in ids else "", []).append(s)

        def add(node: Tree, parent: str, children: dict[str, list[dict[str, Any]]] = children) -> None:
            for s in children.get(parent, []):
                text = label(s) + (f"  [dim]{s['convention'] or 'unmapped'}[/]")
                add(node.add(text), s["span_id"])

        add(tree, "")
        out.print(tree)
        calls = ", ".join(c["name"] or "?" for c in trajectory["tool_calls"]) or "none"
        out.print(f"  steps {len(trajectory['steps'])}  llm calls {trajectory['llm_calls']}  tool calls: {calls}")
        if trajectory["final_output"]:
            out.print(f"  final output: {trajectory['final_output'][:200]}", highlight=False)
