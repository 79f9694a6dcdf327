"""Chaos benchmark: what a real `evalsi serve` keeps of what it acknowledged under overload, a store outage, a crash and
poison spans.

Each scenario starts its own `evalsi serve` (tests/running_collector.py, every endpoint on 127.0.0.1) with
memory_limiter (a only) -> normalize -> tail_sampling (holding each trace `--decision-wait`) -> the clickhouse
exporter, and sends pre-encoded GenAI span requests (those of benchmarks/ingest.py) over OTLP/HTTP from `--senders`
threads that behave as OTLP clients do: a request refused with 429/503 is sent again after its `Retry-After`, one
that hits a closed or reset connection is sent again after 1 s, and a sender whose queue is full drops new requests
(an SDK's batch processor does the same). Request r's trace ids carry r, so the store tells which request every span
came from.

- a, overload: `--overload` x the collector's capacity (measured first, or `--rate`) for `--duration` seconds, the
  memory_limiter's hard limit `--headroom-mib` above the idle memory: every refusal must carry Retry-After, the memory
  is compared with the limits, and no acknowledged span may be lost. `--store server` puts the store in a
  ClickHouse-HTTP stand-in process, so the collector's memory is evalsi's alone (without the embedded engine's).
- b, store outage: the store is a ClickHouse-HTTP stand-in (tests/clickhouse_http.py) in its own process; it is
  killed (SIGKILL) mid-load and started again on the same data and port `--duration` seconds later. The exporter
  queues and retries, receivers refuse with Retry-After once its queue (`--queue-size`) is full (the design says 503; a
  429 is printed as a note); no acknowledged span may be lost.
- c, crash: `evalsi serve` is killed (SIGKILL) mid-load and started again on the same store. With
  `--durability wal` (the default) every request is on disk before it is answered and the restart replays the log:
  no acknowledged span may be lost, and the rows stored twice are counted (a request answered just before the kill
  whose answer never reached its sender is sent again: at-least-once). With `--durability memory` what was held in
  memory is lost, and this scenario measures how much. The restarted collector must open the store and exit cleanly.
- d, poison: invalid spans (bad ids, a start past 2**63-1) and valid spans with hostile values (tests/hostile_otlp.py)
  inside a stream of valid load: exactly the invalid spans are rejected (partial_success), every valid span stored.
- e, regex attack: during `--warmup` + `--duration` s of load, a client POSTs `/v1/evaluate` with builtin/regex
  `^(a+)+$` over 'a' * n + '!' (n 27..40, 64, 1,000, 100,000; exponential in a backtracking engine) one request after
  another, another GETs `/healthz` every 20 ms: /healthz p50/p99/max before and during the attack (target p99 <
  100 ms), the /v1/evaluate answer times by n, stored spans/s before and during, and the seconds SIGTERM takes to
  stop the collector while the attack goes on.
- f, the log's disk full: `durability: wal` on a tmpfs of `--wal-disk-mib` (mounted: needs root); after `--warmup` s
  a filler file keeps it full for `--duration` s (it takes back what the log frees), is deleted, `--after` s more
  load, kill -9, a restart on the same store and log (replay), `--after` s more. Writes that fail must be answered
  503 with Retry-After and cut back; no acknowledged span lost; every span stored twice is accounted by what its
  request's sender saw (only a request in flight at the kill, whose 200 may have been lost, may be).
- g, two projects: strict auth with two project-bound keys; both send the same trace and span ids (b `--project-lag`
  s after a, its own content and a `chaos.sender` resource attribute), kill -9 after `--warmup` s, a restart (WAL
  replay), `--after` s more. Each project's spans read back through the API with each key (a sample of traces) and
  from the store by `evalsi.project`: none missing, none of the other project's.

At the end of each scenario the collector is stopped (SIGTERM), the store opened from another process, and every
acknowledged request's spans looked up by id: `lost` is spans acknowledged and not stored. Exit status 1 on any
loss where the design promises none, or any other broken promise (a `FAIL` line says which).
Run `python benchmarks/chaos.py --help`; figures in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ingest  # noqa: E402  (the payloads, the /proc readers, the metrics parser; it puts tests/ on the path)
from clickhouse_http import StandInProcess, start_stand_in  # noqa: E402
from hostile_otlp import BIG_SIZES, DOUBLES, MAX_NS, NUMERIC_STRINGS, deep_value  # noqa: E402
from ingest import cpu_seconds, log, metric_sum  # noqa: E402
from pipeline import peak_rss_mb  # noqa: E402
from running_collector import Collector, serve_config, start_collector, wait_until  # noqa: E402

from evalsi.processors.memory_limiter import anonymous_resident_bytes  # noqa: E402


def anonymous_bytes(pid: int) -> int:
    """What the memory_limiter measures of a process (0 once it is gone)."""
    return anonymous_resident_bytes(pid) or 0


PROTOBUF = "application/x-protobuf"
TRACE_MARK = b"\xf7\xf7\xf7\xf7"  # bytes 4-8 of every trace id in a template: not UTF-8, so in no string
TEXT_MARK = b"~~~~~~~~"  # in response and conversation ids: replaced by the request number in hex
CONNECTION_RETRY_S = 1.0  # a sender's wait after a closed or reset connection
RECONNECT = -1.0
MAX_RETRY_AFTER_S = 60.0  # a sender waits at most this long, whatever Retry-After says
POLL_S = 0.5  # metrics and memory are read this often
SCENARIOS = {
    "a": "overload (memory_limiter, tail_sampling holding traces)",
    "b": "store unavailable (SIGKILL of the ClickHouse stand-in), then back",
    "c": "kill -9 of evalsi serve, restart on the same store and write-ahead log",
    "d": "poison spans in a stream of valid load",
    "e": "pathological regex on /v1/evaluate during load: /healthz, ingest, SIGTERM",
    "f": "the write-ahead log's disk full during load, freed, then kill -9 and replay",
    "g": "two projects sending the same trace and span ids, kill -9 and replay midway",
}
SENDER_ATTRIBUTE = "chaos.sender"  # (g) a resource attribute naming the sender, so the store tells whose a span is


# --- requests ----------------------------------------------------------------------------------------------------


@dataclass
class Poison:
    """What a poison request adds to the plain one: spans the collector must reject, and valid spans with hostile values
    it must store."""

    invalid: list[str]  # reasons, one span each
    hostile: list[str]  # features, one valid span (its own trace) each


class Requests:
    """Request bodies stamped from one encoded template: request r's trace ids carry r in bytes 4-8, its response and
    conversation ids carry it in hex. Every `poison_every`-th request (0: none) is the poison template."""

    def __init__(self, args: argparse.Namespace, tag: int, poison_every: int = 0, sender: str = "") -> None:
        """`sender` (g): a resource attribute naming it, and content of its own (another seed)."""
        self.spans_per_request = args.spans_per_request
        self.tag = tag
        self.poison_every = poison_every
        self.sender = sender
        seed = args.seed + (1000 * (ord(sender[0]) - ord("a") + 1) if sender else 0)
        template = ingest.build_template(args.spans_per_request, args.content_bytes, seed)
        if sender:
            kv = template.resource_spans[0].resource.attributes.add()
            kv.key, kv.value.string_value = SENDER_ATTRIBUTE, sender
        self._stamp(template, args.spans_per_trace)
        self.plain = template.SerializeToString()
        self._check(self.plain, args.spans_per_request)
        self.poison = Poison([], [])
        self.poisoned = b""
        if poison_every:
            marks = add_poison(template, tag, self.poison)
            self.poisoned = template.SerializeToString()
            ExportTraceServiceRequest.FromString(self.poisoned)  # within protobuf's own limits (depth)
            self._check(self.poisoned, args.spans_per_request + marks)

    def _stamp(self, template: Any, spans_per_trace: int) -> None:
        start = time.time_ns() - 60_000_000_000
        spans = template.resource_spans[0].scope_spans[0].spans
        for i, s in enumerate(spans):
            t, pos = divmod(i, spans_per_trace)
            s.trace_id = self.tag.to_bytes(4, "big") + TRACE_MARK + (t + 1).to_bytes(8, "big")
            s.span_id = (i + 1).to_bytes(8, "big")
            s.parent_span_id = b"" if pos == 0 else (t * spans_per_trace + 1).to_bytes(8, "big")
            if pos == 0:  # the root spans its children; children run one after another
                s.start_time_unix_nano = start + t * 1_000_000
                s.end_time_unix_nano = s.start_time_unix_nano + 900_000_000 * spans_per_trace
            else:
                s.start_time_unix_nano = start + t * 1_000_000 + (pos - 1) * 900_000_000 + 1_000_000
                s.end_time_unix_nano = s.start_time_unix_nano + 150_000_000 + (i * 7919 % 750) * 1_000_000
            mark = TEXT_MARK.decode()
            s.attributes[ingest.RESPONSE_ID_ATTR].value.string_value = f"chatcmpl-{i:08x}{mark}"
            s.attributes[ingest.CONVERSATION_ATTR].value.string_value = f"conv-{self.tag:08x}{mark}{t:06x}"

    @staticmethod
    def _check(body: bytes, trace_marks: int) -> None:
        if body.count(TRACE_MARK) != trace_marks:  # a timestamp's bytes happen to hold the mark: try another --seed
            raise RuntimeError(f"the trace id mark occurs {body.count(TRACE_MARK)} times, not {trace_marks}")

    def is_poison(self, r: int) -> bool:
        return self.poison_every > 0 and r % self.poison_every == self.poison_every - 1

    def body(self, r: int) -> bytes:
        raw = self.poisoned if self.is_poison(r) else self.plain
        return raw.replace(TRACE_MARK, r.to_bytes(4, "big")).replace(TEXT_MARK, f"{r:08x}".encode())

    def valid_spans(self, r: int) -> int:
        return self.spans_per_request + (len(self.poison.hostile) if self.is_poison(r) else 0)

    def spans(self, r: int) -> int:
        return self.valid_spans(r) + (len(self.poison.invalid) if self.is_poison(r) else 0)


def add_poison(template: Any, tag: int, poison: Poison) -> int:
    """Append a resource of poison to `template`: spans the OTLP contract makes invalid (tests/hostile_otlp.py's
    reasons) and valid spans carrying hostile values (its values). Returns how many trace ids carry the mark."""
    rs = template.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "poison"
    spans = rs.scope_spans.add().spans
    now = time.time_ns() - 30_000_000_000
    marks = 0

    def span(name: str, k: int) -> Any:
        nonlocal marks
        s = spans.add()
        s.name, s.kind = name, Span.SPAN_KIND_INTERNAL
        s.trace_id = tag.to_bytes(4, "big") + TRACE_MARK + (0xFFFF_0000 + k).to_bytes(8, "big")
        s.span_id = (0x7F00_0000 + k).to_bytes(8, "big")
        s.start_time_unix_nano, s.end_time_unix_nano = now, now + 5_000_000
        marks += 1
        return s

    def attr(s: Any, key: str) -> Any:
        kv = s.attributes.add()
        kv.key = key
        return kv.value

    k = 0
    for feature in ("doubles", "token counts no count holds", "100 KB string", "nesting depth 20",
                    "end time past 2**64-1", "odd kind and status", "event time 2**64-1", "odd unicode"):  # fmt: skip
        s = span(f"hostile {feature}", k)
        k += 1
        poison.hostile.append(feature)
        if feature == "doubles":
            for j, d in enumerate(DOUBLES):
                attr(s, f"x.double.{j}").double_value = d
        elif feature == "token counts no count holds":
            attr(s, "gen_ai.operation.name").string_value = "chat"
            attr(s, "gen_ai.usage.input_tokens").string_value = NUMERIC_STRINGS[1]  # 23 nines
            attr(s, "gen_ai.usage.output_tokens").int_value = -1
        elif feature == "100 KB string":
            attr(s, "x.big").string_value = "x" * BIG_SIZES[-1]
        elif feature == "nesting depth 20":
            deep_value(attr(s, "x.deep"), 20, "mixed")
        elif feature == "end time past 2**64-1":
            s.end_time_unix_nano = 2**64 - 1
        elif feature == "odd kind and status":
            s.kind, s.status.code = 99, 99  # type: ignore[assignment]
        elif feature == "event time 2**64-1":
            ev = s.events.add()
            ev.name, ev.time_unix_nano = "late", 2**64 - 1
        else:
            attr(s, "x.text").string_value = "nul\x00 rtl\u202e bom\ufeff max\U0010ffff"
    for reason in ("short-trace-id", "long-trace-id", "zero-trace-id", "zero-span-id", "bad-parent-id",
                   "start-after-max"):  # fmt: skip
        s = span(f"poison {reason}", k)
        k += 1
        poison.invalid.append(reason)
        if reason == "short-trace-id":
            s.trace_id = s.trace_id[:15]
        elif reason == "long-trace-id":
            s.trace_id = s.trace_id + b"\x01"
        elif reason == "zero-trace-id":
            s.trace_id = bytes(16)
            marks -= 1
        elif reason == "zero-span-id":
            s.span_id = bytes(8)
        elif reason == "bad-parent-id":
            s.parent_span_id = b"\x01" * 7
        else:
            s.start_time_unix_nano = MAX_NS + 1
    return marks


# --- senders -----------------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the senders saw, request by request."""

    offered: int = 0  # requests made
    dropped: int = 0  # requests a sender's full queue dropped (never sent)
    sent: set[int] = field(default_factory=set)  # requests sent at least once
    acked: dict[int, tuple[int, int]] = field(default_factory=dict)  # request -> (accepted, rejected) spans
    acked_at: dict[int, float] = field(default_factory=dict)
    refusals: Counter[int] = field(default_factory=Counter)  # by HTTP status (429, 503)
    refusals_without_retry_after: int = 0
    retry_after_s: Counter[str] = field(default_factory=Counter)
    connection_errors: int = 0
    failures: list[str] = field(default_factory=list)  # answers not to retry (400, 500, ...)
    rejection_messages: Counter[str] = field(default_factory=Counter)
    answers: list[tuple[float, bool]] = field(default_factory=list)  # (when, refused) of each 200/429/503
    gave_up: set[int] = field(default_factory=set)  # never acknowledged by the end
    attempts: dict[int, list[tuple[float, str]]] = field(default_factory=dict)  # request -> (started, outcome) each
    refusal_messages: Counter[str] = field(default_factory=Counter)

    def acked_spans(self, before: float = float("inf")) -> int:
        return sum(a for r, (a, _) in self.acked.items() if self.acked_at[r] < before)


