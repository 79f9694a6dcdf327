"""Hostile-values benchmark: a long run of the hostile OTLP requests of tests/receivers/test_hostile_values.py
against one real `evalsi serve`.

The requests come from the same hypothesis strategy (`tests/hostile_otlp.py`, `hostile_cases`): valid spans with
fresh ids mixed with extreme ints, NaN/inf/huge doubles, numeric strings no count holds, empty and ~100 KB strings,
AnyValue nesting up to depth 60, odd enum numbers, links with odd ids, GenAI token attributes with hostile values,
invalid spans, and whole requests that do not decode (invalid UTF-8, lone surrogates, JSON ints out of range).
They go round-robin over OTLP/HTTP protobuf, OTLP/HTTP JSON and gRPC. Every answer is checked against the contract
(200 / OK with the invalid spans counted in partial success, or 400 / INVALID_ARGUMENT with a message for a body that
does not decode; 503/429 with Retry-After are retried). Every `--probe-every` requests a plain valid request is sent
and timed until the API shows it (the no-stall property: within two flush intervals plus `--stall-slack`); a
collector that does not store the probe within 10 s more is counted as wedged and restarted on the same store. At the
end: SIGTERM and the exit code, then every span is read back from the store in one query (as the API shows it) and
checked: each valid span of an accepted request stored once, clamped fields marked with `evalsi.clamped`, token
counts parsed or None and listed in `unparsed`; no span of a refused request stored.

Prints: examples per transport, answers by class, spans valid/stored/missing, clamped, stalls and the slowest probe,
restarts, exit code(s), elapsed seconds, and every kind of problem seen with a count and its first example. Exit
status 1 when anything broke the contract.

Run `python benchmarks/hostile_values.py --help`; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from hostile_otlp import (  # noqa: E402
    FLUSH_INTERVAL,
    TRANSPORTS,
    Case,
    ExpectedSpan,
    Harness,
    hostile_cases,
    span_problems,
)
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from evalsi.exporters.clickhouse.backend import ChdbBackend  # noqa: E402
from evalsi.exporters.clickhouse.rows import canonical_from_row  # noqa: E402
from evalsi.exporters.clickhouse.schema import trace_spans_sql  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_SPAN = re.compile(r"span [0-9a-f]{32}/[0-9a-f]{16} \[[^\]]*\]")
_TOKENS = re.compile(r"(input|output)_tokens=('[^']*'|\S+)")
_HEX = re.compile(r"\b(?=[0-9]*[a-f])[0-9a-f]{16}(?:[0-9a-f]{16})?\b")  # ids: hex with a letter
_NUM = re.compile(r"-?\d[\d.e+]{3,}")  # 4+ characters: HTTP statuses and small counts stay
_CONVENTION = re.compile(r" \[[a-z_]+, stored convention [^\]]*\]")
_UNPARSED = re.compile(r"in unparsed \[[^\]]*\]")


def _value_class(literal: str) -> str:
    """What kind of token value a repr'd literal is: the failures group by it."""
    if literal.startswith("'"):
        text = literal[1:-1]
        if not text:
            return "empty string"
        try:
            f = float(text)
        except ValueError:
            return "non-numeric string"
        if f != f or f in (float("inf"), float("-inf")):
            return "nan/inf string"
        if f < 0:
            return "negative numeric string"
        if not f.is_integer():
            return "fractional numeric string"
        return "numeric string > 2**64" if f >= 2**64 else "numeric string"
    if literal in ("nan", "inf", "-inf"):
        return literal
    if "." in literal or "e" in literal:
        f = float(literal)
        if f < 0:
            return "negative double"
        return "fractional double" if not f.is_integer() else ("double > 2**64" if f >= 2**64 else "whole double")
    return "negative int" if literal.startswith("-") else "int"


def signature(problem: str) -> str:
    """A problem with its ids and numbers blanked: one line per kind of failure."""
    s = _SPAN.sub("span", problem)
    s = _CONVENTION.sub("", s)
    s = _UNPARSED.sub("in unparsed", s)
    tokens: list[str] = []

    def token(m: re.Match[str]) -> str:
        tokens.append(f"{m.group(1)}_tokens=<{_value_class(m.group(2))}>")
        return chr(0xE000 + len(tokens) - 1)  # a placeholder the number blanking leaves alone

    s = _TOKENS.sub(token, s)
    s = _HEX.sub("<id>", s)
    s = _NUM.sub("N", s)
    for i, t in enumerate(tokens):
        s = s.replace(chr(0xE000 + i), t)
    return s[:220]


