"""examples/environments works as docs/harness.md says: every run file passes its gates from the example's folder with
no key and no network, a recorded run replays to the same scores, and the ATIF example imports."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from running_collector import EVALSI

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "environments"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    dest = tmp_path / "environments"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns(".evalsi", "__pycache__", "cassettes"))
    return dest


def evalsi(work: Path, *args: str) -> dict[str, Any]:
    res = subprocess.run([*EVALSI, *args, "--json"], capture_output=True, text=True, cwd=work, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("run_file", ["tasks.yaml", "conversation.yaml", "faults.yaml", "mcp.yaml", "tau.yaml"])
def test_each_example_run_passes_its_gates(work: Path, run_file: str) -> None:
    run = evalsi(work, "run", "-f", run_file)
    assert run["infra_errors"] == [] and run["gates"] and all(g["passed"] for g in run["gates"])
    if run_file == "faults.yaml":
        assert run["faults"]["error"] > 0 and run["faults"]["latency"] == 18  # the first call of each attempt
        assert 0 < run["metrics"]["tool-call-error-rate"]["mean"] < 1


def test_the_recorded_example_replays_to_the_same_scores(work: Path) -> None:
    recorded = evalsi(work, "run", "-f", "faults.yaml", "--record", "cassettes")
    replayed = evalsi(work, "run", "-f", "faults.yaml", "--replay", "cassettes")
    for name in ("tool-call-error-rate", "tool-error-recovery"):
        assert replayed["metrics"][name]["mean"] == recorded["metrics"][name]["mean"]
        assert replayed["metrics"][name]["n"] == recorded["metrics"][name]["n"]
    assert replayed["faults"] == recorded["faults"]


def test_the_atif_example_imports(work: Path) -> None:
    run = evalsi(work, "import", "atif", "trajectory.json", "--dataset", "atif_references.jsonl",
                 "-e", "builtin/exact-match", "-e", "builtin/tool-call-error-rate")  # fmt: skip
    assert run["metrics"]["exact-match"]["mean"] == 1.0 and run["attempts"] == 1


def test_the_documented_tool_and_fault_fragments_are_valid() -> None:
    """The `mcp:` and `faults:` fragments of docs/harness.md parse as the run spec parses them."""
    import re

    import yaml

    from evalsi.run_harness.spec import FaultSpec, McpServerSpec

    text = (ROOT / "docs" / "harness.md").read_text()
    fragments = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    mcp = [f["mcp"] for f in fragments if isinstance(f, dict) and set(f) == {"mcp"}]
    faults = [f["faults"] for f in fragments if isinstance(f, dict) and set(f) == {"faults"}]
    assert mcp and faults
    for server in mcp[0]:
        McpServerSpec.model_validate(server)
    for fault in faults[0]:
        FaultSpec.model_validate(fault)
