"""CPU µs of the evaluation path, in one process: a policy's selector, `PolicySet.evaluate_trace`, the evaluation
queue's `evaluate_all` (as a pipeline worker runs it: windows record), the Prometheus exporter's `consume_scores`
(µs a score) and tail sampling's intake and decision (µs a span), over `benchmarks/evaluate.py`'s 5-span agent
traces (decoded and normalized).

Two policies: `pipeline` is `benchmarks/pipeline.py`'s (selector `trace.service_name == 'support-bot'`, latency,
tokens, cost) and `agent` is `benchmarks/evaluate.py`'s (a selector on `span.attributes` and `trace.llm_calls`,
contains, latency, tokens). Each figure is the best of `--rounds` rounds in CPU time of this process.

`--against DIR` runs every measurement in child processes, alternating this checkout and DIR (e.g. a base
unpacked with `git archive <commit> | tar -x -C DIR`) `--pairs` times, and prints each figure with its ratio to
DIR's best. Without it, it measures the checkout first on `PYTHONPATH` (else this file's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
CHECKOUT = Path(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or HERE)

PIPELINE_POLICY = """apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: {name}}}
spec:
  selector: "{selector}"
  sampling: {{rate: 1.0}}
  cascade:
    - ref: builtin/latency
      params: {{max_ms: 60000}}
    - ref: builtin/tokens
      params: {{max_total: 20000}}
    - ref: builtin/cost
