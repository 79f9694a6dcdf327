"""A `command` agent at its timeout, through the real `evalsi run`: its whole process group ends (children and
grandchildren), SIGTERM first and SIGKILL after the stop grace, and the infrastructure error says which."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import yaml
from running_collector import Collector

from .test_run_e2e import evalsi, run_file, run_json

# The agent writes its own pid, starts a grandchild that holds its stdout open, writes the grandchild's pid, and
# never answers. `stubborn` ignores SIGTERM (and so does its grandchild: an ignored signal stays ignored across exec).
AGENT = """
import os, signal, subprocess, sys, time
task = os.environ["EVALSI_TASK_ID"]
if task == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen(["sleep", "60"])
with open(f"{task}.pids.tmp", "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}")
os.rename(f"{task}.pids.tmp", f"{task}.pids")
time.sleep(60)
"""


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its parent to reap it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_command_agent_that_times_out_leaves_no_process_behind(tmp_path: Path, collector: Collector) -> None:
    (tmp_path / "spawner.py").write_text(AGENT)
    data = [{"id": "polite", "input": "x"}, {"id": "stubborn", "input": "x"}]
    path = run_file(tmp_path, data=data, trials=1, timeout="2s", gates=[])
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["target"] = {"command": {"argv": [sys.executable, "spawner.py"]}}
    doc["spec"]["evaluators"] = [{"ref": "builtin/length"}]
    path.write_text(yaml.safe_dump(doc))
    started = time.monotonic()
    run = run_json(evalsi("run", "-f", str(path), "--collector", collector.api, "--json", cwd=tmp_path))
    took = time.monotonic() - started
    pids = {t: [int(p) for p in (tmp_path / f"{t}.pids").read_text().split()] for t in ("polite", "stubborn")}
    try:
        left = {t: [p for p in ps if alive(p)] for t, ps in pids.items()}
        assert left == {"polite": [], "stubborn": []}, f"still running after `evalsi run` exited: {left}"
    finally:  # never leave them to the next test
        for p in [p for ps in pids.values() for p in ps if alive(p)]:
            os.kill(p, 9)
    errors = {e["task_id"]: e for e in run["infra_errors"]}
    assert {t: e["kind"] for t, e in errors.items()} == {"polite": "timeout", "stubborn": "timeout"}
    assert errors["polite"]["message"] == "timed out after 2s; its process group was terminated (SIGTERM)"
    assert errors["stubborn"]["message"] == (
        "timed out after 2s; its process group was killed (SIGKILL: still running 5s after SIGTERM)"
    )
    assert took < 60  # the run waited for the stop grace, not for the agent's sleep
    # the run's stored record keeps the same errors
    shown = run_json(evalsi("runs", "show", run["run_id"], "--json", "--collector", collector.api, cwd=tmp_path))
    assert {e["task_id"]: e["message"] for e in shown["infra_errors"]} == {t: e["message"] for t, e in errors.items()}