@dataclass
class Figures:
    examples: Counter[str] = field(default_factory=Counter)
    answers: Counter[tuple[str, str]] = field(default_factory=Counter)
    valid_sent: int = 0  # valid spans in accepted requests
    refused_valid: int = 0  # valid spans in requests answered 400 (must not be stored)
    checked: int = 0
    missing: int = 0
    clamped_sent: int = 0
    clamped_marked: int = 0
    probes: int = 0
    stalls: int = 0
    problems: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)
    exit_codes: list[int | None] = field(default_factory=list)
    restarts: int = 0
    max_probe_s: float = 0.0
    probe_times: list[float] = field(default_factory=list)  # seconds until each probe stored in time was readable
    elapsed_s: float = 0.0
    send_s: float = 0.0  # of elapsed: answering the hostile requests
    probe_s: float = 0.0  # the probes
    readback_s: float = 0.0  # reading every span back from the store, after the run
    rows: int = 0  # spans in the store (probes included)
    duplicates: int = 0  # rows with a (trace id, span id) another row has

    def add(self, problems: list[str], context: str) -> None:
        real = [p for p in problems if not p.startswith("log: ")]
        logs = [p for p in problems if p.startswith("log: ")]
        for p in real:
            sig = signature(p)
            self.problems[sig] += 1
            if sig not in self.first:
                self.first[sig] = "\n".join([p, context, *logs[:5]])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Hostile OTLP values against a real `evalsi serve`: answers, storage, stalls, exit code.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--examples", type=int, default=20_000, help="hostile requests to send")
    p.add_argument("--workers", type=int, default=1, help="service.workers (1: pipelines in-process)")
    p.add_argument("--transport", choices=["all", *TRANSPORTS], default="all", help="round-robin over all by default")
    p.add_argument("--probe-every", type=int, default=10,
                   help="requests between no-stall probes (and read-backs of the spans accepted meanwhile); "
                        "1 pins a stall on the request that caused it")  # fmt: skip
    p.add_argument("--stall-slack", type=float, default=3.0,
                   help="seconds allowed on top of two flush intervals for a probe to be stored")  # fmt: skip
    p.add_argument("--max-spans", type=int, default=8, help="hostile spans per request at most (+120 scattered)")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (store, logs, configs)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON on stdout instead of a table")
    args = p.parse_args(argv)
    if args.examples < 1 or args.probe_every < 1 or args.workers < 1:
        p.error("--examples, --probe-every and --workers must be >= 1")
    return args