"""
PIPELINE_SELECTOR = "trace.service_name == 'support-bot'"
PIPELINE_NOTHING = "trace.service_name == 'nobody'"


def measure(traces_n: int, rounds: int) -> dict[str, float]:
    """Every figure, µs a trace or a score, best of `rounds`."""
    sys.path.insert(0, str(CHECKOUT / "benchmarks"))
    import evaluate as bench  # the checkout's: it imports `ingest`, which puts the checkout first on sys.path

    from evalsi.collector.builtin import load_builtin_components
    from evalsi.component import REGISTRY, Next, Settings
    from evalsi.exporters.prometheus import PrometheusConfig, PrometheusExporter
    from evalsi.model.score import ScoreBatch
    from evalsi.policies import load_policies
    from evalsi.processors.evaluate.work_queue import ENGINE_CHUNK, Work
    from evalsi.runtime.telemetry import SelfMetrics

    load_builtin_components()
    log = logging.getLogger("evaluate_path")
    traces = bench.normalized_traces(traces_n)
    tmp = Path(tempfile.mkdtemp(prefix="evalsi-evaluate-path-"))

    def pipeline_policy(name: str, selector: str) -> Path:
        d = tmp / name
        d.mkdir()
        path = d / f"{name}.yaml"
        path.write_text(PIPELINE_POLICY.format(name=name, selector=selector))
        return path

    def policy_set(path: Path) -> Any:
        return load_policies([str(path)], path.parent, datasets_dir=path.parent / "datasets")

    pipeline_path = pipeline_policy("pipeline", PIPELINE_SELECTOR)
    sets = {
        "selector only, pipeline (matches nothing)": policy_set(pipeline_policy("nothing", PIPELINE_NOTHING)),
        "selector only, agent (matches nothing)": bench.policy_set(tmp / "agent-nothing", bench.NOTHING),
        "evaluate_trace, pipeline": policy_set(pipeline_path),
        "evaluate_trace, agent": bench.policy_set(tmp / "agent", bench.SELECTOR),
    }
    for name, ps in sets.items():
        if ("nothing" in name) == bool(ps.evaluate_trace(traces[0])):
            raise SystemExit(f"FAIL [{name}] unexpected scores on a benchmark trace")

    def evaluation_queue() -> Any:
        factory, nxt = REGISTRY[("processor", "evaluate")], Next()
        settings = Settings(id="evaluate", metrics=SelfMetrics(), logger=log)
        processor = factory.cls(factory.config(policies=[str(pipeline_path)]), settings, nxt)
        processor.queue.policies.record_windows()  # as in a pipeline worker
        return processor.queue

    chunks = [traces[i : i + ENGINE_CHUNK] for i in range(0, len(traces), ENGINE_CHUNK)]
    queue = evaluation_queue()
    batches = [queue.evaluate_all([Work("trace", spans, 1.0) for spans in chunk]) for chunk in chunks]
    n_scores = sum(len(b) for b in batches)
    loop = asyncio.new_event_loop()

    def exporter() -> Any:
        settings = Settings("prometheus", SelfMetrics(), log)
        e = PrometheusExporter(PrometheusConfig(endpoint="127.0.0.1:0"), settings)
        e.clock = lambda: 1_800_000_000.0
        return e

    prometheus = exporter()

    def run_sets(ps: Any) -> Callable[[], None]:
        def run() -> None:
            for spans in traces:
                ps.evaluate_trace(spans)

        return run

    def run_queue() -> None:
        for chunk in chunks:
            queue.evaluate_all([Work("trace", spans, 1.0) for spans in chunk])
        queue.policies.drain_window_records()

    def run_prometheus() -> None:
        for b in batches:
            loop.run_until_complete(prometheus.consume_scores(ScoreBatch(b)))

    singles = [b[i : i + 3] for b in batches for i in range(0, len(b), 3)]  # one trace's scores a batch

    def run_prometheus_singles() -> None:
        for b in singles:
            loop.run_until_complete(prometheus.consume_scores(ScoreBatch(b)))

    from evalsi.model.span import BatchKind, SpanBatch

    class Sink:
        mutates_data = False

        async def consume(self, batch: Any) -> None:
            pass

    def tail_sampling() -> Any:
        factory, nxt = REGISTRY[("processor", "tail_sampling")], Next()
        nxt.traces = Sink()  # type: ignore[assignment]
        settings = Settings(id="tail_sampling", metrics=SelfMetrics(), logger=log)
        return factory.cls(factory.config(), settings, nxt)

    n_spans = sum(len(t) for t in traces)
    span_batches = [SpanBatch([s for t in chunk for s in t], kind=BatchKind.SPANS) for chunk in chunks]
    samplers: list[Any] = []

    def fresh_sampler() -> None:  # a decided trace's spans would be late: each round takes a fresh processor
        samplers[:] = [tail_sampling()]

    def run_tail_sampling() -> None:
        ts = samplers[0]
        for b in span_batches:
            loop.run_until_complete(ts.consume(b))
            ts._complete([(t, "quiet") for t in ts._buffer.drain()], 0.0)
            loop.run_until_complete(ts._send())

    stages: list[tuple[str, Callable[[], None], int]] = [(name, run_sets(ps), traces_n) for name, ps in sets.items()]
    stages += [
        ("evaluate_all (worker), pipeline", run_queue, traces_n),
        (f"prometheus consume_scores, {ENGINE_CHUNK}-trace batches", run_prometheus, n_scores),
        ("prometheus consume_scores, 1-trace batches", run_prometheus_singles, n_scores),
        ("tail_sampling consume + decide, a span", run_tail_sampling, n_spans),
    ]
    prepare = {"tail_sampling consume + decide, a span": fresh_sampler}
    for name, fn, _ in stages:  # warm-up
        prepare.get(name, lambda: None)()
        fn()
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, fn, n in stages:
            prepare.get(name, lambda: None)()
            t0 = time.process_time()
            fn()
            best[name] = min(best.get(name, float("inf")), 1e6 * (time.process_time() - t0) / n)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--against", help="DIR: a base checkout, measured in alternation with this one")
    p.add_argument("--pairs", type=int, default=2, help="with --against: base/new runs each (default 2)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON (children use it)")
    args = p.parse_args(argv)
    if not args.against:
        figures = measure(args.traces, args.rounds)
        if args.json:
            print(json.dumps(figures))
        else:
            print(f"evalsi from {CHECKOUT}: {args.traces} traces, best of {args.rounds}, CPU µs")
            for name, us in figures.items():
                print(f"  {name:42s} {us:8.2f}")
        return 0
    runs: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
    for _ in range(args.pairs):
        for which, checkout in (("base", args.against), ("new", str(CHECKOUT))):
            env = {**os.environ, "PYTHONPATH": checkout}
            cmd = [sys.executable, __file__, "--json", "--traces", str(args.traces), "--rounds", str(args.rounds)]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            runs[which].append(json.loads(out.strip().splitlines()[-1]))
    print(f"base {args.against}, new {CHECKOUT}: {args.traces} traces, best of {args.rounds} rounds in each of "
          f"{args.pairs} alternated runs, CPU µs")  # fmt: skip
    for name in runs["new"][0]:
        base = min(r[name] for r in runs["base"] if name in r)
        new = min(r[name] for r in runs["new"])
        print(f"  {name:42s} {base:8.2f} -> {new:8.2f}   ({new / base:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
