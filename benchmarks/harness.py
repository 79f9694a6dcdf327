"""`evalsi run` throughput: N tasks against a local Python-callable agent and against the bundled stub model (the
built-in `openai` agent), through a real `evalsi serve` (embedded store) in its own process.

For each agent it measures, in the same run:
- the baseline: the agent alone, called N times with the same concurrency, no tracing, no scoring;
- `evalsi run -f ... --json`: the run's wall time from its JSON (attempts, traces sent, every trace scored by the
  collector) and the command's wall time (process start and collector connection included);
and prints tasks/s and the harness overhead per task: (run wall - baseline wall) / N.
Goal (issue #9): overhead < 5 ms a task, 10,000 tasks in < 60 s on 2 cores.

    python benchmarks/harness.py [--tasks 10000] [--concurrency 16] [--agents python,openai]
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

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from running_collector import EVALSI, serve_config, start_collector  # noqa: E402

AGENT = """
def answer(question):
    return question.upper()
"""


def write_case(tmp: Path, agent: str, tasks: int, concurrency: int, stub_url: str) -> Path:
    (tmp / "agent.py").write_text(AGENT)
    with (tmp / "data.jsonl").open("w") as f:
        for i in range(tasks):
            q = f"What is {i} + 1?" if agent == "openai" else f"task {i}"
            ref = str(i + 1) if agent == "openai" else q.upper()
            f.write(json.dumps({"id": f"t{i}", "input": q, "reference": ref}) + "\n")
    target = (
        {"python": {"function": "agent:answer"}}
        if agent == "python"
        else {"openai": {"base_url": stub_url, "model": "stub-1", "max_steps": 2}}
    )
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
                t0 = time.perf_counter()
                res = subprocess.run([*EVALSI, "run", "-f", str(run_file), "--collector", collector.api, "--json"],
                                     capture_output=True, text=True, cwd=case, env={**os.environ})  # fmt: skip
                command = time.perf_counter() - t0
                if res.returncode != 0:
                    print(res.stderr[-2000:], file=sys.stderr)
                    return 2
                run = json.loads(res.stdout)
                scored = run["metrics"]["exact-match"]["n"]
                rows.append((agent, args.tasks, base, run["wall_s"], command, scored, len(run["infra_errors"])))
        finally:
            collector.stop()
            stub.terminate()
    print(f"{'agent':8} {'tasks':>7} {'baseline s':>10} {'run s':>8} {'command s':>9} {'tasks/s':>8} "
          f"{'overhead ms/task':>16} {'scored':>7} {'infra':>5}")  # fmt: skip
    for agent, n, base, wall, command, scored, infra in rows:
        print(f"{agent:8} {n:>7} {base:>10.2f} {wall:>8.2f} {command:>9.2f} {n / wall:>8.0f} "
              f"{(wall - base) / n * 1000:>16.2f} {scored:>7} {infra:>5}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
