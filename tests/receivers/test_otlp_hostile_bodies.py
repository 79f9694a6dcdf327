"""OTLP/HTTP bodies built to hurt the server, against a real `evalsi serve`: many tiny compressed members (once
quadratic to inflate, freezing the event loop for seconds), big bodies decoded off the event loop, and JSON with
lone UTF-16 surrogates (once an uncaught SystemError in protobuf's parser, answered 500 with a traceback).

One collector serves the module, with an 8 MiB `max_request_body_size` (a 6.4 MB body of 320k empty gzip members
fits). While a hostile request is handled, another thread polls the API's `/healthz`: every answer must come
within 100 ms (plus the slowest answer before the request, as the machine may be busy with other work). Each bad
request is followed by a valid one, which must be stored. The in-process tests time the inflating in CPU seconds
and print their figures (`pytest -s`).
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard
from google.rpc import code_pb2
from running_collector import Collector, serve_config, start_collector
from test_otlp_http import (
    JSON,
    PROTOBUF,
    Ingest,
    SpanSpec,
    export_response_of,
    json_request,
    json_span,
    new_span_id,
    new_trace_id,
    pb_request,
    status_of,
)

from evalsi.receivers.otlp.http_transport import _decompress

LIMIT = 8 * 1024 * 1024  # max_request_body_size of this module's collector
HEALTHZ_WITHIN = 0.1  # s: the longest /healthz may take while a hostile request is handled
HEALTHZ_WITHIN_JSON = 0.4  # s: the same while a big OTLP/JSON body is decoded (see that test)
# s of CPU to inflate each many-members body below: measured 0.2-0.8 s on a busy 2-core machine, while the
# quadratic inflating took 32-48 s for the 320k gzip members
CPU_BOUND = 2.0

EMPTY_GZIP = gzip.compress(b"")  # 20 bytes
EMPTY_ZLIB = zlib.compress(b"")  # 8 bytes
EMPTY_ZSTD = zstandard.ZstdCompressor().compress(b"")  # 9 bytes
SKIPPABLE_ZSTD = struct.pack("<II", 0x184D2A50, 0)  # a skippable frame (RFC 8878 3.1.2) with nothing in it


# --- the collector ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    tmp = tmp_path_factory.mktemp("otlp_hostile_bodies")
    cfg = serve_config(tmp / "store")
    cfg["receivers"]["otlp"]["protocols"]["http"]["max_request_body_size"] = LIMIT
    c = start_collector(tmp, cfg)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def ingest(collector: Collector) -> Iterator[Ingest]:
    ing = Ingest(collector)
    yield ing
    ing.client.close()


class HealthPoller:
    """Polls the API's /healthz from its own thread while a request is handled, timing every answer.

    The machine may be busy with other work: the slowest of a few answers before the request (the baseline) is
    allowed on top of the bound."""

    def __init__(self, api: str) -> None:
        self.client = httpx.Client(base_url=api, timeout=60)
        self.baseline = 0.0
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self) -> float:
        t = time.perf_counter()
        try:
            resp = self.client.get("/healthz")
            if resp.status_code != 200:
                self.failures.append(f"/healthz answered {resp.status_code}")
        except httpx.HTTPError as e:
            self.failures.append(f"/healthz failed: {e!r}")
        return time.perf_counter() - t

    def _run(self) -> None:
        while not self._stop.is_set():
            self.latencies.append(self._poll())
            self._stop.wait(0.01)

    def __enter__(self) -> HealthPoller:
        self.baseline = max(self._poll() for _ in range(10))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.client.close()

    def check(self, what: str, within: float = HEALTHZ_WITHIN) -> None:
        assert not self.failures, self.failures
        assert self.latencies, "no /healthz answer during the request"
        worst = max(self.latencies)
        print(
            f"{what}: {len(self.latencies)} /healthz answers during the request, slowest {worst * 1000:.1f} ms "
            f"(baseline {self.baseline * 1000:.1f} ms)"
        )
        bound = within + self.baseline
        assert worst < bound, f"/healthz took {worst * 1000:.0f} ms (bound {bound * 1000:.0f} ms) during {what}"


def valid_request_still_stored(ingest: Ingest) -> None:
    """After a hostile request, a valid one is taken and stored, and only it: the store holds exactly the spans
    expected so far (`follow_up`), and its trace through the API just its span."""
    trace_id = new_trace_id()
    span_id = ingest.follow_up(trace_id)
    assert [s["span_id"] for s in ingest.stored(trace_id)] == [span_id]


def post_while_polling(
    ingest: Ingest, body: bytes, media: str, what: str, **headers: str
) -> tuple[httpx.Response, HealthPoller]:
    """The answer, and the /healthz timings during the request (checked by the caller once its own checks pass)."""
    with HealthPoller(ingest.collector.api) as poller:
        t = time.perf_counter()
        resp = ingest.post(body, media, **headers)
        elapsed = time.perf_counter() - t
    print(f"{what}: {len(body)} bytes answered {resp.status_code} in {elapsed:.2f} s (wall)")
    return resp, poller


# --- many tiny compressed members -------------------------------------------------------------------

MANY_MEMBERS = [
    pytest.param("gzip", EMPTY_GZIP, 320_000, id="gzip-320k-members"),
    pytest.param("zstd", EMPTY_ZSTD, 160_000, id="zstd-160k-frames"),
    pytest.param("zstd", SKIPPABLE_ZSTD, 160_000, id="zstd-160k-skippable-frames"),
    pytest.param("deflate", EMPTY_ZLIB, 320_000, id="deflate-320k-streams"),
]


@pytest.mark.parametrize(("encoding", "member", "count"), MANY_MEMBERS)
def test_many_empty_members_inflate_in_linear_time(encoding: str, member: bytes, count: int) -> None:
    """In-process: the CPU time of inflating the body, which was quadratic in the number of members."""
    body = member * count
    t = time.process_time()
    out = _decompress(body, encoding, LIMIT)
    cpu = time.process_time() - t
    print(f"{encoding}: {count} members ({len(body)} bytes) inflated in {cpu:.3f} s of CPU")
    assert out == b""
    assert cpu < CPU_BOUND


INFLATE_AS_THE_COLLECTOR = """
import resource, sys
from concurrent.futures import ThreadPoolExecutor
from evalsi.collector.heap import tune_malloc
from evalsi.receivers.otlp.http_transport import _decompress
encoding, path, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = open(path, "rb").read()
assert tune_malloc(), "glibc's mallopt is needed for this check"
with ThreadPoolExecutor(1) as pool:
    pool.submit(lambda: None).result()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = pool.submit(_decompress, body, encoding, limit).result()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults, len(out))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and Linux's fault counts")
