"""`evalsi run` throughput: N tasks against a local Python-callable agent, a trivial `command` agent (a shell
script: `tr a-z A-Z`) and the bundled stub model (the built-in `openai` agent), through a real `evalsi serve`
(embedded store) in its own process, or (`command-alone`) through the collector the run starts in-process when it
is given no `--collector`.

For each agent it measures, in the same run:
- the baseline: the agent alone, called N times with the same concurrency, no tracing, no scoring;
- `evalsi run -f ... --json`: the run's wall time from its JSON (attempts, traces sent, every trace scored by the
  collector) and the command's wall time (process start and collector connection included);
and prints tasks/s and the harness overhead per task: (run wall - baseline wall) / N. For the command agents, which
write when each attempt's process started and ended, also the command's own overhead around the attempts: from
the command's start to the first attempt's start, and from the last attempt's end to the command's exit.
Goal (issue #9): overhead < 5 ms a task, 10,000 tasks in < 60 s on 2 cores.

    python benchmarks/harness.py [--tasks 10000] [--concurrency 16] [--agents python,openai]
    python benchmarks/harness.py --tasks 10 --agents command,command-alone    # the command's own overhead
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from running_collector import EVALSI, serve_config, start_collector  # noqa: E402

AGENT = """
def answer(question):
    return question.upper()
"""


COMMAND_AGENT = """\
start=$(date +%s%N)
tr a-z A-Z
echo "$start $(date +%s%N)" >> "$ATTEMPT_TIMES"
"""
"""The trivial command agent: the input upper-cased; each attempt's start and end (ns since the epoch) appended."""


def target_of(tmp: Path, agent: str, stub_url: str) -> dict[str, Any]:
    if agent == "python":
        return {"python": {"function": "agent:answer"}}
    if agent.startswith("command"):
        return {"command": {"argv": ["sh", "agent.sh"], "env": {"ATTEMPT_TIMES": str(tmp / "times.log")}}}
    return {"openai": {"base_url": stub_url, "model": "stub-1", "max_steps": 2}}


def attempt_span(tmp: Path) -> tuple[float, float]:
    """The first attempt's start and the last one's end (seconds since the epoch), from the command agent's log."""
    times = [[int(t) for t in line.split()] for line in (tmp / "times.log").read_text().splitlines()]
    return min(s for s, _ in times) / 1e9, max(e for _, e in times) / 1e9


def write_case(tmp: Path, agent: str, tasks: int, concurrency: int, stub_url: str) -> Path:
    (tmp / "agent.py").write_text(AGENT)
    (tmp / "agent.sh").write_text(COMMAND_AGENT)
    with (tmp / "data.jsonl").open("w") as f:
        for i in range(tasks):
            q = f"What is {i} + 1?" if agent == "openai" else f"task {i}"
            ref = str(i + 1) if agent == "openai" else q.upper()
            f.write(json.dumps({"id": f"t{i}", "input": q, "reference": ref}) + "\n")
    target = target_of(tmp, agent, stub_url)
    doc = {
        "apiVersion": "evals.si/v1alpha1", "kind": "EvalRun", "metadata": {"name": f"bench-{agent}"},
        "spec": {"target": target, "dataset": "data.jsonl", "trials": 1, "concurrency": concurrency,
                 "evaluators": [{"ref": "builtin/exact-match"}], "gates": ["metric('exact-match').mean >= 0.99"]},
    }  # fmt: skip
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


async def baseline(run_file: Path, concurrency: int) -> float:
    """The agent alone: every task once, `concurrency` at a time, through the same target code."""
    from evalsi.run_harness.collector import CollectorLink
    from evalsi.run_harness.dataset import load_dataset
    from evalsi.run_harness.spec import load_run
    from evalsi.run_harness.targets import build_target
    from evalsi.run_harness.targets.base import AttemptContext

    spec = load_run(run_file)
    tasks = load_dataset(spec.path(spec.body.dataset.path)).tasks
    target = build_target(spec, CollectorLink("", "", "none"))
    await target.prepare(tasks)
    work = iter(tasks)
    ctx = AttemptContext(trial=0, timeout_s=60, traceparent="", run_id="baseline")

    async def worker() -> None:
        for task in work:
            await target.attempt(task, ctx)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await target.close()
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--agents", default="python,openai")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        stub = subprocess.Popen([sys.executable, "-m", "evalsi.run_harness.stub_llm", "--port", "0"],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert stub.stdout is not None
        stub_url = stub.stdout.readline().split()[-1]
        collector = start_collector(tmp, serve_config(tmp / "store"))
        try:
            for agent in args.agents.split(","):
                case = tmp / agent
                case.mkdir()
                run_file = write_case(case, agent, args.tasks, args.concurrency, stub_url)
                sys.path.insert(0, str(case))
                base = asyncio.run(baseline(run_file, args.concurrency))
                (case / "times.log").unlink(missing_ok=True)  # the baseline's attempts
                link = [] if agent == "command-alone" else ["--collector", collector.api]
                started, t0 = time.time(), time.perf_counter()
                res = subprocess.run([*EVALSI, "run", "-f", str(run_file), *link, "--json"],
                                     capture_output=True, text=True, cwd=case, env={**os.environ})  # fmt: skip
                command = time.perf_counter() - t0
                exited = started + command
                if res.returncode != 0:
                    print(res.stderr[-2000:], file=sys.stderr)
                    return 2
                run = json.loads(res.stdout)
                scored = run["metrics"]["exact-match"]["n"]
                around = None
                if agent.startswith("command"):
                    first, last = attempt_span(case)
                    around = (first - started, exited - last)
                rows.append((agent, args.tasks, base, run["wall_s"], command, around, scored,
                             len(run["infra_errors"])))  # fmt: skip
        finally:
            collector.stop()
            stub.terminate()
    print(f"{'agent':13} {'tasks':>7} {'baseline s':>10} {'run s':>8} {'command s':>9} {'tasks/s':>8} "
          f"{'overhead ms/task':>16} {'start→first s':>13} {'last→exit s':>11} {'scored':>7} {'infra':>5}")  # fmt: skip
    for agent, n, base, wall, command, around, scored, infra in rows:
        start, end = (f"{around[0]:.2f}", f"{around[1]:.2f}") if around else ("-", "-")
        print(f"{agent:13} {n:>7} {base:>10.2f} {wall:>8.2f} {command:>9.2f} {n / wall:>8.0f} "
              f"{(wall - base) / n * 1000:>16.2f} {start:>13} {end:>11} {scored:>7} {infra:>5}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
