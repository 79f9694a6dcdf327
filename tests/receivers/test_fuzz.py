"""Fuzzing the OTLP receivers and the API as an attacker would, on a small budget (`benchmarks/fuzz.py` runs the same
inputs 100,000 at a time): tests/fuzz_inputs.py's structured (hypothesis), mutated and API inputs against one real
`evalsi serve`, each answer checked as it comes:

- never a 5xx over HTTP, never INTERNAL / UNKNOWN / DEADLINE_EXCEEDED over gRPC;
- every 4xx on the OTLP port carries a google.rpc.Status in the request's encoding (a BadRequest on a 400),
  INVALID_ARGUMENT over gRPC carries it in grpc-status-details-bin; the API answers JSON;

and, for the whole module: the collector never dies, a valid span sent every half second (HTTP and gRPC in turn)
meanwhile is answered within STALL_S and stored, and its memory is printed (`pytest -s`).

Deterministic (hypothesis derandomized, fixed seeds). The budget is the Hypothesis profile's (tests/budget.py): `ci`
sends 910 inputs (300 to the API first, while the store is small, 110 structured, 500 mutated), `deep`
(HYPOTHESIS_PROFILE=deep) ten times as many; FUZZ_EXAMPLES scales either.
The findings of the fuzzing (benchmarks/fuzz-findings) are tests of their own at the end, each saying what its input
must not break; a finding the product still has is a strict xfail.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fuzz_inputs as F
import grpc
import pytest
from budget import examples
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from running_collector import Collector, serve_config, start_collector

SCALE = float(os.environ.get("FUZZ_EXAMPLES", "1"))
STALL_S = float(os.environ.get("FUZZ_STALL_S", "2.0"))
FINDINGS = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz-findings"


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.split("://", 1)[-1].rpartition(":")
    return host, int(port)


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


class Fuzzed:
    """The collector, a connection to each of its ports, and a probe sending a valid span every half second."""

    def __init__(self, c: Collector) -> None:
        self.c = c
        self.otlp = _host_port(c.http)
        self.api = _host_port(c.api)
        self._otlp = F.Connection(*self.otlp, timeout=60)
        self._api = F.Connection(*self.api, timeout=60)
        self.channel = grpc.insecure_channel(c.grpc)
        self.sent = 0
        self.rss_start = rss_mb(c.proc.pid)
        self.latencies: list[float] = []
        self.refused: list[str] = []
        self.probes: list[str] = []  # trace ids acknowledged
        self._stop = threading.Event()
        self._probe = threading.Thread(target=self._run_probe, daemon=True)
        self._probe.start()

    def _run_probe(self) -> None:
        conn = F.Connection(*self.otlp, timeout=60)
        channel = grpc.insecure_channel(self.c.grpc)
        n = 0
        while not self._stop.wait(0.5):
            body, traces = F.probe_request("fuzz-ci-probe")
            if n % 2 == 0:
                inp = F.FuzzInput("probe", "probe", "otlp", headers={"Content-Type": F.PROTOBUF}, body=body)
                a = F.send_http(conn, inp)
            else:
                a = F.send_grpc(channel, F.FuzzInput("probe", "probe", "grpc", path=F.TRACES_RPC, body=body), 60)
            n += 1
            self.latencies.append(a.seconds)
            if a.status == 200 or a.code == "OK":
                self.probes += traces
            else:
                self.refused.append(a.label)
        conn.close()
        channel.close()

    def send(self, inp: F.FuzzInput) -> F.Answer:
        self.sent += 1
        if inp.port == "grpc":
            return F.send_grpc(self.channel, inp)
        if inp.port == "raw":
            return F.send_raw(self.otlp, inp)
        conn = self._otlp if inp.port == "otlp" else self._api
        a = F.send_http(conn, inp)
        if not a.status:  # the server closed the connection (it may, e.g. after a 413): once more on a new one
            a = F.send_http(conn, inp)
        return a

    def check(self, inp: F.FuzzInput) -> None:
        a = self.send(inp)
        assert self.c.proc.poll() is None, f"evalsi serve died (exit {self.c.proc.returncode}) on {inp.describe()}"
        found = F.problems(inp, a)
        assert not found, f"{inp.describe()} -> {a.label}: " + "; ".join(found)

    def stop(self) -> None:
        self._stop.set()
        self._probe.join(30)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    tmp = tmp_path_factory.mktemp("fuzz")
    c = start_collector(tmp, serve_config(tmp / "store"))
    F.seeds(), F.api_routes(), F.evaluator_refs()  # built before the probe's clock starts
    f = Fuzzed(c)
    yield f
    f.stop()
    if c.proc.poll() is None:
        c.stop(signal.SIGTERM)


@fuzz_settings(examples(ci=300, deep=3_000))
@given(seed=st.integers(0, 2**64 - 1))
def test_api(fuzzed: Fuzzed, seed: int) -> None:
    fuzzed.check(F.api_input(random.Random(seed), light=True))


@fuzz_settings(examples(ci=110, deep=1_100))
@given(inp=F.structured_inputs())
def test_structured_otlp(fuzzed: Fuzzed, inp: F.FuzzInput) -> None:
    fuzzed.check(inp)


@fuzz_settings(examples(ci=500, deep=5_000))
@given(seed=st.integers(0, 2**64 - 1))
def test_mutated_otlp(fuzzed: Fuzzed, seed: int) -> None:
    fuzzed.check(F.mutation_input(random.Random(seed)))


def test_no_death_no_stall_and_every_probe_stored(fuzzed: Fuzzed) -> None:
    """After the inputs above (or alone: the probe runs for a few seconds then): the collector is alive, every probe
    was answered within STALL_S, and every one it acknowledged is stored."""
    time.sleep(2.0)
    fuzzed.stop()
    c = fuzzed.c
    assert c.proc.poll() is None, f"evalsi serve died: {c.log_path}"
    print(f"\n{fuzzed.sent} inputs; RSS {fuzzed.rss_start:.0f} -> {rss_mb(c.proc.pid):.0f} MB "
          f"(peak {rss_mb(c.proc.pid, 'VmHWM'):.0f}); {len(fuzzed.latencies)} probes, slowest "
          f"{max(fuzzed.latencies, default=0):.2f} s")  # fmt: skip
    assert fuzzed.latencies, "no probe was sent"
    assert not fuzzed.refused, f"probes refused: {fuzzed.refused}"
    slow = [round(s, 2) for s in fuzzed.latencies if s > STALL_S]
    assert not slow, f"{len(slow)} probes answered after more than {STALL_S} s: {slow}"
    want = set(fuzzed.probes)
    deadline = time.monotonic() + 30
    stored: set[str] = set()
    while time.monotonic() < deadline:
        conn = F.Connection(*fuzzed.api, timeout=30)
        a = F.send_http(conn, F.FuzzInput("check", "", "api", method="GET",
                                          path="/api/v1/traces?service=fuzz-ci-probe&limit=10000"))  # fmt: skip
        if a.status == 200:
            stored = {t["trace_id"] for t in json.loads(a.body)["traces"]}
            if want <= stored:
                break
        time.sleep(0.5)
    assert want <= stored, f"{len(want - stored)} of {len(want)} acknowledged probes not stored"


# --- findings ---------------------------------------------------------------------------------------------------------
# The inputs of benchmarks/fuzz-findings: what the fuzzing found, each a test of what it must not break. A finding the
# product still has is a strict xfail (it fails loudly once fixed, so the mark can go).


def _finding(name: str) -> F.FuzzInput:
    meta = json.loads((FINDINGS / f"{name}.json").read_text())
    keys = ("kind", "sub", "port", "method", "path", "headers", "grpc_compression")
    body = (FINDINGS / f"{name}.bin").read_bytes()
    return F.FuzzInput(**{k: meta[k] for k in keys}, body=gzip.decompress(body) if meta.get("body_gzip") else body)


def test_finding_log_time_after_2106_is_stored_or_refused(fuzzed: Fuzzed) -> None:
    """A log record timed between 2106-02-07 and 2262 is a valid OTLP time but past the store's sort key (otel_logs'
    ORDER BY has toUnixTimestamp(Timestamp), UInt32 seconds): the receiver refuses it, rejects it or clamps it, and
    what it acknowledges the store must not drop (the sender would believe it stored)."""
    dropped_before = _dropped(fuzzed.c)
    a = fuzzed.send(_finding("log-time-2106"))
    if a.status != 200:
        assert 400 <= a.status < 500, a.label  # refused: fine, the sender knows
        return
    if ExportLogsServiceResponse.FromString(a.body).partial_success.rejected_log_records == 1:
        return  # rejected: fine, the sender knows
    time.sleep(1.0)  # flush_interval is 100 ms
    assert _dropped(fuzzed.c) == dropped_before, "the store dropped a log record the receiver acknowledged"


def _dropped(c: Collector) -> int:
    return sum(1 for e in c.logs() if str(e.get("msg", "")).startswith("dropping") and e.get("level") == "error")


@pytest.mark.parametrize(
    "name", ["feedback-huge-int", "feedback-lone-surrogate", "evaluate-lone-surrogate", "runs-lone-surrogate"]
)
def test_finding_api_bodies_with_unstorable_values_are_400(fuzzed: Fuzzed, name: str) -> None:
    """An integer past a double's range as a feedback value, and a lone UTF-16 surrogate escape in a feedback
    comment, an evaluate record's metadata or a run's manifest, are the client's mistakes: a 400, not a 500. And the
    reads after are unharmed: a run stored with such a manifest would make every later GET /api/v1/runs fail."""
    a = fuzzed.send(_finding(name))
    assert 400 <= a.status < 500, f"{a.label}: {a.body[:200]!r}"
    runs = fuzzed.send(F.FuzzInput("finding", "", "api", method="GET", path="/api/v1/runs"))
    assert runs.status == 200, f"{runs.label}: {runs.body[:200]!r}"


def test_finding_empty_resources_over_grpc_do_not_stall_the_collector(fuzzed: Fuzzed) -> None:
    """1,000,000 empty ResourceSpans are 2 MB on the wire but seconds of decoding (20 MiB of them: ~50 s). A gRPC
    request is decoded off the event loop, so the collector answers everyone else meanwhile; the decoding itself
    still costs those seconds of CPU (no limit counts resources)."""
    inp = _finding("empty-resources-1M-grpc")
    inp.body = inp.body[: 2 * 500_000]  # the first 500,000 of them: ~3 s of decoding here, enough to see a stall
    answers: list[F.Answer] = []
    latencies = _probed(fuzzed, lambda: answers.append(fuzzed.send(inp)))
    assert answers[0].code == "OK", answers[0].label
    assert max(latencies) <= STALL_S, f"a probe took {max(latencies):.2f} s while the request was decoded"


def test_finding_a_backtracking_regex_does_not_stall_the_collector(fuzzed: Fuzzed) -> None:
    """`(a+)+$` over n 'a's and a '!' takes a backtracking engine such as Python's re 2**n steps, holding the GIL
    (25 'a's: every request waits seconds; 40: hours). Patterns from outside run on RE2 (evalsi.pattern), in linear
    time; 60 'a's would take a backtracking engine longer than the suite's timeout."""
    records = [{"output": "a" * 60 + "!"}]
    body = {"records": records, "evaluators": [{"ref": "builtin/regex", "params": {"pattern": "^(a+)+$"}}]}
    inp = F.FuzzInput("finding", "", "api", path="/v1/evaluate", headers={"Content-Type": F.JSON},
                      body=json.dumps(body).encode())  # fmt: skip
    answers: list[F.Answer] = []
    latencies = _probed(fuzzed, lambda: answers.append(fuzzed.send(inp)))
    assert answers[0].status == 200, answers[0].label
    [result] = json.loads(answers[0].body)["results"]
    assert result["scores"][0]["passed"] is False  # the pattern does not match: answered, not hung
    assert max(latencies) <= STALL_S, f"a probe took {max(latencies):.2f} s while the regex ran"


def _probed(fuzzed: Fuzzed, action: Any) -> list[float]:
    """Run `action` while a valid span is sent every 0.1 s over OTLP/HTTP; the probes' answer times."""
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        conn = F.Connection(*fuzzed.otlp, timeout=300)
        while not done.is_set():
            body, _ = F.probe_request("fuzz-ci-finding")
            inp = F.FuzzInput("probe", "", "otlp", headers={"Content-Type": F.PROTOBUF}, body=body)
            latencies.append(F.send_http(conn, inp).seconds)
            time.sleep(0.1)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    time.sleep(0.3)
    action()
    done.set()
    t.join(300)
    return latencies
