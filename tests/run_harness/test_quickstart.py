"""The README's quickstart works as written: both example runs, from the example's folder, with no key and no
network, pass their gates; and every EvalRun file in docs/ and examples/ is a valid run file."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from running_collector import EVALSI

from evalsi.run_harness.spec import parse_run

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"


@pytest.mark.parametrize("run_file", ["run.yaml", "openai.yaml"])
def test_the_quickstart_runs_pass_their_gates(tmp_path: Path, run_file: str) -> None:
    work = tmp_path / "quickstart"
    shutil.copytree(QUICKSTART, work, ignore=shutil.ignore_patterns(".evalsi", "__pycache__"))
    res = subprocess.run([*EVALSI, "run", "-f", run_file, "--json"], capture_output=True, text=True, cwd=work,
                         timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    run = json.loads(res.stdout)
    assert all(g["passed"] for g in run["gates"]) and run["infra_errors"] == []
    assert run["metrics"]["exact-match"]["mean"] == pytest.approx(5 / 6)  # "Who wrote Hamlet?" is beyond it
    assert run["metrics"]["tool-selection"]["mean"] == 1.0


def test_the_quickstart_run_resumed_or_rescored_keeps_its_verdict(tmp_path: Path) -> None:
    """`--resume` of the finished run, and `rescore -f run.yaml`, read the same attempts: the `duration_ms` gate holds
    again (the run-added metrics are rebuilt from the stored traces)."""
    work = tmp_path / "quickstart"
    shutil.copytree(QUICKSTART, work, ignore=shutil.ignore_patterns(".evalsi", "__pycache__"))

    def evalsi(*args: str) -> dict:
        res = subprocess.run([*EVALSI, *args, "--json"], capture_output=True, text=True, cwd=work, timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr
        return json.loads(res.stdout)

    first = evalsi("run", "-f", "run.yaml")
    resumed = evalsi("run", "-f", "run.yaml", "--resume", first["run_id"])
    assert resumed["attempts"] == 0 and resumed["metrics"]["duration_ms"] == first["metrics"]["duration_ms"]
    rescored = evalsi("rescore", "--run", first["run_id"], "-f", "run.yaml")
    assert rescored["metrics"]["duration_ms"] == first["metrics"]["duration_ms"]
    assert [g["passed"] for g in rescored["gates"]] == [True, True]


def _run_documents() -> list[tuple[str, dict]]:
    found = []
    for path in [*ROOT.glob("docs/**/*.md"), ROOT / "README.md"]:
        for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S):
            doc = yaml.safe_load(block)
            if isinstance(doc, dict) and doc.get("kind") == "EvalRun":
                found.append((f"{path.relative_to(ROOT)}", doc))
    return found


def test_every_documented_run_file_is_valid() -> None:
    documented = _run_documents()
    assert len(documented) >= 2, "docs/harness.md shows run files"
    for where, doc in documented:
        parse_run(doc, where, QUICKSTART)  # raises RunSpecError naming the problem
