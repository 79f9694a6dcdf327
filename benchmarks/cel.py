"""CEL over a trace: evaluations per second of cel-expr-python (CEL-C++) and cel-python for one realistic selector.

The trace is an agent run of 8 spans (an agent root, 3 LLM calls with ~1 KB of messages each, 3 tool calls, a
retriever) in the canonical shape `evalsi.cel.trace_activation` builds. Each library is timed three ways, each in
its own process (cel-python fails when two runner classes meet in one):

- eval: the compiled expression against a prepared activation (cel-python: already converted with
  `celpy.json_to_cel`);
- convert + eval: the plain-dict activation converted and evaluated each time (what a policy pays per trace);
- build + convert + eval: also building the activation from `Span` objects.

The `evalsi.cel` row is what the tail sampler runs: cel-expr-python, with span maps cut to the fields the selector
names (`Program.fields`); its "convert" is inside `matches`, so its first two columns measure the same thing.

Run `python benchmarks/cel.py` (`--seconds` per measurement, default 1).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evalsi.cel import compile, trace_activation
from evalsi.model.span import Span

SELECTOR = (
    'trace.root.step_type == "agent" && trace.spans.exists(s, s.step_type == "llm" && s.model.startsWith("gpt-4o") '
    '&& (s.status_code == "ERROR" || s.output_tokens > 400)) || trace.duration_ns > 30000000000'
)


def agent_trace(i: int = 0) -> list[Span]:
    trace_id = f"{i:032x}"
    t0 = 1_700_000_000_000_000_000 + i * 1_000_000
    message = "Please summarise the quarterly report for the board, focusing on revenue and churn. " * 12

    def span(n: int, parent: str, step: str, name: str, **canonical: Any) -> Span:
        s = Span(
            trace_id,
            f"{n + 1:016x}",
            parent,
            name,
            "CLIENT" if step == "llm" else "INTERNAL",
            t0 + n * 200_000_000,
            t0 + n * 200_000_000 + 150_000_000,
            status_code="OK",
            service_name="support-agent",
            attributes={"gen_ai.operation.name": name.split()[0], "gen_ai.conversation.id": "conv-1"},
            step_type=step,
            session_id="conv-1",
            **canonical,
        )
        return s

    root = span(0, "", "agent", "invoke_agent support", agent_name="support")
    spans = [root]
    for k in range(3):
        spans.append(
            span(
                1 + 2 * k,
                root.span_id,
                "llm",
                "chat gpt-4o-mini",
                model="gpt-4o-mini",
                provider="openai",
                input_tokens=900,
                output_tokens=120 + k * 150,
                input=[{"role": "user", "parts": [{"type": "text", "content": message}]}],
                output=[{"role": "assistant", "parts": [{"type": "text", "content": message[:400]}]}],
                content_captured=True,
            )
        )
        spans.append(span(2 + 2 * k, root.span_id, "tool", "execute_tool lookup", tool_name="lookup"))
    spans.append(span(7, root.span_id, "retriever", "retrieve docs"))
    return spans


def rate(fn: Callable[[], Any], seconds: float) -> float:
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(50):
            fn()
        n += 50
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


LIBRARIES = ("cel-expr-python", "evalsi.cel", "cel-python-interpreted", "cel-python-compiled")


def measure(library: str, seconds: float) -> list[float]:
    """[eval/s, convert+eval/s, build+convert+eval/s] for one library."""
    spans = agent_trace()
    activation = trace_activation(spans)
    if library == "cel-expr-python":
        from cel_expr_python import cel

        env = cel.NewEnv(variables={"trace": cel.Type.DYN})
        expr = env.compile(SELECTOR)
        assert expr.eval(data=activation).value() is True
        prepared = env.Activation(data=activation)
        return [
            rate(lambda: expr.eval(prepared), seconds),
            rate(lambda: expr.eval(data=activation), seconds),
            rate(lambda: expr.eval(data=trace_activation(spans)), seconds),
        ]
    if library == "evalsi.cel":
        # what the tail sampler runs: cel-expr-python with span maps cut to the fields the selector names
        program = compile(SELECTOR)
        small = trace_activation(spans, fields=program.fields)
        assert program.matches(small)
        return [
            rate(lambda: program.matches(small), seconds),
            rate(lambda: program.matches(small), seconds),
            rate(lambda: program.matches(trace_activation(spans, fields=program.fields)), seconds),
        ]
    import celpy

    # one runner class per process: mixing them fails ('Tree' object has no attribute 'checked_exception')
    runner = celpy.CompiledRunner if library == "cel-python-compiled" else celpy.InterpretedRunner
    env = celpy.Environment(runner_class=runner)
    prog = env.program(env.compile(SELECTOR))
    converted = {"trace": celpy.json_to_cel(activation["trace"])}
    assert bool(prog.evaluate(converted)) is True
    return [
        rate(lambda: prog.evaluate(converted), seconds),
        rate(lambda: prog.evaluate({"trace": celpy.json_to_cel(activation["trace"])}), seconds),
        rate(lambda: prog.evaluate({"trace": celpy.json_to_cel(trace_activation(spans)["trace"])}), seconds),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    parser.add_argument("--library", choices=LIBRARIES, help="measure one library and print its figures as JSON")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # cel-python logs every evaluation error
    if args.library:
        print(json.dumps(measure(args.library, args.seconds)))
        return

    spans = agent_trace()
    print(f"selector: {SELECTOR}")
    print(f"trace: {len(spans)} spans; trace_activation(): {rate(lambda: trace_activation(spans), 1):,.0f}/s")
    print(f"{'library':<26}{'eval/s':>12}{'convert+eval/s':>18}{'build+convert+eval/s':>24}")
    for library in LIBRARIES:
        out = subprocess.run(
            [sys.executable, __file__, "--library", library, "--seconds", str(args.seconds)],
            capture_output=True, text=True,
        )  # fmt: skip
        if out.returncode != 0:
            print(f"{library:<26}fails: {out.stderr.strip().splitlines()[-1]}")
            continue
        row = json.loads(out.stdout)
        print(f"{library:<26}{row[0]:>12,.0f}{row[1]:>18,.0f}{row[2]:>24,.0f}")


if __name__ == "__main__":
    main()