class Senders:
    """`threads` OTLP/HTTP senders sharing one queue of request numbers (at most `queue_limit` waiting)."""

    def __init__(
        self, requests: Requests, url: str, threads: int, queue_limit: int, headers: dict[str, str] | None = None
    ) -> None:
        self.requests = requests
        self.url = url  # where to send; a restarted collector listens elsewhere
        self.headers = {"Content-Type": PROTOBUF, **(headers or {})}
        self.tally = Tally()
        self._queue: collections.deque[int] = collections.deque()
        self._queue_limit = queue_limit
        self._busy = 0
        self._next = 0
        self._cv = threading.Condition()
        self._closed = False
        self._give_up_at = float("inf")
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def offer(self, n: int = 1) -> None:
        with self._cv:
            for _ in range(n):
                r, self._next = self._next, self._next + 1
                self.tally.offered += 1
                if len(self._queue) >= self._queue_limit:
                    self.tally.dropped += 1
                else:
                    self._queue.append(r)
            self._cv.notify_all()

    def waiting(self) -> int:
        with self._cv:
            return len(self._queue) + self._busy

    def finish(self, timeout: float) -> None:
        """No more requests; wait until every queued one is acknowledged, giving up after `timeout`."""
        with self._cv:
            self._closed = True
            self._give_up_at = time.monotonic() + timeout
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout + 2 * MAX_RETRY_AFTER_S)
        with self._cv:
            self.tally.gave_up.update(self._queue)
            self._queue.clear()

    def _run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        at = ""
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    break
                r = self._queue.popleft()
                self._busy += 1
            body = self.requests.body(r)
            try:
                while True:
                    if time.monotonic() > self._give_up_at:
                        with self._cv:
                            self.tally.gave_up.add(r)
                        break
                    if conn is None or at != self.url:
                        if conn is not None:
                            conn.close()
                        at = self.url
                        u = urlsplit(at)
                        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=60)
                    wait = self._send(conn, r, body)
                    if wait is None:
                        break
                    if wait == RECONNECT:
                        conn.close()
                        conn = None
                        wait = CONNECTION_RETRY_S
                    time.sleep(wait)
            finally:
                with self._cv:
                    self._busy -= 1
        if conn is not None:
            conn.close()

    def _send(self, conn: http.client.HTTPConnection, r: int, body: bytes) -> float | None:
        """One attempt; the seconds to wait before the next (RECONNECT: a new connection, after CONNECTION_RETRY_S),
        or None when the request is done with."""
        tally = self.tally
        started = time.monotonic()
        with self._cv:
            tally.sent.add(r)
        try:
            conn.request("POST", "/v1/traces", body=body, headers=self.headers)
            resp = conn.getresponse()
            content = resp.read()
        except (OSError, http.client.HTTPException):
            with self._cv:
                tally.connection_errors += 1
                tally.attempts.setdefault(r, []).append((started, "connection"))
            return RECONNECT
        now = time.monotonic()
        with self._cv:
            tally.attempts.setdefault(r, []).append((started, str(resp.status)))
        if resp.status == 200:
            answer = ExportTraceServiceResponse.FromString(content) if content else ExportTraceServiceResponse()
            rejected = answer.partial_success.rejected_spans
            with self._cv:
                tally.acked[r] = (self.requests.spans(r) - rejected, rejected)
                tally.acked_at[r] = now
                tally.answers.append((now, False))
                if rejected:
                    tally.rejection_messages[answer.partial_success.error_message[:120]] += 1
            return None
        if resp.status in (429, 503):
            header = resp.getheader("Retry-After")
            with self._cv:
                tally.refusals[resp.status] += 1
                tally.answers.append((now, True))
                text = "".join(ch for ch in content[:200].decode("utf-8", "replace") if ch.isprintable())
                tally.refusal_messages[f"{resp.status} {text}"] += 1
                if header is None:
                    tally.refusals_without_retry_after += 1
                else:
                    tally.retry_after_s[header] += 1
            try:
                return min(MAX_RETRY_AFTER_S, float(header)) if header else CONNECTION_RETRY_S
            except ValueError:  # an HTTP date: not what evalsi sends
                return CONNECTION_RETRY_S
        with self._cv:
            tally.failures.append(f"request {r}: HTTP {resp.status}: {content[:200]!r}")
        return None