def run(args: argparse.Namespace, workdir: Path) -> Figures:
    fig = Figures()
    transports = list(TRANSPORTS) if args.transport == "all" else [args.transport]
    t0 = time.monotonic()
    h = Harness(workdir, args.workers, stall_slack=args.stall_slack)
    log(f"collector ready in {time.monotonic() - t0:.1f}s ({args.workers} worker(s)); sending {args.examples:,} "
        f"hostile requests over {', '.join(transports)}")  # fmt: skip
    accepted: list[tuple[ExpectedSpan, str]] = []  # valid spans of accepted requests, and their request
    refused: list[tuple[tuple[str, str], str]] = []  # (trace, span) of valid spans of refused requests
    recent: list[str] = []  # the cases since the last probe, for the context of a stall
    n = 0
    t0 = time.monotonic()

    def check_point() -> None:
        nonlocal recent
        fig.probes += 1
        t = time.monotonic()
        waited, late = h.probe()
        fig.probe_s += time.monotonic() - t
        if waited is not None:
            fig.probe_times.append(waited)
        if waited is None:
            fig.stalls += 1
            assert h.collector is not None
            wedged = late is None
            state = f"stored after {late:.1f}s" if late is not None else "wedged: restarted"
            if h.collector.proc.poll() is not None:
                state = f"collector exited {h.collector.proc.returncode}: restarted"
            problems = [f"stall: probe not stored within {h.stall_limit:.1f}s ({state})"]
            problems += [f"log: {line}" for line in h.new_log_lines()][:10]
            context = "requests since the previous probe:\n  " + "\n  ".join(recent[-args.probe_every :])
            fig.add(problems, context)
            if wedged:
                fig.restarts += 1
                h.restart()
        else:
            h.new_log_lines()
        recent = []

    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @seed(args.seed)
    @given(case=hostile_cases(max_spans=args.max_spans))
    def one(case: Case) -> None:
        nonlocal n
        transport = transports[n % len(transports)]
        n += 1
        fig.examples[transport] += 1
        body = case.body(transport)
        t = time.monotonic()
        a = h.send(body, transport)
        fig.send_s += time.monotonic() - t
        labels = {"ok": "200/OK partial" if a.rejected else "200/OK", "bad": "400/INVALID_ARGUMENT"}
        klass = labels.get(a.klass, a.klass)
        fig.answers[(transport, klass)] += 1
        context = f"[{transport}] {case!r}"
        recent.append(context[:600])
        problems = h.answer_problems(case, transport, a)
        if a.klass == "ok":
            accepted.extend((e, context) for e in case.valid)
            fig.valid_sent += len(case.valid)
        elif a.klass == "bad":
            fig.refused_valid += len(case.valid)
            refused.extend(((e.trace_id, e.span_id), context) for e in case.valid)
        if problems:
            fig.add(problems, context)
        if n % args.probe_every == 0:
            check_point()
        if n % 500 == 0:
            rate = n / (time.monotonic() - t0)
            log(f"{n:,} requests ({rate:.1f}/s), {sum(fig.problems.values()):,} problems of "
                f"{len(fig.problems)} kinds, {fig.stalls} stalls, max probe {h.max_probe:.2f}s")  # fmt: skip

    try:
        one()
        check_point()
        fig.max_probe_s = h.max_probe
        h.stop()
    finally:
        if h.collector is not None and h.collector.proc.poll() is None:
            h.collector.proc.kill()
    fig.exit_codes = h.exit_codes
    fig.elapsed_s = time.monotonic() - t0
    for code in fig.exit_codes:
        if code != 0:
            fig.add([f"collector exit code {code} on SIGTERM"], "")
    t = time.monotonic()
    read_back(fig, workdir / "store", accepted, refused)
    fig.readback_s = time.monotonic() - t
    return fig


def stored_spans(store: Path) -> tuple[dict[tuple[str, str], dict[str, Any]], int]:
    """Every stored span in the canonical shape the API gives, by (trace id, span id); and how many rows repeat a
    key. Read from the store directly once the collector has stopped: one query instead of one per trace."""
    sql = trace_spans_sql("otel_traces")
    start = sql.index("\nSELECT\n") + len("\nSELECT\n")  # the outer SELECT (the WITH clause has its own)
    columns = sql[start : sql.index("\nFROM otel_traces\n", start)]
    backend = ChdbBackend(str(store), create=False)
    try:
        rows = backend.query(f"SELECT {columns} FROM otel_traces")
    finally:
        backend.close()
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        span = canonical_from_row(row)
        out[(span["trace_id"], span["span_id"])] = span
    return out, len(rows) - len(out)


