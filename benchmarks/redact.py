"""Redaction benchmark: what the redact processor costs per span, against normalize measured in the same run.

Uses the GenAI chat spans of benchmarks/ingest.py (its payload builder: 500 spans per request, a ~1 KB
`gen_ai.input.messages` each), decoded and normalized as the collector does, then:

- regex redaction (default rules) over the normalized spans, in spans per CPU-second: with no PII in them (the usual
  case: one Rust-regex pass finds nothing) and with an e-mail, a phone and a card number in every span's prompt;
- the same against normalize alone and against the in-process pipeline floor (decode + normalize + Arrow columns);
- Presidio (pattern recognizers, no NLP model) in texts per second, on the same content strings and on short prompts;
- with --serve, a real `evalsi serve` run twice on the same payloads, normalize alone then normalize -> redact, and
  their stored spans/s and server CPU per span.

Run `python benchmarks/redact.py --help`; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import ingest  # noqa: E402
from running_collector import serve_config, start_collector  # noqa: E402

from evalsi.component import Next, Settings  # noqa: E402
from evalsi.exporters.clickhouse.rows import to_arrow  # noqa: E402
from evalsi.model.span import Span, SpanBatch  # noqa: E402
from evalsi.processors.normalize import normalize_span  # noqa: E402
from evalsi.processors.redact import Redact, RedactConfig  # noqa: E402
from evalsi.receivers.otlp.decode import decode_traces_protobuf  # noqa: E402
from evalsi.runtime.telemetry import SelfMetrics  # noqa: E402

PII = " Contact me at jane.doe@example.com or +1 415 555 0134, and charge my card 4111 1111 1111 1111."
INPUT_MESSAGES = 12  # index of gen_ai.input.messages in ingest.build_template's attributes
GOAL = 0.20  # the goal: regex redaction costs < 20% of the spine's stored spans/s


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def payloads(args: argparse.Namespace, pii: bool, n_requests: int) -> list[bytes]:
    template = ingest.build_template(args.spans_per_request, args.content_bytes, seed=7)
    if pii:
        for s in template.resource_spans[0].scope_spans[0].spans:
            kv = s.attributes[INPUT_MESSAGES]
            assert kv.key == "gen_ai.input.messages"
            messages = json.loads(kv.value.string_value)
            messages[-1]["parts"][0]["content"] += PII
            kv.value.string_value = json.dumps(messages, separators=(",", ":"))
    return ingest.build_payloads(template, n_requests, 5, run_tag=0xBE7C, start_ns=time.time_ns())


class _Sink:
    async def consume(self, batch: SpanBatch) -> None:
        pass

    async def consume_logs(self, batch: Any) -> None:
        pass


def redact_processor(config: dict[str, Any]) -> Redact:
    nxt = Next()
    nxt.traces = _Sink()  # type: ignore[assignment]
    return Redact(RedactConfig(**config), Settings("redact", SelfMetrics(), logging.getLogger("bench")), nxt)


def cpu(fn: Callable[[], Any]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def in_process(bodies: list[bytes], repeats: int) -> dict[str, float]:
    """µs of CPU per span for each step, best of `repeats` (fresh spans each time: redaction changes them)."""
    redact = redact_processor({})
    best: dict[str, float] = {}
    n = 0
    for _ in range(repeats):
        batches: list[list[Span]] = []
        times = {"decode": 0.0, "normalize": 0.0, "redact": 0.0, "to_arrow": 0.0}
        for body in bodies:
            out: list[Any] = []
            times["decode"] += cpu(lambda body=body, out=out: out.append(decode_traces_protobuf(body).batch.spans))
            batches.append(out[0])
        n = sum(len(b) for b in batches)
        for spans in batches:
            times["normalize"] += cpu(lambda spans=spans: [normalize_span(s) for s in spans])
        loop = asyncio.new_event_loop()
        for spans in batches:
            times["redact"] += cpu(
                lambda spans=spans, loop=loop: loop.run_until_complete(redact.consume(SpanBatch(spans)))
            )
        loop.close()
        for spans in batches:
            times["to_arrow"] += cpu(lambda spans=spans: to_arrow(spans))
        for k, v in times.items():
            best[k] = min(best.get(k, v), v)
    return {k: v / n * 1e6 for k, v in best.items()}


def presidio_rate(texts: list[str], seconds: float) -> float | None:
    try:
        from evalsi.processors.redact.presidio import PresidioEngine
        from evalsi.processors.redact.rules import Hasher

        engine = PresidioEngine(RedactConfig(presidio={"enabled": True}).presidio, Hasher("sha256"))
        engine.load()
    except Exception as e:  # not installed: `pip install 'evalsi[presidio]'`
        log(f"presidio: not measured ({type(e).__name__}: {e})")
        return None
    engine.redact(texts[:2])  # warm-up
    done = 0
    t0 = time.process_time()
    while time.process_time() - t0 < seconds:
        engine.redact(texts[done % len(texts) : done % len(texts) + 20])
        done += len(texts[done % len(texts) : done % len(texts) + 20])
    return done / (time.process_time() - t0)


def content_texts(bodies: list[bytes], limit: int) -> tuple[list[str], float]:
    """The strings redaction scans in the benchmark's spans (attribute and canonical texts), and how many per span."""
    spans = decode_traces_protobuf(bodies[0]).batch.spans
    texts: list[str] = []
    for s in spans:
        normalize_span(s)
        texts.append(s.attributes["gen_ai.input.messages"])
        texts += [p["content"] for m in s.input or [] for p in m["parts"] if p.get("content")]
    return texts[:limit], len(texts) / len(spans)


