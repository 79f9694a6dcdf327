"""Online evaluation benchmark: traces/s through a policy in-process, and score freshness in a real `evalsi serve`.

1. **Throughput** (in-process, CPU time of one thread, best of `--rounds`): realistic 5-span agent traces (pre-encoded
   OTLP, decoded with the real decoder and normalized) through `PolicySet.evaluate_trace` with one policy that has a
   CEL selector and three deterministic evaluators (builtin/contains, builtin/latency, builtin/tokens). Baselines
   over the same traces: `build_trajectory` alone, and the same policy with a selector that matches nothing.
2. **Freshness** (`--serve`, on by default): `evalsi serve` with normalize -> tail_sampling (decision_wait 200ms)
   -> evaluate and a scores pipeline to the embedded store; `--rate` traces/s for `--seconds` over OTLP/HTTP. Reports
   the `evalsi_evaluate_freshness_seconds` histogram (p50/p95 by bucket interpolation: trace handed to `evaluate`
   -> scores handed to the scores pipeline) and an end-to-end figure measured by polling `GET /api/v1/scores`: from
   the trace's root span end (client clock) to the first time one of its scores is readable. The end-to-end figure
   includes tail sampling's decision_wait and the exporter's flush interval.

Run `python benchmarks/evaluate.py --help`; see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan, Status

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from ingest import (  # noqa: E402
    PROTOBUF,
    _kv,
    cpu_seconds,
    log,
    metric_sum,
    serve_config as _serve_config,
    start_collector,
)

from evalsi.model.span import Span  # noqa: E402
from evalsi.model.trajectory import build_trajectory  # noqa: E402
from evalsi.processors.normalize import normalize_span  # noqa: E402
from evalsi.receivers.otlp.decode import decode_traces_protobuf  # noqa: E402

if TYPE_CHECKING:
    from evalsi.policies import PolicySet

POLICY_NAME = "bench-support-agent"
SELECTOR = "span.attributes['app.route'] == 'support' && trace.llm_calls > 0"
NOTHING = "span.attributes['app.route'] == 'no-such-route' && trace.llm_calls > 0"
POLICY = """\
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: {name}}}
spec:
  selector: "{selector}"
  sampling: {{rate: 1.0}}
  cascade:
    - ref: builtin/contains
      params: {{any: [order], none: ["I cannot help"], case_insensitive: true}}
    - ref: builtin/latency
      params: {{max_ms: 30000}}
    - ref: builtin/tokens
      params: {{max_total: 20000}}
