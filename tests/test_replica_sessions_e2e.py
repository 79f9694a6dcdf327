"""Three `evalsi serve` replicas sharing one ClickHouse (the chDB-backed HTTP stand-in) behind a test router that
sends each trace to the replica its trace id hashes to, against the same traffic through one evalsi with no
`replicas` config: a ten-turn conversation spread over the three is evaluated once, by its owner, to the same
session score as one process gives; a judge budget holds across the replicas within its documented bound."""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from clickhouse_http import start_stand_in
from fake_judge import FakeJudge
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from running_collector import Collector, serve_config, start_collector, wait_until

from evalsi.exporters.clickhouse.backend import open_backend

SERVER_URL = os.environ.get("EVALSI_TEST_CLICKHOUSE_URL", "")

POLICIES = """
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: conversations}}
spec:
  cascade:
    - ref: builtin/session-turns
      params: {{max_turns: 12}}
---
apiVersion: evals.si/v1alpha1
kind: OnlineEvalPolicy
metadata: {{name: judged}}
spec:
  cascade:
    - ref: builtin/llm-judge
      params:
        endpoint: {judge}
        model: judge-1
        budget: {{max_calls: {budget}, window_s: 3650d}}
"""
REPLICAS = ("r0", "r1", "r2")
BUDGET = 12
SLICE = 0.25
TURNS = 10
TRACES = 24  # the conversation's ten turns, then fourteen traces of no session
BASE = 0xE2E0 << 64


class Next(RandomIdGenerator):
    """The trace id the test chose for the next trace, and its one span's id: the replicas and the one process get
    the same spans."""

    def __init__(self) -> None:
        self.trace_id = 0

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.trace_id & 0xFFFF | 1 << 40


def _provider(c: Collector, ids: Next) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "support"}), id_generator=ids)
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=c.http + "/v1/traces")))
    return provider


def _trace(provider: TracerProvider, n: int) -> None:
    tracer = provider.get_tracer("support.app")
    with tracer.start_as_current_span("chat gpt-4o-mini") as chat:
        chat.set_attribute("gen_ai.operation.name", "chat")
        chat.set_attribute("gen_ai.request.model", "gpt-4o-mini")
        if n < TURNS:
            chat.set_attribute("gen_ai.conversation.id", "conv-e2e")
        asked = [{"role": "user", "parts": [{"type": "text", "content": f"Question {n}: the capital of France?"}]}]
        chat.set_attribute("gen_ai.input.messages", json.dumps(asked))
        reply = [{"role": "assistant", "parts": [{"type": "text", "content": f"Paris ({n})."}]}]
        chat.set_attribute("gen_ai.output.messages", json.dumps(reply))


def _scores(c: Collector) -> list[dict[str, Any]]:
    return httpx.get(c.api + "/api/v1/scores", params={"limit": 1000}).json()["scores"]


def _metric(c: Collector, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in httpx.get(c.metrics).text.splitlines()
               if line.startswith(name))  # fmt: skip


def _session_scores(c: Collector) -> list[tuple[Any, ...]]:
    keys = ("policy", "evaluator", "name", "value", "passed", "trace_id", "span_id", "session_id", "explanation")
    return sorted(tuple(s[k] for k in keys) for s in _scores(c) if s["name"] == "session-turns")


@pytest.fixture
def judges() -> Iterator[tuple[FakeJudge, FakeJudge]]:
    fakes = (FakeJudge(), FakeJudge())
    for fake in fakes:
        fake.thread.start()
    yield fakes
    for fake in fakes:
        fake.server.shutdown()
        fake.server.server_close()