class Offer(threading.Thread):
    """Makes requests for the senders: `rate` spans/s, or (rate None) as fast as they are taken."""

    def __init__(self, senders: Senders, rate: float | None, threads: int) -> None:
        super().__init__(daemon=True)
        self.senders = senders
        self.rate = rate
        self.threads = threads
        self._stop_event = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        made = 0
        while not self._stop_event.is_set():
            if self.rate is None:
                gap = self.threads - self.senders.waiting()
                if gap > 0:
                    self.senders.offer(gap)
            else:
                due = int((time.monotonic() - start) * self.rate / self.senders.requests.spans_per_request)
                if due > made:
                    self.senders.offer(due - made)
                    made = due
            self._stop_event.wait(0.02)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


# --- watching the collector ----------------------------------------------------------------------------------------


def labelled(text: str, name: str, label: str) -> float:
    """A metric summed over the series whose labels include `label` (e.g. `limit="soft"`)."""
    lines = text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name + "{") and label in line)


@dataclass
class Sample:
    at: float
    sent_spans: float
    queue: float
    tail_traces: float
    anon_mb: float
    limiter_mb: float
    refusing: float
    store_unavailable: float


class Monitor(threading.Thread):
    """Reads the collector's /metrics and its processes' memory every POLL_S."""

    def __init__(self, c: Collector) -> None:
        super().__init__(daemon=True)
        self.samples: list[Sample] = []
        self.text = ""  # the last /metrics read
        self.hwm_mb: dict[str, float] = {}
        self._stop_event = threading.Event()
        self.watch(c)

    def watch(self, c: Collector) -> None:
        self.c = c
        self.pids = [c.proc.pid, *c.ready.get("workers", [])]

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop_event.is_set():
                try:
                    text = client.get(self.c.metrics).text
                except httpx.HTTPError:
                    text = ""
                if text:
                    self.text = text
                self.samples.append(
                    Sample(
                        time.monotonic(),
                        metric_sum(text, "otelcol_exporter_sent_spans_total") if text else float("nan"),
                        metric_sum(text, "otelcol_exporter_queue_size") if text else float("nan"),
                        metric_sum(text, "evalsi_tail_sampling_traces_buffered") if text else float("nan"),
                        sum(anonymous_bytes(p) for p in self.pids) / 2**20,
                        metric_sum(text, "evalsi_memory_limiter_usage_bytes") / 2**20 if text else float("nan"),
                        metric_sum(text, "evalsi_memory_limiter_refusing") if text else float("nan"),
                        metric_sum(text, "evalsi_exporter_store_unavailable") if text else float("nan"),
                    )
                )
                for i, pid in enumerate(self.pids):
                    name = "collector" if i == 0 else f"worker {i}"
                    self.hwm_mb[name] = max(self.hwm_mb.get(name, 0.0), peak_rss_mb(pid))
                self._stop_event.wait(POLL_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def wait_sent(self, spans: int, timeout: float) -> float | None:
        """Wait until the exporter has written `spans` spans; when it did (monotonic), None after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            done = next((s.at for s in list(self.samples) if s.sent_spans >= spans), None)
            if done is not None or time.monotonic() > deadline:
                return done
            time.sleep(POLL_S / 2)


# --- the store ---------------------------------------------------------------------------------------------------

READ_STORE = """
import json, sys
from chdb import session
s = session.Session(sys.argv[1])
tag, project, sender = sys.argv[2], sys.argv[3], sys.argv[4]
def rows(sql):
    out = s.query(sql, "TabSeparated").bytes().decode().strip()
    return [line.split("\\t") for line in out.splitlines() if line]
where = f"length(TraceId) = 32 AND startsWith(TraceId, '{tag}')"
if project:
    where += f" AND ResourceAttributes['evalsi.project'] = '{project}'"
per_request = rows(
    "SELECT req, sum(c), count(), sum(foreign), countIf(c > 1) FROM ("
    f"  SELECT substring(TraceId, 9, 8) AS req, TraceId, SpanId, count() AS c,"
    f"    countIf('{sender}' != '' AND ResourceAttributes['chaos.sender'] != '{sender}') AS foreign"
    f"  FROM default.otel_traces WHERE {where} GROUP BY req, TraceId, SpanId) GROUP BY req")
poison = rows("SELECT count() FROM default.otel_traces WHERE startsWith(SpanName, 'poison')")
odd_ids = rows(f"SELECT count() FROM default.otel_traces WHERE length(TraceId) != 32 AND ServiceName = 'poison'")
print(json.dumps({"requests": {r: [int(n), int(u), int(f), int(d)] for r, n, u, f, d in per_request},
                  "poison": int(poison[0][0]), "odd_ids": int(odd_ids[0][0])}))
"""


@dataclass
class Stored:
    by_request: dict[int, tuple[int, int]]  # request -> (rows, distinct spans)
    poison_rows: int
    foreign: dict[int, int] = field(default_factory=dict)  # request -> rows another sender sent (g)
    duplicated: dict[int, int] = field(default_factory=dict)  # request -> its spans stored more than once


def read_store(path: Path, tag: int, project: str = "", sender: str = "") -> Stored:
    """Every span of this run in the store at `path` (of `project` only, if given), by request; the store opened by a
    separate process (the collector, and the stand-in, have released it). `sender`: rows whose resource names another
    sender are counted as foreign."""
    res = subprocess.run(
        [sys.executable, "-c", READ_STORE, str(path), f"{tag:08x}", project, sender],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"the store at {path} did not open: {res.stderr.strip()[-800:]}")
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    by_request = {int(r, 16): (n, u) for r, (n, u, _, _) in doc["requests"].items()}
    foreign = {int(r, 16): f for r, (_, _, f, _) in doc["requests"].items() if f}
    duplicated = {int(r, 16): d for r, (_, _, _, d) in doc["requests"].items() if d}
    return Stored(by_request, doc["poison"] + doc["odd_ids"], foreign, duplicated)


# --- one scenario ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    scenario: str
    title: str
    promise: str  # "0 lost", or what is measured instead
    spans_offered: int = 0
    spans_not_sent: int = 0  # dropped by the senders' full queues: never sent, so not the collector's
    spans_sent: int = 0
    spans_acked: int = 0
    spans_rejected: int = 0  # partial_success
    refusals: dict[str, int] = field(default_factory=dict)  # by status, requests
    refusals_without_retry_after: int = 0
    spans_stored: int = 0  # distinct spans of this run in the store
    duplicates: int = 0  # rows beyond one a span
    lost: int = 0  # acknowledged and not stored
    stored_not_acked: int = 0  # spans of requests never acknowledged (in flight at a crash) that the store holds
    spans_gave_up: int = 0  # still unacknowledged when the senders stopped retrying
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def account(out: Outcome, senders: Senders, stored: Stored) -> None:
    """The sender's side against the store's."""
    t, req = senders.tally, senders.requests
    offered = sum(req.spans(r) for r in range(t.offered))
    sent = sum(req.spans(r) for r in t.sent)
    out.spans_offered += offered
    out.spans_sent += sent
    out.spans_not_sent += offered - sent
    out.spans_acked += sum(a for a, _ in t.acked.values())
    out.spans_rejected += sum(rej for _, rej in t.acked.values())
    for k, v in t.refusals.items():
        out.refusals[str(k)] = out.refusals.get(str(k), 0) + v
    out.refusals = dict(sorted(out.refusals.items()))
    out.refusals_without_retry_after += t.refusals_without_retry_after
    out.spans_gave_up += sum(req.spans(r) for r in t.gave_up)
    for r, (rows, distinct) in stored.by_request.items():
        out.spans_stored += distinct
        out.duplicates += rows - distinct
        if r not in t.acked:
            out.stored_not_acked += distinct
    for r, (accepted, _) in t.acked.items():
        out.lost += max(0, accepted - stored.by_request.get(r, (0, 0))[1])
    if t.answers:
        streak, streak_s = longest_streak(t.answers)
        out.figures["longest refusal streak (answers, first to last s)"] = [streak, round(streak_s, 1)]
        out.figures["Retry-After values (s: answers)"] = dict(
            sorted(t.retry_after_s.items(), key=lambda kv: float(kv[0]))
        )
    if t.refusals_without_retry_after:
        out.failures.append(f"{t.refusals_without_retry_after} refusals (429/503) without Retry-After")
    for f in t.failures[:5]:
        out.failures.append(f"an answer not to retry: {f}")
    if t.gave_up:
        out.failures.append(f"{len(t.gave_up)} requests never acknowledged (senders gave up)")


def config(args: argparse.Namespace, endpoint: str, *, limit_mib: int | None = None) -> dict[str, Any]:
    cfg = serve_config(Path("unused"))
    cfg["exporters"]["clickhouse"] = {"endpoint": endpoint}  # the product's delivery defaults
    if args.batch_size:
        cfg["exporters"]["clickhouse"]["batch_size"] = args.batch_size
    processors: dict[str, Any] = {
        "normalize": {},
        "tail_sampling": {"decision_wait": f"{args.decision_wait:g}s"},
    }
    chain = ["normalize", "tail_sampling"]
    if limit_mib is not None:
        processors = {"memory_limiter": {"check_interval": "1s", "limit_mib": limit_mib}, **processors}
        chain = ["memory_limiter", *chain]
    cfg["processors"] = processors
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"]["processors"] = chain
    pipelines["logs"]["processors"] = [p for p in chain if p != "tail_sampling"]
    cfg["service"]["workers"] = args.workers
    return cfg


def finish(
    out: Outcome, senders: Senders, c: Collector, monitor: Monitor, args: argparse.Namespace, during: Any = None
) -> None:
    """Let the senders finish, then the collector write what it holds and stop (SIGTERM). `during`: a thread whose
    `answers` are still coming in (e): how many it had when the collector exited."""
    senders.finish(args.drain_timeout)
    if out.scenario not in ("c", "f", "g"):  # a restarted collector counts only what it wrote itself
        written = monitor.wait_sent(senders.tally.acked_spans(), timeout=30)
        last = max(senders.tally.acked_at.values(), default=0.0)
        out.figures["last answer to all written (s)"] = None if written is None else round(written - last, 1)
    out.figures["exporter data errors (rows dropped)"] = metric_sum(monitor.text, "evalsi_exporter_items_refused_total")
    out.figures["tail_sampling spans lost"] = metric_sum(monitor.text, "evalsi_tail_sampling_spans_lost_total")
    monitor.stop()
    out.figures["peak RSS MB (VmHWM)"] = {k: round(v) for k, v in monitor.hwm_mb.items()}
    answered = len(during.answers) if during is not None else 0
    t0 = time.monotonic()
    code = c.stop(signal.SIGTERM, timeout=180)
    out.figures["SIGTERM to exit (s)"] = round(time.monotonic() - t0, 2)
    if during is not None:
        out.figures["attack requests answered between SIGTERM and exit"] = len(during.answers) - answered
    out.figures["exit code"] = code
    if code != 0:
        out.failures.append(f"evalsi serve exited {code} on SIGTERM (log: {c.log_path})")


def read_and_account(out: Outcome, senders: Senders, store: Path) -> Stored | None:
    try:
        stored = read_store(store, senders.requests.tag)
    except RuntimeError as e:
        out.failures.append(str(e))
        return None
    account(out, senders, stored)
    out.figures["poison spans stored"] = stored.poison_rows
    return stored


STARTED: list[subprocess.Popen[str]] = []  # every process this script started, killed at exit if still running


def start(tmp: Path, cfg: dict[str, Any]) -> Collector:
    tmp.mkdir(parents=True, exist_ok=True)
    c = start_collector(tmp, cfg, timeout=180)
    STARTED.append(c.proc)
    return c


def stand_in(data: Path, port: int = 0) -> StandInProcess:
    server = start_stand_in(data, port=port)
    STARTED.append(server.proc)
    return server


def measure_capacity(args: argparse.Namespace, workdir: Path, tag: int) -> tuple[float, float]:
    """Stored spans/s of a fresh collector fed as fast as it accepts (no memory_limiter), over `--capacity-seconds`
    after a 5 s warm-up; and its idle anonymous memory in MiB (every process), read before the load."""
    store = workdir / "capacity" / "store"
    c = start(workdir / "capacity", config(args, f"chdb://{store}"))
    try:
        idle = sum(anonymous_bytes(p) for p in [c.proc.pid, *c.ready.get("workers", [])]) / 2**20
        senders = Senders(Requests(args, tag), c.http, args.senders, args.senders)
        offer = Offer(senders, None, args.senders)
        offer.start()
        with httpx.Client(timeout=10) as client:
            time.sleep(5)
            sent0, t0 = metric_sum(client.get(c.metrics).text, "otelcol_exporter_sent_spans_total"), time.monotonic()
            time.sleep(args.capacity_seconds)
            sent1, t1 = metric_sum(client.get(c.metrics).text, "otelcol_exporter_sent_spans_total"), time.monotonic()
        offer.stop()
        senders.finish(10)
    finally:
        c.stop(signal.SIGKILL)  # what it still holds does not matter here
        shutil.rmtree(store, ignore_errors=True)
    return (sent1 - sent0) / (t1 - t0), idle


def overload(args: argparse.Namespace, workdir: Path, tag: int) -> Outcome:
    out = Outcome("a", SCENARIOS["a"], "0 lost")
    if args.rate:
        capacity, idle = args.rate, None
    else:
        log("[a] measuring capacity")
        capacity, idle = measure_capacity(args, workdir, tag ^ 0x5A5A)
        log(f"[a] capacity {capacity:,.0f} stored spans/s; idle memory {idle:.0f} MiB")
    if args.limit_mib:
        limit = args.limit_mib
    else:
        if idle is None:  # --rate given: read the idle memory of a collector that takes nothing
            server = stand_in(workdir / "idle" / "clickhouse") if args.store == "server" else None
            endpoint = server.url if server is not None else f"chdb://{workdir / 'idle' / 'store'}"
            probe = start(workdir / "idle", config(args, endpoint))
            time.sleep(2)
            idle = sum(anonymous_bytes(p) for p in [probe.proc.pid, *probe.ready.get("workers", [])]) / 2**20
            probe.stop()
            if server is not None:
                server.stop()
        limit = round(idle + args.headroom_mib)
    rate = args.overload * capacity
    out.figures.update({"capacity (stored spans/s)": round(capacity), "offered spans/s": round(rate),
                        "idle memory MiB": None if idle is None else round(idle), "hard limit MiB": limit})  # fmt: skip
    server = stand_in(workdir / "a" / "clickhouse") if args.store == "server" else None
    store = workdir / "a" / ("clickhouse" if server is not None else "store")
    c = start(workdir / "a", config(args, server.url if server is not None else f"chdb://{store}", limit_mib=limit))
    monitor = Monitor(c)
    monitor.start()
    senders = Senders(Requests(args, tag), c.http, args.senders, args.sender_queue)
    cpu0 = cpu_seconds(*monitor.pids)
    log(f"[a] offering {rate:,.0f} spans/s for {args.duration:g}s; memory_limiter limit_mib {limit}")
    offer = Offer(senders, rate, args.senders)
    t0 = time.monotonic()
    offer.start()
    time.sleep(args.duration)
    offer.stop()
    ended = time.monotonic()
    window = ended - t0
    acked_in_window = senders.tally.acked_spans()
    out.figures["acknowledged spans/s during the load"] = round(acked_in_window / window)
    out.figures["collector CPU µs a span acknowledged"] = round(
        1e6 * (cpu_seconds(*monitor.pids) - cpu0) / max(1, acked_in_window)
    )
    finish(out, senders, c, monitor, args)
    soft = labelled(monitor.text, "evalsi_memory_limiter_limit_bytes", 'limit="soft"') / 2**20
    out.figures["soft limit MiB"] = round(soft)
    samples = [s for s in monitor.samples if s.anon_mb]
    out.figures["peak memory MiB (limiter's measure, sampled)"] = round(max((s.anon_mb for s in samples), default=0))
    out.figures["seconds refusing (limiter gauge)"] = round(POLL_S * sum(1 for s in samples if s.refusing == 1), 1)
    accepting = next((s.at for s in samples if s.at > ended and s.refusing == 0), None)
    out.figures["accepting again after the load ended (s)"] = None if accepting is None else round(accepting - ended, 1)
    out.figures["memory MiB at the end (limiter's measure)"] = round(samples[-1].anon_mb) if samples else None
    out.figures["peak exporter queue (spans)"] = round(max((s.queue for s in samples if s.queue == s.queue), default=0))
    if server is not None:
        server.stop()
    read_and_account(out, senders, store)
    if out.figures["peak memory MiB (limiter's measure, sampled)"] > limit:
        out.figures["note"] = "peak above the hard limit"
    if out.lost:
        out.failures.append(f"{out.lost:,} acknowledged spans lost")
    return out


def store_outage(args: argparse.Namespace, workdir: Path, tag: int) -> Outcome:
    out = Outcome("b", SCENARIOS["b"], "0 lost")
    data = workdir / "b" / "clickhouse"
    store = stand_in(data)
    port = urlsplit(store.url).port or 0
    cfg = config(args, store.url)
    cfg["exporters"]["clickhouse"]["queue_size"] = args.queue_size
    c = start(workdir / "b", cfg)
    monitor = Monitor(c)
    monitor.start()
    senders = Senders(Requests(args, tag), c.http, args.senders, args.sender_queue)
    offer = Offer(senders, args.steady_rate, args.senders)
    log(f"[b] {args.steady_rate:,.0f} spans/s; the store is killed after {args.warmup:g}s, for {args.duration:g}s; "
        f"queue_size {args.queue_size:,}")  # fmt: skip
    offer.start()
    time.sleep(args.warmup)
    killed = time.monotonic()
    store.proc.kill()
    store.proc.wait()
    time.sleep(args.duration)
    restarted: StandInProcess | None = None
    try:
        restarted = stand_in(data, port=port)
    except RuntimeError as e:
        out.failures.append(f"the stand-in did not start again on port {port}: {e}")
    back = time.monotonic()
    acked_before_back = senders.tally.acked_spans(before=back)
    time.sleep(args.after)
    offer.stop()
    drained = monitor.wait_sent(acked_before_back, timeout=args.drain_timeout)
    t = senders.tally
    refused_at = [at for at, refused in t.answers if refused]
    out.figures.update({
        "offered spans/s": args.steady_rate, "queue_size": args.queue_size, "outage (s)": round(back - killed, 1),
        "first refusal after the kill (s)": round(refused_at[0] - killed, 1) if refused_at else None,
        "last refusal after the store was back (s)": round(refused_at[-1] - back, 1) if refused_at else None,
        "drain: store back to every span acknowledged before written (s)":
            None if drained is None else round(drained - back, 1),
    })  # fmt: skip
    if t.refusals.get(429):
        out.figures["note"] = (
            "refused with 429 (a queue is full), where the docs promise 503 (the store refuses writes)"
        )
    finish(out, senders, c, monitor, args)
    if restarted is not None:
        restarted.stop()
    read_and_account(out, senders, data)
    if drained is None:
        out.failures.append(f"the backlog was not written {args.drain_timeout:g}s after the store came back")
    if not refused_at:
        out.figures["note"] = "no refusal: the queue never filled (raise the rate or lower --queue-size)"
    if out.lost:
        out.failures.append(f"{out.lost:,} acknowledged spans lost")
    return out


def longest_streak(answers: list[tuple[float, bool]]) -> tuple[int, float]:
    """The longest run of consecutive refusals among all senders' answers in time order: (answers, first to last s)."""
    best, best_s, n, first = 0, 0.0, 0, 0.0
    for at, refused in sorted(answers):
        if refused:
            if n == 0:
                first = at
            n += 1
            if n > best:
                best, best_s = n, at - first
        else:
            n = 0
    return best, best_s


def crash(args: argparse.Namespace, workdir: Path, tag: int) -> Outcome:
    wal = args.durability == "wal"
    title = SCENARIOS["c"] if wal else "kill -9 of evalsi serve, restart on the same store (durability memory)"
    out = Outcome("c", title, "0 lost (write-ahead log)" if wal else "measured, not promised: durability memory")
    store = workdir / "c" / "store"
    cfg = config(args, f"chdb://{store}")
    if wal:
        cfg["service"]["durability"] = {"mode": "wal", "directory": str(workdir / "c" / "wal")}
    c = start(workdir / "c" / "first", cfg)
    monitor = Monitor(c)
    monitor.start()
    senders = Senders(Requests(args, tag), c.http, args.senders, args.sender_queue)
    offer = Offer(senders, args.steady_rate, args.senders)
    log(f"[c] {args.steady_rate:,.0f} spans/s; kill -9 of evalsi serve after {args.warmup:g}s, then a restart")
    offer.start()
    time.sleep(args.warmup)
    last = monitor.samples[-1] if monitor.samples else None
    workers = list(c.ready.get("workers", []))
    c.proc.kill()
    killed = time.monotonic()
    c.proc.wait()
    acked_by_first = set(senders.tally.acked)
    out.figures["held when killed (last poll): exporter queue spans, tail_sampling traces"] = (
        [round(last.queue), round(last.tail_traces)] if last else None
    )
    out.figures["written by the first collector (last poll)"] = round(last.sent_spans) if last else None
    orphans = [p for p in workers if Path(f"/proc/{p}").exists()]
    time.sleep(2)
    for p in orphans:
        if Path(f"/proc/{p}").exists():
            out.failures.append(f"pipeline worker {p} still ran 2 s after its collector was killed; killed it")
            os.kill(p, signal.SIGKILL)
    try:
        c2 = start(workdir / "c" / "second", cfg)
    except AssertionError as e:
        out.failures.append(f"the store did not open after the crash: {e}")
        offer.stop()
        senders.finish(1)
        monitor.stop()
        return out
    out.figures["kill to ready again (s)"] = round(time.monotonic() - killed, 1)
    senders.url = c2.http
    monitor.watch(c2)
    time.sleep(args.after)
    offer.stop()
    finish(out, senders, c2, monitor, args)
    found = read_and_account(out, senders, store)
    t = senders.tally
    stored = found.by_request if found else {}
    lost_first = sum(max(0, t.acked[r][0] - stored.get(r, (0, 0))[1]) for r in acked_by_first)
    out.figures["acknowledged by the killed collector (spans)"] = sum(t.acked[r][0] for r in acked_by_first)
    out.figures["of which lost"] = lost_first
    out.figures["lost of those acknowledged after the restart"] = out.lost - lost_first
    out.figures["connection errors (retried)"] = t.connection_errors
    if out.lost - lost_first:
        out.failures.append(f"{out.lost - lost_first:,} spans acknowledged by the restarted collector lost")
    if wal and lost_first:
        out.failures.append(f"{lost_first:,} spans acknowledged before the kill lost despite the write-ahead log")
    replayed = next((e for e in c2.logs() if e.get("msg") == "write-ahead log replayed"), None)
    if replayed is not None:
        left_out = replayed["stored_spans_left_out"]
        out.figures["replayed requests, stored spans left out"] = [replayed["requests"], left_out]
    return out


def poison(args: argparse.Namespace, workdir: Path, tag: int) -> Outcome:
    out = Outcome("d", SCENARIOS["d"], "0 lost; exactly the invalid spans rejected")
    store = workdir / "d" / "store"
    c = start(workdir / "d", config(args, f"chdb://{store}"))
    monitor = Monitor(c)
    monitor.start()
    requests = Requests(args, tag, poison_every=args.poison_every)
    senders = Senders(requests, c.http, args.senders, args.sender_queue)
    offer = Offer(senders, args.steady_rate, args.senders)
    log(f"[d] {args.steady_rate:,.0f} spans/s for {args.duration:g}s, 1 request in {args.poison_every} poisoned: "
        f"{len(requests.poison.invalid)} invalid spans ({', '.join(requests.poison.invalid)}) and "
        f"{len(requests.poison.hostile)} valid ones with hostile values")  # fmt: skip
    offer.start()
    time.sleep(args.duration)
    offer.stop()
    finish(out, senders, c, monitor, args)
    read_and_account(out, senders, store)
    t = senders.tally
    wrong = {r: rej for r, (_, rej) in t.acked.items() if rej != (len(requests.poison.invalid) * requests.is_poison(r))}
    poisoned = [r for r in t.acked if requests.is_poison(r)]
    out.figures.update({
        "poison requests acknowledged": len(poisoned),
        "invalid spans a poison request": len(requests.poison.invalid),
        "hostile valid spans a poison request": len(requests.poison.hostile),
        "requests whose rejected count is wrong": len(wrong),
        "rejection messages": dict(t.rejection_messages.most_common(3)),
    })  # fmt: skip
    if wrong:
        r = next(iter(wrong))
        out.failures.append(f"{len(wrong)} requests rejected the wrong number of spans (request {r}: {wrong[r]})")
    if out.figures.get("poison spans stored"):
        out.failures.append(f"{out.figures['poison spans stored']} invalid spans stored")
    if out.lost:
        out.failures.append(f"{out.lost:,} valid acknowledged spans lost")
    return out


# --- e: a pathological regex during load ---------------------------------------------------------------------------

REGEX_PATTERN = "^(a+)+$"  # backtracks exponentially in Python's `re` over 'a' * n + '!'
REGEX_LENGTHS = (*range(27, 41), 64, 1_000, 100_000)


def percentiles_ms(values: list[float]) -> list[float] | None:
    """p50, p99 and max of `values` (seconds), in ms."""
    if not values:
        return None
    v = sorted(values)
    return [round(1000 * v[min(len(v) - 1, int(q * len(v)))], 1) for q in (0.5, 0.99)] + [round(1000 * v[-1], 1)]


class HealthPoller(threading.Thread):
    """GETs `/healthz` every `every` s (a new request once the last is answered): (started, seconds, status or -1)."""

    def __init__(self, api: str, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.url = api + "/healthz"
        self.every = every
        self.samples: list[tuple[float, float, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop_event.is_set():
                t0 = time.monotonic()
                try:
                    status = client.get(self.url).status_code
                except httpx.HTTPError:
                    status = -1
                took = time.monotonic() - t0
                self.samples.append((t0, took, status))
                self._stop_event.wait(max(0.0, self.every - took))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def between(self, t0: float, t1: float) -> list[tuple[float, float, int]]:
        return [s for s in self.samples if t0 <= s[0] < t1]


class RegexAttack(threading.Thread):
    """POSTs `/v1/evaluate` with builtin/regex `REGEX_PATTERN` over 'a' * n + '!', n cycling over `REGEX_LENGTHS`,
    one request after another: (started, n, seconds, status or -1, the score's `passed` or the error)."""

    def __init__(self, api: str, pattern: str = REGEX_PATTERN, headers: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True)
        self.url = api + "/v1/evaluate"
        self.pattern = pattern
        self.headers = headers or {}
        self.answers: list[tuple[float, int, float, int, Any]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        evaluator = {"ref": "builtin/regex", "params": {"pattern": self.pattern}}
        with httpx.Client(timeout=900) as client:
            i = 0
            while not self._stop_event.is_set():
                n = REGEX_LENGTHS[i % len(REGEX_LENGTHS)]
                i += 1
                body = {"records": [{"output": "a" * n + "!"}], "evaluators": [evaluator]}
                t0 = time.monotonic()
                try:
                    resp = client.post(self.url, json=body, headers=self.headers)
                    status = resp.status_code
                    verdict: Any = resp.json()["results"][0]["scores"][0]["passed"] if status == 200 else resp.text
                except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
                    status, verdict = -1, type(e).__name__
                self.answers.append((t0, n, time.monotonic() - t0, status, verdict))
                if status != 200:
                    self._stop_event.wait(0.1)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def stored_rate(monitor: Monitor, t0: float, t1: float) -> float | None:
    """Spans/s the exporter wrote between `t0` and `t1` (its counter, as the monitor sampled it)."""
    s = [x for x in monitor.samples if t0 <= x.at <= t1 and x.sent_spans == x.sent_spans]
    if len(s) < 2 or s[-1].at <= s[0].at:
        return None
    return round((s[-1].sent_spans - s[0].sent_spans) / (s[-1].at - s[0].at))


def acked_rate(tally: Tally, t0: float, t1: float) -> float:
    return round(sum(tally.acked[r][0] for r, at in tally.acked_at.items() if t0 <= at < t1) / max(1e-9, t1 - t0))


def regex_attack(args: argparse.Namespace, workdir: Path, tag: int) -> Outcome:
    out = Outcome("e", SCENARIOS["e"], "0 lost; /healthz p99 < 100 ms")
    store = workdir / "e" / "store"
    c = start(workdir / "e", config(args, f"chdb://{store}"))
    monitor = Monitor(c)
    monitor.start()
    health = HealthPoller(c.api)
    health.start()
    senders = Senders(Requests(args, tag), c.http, args.senders, args.sender_queue)
    offer = Offer(senders, args.steady_rate, args.senders)
    log(f"[e] {args.steady_rate:,.0f} spans/s; after {args.warmup:g}s, {args.duration:g}s of /v1/evaluate with "
        f"builtin/regex {args.regex!r} over 'a' * n + '!' (n: 27..40, 64, 1,000, 100,000), /healthz polled; "
        "SIGTERM while the attack goes on")  # fmt: skip
    began = time.monotonic()
    offer.start()
    time.sleep(args.warmup)
    attack = RegexAttack(c.api, args.regex)
    attacked = time.monotonic()
    attack.start()
    time.sleep(args.duration)
    calm = time.monotonic()
    offer.stop()
    before, during = health.between(began + 2, attacked), health.between(attacked, calm)
    out.figures.update({
        "/healthz before the attack: answers, p50/p99/max ms": [len(before), percentiles_ms([x[1] for x in before])],
        "/healthz during the attack: answers, p50/p99/max ms": [len(during), percentiles_ms([x[1] for x in during])],
        "/healthz answers not 200 during the attack": sum(1 for s in during if s[2] != 200),
        "stored spans/s before / during the attack": [stored_rate(monitor, began + 3, attacked),
                                                      stored_rate(monitor, attacked, calm)],
        "acknowledged spans/s before / during the attack": [acked_rate(senders.tally, began + 3, attacked),
                                                            acked_rate(senders.tally, attacked, calm)],
    })  # fmt: skip
    finish(out, senders, c, monitor, args, during=attack)  # SIGTERM while the attack goes on
    attack.stop()
    health.stop()
    answers = [a for a in attack.answers if a[0] < calm]
    by_n: dict[str, list[float]] = {}
    for _, n, took, _, _ in answers:
        by_n.setdefault("27..40" if n <= 40 else f"{n:,}", []).append(took)
    statuses = Counter(a[3] for a in answers)
    wrong = [a for a in answers if a[3] == 200 and a[4] is not False]
    out.figures.update({
        "/v1/evaluate answers during the attack (by status)": dict(statuses),
        "/v1/evaluate ms by n: answers, p50 / p99 / max": {k: [len(v), percentiles_ms(v)] for k, v in by_n.items()},
        "/v1/evaluate verdicts not 'fails' ('a...a!' does not match)": len(wrong),
    })  # fmt: skip
    read_and_account(out, senders, store)
    p99 = (percentiles_ms([s[1] for s in during]) or [0, float("inf")])[1]
    if p99 >= 100:
        out.failures.append(f"/healthz p99 {p99} ms during the attack (target < 100 ms)")
    if set(statuses) != {200}:
        out.failures.append(f"/v1/evaluate answered {dict(statuses)} during the attack")
    if wrong:
        out.failures.append(f"{len(wrong)} /v1/evaluate verdicts were not 'fails': {wrong[0][4]!r:.200}")
    if out.lost:
        out.failures.append(f"{out.lost:,} acknowledged spans lost")
    return out


# --- f: the write-ahead log's disk full ----------------------------------------------------------------------------


class Filler(threading.Thread):
    """Keeps a filesystem full, as another tenant of the disk would: appends to `path` until the disk is full (ENOSPC),
    and again every 20 ms (the log frees space as it retires segments), until stopped; then deletes the file."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.bytes = 0
        self.full_at: float | None = None
        self.freed_at: float | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while not self._stop_event.is_set():
                for size in (1 << 20, 4096, 1):
                    chunk = bytes(size)
                    while True:
                        try:
                            self.bytes += os.write(fd, chunk)
                        except OSError:
                            break
                if self.full_at is None:
                    self.full_at = time.monotonic()
                self._stop_event.wait(0.02)
        finally:
            os.close(fd)
            self.path.unlink()
            self.freed_at = time.monotonic()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def mount_tmpfs(where: Path, mib: int) -> str | None:
    """Mount a tmpfs of `mib` MiB at `where`; None, or why not (mounting needs root)."""
    where.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(where)], capture_output=True,
                         text=True)  # fmt: skip
    return None if res.returncode == 0 else (res.stderr.strip() or f"mount exited {res.returncode}")


def first_answer(tally: Tally, status: str, after: float) -> float | None:
    """When (monotonic) the first attempt started after `after` that was answered `status`."""
    return min(
        (at for tries in tally.attempts.values() for at, o in tries if o == status and at >= after), default=None
    )


def wal_disk_full(args: argparse.Namespace, workdir: Path, tag: int) -> Outcome:
    out = Outcome("f", SCENARIOS["f"], "0 lost; stored twice only if answered 200")
    disk = workdir / "f" / "disk"
    why = mount_tmpfs(disk, args.wal_disk_mib)
    if why is not None:
        out.failures.append(f"could not mount a {args.wal_disk_mib} MiB tmpfs for the log ({why}): run as root")
        return out
    try:
        return _wal_disk_full(out, args, workdir, disk, tag)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _wal_disk_full(out: Outcome, args: argparse.Namespace, workdir: Path, disk: Path, tag: int) -> Outcome:
    store = workdir / "f" / "store"
    cfg = config(args, f"chdb://{store}")
    cfg["service"]["durability"] = {"mode": "wal", "directory": str(disk / "wal")}
    c = start(workdir / "f" / "first", cfg)
    monitor = Monitor(c)
    monitor.start()
    senders = Senders(Requests(args, tag), c.http, args.senders, args.sender_queue)
    offer = Offer(senders, args.steady_rate, args.senders)
    log(f"[f] {args.steady_rate:,.0f} spans/s; the log on a {args.wal_disk_mib} MiB tmpfs, kept full from "
        f"{args.warmup:g}s for {args.duration:g}s, then freed; kill -9 {args.after:g}s later, a restart (replay), "
        f"{args.after:g}s more")  # fmt: skip
    offer.start()
    time.sleep(args.warmup)
    filler = Filler(disk / "filler")
    filling = time.monotonic()
    filler.start()
    time.sleep(args.duration)
    filled_mib = filler.bytes / 2**20
    filler.stop()
    freed = filler.freed_at or time.monotonic()
    time.sleep(args.after)
    t = senders.tally
    first_metrics = monitor.text
    c.proc.kill()
    killed = time.monotonic()
    c.proc.wait()
    acked_by_first = {r for r, at in t.acked_at.items() if at < killed}
    full_from = filler.full_at or filling
    refused_full = sum(1 for tries in t.attempts.values() for at, o in tries if o == "503" and filling <= at < freed)
    first_503, ok_again = first_answer(t, "503", filling), first_answer(t, "200", freed)
    logs = c.logs()
    out.figures.update({
        "log's filesystem": f"tmpfs of {args.wal_disk_mib} MiB; filler {filled_mib:.1f} MiB at the end",
        "disk full for (s)": round(freed - full_from, 1),
        "first 503 after the filler started (s)": None if first_503 is None else round(first_503 - filling, 2),
        "answers 503 from the filler's start to the freeing, acknowledged spans/s while full": [
            refused_full, acked_rate(t, full_from, freed)],
        "first 200 after the disk was freed (s)": None if ok_again is None else round(ok_again - freed, 2),
        "acknowledged spans/s before / while full / after freeing": [
            acked_rate(t, full_from - args.warmup + 3, full_from), acked_rate(t, full_from, freed),
            acked_rate(t, freed, killed)],
        "refusal messages": dict(t.refusal_messages.most_common(2)),
        "WAL write failures, voided records, records (first collector)": [
            metric_sum(first_metrics, "evalsi_wal_write_failures_total"),
            metric_sum(first_metrics, "evalsi_wal_voided_records_total"),
            metric_sum(first_metrics, "evalsi_wal_records_total")],
        "log lines: failed writes cut back, not cut back": [
            sum(1 for e in logs if str(e.get("msg", "")).startswith("cannot write the write-ahead log; the failed")),
            sum(1 for e in logs if str(e.get("msg", "")).startswith("cannot write the write-ahead log, nor"))],
    })  # fmt: skip
    try:
        c2 = start(workdir / "f" / "second", cfg)
    except AssertionError as e:
        out.failures.append(f"the collector did not start again on the same store and log: {e}")
        offer.stop()
        senders.finish(1)
        monitor.stop()
        return out
    out.figures["kill to ready again (s)"] = round(time.monotonic() - killed, 1)
    senders.url = c2.http
    monitor.watch(c2)
    time.sleep(args.after)
    offer.stop()
    finish(out, senders, c2, monitor, args)
    replayed = next((e for e in c2.logs() if e.get("msg") == "write-ahead log replayed"), None)
    if replayed is not None:
        out.figures["replayed requests, stored spans left out"] = [
            replayed["requests"],
            replayed["stored_spans_left_out"],
        ]
    out.figures["resent spans dropped after the restart (evalsi_wal_duplicate_spans)"] = metric_sum(
        monitor.text, "evalsi_wal_duplicate_spans_total"
    )
    found = read_and_account(out, senders, store)
    if found is None:
        return out
    # each span stored twice: whose request, and what its sender saw
    kinds: Counter[str] = Counter()
    for r, spans in found.duplicated.items():
        tries = t.attempts.get(r, [])
        if any(o == "connection" and at < killed for at, o in tries):
            kinds["in flight at the kill (its answer lost), sent again"] += spans
        elif any(o == "503" for _, o in tries):
            kinds["answered 503 (its write refused), sent again"] += spans
        elif r in acked_by_first:
            kinds["answered 200 by the killed collector, never sent again"] += spans
        else:
            kinds["other"] += spans
    out.figures["spans stored more than once, by what their request saw"] = dict(kinds)
    out.figures["lost of those acknowledged by the killed collector"] = sum(
        max(0, t.acked[r][0] - found.by_request.get(r, (0, 0))[1]) for r in acked_by_first
    )
    bad = {k: v for k, v in kinds.items() if not k.startswith("in flight")}
    if bad:
        out.failures.append(f"spans stored twice that no answer 200 explains: {bad}")
    if not refused_full:
        out.failures.append("no request was answered 503 while the disk was full")
    if out.lost:
        out.failures.append(f"{out.lost:,} acknowledged spans lost")
    return out


# --- g: two projects, the same ids -----------------------------------------------------------------------------------

PROJECTS = {"a": "chaos-a", "b": "chaos-b"}


def api_check(c: Collector, keys: dict[str, str], tag: int, requests: list[int], spans: int) -> dict[str, int]:
    """Read the first trace of each of `requests` through the API with each project's key: spans read, spans missing
    (fewer than `spans`), spans another sender sent, traces not found."""
    got: Counter[str] = Counter()
    with httpx.Client(timeout=30) as client:
        for r in requests:
            trace = (tag.to_bytes(4, "big") + r.to_bytes(4, "big") + (1).to_bytes(8, "big")).hex()
            for x, key in keys.items():
                resp = client.get(f"{c.api}/api/v1/traces/{trace}", headers={"Authorization": f"Bearer {key}"})
                if resp.status_code != 200:
                    got["traces not found"] += 1
                    got["spans missing"] += spans
                    continue
                read = resp.json()["spans"]
                got["spans read"] += len(read)
                got["spans missing"] += max(0, spans - len(read))
                got["spans of the other project"] += sum(
                    1 for s in read
                    if s["resource_attributes"].get(SENDER_ATTRIBUTE) != x
                    or s["resource_attributes"].get("evalsi.project") != PROJECTS[x])  # fmt: skip
    return dict(got)


def two_projects(args: argparse.Namespace, workdir: Path, tag: int) -> Outcome:
    from evalsi.auth import new_key

    out = Outcome("g", SCENARIOS["g"], "0 lost; 0 of the other project")
    keys = {x: new_key() for x in PROJECTS}
    store = workdir / "g" / "store"
    cfg = config(args, f"chdb://{store}")
    cfg["service"]["durability"] = {"mode": "wal", "directory": str(workdir / "g" / "wal")}
    cfg["auth"] = {"mode": "strict", "api_keys": [
        {"hash": keys[x][1], "name": f"chaos sender {x}", "project": p} for x, p in PROJECTS.items()]}  # fmt: skip
    c = start(workdir / "g" / "first", cfg)
    monitor = Monitor(c)
    monitor.start()
    threads = max(1, args.senders // 2)
    senders = {x: Senders(Requests(args, tag, sender=x), c.http, threads, args.sender_queue,
                          headers={"Authorization": f"Bearer {keys[x][0]}"}) for x in PROJECTS}  # fmt: skip
    offers = {x: Offer(s, args.steady_rate / 2, threads) for x, s in senders.items()}
    log(f"[g] {args.steady_rate / 2:,.0f} spans/s from each of two projects, the same trace and span ids (b "
        f"{args.project_lag:g}s behind a); kill -9 after {args.warmup:g}s more, a restart (replay), {args.after:g}s "
        "more")  # fmt: skip
    offers["a"].start()  # b sends each of a's ids `--project-lag` s later: at the kill, b's twin of a stored span
    time.sleep(args.project_lag)  # is in the log only, and the replay must not take a's span for b's
    offers["b"].start()
    time.sleep(args.warmup)
    c.proc.kill()
    killed = time.monotonic()
    c.proc.wait()
    ta, tb = senders["a"].tally, senders["b"].tally
    out.figures[
        "b's requests acknowledged in the 5 s before the kill, their twin from a acknowledged >= 4 s before"
    ] = sum(1 for r, at in tb.acked_at.items() if killed - 5 <= at and ta.acked_at.get(r, killed) <= killed - 4)
    try:
        c2 = start(workdir / "g" / "second", cfg)
    except AssertionError as e:
        out.failures.append(f"the collector did not start again on the same store and log: {e}")
        for x in PROJECTS:
            offers[x].stop()
            senders[x].finish(1)
        monitor.stop()
        return out
    out.figures["kill to ready again (s)"] = round(time.monotonic() - killed, 1)
    for s in senders.values():
        s.url = c2.http
    monitor.watch(c2)
    time.sleep(args.after)
    for x in PROJECTS:
        offers[x].stop()
        senders[x].finish(args.drain_timeout)
    replayed = next((e for e in c2.logs() if e.get("msg") == "write-ahead log replayed"), None)
    if replayed is not None:
        out.figures["replayed requests, stored spans left out"] = [
            replayed["requests"],
            replayed["stored_spans_left_out"],
        ]
    both = sorted(set(senders["a"].tally.acked) & set(senders["b"].tally.acked))
    sample = both[:: max(1, len(both) // 20)]
    checked: dict[str, int] = {}

    def complete() -> bool:
        nonlocal checked
        checked = api_check(c2, {x: k for x, (k, _) in keys.items()}, tag, sample, args.spans_per_trace)
        return not checked.get("spans missing") and not checked.get("spans of the other project")

    wait_until(complete, timeout=30, interval=1)
    out.figures[f"API: first trace of {len(sample)} requests both sent, read with each key"] = checked
    finish(out, senders["a"], c2, monitor, args)
    for x, p in PROJECTS.items():
        try:
            found = read_store(store, tag, project=p, sender=x)
        except RuntimeError as e:
            out.failures.append(str(e))
            continue
        lost_before = out.lost
        account(out, senders[x], found)
        t = senders[x].tally
        out.figures[f"project {p}: acknowledged, stored, lost, rows of the other project, spans stored twice"] = [
            sum(a for a, _ in t.acked.values()), sum(u for _, u in found.by_request.values()), out.lost - lost_before,
            sum(found.foreign.values()), sum(found.duplicated.values())]  # fmt: skip
        if found.foreign:
            out.failures.append(f"project {p} holds {sum(found.foreign.values())} rows the other project sent")
    if checked.get("spans missing") or checked.get("spans of the other project") or checked.get("traces not found"):
        out.failures.append(f"the API read back wrong: {checked}")
    if out.lost:
        out.failures.append(f"{out.lost:,} acknowledged spans lost")
    return out


# --- main --------------------------------------------------------------------------------------------------------


def print_table(outcomes: list[Outcome]) -> None:
    head = ["scenario", "offered", "not sent", "sent", "acknowledged", "rejected", "refused (429/503)", "stored",
            "lost", "promise"]  # fmt: skip
    rows = [head]
    for o in outcomes:
        refused = "/".join(str(o.refusals.get(k, 0)) for k in ("429", "503"))
        refused += "" if not o.refusals_without_retry_after else f" ({o.refusals_without_retry_after} no Retry-After)"
        rows.append([o.scenario, f"{o.spans_offered:,}", f"{o.spans_not_sent:,}", f"{o.spans_sent:,}",
                     f"{o.spans_acked:,}", f"{o.spans_rejected:,}", refused, f"{o.spans_stored:,}", f"{o.lost:,}",
                     o.promise])  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(v.rjust(w) if i not in (0, len(head) - 1) else v.ljust(w) for i, (v, w) in
                        enumerate(zip(r, widths, strict=True))))  # fmt: skip
    for o in outcomes:
        print(f"\n{o.scenario}: {o.title}")
        extra = {"duplicates (rows beyond one a span)": o.duplicates, "stored, never acknowledged": o.stored_not_acked,
                 "senders gave up (spans)": o.spans_gave_up}  # fmt: skip
        for k, v in {**o.figures, **extra}.items():
            print(f"  {k}: {v}")
        for f in o.failures:
            print(f"  FAIL: {f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=sorted(SCENARIOS))
    p.add_argument(
        "--duration",
        type=float,
        default=60,
        help="seconds of overload (a), of outage (b), of load (d), of attack (e), of a full disk (f)",
    )
    p.add_argument("--spans-per-request", type=int, default=500)
    p.add_argument("--spans-per-trace", type=int, default=5)
    p.add_argument("--content-bytes", type=int, default=1024, help="size of each span's gen_ai.input.messages")
    p.add_argument("--senders", type=int, default=16, help="sender threads, one connection each")
    p.add_argument("--sender-queue", type=int, default=32, help="requests waiting for a sender at most; more dropped")
    p.add_argument("--workers", type=int, default=1, help="service.workers")
    p.add_argument("--decision-wait", type=float, default=2.0, help="tail_sampling's decision_wait, seconds")
    p.add_argument("--rate", type=float, help="(a) the collector's capacity in spans/s; default: measured first")
    p.add_argument("--capacity-seconds", type=float, default=15, help="(a) how long capacity is measured")
    p.add_argument("--overload", type=float, default=3.0, help="(a) the load, in multiples of the capacity")
    p.add_argument("--limit-mib", type=int, help="(a) memory_limiter limit_mib; default: idle + --headroom-mib")
    p.add_argument("--headroom-mib", type=int, default=400, help="(a) hard limit above the idle memory")
    p.add_argument("--batch-size", type=int, help="the clickhouse exporter's batch_size (default: the product's)")
    p.add_argument(
        "--store", choices=["embedded", "server"], default="embedded",
        help="(a) the embedded store (chDB in the collector) or a ClickHouse-HTTP stand-in in its own process",
    )  # fmt: skip
    p.add_argument("--durability", choices=["wal", "memory"], default="wal", help="(c) service.durability.mode")
    p.add_argument("--steady-rate", type=float, default=2000, help="(b-g) spans/s offered (g: half each project)")
    p.add_argument("--queue-size", type=int, default=50_000, help="(b) the exporter's queue_size, spans")
    p.add_argument("--warmup", type=float, default=15, help="(b, c, e, f, g) seconds of load before the event")
    p.add_argument("--after", type=float, default=15, help="(b, c, f, g) seconds of load after the restart")
    p.add_argument("--poison-every", type=int, default=10, help="(d) every n-th request carries poison")
    p.add_argument("--regex", default=REGEX_PATTERN, help="(e) the pattern; '^a+$' for a control run")
    p.add_argument("--project-lag", type=float, default=5, help="(g) seconds project b sends each id after a")
    p.add_argument("--wal-disk-mib", type=int, default=32, help="(f) size of the tmpfs the log is put on")
    p.add_argument("--drain-timeout", type=float, default=120, help="how long the senders keep retrying at the end")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the work directory (stores, logs)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="evalsi-chaos-"))
    runs = {
        "a": overload,
        "b": store_outage,
        "c": crash,
        "d": poison,
        "e": regex_attack,
        "f": wal_disk_full,
        "g": two_projects,
    }
    outcomes: list[Outcome] = []
    try:
        for k, name in enumerate(args.scenarios):
            tag = random.Random(args.seed * 31 + k).getrandbits(31) | 1
            t0 = time.monotonic()
            outcomes.append(runs[name](args, workdir, tag))
            outcomes[-1].figures["scenario wall time (s)"] = round(time.monotonic() - t0)
            log(f"[{name}] done in {time.monotonic() - t0:.0f}s: lost {outcomes[-1].lost:,}")
    finally:
        for proc in STARTED:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps([asdict(o) for o in outcomes], indent=1, default=str))
    else:
        print()
        print_table(outcomes)
    failed = [f"[{o.scenario}] {f}" for o in outcomes for f in o.failures]
    for f in failed:
        log(f"FAIL {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