"""
GOAL_TRACES_PER_S = 5_000
GOAL_FRESHNESS_P95 = 2.0

QUESTIONS = [
    "Where is my order {o}? It was due on Monday.",
    "Please refund order {o}, the package arrived damaged.",
    "Can you change the shipping address for order {o}?",
    "My invoice for order {o} shows the wrong amount.",
]
ANSWERS = [
    "Your order {o} shipped yesterday and should arrive on Thursday.",
    "I have started a refund for order {o}; you will see it within 5 business days.",
    "The shipping address for order {o} is updated to the new one you gave.",
    "I corrected the invoice for order {o} and sent you the new copy.",
]
SYSTEM = "You are a helpful support assistant. Answer briefly and cite the order number when relevant."


def _msgs(*messages: dict[str, Any]) -> str:
    return json.dumps(list(messages), separators=(",", ":"))


def _text(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


# --- traces ----------------------------------------------------------------------------------------------


def agent_request(n: int, run_tag: int, end_ns: int, seed: int = 7) -> bytes:
    """One encoded request holding one agent trace of 5 spans ending at `end_ns`: `invoke_agent` (root, with
    `app.route`), `chat` asking for two tools, two `execute_tool` spans, and a final `chat` with the answer. Content
    in the OTel GenAI message format; token usage on both chat spans."""
    rng = random.Random(seed * 1_000_003 + n)
    order = f"A{rng.randint(10000, 99999)}"
    k = n % len(QUESTIONS)
    question, answer = QUESTIONS[k].format(o=order), ANSWERS[k].format(o=order)
    tid = run_tag.to_bytes(4, "big") + n.to_bytes(12, "big")
    ids = [(n * 8 + i + 1).to_bytes(8, "big") for i in range(5)]
    duration = rng.randint(1_500, 4_000) * 1_000_000
    start = end_ns - duration
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(
        [
            _kv("service.name", "support-bot"),
            _kv("service.version", "1.4.2"),
            _kv("deployment.environment.name", "bench"),
        ]
    )
    ss = rs.scope_spans.add()
    ss.scope.name = "support.agent"
    conv = f"conv-{run_tag:04x}-{n // 3:06x}"

    def add(i: int, name: str, t0: int, t1: int, kind: int, attrs: list[Any]) -> None:
        s = ss.spans.add()
        s.trace_id, s.span_id = tid, ids[i]
        if i:
            s.parent_span_id = ids[0]
        s.name, s.kind = name, kind
        s.start_time_unix_nano, s.end_time_unix_nano = t0, t1
        s.status.code = Status.STATUS_CODE_OK
        s.attributes.extend(attrs)

    calls = [
        {"type": "tool_call", "id": f"call_{n}_1", "name": "lookup_order", "arguments": {"order_id": order}},
        {"type": "tool_call", "id": f"call_{n}_2", "name": "get_customer", "arguments": {"order_id": order}},
    ]
    user = _text("user", question)
    t = [start + (duration * q) // 10 for q in range(11)]
    add(0, "invoke_agent support-agent", start, end_ns, PbSpan.SPAN_KIND_INTERNAL, [
        _kv("gen_ai.operation.name", "invoke_agent"), _kv("gen_ai.agent.name", "support-agent"),
        _kv("gen_ai.conversation.id", conv), _kv("app.route", "support"), _kv("enduser.id", f"user-{n % 97}"),
    ])  # fmt: skip
    add(1, "chat gpt-4o-mini", t[0] + 1_000_000, t[4], PbSpan.SPAN_KIND_CLIENT, [
        _kv("gen_ai.operation.name", "chat"), _kv("gen_ai.provider.name", "openai"),
        _kv("gen_ai.request.model", "gpt-4o-mini"), _kv("gen_ai.response.model", "gpt-4o-mini-2024-07-18"),
        _kv("gen_ai.usage.input_tokens", rng.randint(300, 1500)),
        _kv("gen_ai.usage.output_tokens", rng.randint(20, 60)),
        _kv("gen_ai.response.finish_reasons", ["tool_calls"]), _kv("gen_ai.conversation.id", conv),
        _kv("gen_ai.input.messages", _msgs(_text("system", SYSTEM), user)),
        _kv("gen_ai.output.messages", _msgs({"role": "assistant", "parts": calls, "finish_reason": "tool_calls"})),
    ])  # fmt: skip
    for j, (i, call) in enumerate(((2, calls[0]), (3, calls[1]))):
        result = {"order_id": order, "status": "shipped"} if j == 0 else {"customer": f"c-{n % 500}", "tier": "gold"}
        add(i, f"execute_tool {call['name']}", t[4] + 1_000_000, t[5 + j], PbSpan.SPAN_KIND_INTERNAL, [
            _kv("gen_ai.operation.name", "execute_tool"), _kv("gen_ai.tool.name", call["name"]),
            _kv("gen_ai.tool.call.id", call["id"]), _kv("gen_ai.tool.type", "function"),
            _kv("gen_ai.tool.call.arguments", json.dumps(call["arguments"])),
            _kv("gen_ai.tool.call.result", json.dumps(result)),
        ])  # fmt: skip
    tool_msgs = [
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": c["id"], "response": "ok"}]} for c in calls
    ]
    add(4, "chat gpt-4o-mini", t[6] + 1_000_000, end_ns - 1_000_000, PbSpan.SPAN_KIND_CLIENT, [
        _kv("gen_ai.operation.name", "chat"), _kv("gen_ai.provider.name", "openai"),
        _kv("gen_ai.request.model", "gpt-4o-mini"), _kv("gen_ai.response.model", "gpt-4o-mini-2024-07-18"),
        _kv("gen_ai.usage.input_tokens", rng.randint(600, 2500)),
        _kv("gen_ai.usage.output_tokens", rng.randint(20, 120)),
        _kv("gen_ai.response.finish_reasons", ["stop"]), _kv("gen_ai.conversation.id", conv),
        _kv("gen_ai.input.messages", _msgs(_text("system", SYSTEM), user,
            {"role": "assistant", "parts": calls}, *tool_msgs)),
        _kv("gen_ai.output.messages", _msgs({**_text("assistant", answer), "finish_reason": "stop"})),
    ])  # fmt: skip
    return req.SerializeToString()


def normalized_traces(n: int) -> list[list[Span]]:
    """`n` traces as the `evaluate` processor gets them: decoded by the OTLP receiver's decoder, then normalized."""
    now = time.time_ns()
    out = []
    for i in range(n):
        spans = decode_traces_protobuf(agent_request(i, 1, now - (n - i) * 50_000_000)).batch.spans
        for s in spans:
            normalize_span(s)
        out.append(spans)
    return out