def read_back(
    fig: Figures, store: Path, accepted: list[tuple[ExpectedSpan, str]], refused: list[tuple[tuple[str, str], str]]
) -> None:
    log(f"reading back {len(accepted):,} valid spans from the store")
    stored, fig.duplicates = stored_spans(store)
    fig.rows = len(stored) + fig.duplicates
    for e, context in accepted:
        got = stored.get((e.trace_id, e.span_id))
        fig.checked += 1
        if got is None:
            fig.missing += 1
            fig.add([f"span {e.describe()} not stored"], context)
            continue
        found = span_problems(e, got)
        if e.clamped:
            fig.clamped_sent += 1
            fig.clamped_marked += not any("evalsi.clamped" in p for p in found)
        if found:
            fig.add(found, context)
    for key, context in refused:
        if key in stored:
            fig.add([f"span {key[0]}/{key[1]} stored though its request was refused"], context)


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def print_figures(fig: Figures, args: argparse.Namespace) -> None:
    print(f"\nhostile values: {sum(fig.examples.values()):,} requests, {args.workers} worker(s), "
          f"{fig.elapsed_s:.0f}s")  # fmt: skip
    print("\nrequests and answers by transport")
    classes = sorted({k for _, k in fig.answers})
    head = ["transport", "sent", *classes]
    rows = [head] + [
        [t, f"{fig.examples[t]:,}", *(f"{fig.answers[(t, k)]:,}" for k in classes)] for t in sorted(fig.examples)
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for i, r in enumerate(rows):
        print("  " + "  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths, strict=True))))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))
    print("\nspans")
    print(f"  valid in accepted requests   {fig.valid_sent:,}")
    print(f"  read back                    {fig.checked:,}")
    print(f"  stored                       {fig.checked - fig.missing:,}")
    print(f"  missing                      {fig.missing:,}")
    print(f"  to clamp / marked            {fig.clamped_sent:,} / {fig.clamped_marked:,}")
    print(f"  valid in refused requests    {fig.refused_valid:,} (must not be stored)")
    print(f"  rows in the store            {fig.rows:,} (probes included; {fig.duplicates:,} repeat a span id)")
    print("\ncollector")
    print(f"  probes / stalls              {fig.probes:,} / {fig.stalls:,}")
    p50, p95 = percentile(fig.probe_times, 50), percentile(fig.probe_times, 95)
    over = sum(1 for x in fig.probe_times if x > 2 * FLUSH_INTERVAL)
    print(f"  probe stored in              p50 {p50:.2f}s, p95 {p95:.2f}s, max {fig.max_probe_s:.2f}s "
          f"({over:,} over two flush intervals, {2 * FLUSH_INTERVAL:.1f}s)")  # fmt: skip
    print(f"  restarts (wedged)            {fig.restarts}")
    print(f"  exit code(s) on SIGTERM      {fig.exit_codes}")
    print(f"  elapsed                      {fig.elapsed_s:.0f}s: sending {fig.send_s:.0f}s, probes {fig.probe_s:.0f}s, "
          f"the rest (hypothesis, encoding) {fig.elapsed_s - fig.send_s - fig.probe_s:.0f}s; "
          f"then {fig.readback_s:.0f}s reading the store back")  # fmt: skip
    if fig.problems:
        print(f"\nproblems: {sum(fig.problems.values()):,} of {len(fig.problems)} kinds")
        for sig, count in fig.problems.most_common():
            print(f"\n  {count:>6,}x {sig}")
            print("         first: " + fig.first[sig].replace("\n", "\n         ")[:3000])
    else:
        print("\nno problems: every answer, span and probe as the contract says")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="evalsi-hostile-"))
    try:
        fig = run(args, workdir)
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        doc: dict[str, Any] = {
            "params": vars(args),
            "examples": dict(fig.examples),
            "answers": {f"{t} {k}": v for (t, k), v in fig.answers.items()},
            "spans": {
                "valid": fig.valid_sent,
                "checked": fig.checked,
                "stored": fig.checked - fig.missing,
                "missing": fig.missing,
                "clamped": fig.clamped_sent,
                "clamped_marked": fig.clamped_marked,
                "refused_valid": fig.refused_valid,
                "rows": fig.rows,
                "duplicates": fig.duplicates,
            },
            "probes": fig.probes,
            "stalls": fig.stalls,
            "max_probe_s": fig.max_probe_s,
            "probe_p50_s": percentile(fig.probe_times, 50),
            "probe_p95_s": percentile(fig.probe_times, 95),
            "probes_over_two_flush_intervals": sum(1 for x in fig.probe_times if x > 2 * FLUSH_INTERVAL),
            "restarts": fig.restarts,
            "exit_codes": fig.exit_codes,
            "elapsed_s": fig.elapsed_s,
            "send_s": fig.send_s,
            "probe_s": fig.probe_s,
            "readback_s": fig.readback_s,
            "problems": [{"count": c, "kind": s, "first": fig.first[s]} for s, c in fig.problems.most_common()],
        }
        print(json.dumps(doc, indent=2))
    else:
        print_figures(fig, args)
    if fig.problems:
        log(f"FAIL: {sum(fig.problems.values()):,} problems of {len(fig.problems)} kinds (see above)")
        return 1
    log("ok: every answer, span and probe as the contract says; the collector exited 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
