"""Late signals benchmark: memory per trace held in the `evaluate` processor's buffer of recent traces, and the cost
of the late path per feedback score.

Real captures (tests/fixtures, decoded and normalized) are copied under fresh trace ids and handed to the processor's
engine path one by one, as tail sampling hands them on; the spans are then dropped by the caller, so what stays
allocated is what the buffer keeps alive (the spans, the policies' decisions, the scores of stages that ran).
Measured with tracemalloc, against the same run with a policy that does not read `feedback` (nothing buffered).

Run `python benchmarks/late_signals.py --help`; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

import evalsi.processors  # noqa: E402,F401  (before evalsi.policies: the import cycle note in collector/score_api)
from evalsi.component import Next, Settings  # noqa: E402
from evalsi.model.score import Score  # noqa: E402
from evalsi.model.span import Span  # noqa: E402
from evalsi.processors.evaluate import Evaluate, EvaluateConfig, Work  # noqa: E402
from evalsi.processors.normalize.files import normalize_files  # noqa: E402
from evalsi.runtime.telemetry import SelfMetrics  # noqa: E402

POLICY = """\
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: bench}}
spec:
  sampling: {{rate: {rate}, always: [{always}]}}
  cascade:
    - ref: builtin/contains
      params: {{any: [Paris]}}
    - ref: builtin/latency
      params: {{max_ms: 60000}}
"""

SCENARIOS = [("otel-openai-v2", "chat_simple"), ("otel-openai-v2", "chat_tools"), ("openinference", "chat_tools")]


def fixture(folder: str, scenario: str) -> list[Span]:
    d = FIXTURES / folder
    paths = [p for p in (d / f"{scenario}.pb", d / f"{scenario}.logs.pb") if p.exists()]
    return normalize_files(paths).spans


def processor(tmp: Path, rate: float, always: str, max_traces: int) -> Evaluate:
    (tmp / "p.yaml").write_text(POLICY.format(rate=rate, always=always))
    raw = {"policies": ["p.yaml"], "late_signals": {"max_traces": max_traces}, "datasets_dir": str(tmp / "ds")}
    config = EvaluateConfig.model_validate(raw, context={"base_dir": tmp})
    return Evaluate(config, Settings("evaluate", SelfMetrics(), logging.getLogger("bench")), Next())


def copies(spans: list[Span], n: int) -> list[list[Span]]:
    out = []
    for i in range(n):
        trace_id = f"{i:032x}"
        trace = copy.deepcopy(spans)
        for s in trace:
            s.trace_id = trace_id
        out.append(trace)
    return out


def held_bytes(spans: list[Span], n: int, rate: float, always: str) -> tuple[float, Evaluate]:
    """Bytes still allocated per trace after `n` traces went through the engine path and the caller dropped them."""
    with tempfile.TemporaryDirectory() as d:
        proc = processor(Path(d), rate, always, max_traces=n)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        traces = copies(spans, n)
        for trace in traces:
            proc.queue.evaluate(Work("trace", trace, time.monotonic()))
        del traces, trace
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
    return held / n, proc


def late_path_rate(proc: Evaluate, n: int) -> float:
    """Negative feedback scores/s through the late path (each brings its trace in: the cascade runs)."""
    feedback = [
        Score("thumbs", passed=False, trace_id=f"{i:032x}", source="human", policy="feedback", evaluator="feedback")
        for i in range(n)
    ]
    t0 = time.process_time()
    for s in feedback:
        proc.queue.evaluate(Work("feedback", [], time.monotonic(), [s]))
    return n / (time.process_time() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=int, default=2000, help="traces buffered per scenario (default 2000)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for folder, scenario in SCENARIOS:
        spans = fixture(folder, scenario)
        plain, _ = held_bytes(spans, args.traces, 0.0, "trace.error")
        sampled_out, proc = held_bytes(spans, args.traces, 0.0, "feedback.negative")
        buffered = len(proc.late.recent)
        late = late_path_rate(proc, min(args.traces, buffered))
        evaluated, _ = held_bytes(spans, args.traces, 1.0, "feedback.negative")
        rows.append(
            {
                "scenario": f"{folder}/{scenario}", "spans": len(spans), "buffered": buffered,
                "bytes_per_trace_not_read": round(plain), "bytes_per_trace_sampled_out": round(sampled_out - plain),
                "bytes_per_trace_evaluated": round(evaluated - plain), "late_path_feedback_per_s": round(late),
            }
        )  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'scenario':32} {'spans':>5} {'KiB/trace out':>14} {'KiB/trace in':>13} {'late feedback/s':>16}")
    for r in rows:
        print(
            f"{r['scenario']:32} {r['spans']:>5} {r['bytes_per_trace_sampled_out'] / 1024:>14.1f} "
            f"{r['bytes_per_trace_evaluated'] / 1024:>13.1f} {r['late_path_feedback_per_s']:>16,}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