def serve(args: argparse.Namespace, bodies: list[bytes], with_redact: bool, workdir: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(dir=workdir))
    config = serve_config(tmp / "store")
    config["exporters"]["clickhouse"].pop("flush_interval", None)  # product defaults, as benchmarks/ingest.py
    processors = ["normalize", "redact"] if with_redact else ["normalize"]
    if with_redact:
        config["processors"]["redact"] = {}
    for pipeline in config["service"]["pipelines"].values():
        pipeline["processors"] = processors
    c = start_collector(tmp, config)
    spans = len(bodies) * args.spans_per_request
    try:
        poller = ingest.StorePoller(c.metrics, 0.05, 600)
        cpu0, sys0, t0 = ingest.cpu_seconds(c.proc.pid), ingest.system_busy_seconds(), time.perf_counter()
        client0 = time.process_time()
        poller.start()
        sent = ingest.send_all("http", c, bodies, args.spans_per_request, args.concurrency)
        poller.target = sent.accepted_spans
        poller.join()
        t1 = poller.done_at or time.perf_counter()
        server = ingest.cpu_seconds(c.proc.pid) - cpu0
        other = ingest.system_busy_seconds() - sys0 - server - (time.process_time() - client0)
    finally:
        code = c.stop()
    if sent.accepted_spans != spans or poller.done_at is None or code != 0:
        raise SystemExit(f"FAIL serve run: accepted {sent.accepted_spans}/{spans}, stored {poller.stored}, exit {code}")
    return {
        "pipeline": " -> ".join(processors),
        "stored_per_s": spans / (t1 - t0),
        "server_us_per_span": server / spans * 1e6,
        "other_cpu_pct": max(0.0, 100 * other / (t1 - t0)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--spans", type=int, default=20_000, help="spans for the in-process measurements")
    p.add_argument("--spans-per-request", type=int, default=500)
    p.add_argument("--content-bytes", type=int, default=1024, help="size of the gen_ai.input.messages attribute")
    p.add_argument("--repeats", type=int, default=3, help="in-process: best of this many passes")
    p.add_argument("--presidio-seconds", type=float, default=5.0, help="CPU seconds spent on each Presidio rate")
    p.add_argument("--serve", action="store_true", help="also compare a real `evalsi serve` without and with redact")
    p.add_argument("--serve-spans", type=int, default=100_000)
    p.add_argument("--serve-rounds", type=int, default=2, help="runs of each pipeline, alternated; medians compared")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)

    n_requests = max(1, args.spans // args.spans_per_request)
    figures: dict[str, Any] = {"spans": n_requests * args.spans_per_request}
    for name, pii in (("clean", False), ("pii", True)):
        log(f"in-process, {name} spans: {n_requests} requests x {args.spans_per_request}")
        us = in_process(payloads(args, pii, n_requests), args.repeats)
        floor = us["decode"] + us["normalize"] + us["to_arrow"]
        figures[name] = {
            "us_per_span": {k: round(v, 2) for k, v in us.items()},
            "normalize_per_s": 1e6 / us["normalize"],
            "redact_per_s": 1e6 / us["redact"],
            "redact_vs_normalize": us["redact"] / us["normalize"],
            "redact_share_of_floor": us["redact"] / (floor + us["redact"]),
        }

    bodies = payloads(args, False, 1)
    texts, per_span = content_texts(bodies, 200)
    short = [PII.strip()] * 50
    log("presidio: texts/s on the benchmark's content strings and on short prompts")
    figures["presidio"] = {
        "texts_per_span": per_span,
        "content_texts_per_s": presidio_rate(texts, args.presidio_seconds),
        "short_texts_per_s": presidio_rate(short, args.presidio_seconds),
    }

    if args.serve:
        serve_requests = max(1, args.serve_spans // args.spans_per_request)
        with tempfile.TemporaryDirectory(prefix="evalsi-redact-bench-") as workdir:
            runs: list[dict[str, Any]] = []
            bodies = payloads(args, False, serve_requests)
            # alternated, so that load from elsewhere on the machine falls on both alike
            for round_ in range(args.serve_rounds):
                for with_redact in (False, True):
                    pipeline = "normalize -> redact" if with_redact else "normalize"
                    log(f"serve {round_ + 1}/{args.serve_rounds}: {pipeline}, "
                        f"{len(bodies) * args.spans_per_request} spans over HTTP")  # fmt: skip
                    runs.append(serve(args, bodies, with_redact, Path(workdir)))
        figures["serve"] = runs

    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    spans = f"{figures['spans']:,} spans of ~{args.content_bytes} B"
    print(f"in-process, µs of CPU per span (best of {args.repeats}, {spans})")
    print("  spans   decode  normalize  redact  to_arrow   normalize/s    redact/s  redact÷normalize  redact share")
    for name in ("clean", "pii"):
        f = figures[name]
        u = f["us_per_span"]
        print(f"  {name:6} {u['decode']:7.1f} {u['normalize']:10.1f} {u['redact']:7.1f} {u['to_arrow']:9.1f} "
              f"{f['normalize_per_s']:13,.0f} {f['redact_per_s']:11,.0f} {f['redact_vs_normalize']:17.2f} "
              f"{100 * f['redact_share_of_floor']:11.1f}%")  # fmt: skip
    print("  (redact share: of decode + normalize + redact + to_arrow, the in-process floor of the spine)")
    pr = figures["presidio"]
    normalize_rate = figures["clean"]["normalize_per_s"]
    if pr["content_texts_per_s"]:
        spans_rate = pr["content_texts_per_s"] / pr["texts_per_span"]
        print(f"presidio (pattern recognizers): {pr['content_texts_per_s']:,.0f} content texts/s "
              f"({pr['texts_per_span']:.1f} per span: {spans_rate:,.0f} spans/s, "
              f"{spans_rate / normalize_rate:.3f}x normalize)")  # fmt: skip
        print(f"  short prompts (e-mail, phone, card): {pr['short_texts_per_s']:,.0f} texts/s")
    if "serve" in figures:
        print("evalsi serve over HTTP:")
        for r in figures["serve"]:
            print(f"  {r['pipeline']:22} stored {r['stored_per_s']:7,.0f}/s  "
                  f"server {r['server_us_per_span']:5.0f} µs/span  other CPU {r['other_cpu_pct']:3.0f}%")  # fmt: skip
        med = {
            (p, k): statistics.median(r[k] for r in figures["serve"] if r["pipeline"] == p)
            for p in {r["pipeline"] for r in figures["serve"]}
            for k in ("stored_per_s", "server_us_per_span")
        }
        base, red = "normalize", "normalize -> redact"
        cost = 1 - med[red, "stored_per_s"] / med[base, "stored_per_s"]
        cpu_cost = med[red, "server_us_per_span"] / med[base, "server_us_per_span"] - 1
        print(f"  medians: redact costs {100 * cost:.1f}% of stored spans/s, "
              f"{100 * cpu_cost:.1f}% more server CPU per span (goal: < {100 * GOAL:.0f}%)")  # fmt: skip
    share = figures["clean"]["redact_share_of_floor"]
    print(f"goal (< {100 * GOAL:.0f}% of the spine): in-process share {100 * share:.1f}% "
          f"{'met' if share < GOAL else 'MISSED'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