def write_policy(directory: Path, selector: str, name: str = POLICY_NAME) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(POLICY.format(name=name, selector=selector.replace('"', '\\"')))
    return path


def policy_set(directory: Path, selector: str) -> PolicySet:
    # imported here: `import evalsi.policies` before `evalsi.processors` is a circular import today
    from evalsi.policies import load_policies

    path = write_policy(directory, selector)
    return load_policies([str(path)], directory, datasets_dir=directory / "datasets")


# --- 1. throughput ---------------------------------------------------------------------------------------


def best_rate(traces: list[list[Span]], fn: Any, rounds: int) -> float:
    """Traces per CPU-second of `fn(spans)` over every trace, best of `rounds` (one warm-up pass first)."""
    for spans in traces[:50]:
        fn(spans)
    best = 0.0
    for _ in range(rounds):
        t0 = time.thread_time()
        for spans in traces:
            fn(spans)
        elapsed = time.thread_time() - t0
        best = max(best, len(traces) / elapsed if elapsed > 0 else float("inf"))
    return best


def throughput(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    log(f"building {args.traces} agent traces (decode + normalize) ...")
    traces = normalized_traces(args.traces)
    full = policy_set(tmp / "full", SELECTOR)
    empty = policy_set(tmp / "nothing", NOTHING)
    # check the benchmark measures what it says: every trace selected, three scored scores each
    sample = full.evaluate_trace(traces[0])
    outcomes = {s.name: (s.outcome, s.passed) for s in sample}
    if outcomes != {"contains": ("scored", True), "latency": ("scored", True), "tokens": ("scored", True)}:
        raise SystemExit(f"FAIL [policy] unexpected scores on a benchmark trace: {outcomes}")
    if empty.evaluate_trace(traces[0]):
        raise SystemExit("FAIL [policy] the match-nothing selector scored a trace")
    rates = {
        "build_trajectory": best_rate(traces, build_trajectory, args.rounds),
        "selector matches nothing": best_rate(traces, empty.evaluate_trace, args.rounds),
        "policy (CEL + 3 evaluators)": best_rate(traces, full.evaluate_trace, args.rounds),
    }
    stats = full.stats[POLICY_NAME]
    if stats.selected != stats.seen:
        raise SystemExit(f"FAIL [policy] selected {stats.selected} of {stats.seen} traces")
    return rates


# --- 2. freshness ----------------------------------------------------------------------------------------


def histogram_quantiles(text: str, name: str, qs: tuple[float, ...]) -> dict[str, float | None]:
    """Quantiles from a Prometheus histogram by linear interpolation inside the bucket (as histogram_quantile)."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "_bucket{"):
            continue
        labels, value = line.rsplit(" ", 1)
        le = labels.split('le="', 1)[1].split('"', 1)[0]
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + float(value)
    out: dict[str, float | None] = {}
    bounds = sorted(buckets)
    total = buckets.get(float("inf"), 0.0)
    for q in qs:
        key = f"p{round(q * 100)}"
        if total <= 0:
            out[key] = None
            continue
        rank = q * total
        prev_bound, prev_count = 0.0, 0.0
        for b in bounds:
            c = buckets[b]
            if c >= rank:
                if b == float("inf"):
                    out[key] = prev_bound  # past the last finite bucket: its bound is all we know
                else:
                    frac = (rank - prev_count) / (c - prev_count) if c > prev_count else 1.0
                    out[key] = prev_bound + (b - prev_bound) * frac
                break
            prev_bound, prev_count = b, c
    out["count"] = total
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class ScorePoller(threading.Thread):
    """Polls `GET /api/v1/scores?policy=...&limit=...` (newest first) and records when each trace id first shows."""

    def __init__(self, api: str, interval: float, limit: int) -> None:
        super().__init__(daemon=True)
        self.url = api + "/api/v1/scores"
        self.params = {"policy": POLICY_NAME, "limit": limit}
        self.interval = interval
        self.first_seen: dict[str, float] = {}
        self.polls = 0
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._halt.is_set():
                t0 = time.time()
                try:
                    resp = client.get(self.url, params=self.params)
                    rows = resp.json()["scores"] if resp.status_code == 200 else []
                    if resp.status_code != 200:
                        self.errors += 1
                except (httpx.HTTPError, ValueError):
                    rows = []
                    self.errors += 1
                seen = time.time()  # the answer is in hand: scores in it were readable by now
                self.polls += 1
                for r in rows:
                    self.first_seen.setdefault(r["trace_id"], seen)
                self._halt.wait(max(0.0, self.interval - (time.time() - t0)))

    def stop(self) -> None:
        self._halt.set()
        self.join()


def freshness(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    write_policy(tmp / "policies", SELECTOR)
    cfg = _serve_config(tmp / "store")
    exporter = cfg["exporters"]["clickhouse"]
    if args.flush_interval is None:
        exporter.pop("flush_interval", None)  # the product default
    else:
        exporter["flush_interval"] = args.flush_interval
    cfg["processors"]["tail_sampling"] = {"decision_wait": args.decision_wait}
    cfg["processors"]["evaluate"] = {"policies": ["policies/*.yaml"]}
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
    pipelines["scores"] = {"exporters": ["clickhouse"]}
    c = start_collector(tmp, cfg)
    total = int(args.rate * args.seconds)
    run_tag = random.randrange(1, 2**31)
    sent: dict[str, float] = {}  # trace id -> root span end, client wall clock (seconds)
    errors: list[str] = []
    profiler = None
    t_start = profile_seconds = 0.0
    try:
        if args.profile:
            from ingest import start_profiler

            Path(args.profile).mkdir(parents=True, exist_ok=True)
            profiler = start_profiler(c.proc.pid, Path(args.profile) / "serve.raw", 100, [])
        poller = ScorePoller(c.api, args.poll_interval, limit=max(100, int(args.rate * 3 * 10)))
        poller.start()
        cpu0 = cpu_seconds(c.proc.pid)
        log(f"sending {total} traces at {args.rate:g}/s for {args.seconds:g} s ...")
        t_start = time.perf_counter()
        with httpx.Client(timeout=30, headers={"Content-Type": PROTOBUF}) as client:
            for n in range(total):
                due = t_start + n / args.rate
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                end_ns = time.time_ns()
                body = agent_request(n, run_tag, end_ns)
                trace_id = (run_tag.to_bytes(4, "big") + n.to_bytes(12, "big")).hex()
                sent[trace_id] = end_ns / 1e9
                try:
                    resp = client.post(c.http + "/v1/traces", content=body)
                    if resp.status_code != 200:
                        errors.append(f"trace {n}: HTTP {resp.status_code}")
                except httpx.HTTPError as e:
                    errors.append(f"trace {n}: {type(e).__name__}: {e}")
        send_seconds = time.perf_counter() - t_start
        deadline = time.monotonic() + args.drain_timeout
        while time.monotonic() < deadline and not set(sent) <= set(poller.first_seen):
            time.sleep(0.1)
        poller.stop()
        cpu = cpu_seconds(c.proc.pid) - cpu0
        metrics = httpx.get(c.metrics).text
    finally:
        if profiler is not None:
            from ingest import stop_profiler

            stop_profiler(profiler)
            profile_seconds = time.perf_counter() - t_start
        rc = c.stop()
    if rc != 0:
        errors.append(f"evalsi serve exited {rc}")
    lags = [poller.first_seen[t] - end for t, end in sent.items() if t in poller.first_seen]
    hist = histogram_quantiles(metrics, "evalsi_evaluate_freshness_seconds", (0.5, 0.95, 0.99))
    evaluated = metric_sum(metrics, "evalsi_evaluate_traces_total")
    eval_sum = metric_sum(metrics, "evalsi_evaluate_seconds_sum")
    eval_count = metric_sum(metrics, "evalsi_evaluate_seconds_count")
    if profiler is not None:
        from ingest import print_profile, summarize_profile

        print_profile(summarize_profile(Path(args.profile) / "serve.raw", profile_seconds, 100, 25))
    missing = len(sent) - len(lags)
    if missing:
        errors.append(f"{missing} of {len(sent)} traces had no score within {args.drain_timeout:g} s after sending")
    return {
        "sent": len(sent),
        "send_seconds": send_seconds,
        "evaluated": evaluated,
        "scored_traces": len(lags),
        "metric": hist,
        "e2e": {
            "p50": percentile(lags, 0.5),
            "p95": percentile(lags, 0.95),
            "p99": percentile(lags, 0.99),
            "max": max(lags, default=None),
        },
        "evaluate_ms_mean": 1000 * eval_sum / eval_count if eval_count else None,
        "server_cpu": cpu / send_seconds if send_seconds else None,
        "polls": poller.polls,
        "poll_errors": poller.errors,
        "errors": errors,
    }


# --- main ------------------------------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:,.0f} ms"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--traces", type=int, default=5_000, help="traces for the in-process throughput (default 5000)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per measurement, best taken (default 5)")
    p.add_argument("--no-serve", dest="serve", action="store_false", help="skip the freshness run")
    p.add_argument("--rate", type=float, default=20.0, help="traces/s sent to evalsi serve (default 20)")
    p.add_argument("--seconds", type=float, default=30.0, help="how long to send (default 30)")
    p.add_argument("--decision-wait", default="200ms", help="tail_sampling decision_wait (default 200ms)")
    p.add_argument("--flush-interval", default=None, help="clickhouse exporter flush_interval (default: product's)")
    p.add_argument("--poll-interval", type=float, default=0.05, help="seconds between score polls (default 0.05)")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="wait for the last scores at most (default 30)")
    p.add_argument("--profile", default=None, help="DIR: py-spy flamegraph of evalsi serve during the freshness run")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="evalsi-bench-evaluate-"))
    failed = False
    try:
        rates = throughput(args, tmp / "inproc")
        fresh = freshness(args, tmp / "serve") if args.serve else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    policy_rate = rates["policy (CEL + 3 evaluators)"]
    if args.json:
        print(json.dumps({"traces_per_cpu_second": rates, "freshness": fresh}, indent=2))
    else:
        print(f"\nthroughput: {args.traces} 5-span agent traces, traces per CPU-second of one thread, best of "
              f"{args.rounds}")  # fmt: skip
        base = rates["build_trajectory"]
        for name, r in rates.items():
            print(f"  {name:<30} {r:>10,.0f}/s   {1e6 / r:>7.1f} µs/trace   ({r / base:.2f}x build_trajectory)")
        met = "met" if policy_rate >= GOAL_TRACES_PER_S else "MISSED"
        print(f"  goal >= {GOAL_TRACES_PER_S:,} traces/s per core: {met}")
        if fresh is not None:
            m, e = fresh["metric"], fresh["e2e"]
            print(f"\nfreshness: {fresh['sent']} traces at {args.rate:g}/s over {fresh['send_seconds']:.1f} s, "
                  f"decision_wait {args.decision_wait}, exporter flush_interval "
                  f"{args.flush_interval or 'default'}; {fresh['evaluated']:.0f} evaluated, "
                  f"{fresh['scored_traces']} with scores read back")  # fmt: skip
            print(f"  evalsi_evaluate_freshness_seconds (handed to evaluate -> scores handed on), "
                  f"{m['count']:.0f} obs:  p50 {_ms(m['p50'])}  p95 {_ms(m['p95'])}  p99 {_ms(m['p99'])}")  # fmt: skip
            print(f"  end to end (root span end -> score readable via API, incl. decision_wait + flush):  "
                  f"p50 {_ms(e['p50'])}  p95 {_ms(e['p95'])}  p99 {_ms(e['p99'])}  max {_ms(e['max'])}")  # fmt: skip
            print(f"  evaluate_seconds mean {fresh['evaluate_ms_mean'] or 0:.2f} ms; server CPU "
                  f"{100 * (fresh['server_cpu'] or 0):.0f}% of a core; {fresh['polls']} polls every "
                  f"{args.poll_interval * 1000:.0f} ms")  # fmt: skip
            p95 = e["p95"]
            met = "met" if p95 is not None and p95 < GOAL_FRESHNESS_P95 else "MISSED"
            print(f"  goal end-to-end p95 < {GOAL_FRESHNESS_P95:g} s: {met}")
    if policy_rate < GOAL_TRACES_PER_S:
        log(f"NOTE: {policy_rate:,.0f} traces/s is under the goal of {GOAL_TRACES_PER_S:,}")
    if fresh is not None:
        for err in fresh["errors"]:
            print(f"FAIL [serve] {err}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
