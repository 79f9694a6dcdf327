"""Redaction by kind of content: CPU µs a span of the redact processor (default rules) on ASCII and non-ASCII prompts,
with and without numbers and PII, against the plain scan (every pattern over every string, as the rules ran before
the fast scan) measured in the same run on the same spans.

Each span is a chat span as normalize leaves it: a raw `gen_ai.input.messages` (JSON text, UTF-8 as most
instrumentations write it) and the canonical messages made from it, a shared system prompt and a user prompt of about
`--content-bytes` that no other span repeats (so scanning each distinct string once saves nothing but the system
prompt). Each figure is the best of `--rounds` rounds of CPU time of this process over fresh copies of the spans,
each round with new processors (so that nothing is remembered from an earlier round); the plain and the fast scan
alternate within each round, and the garbage collector is off while they run.

Run `python benchmarks/redact_content.py --help`; see docs/processors/redact.md (Speed).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import logging
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "processors"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from test_redact_scan import PlainRuleSet  # noqa: E402  (the plain scan the tests hold the fast one to)

from evalsi.component import Next, Settings  # noqa: E402
from evalsi.model.span import Span, SpanBatch  # noqa: E402
from evalsi.processors.normalize import normalize_span  # noqa: E402
from evalsi.processors.redact import Redact, RedactConfig  # noqa: E402
from evalsi.runtime.telemetry import SelfMetrics  # noqa: E402

SYSTEM = "You are a helpful support assistant. Answer briefly and cite the order number when relevant."
ASCII_WORDS = "the a customer asked about order refund shipping invoice status delayed account please help".split()
NON_ASCII_WORDS = (
    "der Kunde fragt nach Bestellung Rückerstattung Lieferung größer später bitte überprüfen "
    "le client a demandé où est ma commande déjà reçu été "
    "客户 询问 订单 退款 发货 发票 状态 延迟 账户 请 帮助 😀 👍"
).split()
NUMBERS = ["#48213", "2024-11-03", "$12.50", "3 items", "order 77120", "v2.1", "10:45", "x2"]
PII = ["jane.doe@example.com", "+1 415 555 0134", "4111 1111 1111 1111"]
KINDS = {
    "ascii": (ASCII_WORDS, False, False),
    "ascii+numbers": (ASCII_WORDS, True, False),
    "ascii+numbers+PII": (ASCII_WORDS, True, True),
    "non-ascii": (NON_ASCII_WORDS, False, False),
    "non-ascii+numbers": (NON_ASCII_WORDS, True, False),
    "non-ascii+numbers+PII": (NON_ASCII_WORDS, True, True),
}


def prompt(rng: random.Random, words: list[str], numbers: bool, pii: bool, size: int) -> str:
    out: list[str] = []
    length = 0
    while length < size:
        w = rng.choice(NUMBERS) if numbers and rng.random() < 0.05 else rng.choice(words)
        out.append(w)
        length += len(w.encode()) + 1
    if pii:
        for p in PII:
            out.insert(rng.randrange(len(out)), p)
    return " ".join(out)


def chat_spans(kind: str, n: int, size: int) -> list[Span]:
    words, numbers, pii = KINDS[kind]
    rng = random.Random(kind)
    spans = []
    for i in range(n):
        messages = [
            {"role": "system", "parts": [{"type": "text", "content": SYSTEM}]},
            {"role": "user", "parts": [{"type": "text", "content": prompt(rng, words, numbers, pii, size)}]},
        ]
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.input.messages": json.dumps(messages, ensure_ascii=False, separators=(",", ":")),
        }
        span = Span(f"{i + 1:032x}", f"{i + 1:016x}", "", "chat gpt-4o-mini", "CLIENT", 1, 2, attributes=attributes)
        normalize_span(span)
        spans.append(span)
    return spans


class _Sink:
    async def consume(self, batch: SpanBatch) -> None:
        pass


def processor(plain: bool) -> Redact:
    nxt = Next()
    nxt.traces = _Sink()  # type: ignore[assignment]
    redact = Redact(RedactConfig(), Settings("redact", SelfMetrics(), logging.getLogger("bench")), nxt)
    if plain:
        redact.content_rules = PlainRuleSet(redact.content_rules.rules)
    return redact


def cpu_seconds(fn: Callable[[], Any]) -> float:
    """CPU seconds of `fn`, without the garbage collector: a full collection over this benchmark's heap of spans
    lands in one run or the other and would dwarf what is measured."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time()
        fn()
        return time.process_time() - t0
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spans", type=int, default=5_000, help="spans of each kind")
    p.add_argument("--batch", type=int, default=500, help="spans a batch")
    p.add_argument("--content-bytes", type=int, default=1_000, help="bytes of each user prompt (UTF-8)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--kinds", help="comma-separated kinds (default: all): " + ", ".join(KINDS))
    args = p.parse_args(argv)
    kinds = args.kinds.split(",") if args.kinds else list(KINDS)
    loop = asyncio.new_event_loop()
    print(
        f"redact, default rules: {args.spans:,} spans a kind, {args.batch} a batch, ~{args.content_bytes} B prompts, "
        f"best of {args.rounds} rounds, CPU µs a span"
    )
    print(f"  {'content':26s} {'plain scan':>10s} {'this scan':>10s} {'plain/this':>10s}")
    figures: dict[str, float] = {}
    for kind in kinds:
        spans = chat_spans(kind, args.spans, args.content_bytes)
        best = {"plain": float("inf"), "this": float("inf")}
        for _ in range(args.rounds):
            for name in best:
                redact = processor(plain=name == "plain")
                fresh = copy.deepcopy(spans)  # redaction changes the spans that hold PII
                batches = [SpanBatch(fresh[i : i + args.batch]) for i in range(0, len(fresh), args.batch)]

                def run(redact: Redact = redact, batches: list[SpanBatch] = batches) -> None:
                    for batch in batches:
                        loop.run_until_complete(redact.consume(batch))

                best[name] = min(best[name], cpu_seconds(run))
        plain, this = (1e6 * best[n] / args.spans for n in ("plain", "this"))
        figures[kind] = this
        print(f"  {kind:26s} {plain:10.2f} {this:10.2f} {plain / this:9.1f}x")
    for kind in kinds:
        if kind.startswith("non-ascii") and kind.replace("non-ascii", "ascii") in figures:
            ascii_kind = kind.replace("non-ascii", "ascii")
            print(f"  this scan, {kind} / {ascii_kind}: {figures[kind] / figures[ascii_kind]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
