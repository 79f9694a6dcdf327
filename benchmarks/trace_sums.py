"""A trace's sums counting each model call once: CPU time of `evalsi.cel.trace_activation` (the `trace.*` fields a
policy reads) with the rules that leave out an agent span's summed usage (`trajectory.aggregate_usage`) and a call's
wrapper span (`trajectory.llm_wrappers`), against the same function with both rules off, in the same process.

Two synthetic traces of 500 spans (50 agent spans, 9 model calls under each): one whose agents carry no usage (the
common case: only the calls do), one whose agents carry their run's summed usage (the Vercel AI SDK's GenAI spans,
Strands). Run `python benchmarks/trace_sums.py` (`--rounds`, default 5; each round times every variant, interleaved).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import evalsi.cel as cel
import evalsi.model.trajectory as trajectory
from evalsi.model.span import Span


def trace(agent_tokens: int | None) -> list[Span]:
    spans = []
    for a in range(50):
        agent_id = f"{a:016x}"
        spans.append(Span("t" * 32, agent_id, None, "agent", "INTERNAL", a, a + 1, step_type="agent",
                          input_tokens=agent_tokens))  # fmt: skip
        for k in range(9):
            spans.append(Span("t" * 32, f"{a:08x}{k:08x}", agent_id, "chat", "CLIENT", a, a + 1, step_type="llm",
                              model="gpt-4o-mini", input_tokens=10, output_tokens=2))  # fmt: skip
    return spans


def per_call(spans: list[Span], n: int = 300) -> float:
    start = time.process_time()
    for _ in range(n):
        cel.trace_activation(spans, span_maps=False)
    return (time.process_time() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    aggregate, wrappers = cel.aggregate_usage, trajectory.llm_wrappers
    for label, spans in (("calls only carry usage", trace(None)), ("agents carry summed usage", trace(100))):
        on, off = [], []
        for _ in range(args.rounds):
            on.append(per_call(spans))
            cel.aggregate_usage = lambda spans, folded=frozenset(): set()  # type: ignore[assignment]
            trajectory.llm_wrappers = lambda spans: set()  # type: ignore[assignment]
            off.append(per_call(spans))
            cel.aggregate_usage, trajectory.llm_wrappers = aggregate, wrappers
        on_ms, off_ms = sorted(on)[len(on) // 2] * 1e3, sorted(off)[len(off) // 2] * 1e3
        print(f"{label}: {on_ms:.3f} ms with the rules, {off_ms:.3f} ms without (median of {args.rounds}), "
              f"ratio {on_ms / off_ms:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