@pytest.mark.parametrize(("encoding", "member", "count"), MANY_MEMBERS)
def test_many_empty_members_map_no_memory_for_each(tmp_path: Path, encoding: str, member: bytes, count: int) -> None:
    """As the collector inflates (glibc's mmap threshold fixed by `tune_malloc`, in a decode thread), memory is not
    mapped afresh for each member: zstd's default output buffer (128 KiB + 3) was, once a frame, and 160,000 empty
    frames took 2-3 s of page faults instead of 0.4 s, while /healthz waited up to 350 ms."""
    path = tmp_path / "body"
    path.write_bytes(member * count)

    done = subprocess.run(
        [sys.executable, "-c", INFLATE_AS_THE_COLLECTOR, encoding, str(path), str(LIMIT)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    faults, inflated = (int(x) for x in done.stdout.split())
    print(f"{encoding}: {count} members inflated with {faults} page faults")
    assert inflated == 0
    assert faults < count // 20, f"{faults} page faults inflating {count} members: memory mapped for each"


@pytest.mark.parametrize(("encoding", "member", "count"), MANY_MEMBERS[:2])
def test_many_empty_members_answered_while_healthz_stays_up(
    ingest: Ingest, encoding: str, member: bytes, count: int
) -> None:
    """An empty body is an empty request, a full success; the API keeps answering meanwhile."""
    what = f"{count} empty {encoding} members"
    resp, healthz = post_while_polling(ingest, member * count, PROTOBUF, what, **{"content-encoding": encoding})

    assert not export_response_of(resp, PROTOBUF).HasField("partial_success")
    valid_request_still_stored(ingest)
    healthz.check(what)


def test_members_inflating_past_the_limit_are_413(ingest: Ingest) -> None:
    """Many members, each small, past the limit together: the bound is on the whole inflated body."""
    member = gzip.compress(b"\0" * 4096)
    body = member * (LIMIT // 4096 + 1)
    assert len(body) < LIMIT

    resp = ingest.post(body, PROTOBUF, **{"content-encoding": "gzip"})

    assert resp.status_code == 413
    assert "decompressed body exceeds the limit" in status_of(resp, PROTOBUF).message
    valid_request_still_stored(ingest)


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_many_members_then_a_truncated_one_is_400(ingest: Ingest, encoding: str) -> None:
    if encoding == "gzip":
        body = EMPTY_GZIP * 50_000 + gzip.compress(b"x" * 1000)[:-3]
    else:
        body = EMPTY_ZSTD * 50_000 + zstandard.ZstdCompressor().compress(b"x" * 1000)[:-3]

    resp = ingest.post(body, PROTOBUF, **{"content-encoding": encoding})

    assert resp.status_code == 400
    assert f"body is not valid {encoding}" in status_of(resp, PROTOBUF).message
    valid_request_still_stored(ingest)


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("zstd", zstandard.ZstdCompressor().compress)],
)
def test_a_few_members_with_data_are_all_read(
    ingest: Ingest, encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    """Regression: members of every size (an empty one, one larger than the first slices fed to the
    decompressor) are all inflated, in order."""
    trace_id = new_trace_id()
    span_ids = [new_span_id() for _ in range(3)]
    parts = [
        pb_request(SpanSpec(trace_id, span_ids[0], "small")).SerializeToString(),
        b"",  # an empty member: nothing between the requests
        pb_request(SpanSpec(trace_id, span_ids[1], "large", padding=os.urandom(150_000).hex())).SerializeToString(),
        pb_request(SpanSpec(trace_id, span_ids[2], "small-again")).SerializeToString(),
    ]
    # serialized requests back to back are one request holding all their spans (protobuf merges repeated fields)
    body = b"".join(compress(p) for p in parts)

    resp = ingest.post(body, PROTOBUF, **{"content-encoding": encoding})

    assert not export_response_of(resp, PROTOBUF).HasField("partial_success")
    spans = ingest.wait_trace(trace_id, 3)
    assert sorted(s["span_id"] for s in spans) == sorted(s.hex() for s in span_ids)


# --- big bodies are decoded off the event loop ------------------------------------------------------


def test_big_json_body_is_decoded_while_healthz_stays_up(ingest: Ingest) -> None:
    """OTLP/JSON is slow to decode (~1.5 s for this 1.7 MB of 40k attributes): decoded in a thread, it does not
    hold the event loop that long. What remains is `json.loads`, which holds the GIL throughout (~40 ms a MB)."""
    trace_id = new_trace_id()
    spans = [json_span(trace_id.hex(), new_span_id().hex(), f"span-{i}") for i in range(200)]
    for s in spans:
        s["attributes"] = [{"key": f"a{k}", "value": {"intValue": str(k)}} for k in range(200)]
    body = json.dumps(json_request(*spans), separators=(",", ":")).encode()

    resp, healthz = post_while_polling(ingest, body, JSON, "a big OTLP/JSON body")

    assert not export_response_of(resp, JSON).HasField("partial_success")
    ingest.wait_stored(len(spans))
    healthz.check("a big OTLP/JSON body", within=HEALTHZ_WITHIN_JSON)


# --- lone surrogates in OTLP/JSON -------------------------------------------------------------------


def _with_attribute(key: str, value: str) -> str:
    """A valid-looking request with one span carrying the attribute, as JSON text (the escapes left as written)."""
    span = json_span(new_trace_id().hex(), new_span_id().hex(), "surrogate")
    span["attributes"] = [{"key": "KEY", "value": {"stringValue": "VALUE"}}]
    text = json.dumps(json_request(span))
    return text.replace('"KEY"', f'"{key}"').replace('"VALUE"', f'"{value}"')


SURROGATES: list[Any] = [
    pytest.param(b'{"\\ud800":1}', "object key '\\ud800' in the top-level object", id="top-level-key"),
    pytest.param(
        _with_attribute("gen_ai.\\udc00", "ok").encode(),
        "'gen_ai.\\udc00' at resourceSpans[0].scopeSpans[0].spans[0].attributes[0].key",
        id="attribute-key",
    ),
    pytest.param(
        _with_attribute("ok", "text \\uD83D then nothing").encode(),
        "'text \\ud83d then nothing' at resourceSpans[0].scopeSpans[0].spans[0].attributes[0].value.stringValue",
        id="attribute-value",
    ),
    pytest.param(
        _with_attribute("ok", "ok").replace('"kind": 1', '"kind": "\\udfff"').encode(),
        "spans[0].kind",
        id="enum-value",
    ),
    pytest.param(
        _with_attribute("ok", "ok").replace('"attributes"', '"\\ud800unknown"').encode(),
        "object key '\\ud800unknown' in resourceSpans[0].scopeSpans[0].spans[0]",
        id="unknown-field-key",
    ),
    pytest.param(
        _with_attribute("ok", "ok").encode().replace(b'"ok"', b'"\xed\xa0\x80"', 1),
        "'\\ud800' at resourceSpans[0].scopeSpans[0].spans[0].attributes[0].key",
        id="surrogate-as-utf8-bytes",
    ),
]


@pytest.mark.parametrize(("body", "where"), SURROGATES)
def test_lone_surrogate_in_json_is_400_with_status(ingest: Ingest, body: bytes, where: str) -> None:
    resp = ingest.post(body, JSON)

    assert resp.status_code == 400, resp.text
    status = status_of(resp, JSON)
    assert status.code == code_pb2.INVALID_ARGUMENT
    assert "invalid Unicode escape" in status.message, status.message
    assert where in status.message, status.message
    valid_request_still_stored(ingest)

    # a one-line warning naming the problem, and no traceback
    refused = [
        e
        for e in ingest.collector.logs()
        if e.get("logger") == "evalsi.receiver.otlp" and where in e.get("msg", "") and e["level"] == "warning"
    ]
    assert refused, "no warning logged for the refused request"
    assert "exception" not in refused[-1]
    assert "Traceback" not in ingest.collector.log_path.read_text()


def test_surrogate_pairs_are_accepted(ingest: Ingest) -> None:
    """A surrogate pair is a valid escape (one astral character); so is the same text sent as UTF-8, and text
    that only looks like an escape (an escaped backslash, then `ud83d`)."""
    trace_id = new_trace_id()
    sent = []
    for ensure_ascii in (True, False):
        span_id = new_span_id()
        span = json_span(trace_id.hex(), span_id.hex(), "emoji \U0001f600")
        attribute = {"key": "escaped \\ud83d", "value": {"stringValue": "\U0001f600 and \ud55c"}}
        span["attributes"] = [attribute]
        body = json.dumps(json_request(span), ensure_ascii=ensure_ascii).encode()
        assert (b"\\ud83d\\ude00" in body) == ensure_ascii  # the emoji as a pair of escapes, or as UTF-8

        assert not export_response_of(ingest.post(body, JSON), JSON).HasField("partial_success")
        sent.append(span_id.hex())
    ingest.wait_stored(2)
    stored = ingest.stored(trace_id)
    assert sorted(s["span_id"] for s in stored) == sorted(sent)
    for s in stored:
        assert s["name"] == "emoji \U0001f600"
        assert s["attributes"]["escaped \\ud83d"] == "\U0001f600 and \ud55c"