@pytest.mark.parametrize("where", ["stand-in", "clickhouse-server"])
def test_three_replicas_evaluate_a_spread_session_once_and_share_one_judge_budget(
    tmp_path: Path, judges: tuple[FakeJudge, FakeJudge], where: str
) -> None:
    shared_judge, own_judge = judges
    if where == "stand-in":
        stand_in = start_stand_in(tmp_path / "clickhouse")
        url, stop = stand_in.url, stand_in.stop
    elif SERVER_URL:
        url, stop = SERVER_URL, lambda: None
    else:
        pytest.skip("no ClickHouse server: set EVALSI_TEST_CLICKHOUSE_URL=http://user:password@host:8123 to run")
    database = f"evalsi_replicas_{uuid.uuid4().hex[:8]}"
    collectors: list[Collector] = []
    try:

        def config(where: Path, judge: FakeJudge, replica: str | None) -> dict[str, Any]:
            where.mkdir()
            (where / "policies.yaml").write_text(POLICIES.format(judge=judge.url, budget=BUDGET))
            cfg = serve_config(where / "store")
            cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms", "session_timeout": "3s"}
            cfg["processors"]["evaluate"] = {"policies": ["policies.yaml"]}
            if replica is not None:  # a replica: the shared store, and the replica set
                cfg["exporters"]["clickhouse"] = {"endpoint": url, "database": database,
                                                  "flush_interval": "100ms"}  # fmt: skip
                cfg["processors"]["evaluate"]["replicas"] = {
                    "self": replica, "static": list(REPLICAS), "session_timeout": "3s", "budget_slice": SLICE,
                }  # fmt: skip
            pipelines = cfg["service"]["pipelines"]
            pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
            pipelines["scores"] = {"exporters": ["clickhouse"]}
            return cfg

        places = [(tmp_path / r, shared_judge, r) for r in REPLICAS] + [(tmp_path / "one", own_judge, None)]
        configs = [(where, config(where, judge, r)) for where, judge, r in places]
        with ThreadPoolExecutor(len(configs)) as pool:  # started together: each takes seconds to start
            futures = [pool.submit(start_collector, where, cfg) for where, cfg in configs]
            for f in futures:  # every one, so that a failed start still leaves the others to stop
                try:
                    collectors.append(f.result())
                except AssertionError:
                    pass
        assert len(collectors) == 4, "a collector did not start"
        *replicas, one = collectors
        ids = [Next() for _ in collectors]
        providers = [_provider(c, i) for c, i in zip(collectors, ids, strict=True)]
        for n in range(TRACES):  # the test router: a trace goes to the replica its id hashes to, and to the one
            trace_id = BASE | n
            r = trace_id % len(replicas)
            ids[r].trace_id = ids[-1].trace_id = trace_id
            _trace(providers[r], n)
            _trace(providers[-1], n)
        for p in providers:
            p.shutdown()

        assert wait_until(lambda: _session_scores(one), timeout=60), _scores(one)
        assert wait_until(lambda: _session_scores(replicas[0]), timeout=60), _scores(replicas[0])
        expected = _session_scores(one)
        assert [s[3] for s in expected] == [TURNS]  # one process: every turn, one score
        assert _session_scores(replicas[0]) == expected  # the same score, from the same first trace
        assert all(_session_scores(c) == expected for c in replicas)  # whichever replica is asked
        # evaluated once: by one replica, and the store holds one row of its key (not merged away: FINAL not used)
        evaluated = 'evalsi_replica_sessions_total{outcome="evaluated",processor="evaluate"}'
        assert wait_until(lambda: sum(_metric(c, evaluated) for c in replicas) >= 1)
        store = open_backend(url, database=database)
        rows = store.query("SELECT count() AS n FROM evalsi_scores WHERE Name = 'session-turns'")
        assert int(rows[0]["n"]) == 1
        assert [_metric(c, evaluated) for c in replicas].count(1) == 1
        assert wait_until(lambda: all(_metric(c, "evalsi_evaluate_traces_total") > 0 for c in replicas))

        # the judge budget: one process spends exactly it; three replicas together within one slice per other
        assert wait_until(lambda: sum(1 for s in _scores(one) if s["name"] == "llm-judge") == TRACES)
        assert len(own_judge.requests) == BUDGET

        def judged() -> list[dict[str, Any]]:
            return [s for s in _scores(replicas[0]) if s["name"] == "llm-judge"]

        assert wait_until(lambda: len(judged()) == TRACES), len(judged())
        calls = len(shared_judge.requests)
        assert BUDGET <= calls <= BUDGET + (len(replicas) - 1) * math.ceil(SLICE * BUDGET)
        assert sum(1 for s in judged() if s["reason"] == "budget exhausted") == TRACES - calls
        spent = "SELECT sum(Calls) AS calls FROM evalsi_judge_ledger FINAL WHERE Budget = 'judged#0'"
        assert wait_until(lambda: int(store.query(spent)[0]["calls"] or 0) == calls)  # recorded as it happened
        store.close()
    finally:
        for c in collectors:
            c.stop()
        stop()


def test_a_replica_with_pipeline_workers_shares_its_budget_and_sessions_through_the_store(
    tmp_path: Path, judges: tuple[FakeJudge, FakeJudge]
) -> None:
    """With `service.workers: 2` the workers' judges ask the collector process's ledger, which is the shared one,
    and the workers' session traces are recorded there for the owner (here the only replica)."""
    judge, _ = judges
    stand_in = start_stand_in(tmp_path / "clickhouse")
    database = f"evalsi_replicas_{uuid.uuid4().hex[:8]}"
    try:
        (tmp_path / "policies.yaml").write_text(POLICIES.format(judge=judge.url, budget=5))
        cfg = serve_config(tmp_path / "unused")
        cfg["service"]["workers"] = 2
        cfg["exporters"]["clickhouse"] = {"endpoint": stand_in.url, "database": database, "flush_interval": "100ms"}
        cfg["processors"]["tail_sampling"] = {"decision_wait": "300ms"}
        cfg["processors"]["evaluate"] = {
            "policies": ["policies.yaml"], "replicas": {"self": "r0", "static": ["r0"], "session_timeout": "2s"},
        }  # fmt: skip
        pipelines = cfg["service"]["pipelines"]
        pipelines["traces"]["processors"] = ["normalize", "tail_sampling", "evaluate"]
        pipelines["scores"] = {"exporters": ["clickhouse"]}
        c = start_collector(tmp_path, cfg)
        try:
            ids = Next()
            provider = _provider(c, ids)
            for n in range(TRACES):
                ids.trace_id = BASE | n
                _trace(provider, n)
            provider.shutdown()
            assert wait_until(lambda: _session_scores(c), timeout=60), _scores(c)
            [turns] = _session_scores(c)
            assert (turns[3], turns[5]) == (TURNS, f"{BASE:032x}")  # every turn, from the first trace
            assert wait_until(lambda: sum(1 for s in _scores(c) if s["name"] == "llm-judge") == TRACES)
            assert len(judge.requests) == 5  # one replica: exactly the budget, whichever worker judged
            store = open_backend(stand_in.url, database=database)
            spent = "SELECT sum(Calls) AS calls FROM evalsi_judge_ledger FINAL WHERE Budget = 'judged#0'"
            assert wait_until(lambda: int(store.query(spent)[0]["calls"] or 0) == 5)
            store.close()
        finally:
            assert c.stop() == 0
    finally:
        stand_in.stop()
