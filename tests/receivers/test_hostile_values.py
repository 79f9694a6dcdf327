"""Property tests: hostile OTLP trace requests against a real `evalsi serve`, in-process and with 2 pipeline workers.

Each example is a request mixing valid spans (fresh ids, remembered) with hostile values and invalid spans, built by
the hypothesis strategy `hostile_otlp.hostile_cases` (see that module for the contract checked). Per example, through
one transport (OTLP/HTTP protobuf, OTLP/HTTP JSON, gRPC):

- the answer: 200 / OK with `rejected_spans` = the invalid spans and `error_message` naming the first, or, for a body
  that does not decode, 400 with a google.rpc.Status message / INVALID_ARGUMENT; never another 5xx (503/429 with
  Retry-After are retried);
- a valid request sent right after is stored within two flush intervals (+ slack for a slow machine);
- the valid spans are stored: duration, kind and status clamped where the contract says, with `evalsi.clamped`
  naming the fields, token counts parsed or None and listed in `unparsed`; nothing of a refused request is stored.

At the end of each collector: every valid span of every accepted request is still there, and SIGTERM exits 0.

Budget: per transport and worker mode, 15 examples in the `ci` Hypothesis profile, 250 in `deep`
(HYPOTHESIS_PROFILE=deep; tests/budget.py); HOSTILE_EXAMPLES sets it. Shrinking is off by default (a
stalled collector is restarted, which makes shrinking slow); set HOSTILE_SHRINK=1 to shrink a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from budget import examples
from hostile_otlp import Case, Harness, hostile_cases
from hypothesis import HealthCheck, Phase, given, settings

EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", examples(ci=15, deep=250)))
PHASES = (
    (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
    if os.environ.get("HOSTILE_SHRINK")
    else (Phase.explicit, Phase.generate)
)
HOSTILE = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # nothing written to the checkout; failures print their case
    phases=PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


@pytest.fixture(scope="module", params=[1, 2], ids=["in-process", "2-workers"])
def harness(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """One collector per worker mode (`service.workers`: 1 runs the pipelines in-process, 2 in two workers)."""
    h = Harness(tmp_path_factory.mktemp(f"hostile-{request.param}"), request.param)
    yield h
    if h.collector is not None and h.collector.proc.poll() is None:
        h.stop()


def check(harness: Harness, case: Case, transport: str) -> None:
    problems = harness.run_case(case, transport)
    assert not problems, "\n".join(problems)


@HOSTILE
@given(case=hostile_cases())
def test_http_protobuf(harness: Harness, case: Case) -> None:
    check(harness, case, "http-protobuf")


@HOSTILE
@given(case=hostile_cases())
def test_http_json(harness: Harness, case: Case) -> None:
    check(harness, case, "http-json")


@HOSTILE
@given(case=hostile_cases())
def test_grpc(harness: Harness, case: Case) -> None:
    check(harness, case, "grpc")


def test_every_valid_span_is_still_stored(harness: Harness) -> None:
    """Nothing accepted went missing later (a failed flush, a worker that died), the clamped spans carry their
    marker, nothing refused appeared. (The examples checked every field already, right after their request.)"""
    problems, missing = harness.stored_problems(harness.stored_expected, timeout=5, markers_only=True)
    problems += harness.absent_problems(harness.must_be_absent)
    assert not problems, f"{missing} of {len(harness.stored_expected)} valid spans missing\n" + "\n".join(problems[:50])


def test_no_stall_and_sigterm_exits_0(harness: Harness) -> None:
    waited, late = harness.probe()
    assert waited is not None, f"a last valid request took {late}s to be stored (None: never)"
    code = harness.stop()
    assert harness.restarts == 0, f"the collector wedged and was restarted {harness.restarts}x: {harness.stalls}"
    assert harness.exit_codes == [0], f"exit codes {harness.exit_codes}\n" + "\n".join(harness.new_log_lines()[-20:])
    assert code == 0
